"""Record episodes of the observation/action contract into a LeRobotDataset v3.

Used by ``vla-rl collect`` (scripted-expert demos). (Robot deployments record
with :class:`hardware.recording.RobotEpisodeRecorder`, which stores a robot's
joint layout and intervention flags instead.) Frames carry LeRobot's
keys: ``observation.images.<cam>`` (stored as PNG images, no video codec
needed), ``observation.state``, ``action``, ``task`` plus ``next.reward``,
``next.success`` and any extra per-frame fields declared up front (for example
``is_intervention``).

Writing is atomic and durable at the dataset level: episodes go to
``<root>.partial``; :meth:`EpisodeRecorder.finalize` closes LeRobot's writers,
then :func:`seal_dataset` fsyncs every file, writes ``manifest.json`` (size and
sha256 of every file, :mod:`vla_core.manifest`) last, renames the folder to
``root`` and fsyncs its parent. A crash never leaves a half-written dataset at
``root``; a ``.partial`` folder left by a crash is moved aside
(``<root>.partial.damaged-<n>``), never deleted, by the next recording.

The manifest is an extra file at the dataset's top level: LeRobot ignores it, so
the folder stays a plain LeRobotDataset. :func:`verify_dataset` checks it (or,
for a dataset without one, recorded by another tool, that its JSON metadata
parses and its parquet files are complete) and names the damaged file;
:func:`load_dataset` calls it before LeRobot reads anything.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sim.core import OBS_ENV_STATE, OBS_STATE, EnvSpec
from vla_core.manifest import IntegrityError, fsync_dir, move_aside, verify_manifest, write_manifest

from vla_core.keys import ACTION, REWARD, SUCCESS  # noqa: F401  (re-exported)

# PyAV ships its FFmpeg inside the wheel; torchcodec needs system FFmpeg libraries (absent on our machines).
VIDEO_BACKEND = "pyav"


def features_for(spec: EnvSpec, extra: dict[str, dict] | None = None) -> dict[str, dict]:
    """LeRobot feature dict for an env spec: cameras, state, the privileged env state (when the env has one:
    policies that read it, such as ``gaussian-mlp``, can then be pre-trained on the dataset), action, reward,
    success (+ ``extra``)."""
    feats: dict[str, dict] = {}
    for key in spec.image_keys:
        h, w, c = spec.observation[key].shape
        feats[key] = {"dtype": "image", "shape": (h, w, c), "names": ["height", "width", "channels"]}
    if OBS_STATE in spec.observation:
        (s,) = spec.observation[OBS_STATE].shape
        feats[OBS_STATE] = {"dtype": "float32", "shape": (s,), "names": [f"s{i}" for i in range(s)]}
    if OBS_ENV_STATE in spec.observation:
        (p,) = spec.observation[OBS_ENV_STATE].shape
        feats[OBS_ENV_STATE] = {"dtype": "float32", "shape": (p,), "names": [f"e{i}" for i in range(p)]}
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
        self.partial = partial_root(self.root)
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
        """Flush metadata, seal the dataset (:func:`seal_dataset`) and move it into place. Returns ``root``."""
        self.dataset.finalize()
        return seal_dataset(self.partial, self.root)


def _row(value: Any, index: int | None) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    value = np.asarray(value)
    return value if index is None else value[index]


PARTIAL_SUFFIX = ".partial"
"""Suffix of the folder a dataset is recorded into before :func:`seal_dataset` renames it to its final name."""
_PARQUET_MAGIC = b"PAR1"


def partial_root(root: Path) -> Path:
    """``<root>.partial``, ready to record into: its parent exists; one left by a crashed recording is moved aside
    to ``<root>.partial.damaged-<n>`` (printed), never deleted."""
    partial = root.with_name(root.name + PARTIAL_SUFFIX)
    if partial.exists():
        print(f"note: moved the unfinished recording {partial} aside to {move_aside(partial).name}")
    partial.parent.mkdir(parents=True, exist_ok=True)
    return partial


def seal_dataset(written: str | Path, root: str | Path) -> Path:
    """Make a finalized LeRobotDataset folder durable and put it in place: fsync every file, write its
    ``manifest.json`` last (:func:`vla_core.manifest.write_manifest`), rename ``written`` to ``root`` (when they
    differ) and fsync the parent. Returns ``root``.

    Raises:
        OSError: from the file system (disk full...); ``root`` is then not created.
    """
    written, root = Path(written), Path(root)
    write_manifest(written)
    if written != root:
        os.replace(written, root)
    fsync_dir(root.parent)
    return root


def verify_dataset(root: str | Path, *, hashes: bool = True) -> bool:
    """Check a LeRobotDataset folder before reading it, naming the file at fault.

    A dataset with a ``manifest.json`` (recorded by this project) is checked against it: every file present with
    its size and (``hashes``) sha256. Without one (recorded by another tool) every ``meta/*.json`` must parse and
    every ``*.parquet`` file must begin and end with parquet's magic bytes (a truncated or empty file does not).

    Returns:
        True when a manifest verified the folder; False when it has none (checked file by file only).

    Raises:
        IntegrityError: one sentence naming the missing, truncated, altered or malformed file.
    """
    root = Path(root)
    if verify_manifest(root, hashes=hashes):
        return True
    for path in sorted((root / "meta").glob("*.json")):
        try:
            json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise IntegrityError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
        except UnicodeDecodeError:
            raise IntegrityError(f"{path}: not valid JSON (not UTF-8 text; a corrupted file?)") from None
    for path in sorted(root.rglob("*.parquet")):
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(4)
            f.seek(max(size - 4, 0))
            tail = f.read(4)
        if size < 12 or head != _PARQUET_MAGIC or tail != _PARQUET_MAGIC:
            raise IntegrityError(f"{path} has {size} bytes and is not a complete parquet file (empty or truncated)")
    return False


def load_dataset(root: str | Path, repo_id: str = "local/dataset", **kwargs: Any) -> Any:
    """Open a dataset written by :class:`EpisodeRecorder` (offline, from disk), verified first
    (:func:`verify_dataset`).

    Raises:
        FileNotFoundError: naming ``root`` when it holds no LeRobot dataset.
        IntegrityError: naming the file that is missing, truncated, altered or malformed.
    """
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    root = Path(root)
    if not (root / "meta" / "info.json").exists():
        raise FileNotFoundError(f"{root} is not a LeRobotDataset (no meta/info.json); run `vla-rl collect` first")
    verify_dataset(root)
    kwargs.setdefault("video_backend", VIDEO_BACKEND)
    return LeRobotDataset(repo_id, root=root, **kwargs)
