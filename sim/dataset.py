"""Record episodes of the observation/action contract into a LeRobotDataset v3.

Used by ``vla-rl collect`` (scripted-expert demos). (Robot deployments record
with :class:`hardware.recording.RobotEpisodeRecorder`, which stores a robot's
joint layout and intervention flags instead.) Frames carry LeRobot's
keys: ``observation.images.<cam>`` (stored as PNG images, no video codec
needed), ``observation.state``, ``action``, ``task`` plus ``next.reward``,
``next.success`` and any extra per-frame fields declared up front (for example
``is_intervention``).

Writing is atomic at the dataset level: episodes go to ``<root>.partial`` and
the folder is renamed to ``root`` by :meth:`EpisodeRecorder.finalize`, so a
crash never leaves a half-written dataset at ``root``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sim.core import OBS_STATE, EnvSpec

from vla_core.keys import ACTION, REWARD, SUCCESS  # noqa: F401  (re-exported)

# PyAV ships its FFmpeg inside the wheel; torchcodec needs system FFmpeg libraries (absent on our machines).
VIDEO_BACKEND = "pyav"


def features_for(spec: EnvSpec, extra: dict[str, dict] | None = None) -> dict[str, dict]:
    """LeRobot feature dict for an env spec: cameras, state, action, reward, success (+ ``extra``)."""
    feats: dict[str, dict] = {}
    for key in spec.image_keys:
        h, w, c = spec.observation[key].shape
        feats[key] = {"dtype": "image", "shape": (h, w, c), "names": ["height", "width", "channels"]}
    if OBS_STATE in spec.observation:
        (s,) = spec.observation[OBS_STATE].shape
        feats[OBS_STATE] = {"dtype": "float32", "shape": (s,), "names": [f"s{i}" for i in range(s)]}
    a = spec.action_dim
    feats[ACTION] = {"dtype": "float32", "shape": (a,), "names": [f"a{i}" for i in range(a)]}
    feats[REWARD] = {"dtype": "float32", "shape": (1,), "names": None}
    feats[SUCCESS] = {"dtype": "bool", "shape": (1,), "names": None}
    feats.update(extra or {})
    return feats


class EpisodeRecorder:
    """Append episodes to a new LeRobotDataset under ``root`` (see module doc).

    Args:
        root: final dataset folder; must not exist yet.
        repo_id: dataset name stored in its metadata (no hub access happens).
        spec: the env spec whose observations are recorded.
        fps: control frequency.
        extra_features: additional per-frame LeRobot features.

    Raises:
        FileExistsError: if ``root`` exists (delete it or choose another root).
    """

    def __init__(
        self,
        root: str | Path,
        repo_id: str,
        spec: EnvSpec,
        fps: int,
        extra_features: dict[str, dict] | None = None,
        robot_type: str | None = None,
    ) -> None:
        from lerobot.datasets.lerobot_dataset import LeRobotDataset

        self.root = Path(root)
        if self.root.exists():
            raise FileExistsError(f"dataset folder {self.root} already exists; remove it or pick another --output")
        self.partial = self.root.with_name(self.root.name + ".partial")
        if self.partial.exists():
            shutil.rmtree(self.partial)
        self.partial.parent.mkdir(parents=True, exist_ok=True)
        self.features = features_for(spec, extra_features)
        self.spec = spec
        self.num_episodes = 0
        self.dataset = LeRobotDataset.create(
            repo_id=repo_id,
            fps=int(fps),
            features=self.features,
            root=self.partial,
            robot_type=robot_type,
            use_videos=False,
            video_backend=VIDEO_BACKEND,
        )

    def add_frame(
        self,
        obs: dict[str, Any],
        action: torch.Tensor | np.ndarray,
        reward: float,
        success: bool,
        index: int = 0,
        **extra: Any,
    ) -> None:
        """Add env ``index``'s row of a batched observation and its action as one frame."""
        frame: dict[str, Any] = {}
        for key in self.features:
            if key in obs:
                frame[key] = _row(obs[key], index)
        frame[ACTION] = np.asarray(_row(action, None), dtype=np.float32)
        frame[REWARD] = np.array([reward], dtype=np.float32)
        frame[SUCCESS] = np.array([bool(success)])
        for key, value in extra.items():
            frame[key] = np.asarray(value)
        frame["task"] = obs["task"][index]
        self.dataset.add_frame(frame)

    def save_episode(self) -> None:
        """Close the current episode."""
        self.dataset.save_episode(parallel_encoding=False)
        self.num_episodes += 1

    def discard_episode(self) -> None:
        """Drop the frames of the current, unsaved episode."""
        self.dataset.clear_episode_buffer()

    def finalize(self) -> Path:
        """Flush metadata and move the dataset into place atomically. Returns ``root``."""
        self.dataset.finalize()
        os.replace(self.partial, self.root)
        return self.root


def _row(value: Any, index: int | None) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    value = np.asarray(value)
    return value if index is None else value[index]


def load_dataset(root: str | Path, repo_id: str = "local/dataset", **kwargs: Any) -> Any:
    """Open a dataset written by :class:`EpisodeRecorder` (offline, from disk).

    Raises:
        FileNotFoundError: naming ``root`` when it holds no LeRobot dataset.
    """
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    root = Path(root)
    if not (root / "meta" / "info.json").exists():
        raise FileNotFoundError(f"{root} is not a LeRobotDataset (no meta/info.json); run `vla-rl collect` first")
    kwargs.setdefault("video_backend", VIDEO_BACKEND)
    return LeRobotDataset(repo_id, root=root, **kwargs)
