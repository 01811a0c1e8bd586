"""Recording deployment episodes to a LeRobotDataset (v3).

Per control step: the observation the policy saw, the command actually sent
(after the safety envelope), whether a human was in control, and whether the
envelope changed the command. Images are stored as PNG frames unless
``use_videos`` (PyAV encoding) is asked for.

Features:

- ``observation.state`` ``float32 [S]`` (names: the robot's state names);
- ``observation.images.<cam>`` ``image``/``video`` ``[H, W, 3]``;
- ``action`` ``float32 [A]`` the command sent (names: the robot's joints);
- ``intervention`` ``bool [1]`` LeRobot's human-in-the-loop field (what its DAgger rollout records);
- ``intervention_label`` ``int64 [1]`` the RaC label (:mod:`vla_core.labels`: 0 policy, 1 recovery,
  2 correction);
- ``action_modified`` ``bool [1]`` the envelope clamped, held or replaced the command.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hardware.adapter import RobotObservation
from vla_core.keys import INTERVENTION, INTERVENTION_LABEL
from vla_core.labels import Label, label_features

log = logging.getLogger(__name__)

IS_INTERVENTION = INTERVENTION  # the former name of the constant (the field is LeRobot's ``intervention``)
ACTION_MODIFIED = "action_modified"


@dataclass
class DatasetConfig:
    """Where and how deployment episodes are recorded."""

    repo_id: str = ""
    """Dataset id (``user/name``); empty = record nothing."""
    root: str = ""
    """Local folder of the dataset (must not exist yet); empty = LeRobot's default under ``HF_LEROBOT_HOME``."""
    use_videos: bool = False
    """Encode camera streams as MP4 (PyAV) instead of PNG frames."""


def dataset_features(
    state_names: list[str], joint_names: list[str], cameras: dict[str, tuple[int, int]], use_videos: bool
) -> dict[str, dict]:
    """The LeRobotDataset ``features`` dict for a robot (see the module docstring)."""
    feats: dict[str, dict] = {
        "observation.state": {"dtype": "float32", "shape": (len(state_names),), "names": list(state_names)},
        "action": {"dtype": "float32", "shape": (len(joint_names),), "names": list(joint_names)},
        **label_features(),
        ACTION_MODIFIED: {"dtype": "bool", "shape": (1,), "names": None},
    }
    for cam, (h, w) in cameras.items():
        feats[f"observation.images.{cam}"] = {
            "dtype": "video" if use_videos else "image",
            "shape": (h, w, 3),
            "names": ["height", "width", "channels"],
        }
    return feats


class RobotEpisodeRecorder:
    """Buffers frames of the current robot episode and saves or discards it.

    Not :class:`sim.dataset.EpisodeRecorder`: that one records the sim contract
    (an :class:`sim.core.EnvSpec`, reward and success per frame, written atomically
    via a ``.partial`` folder); this one records a robot's layout (named joints and
    state), the command as sent, who was in control and whether the safety envelope
    changed the command.

    Args:
        cfg: dataset settings (``repo_id`` must be set).
        fps: control rate (frames per second of the dataset).
        robot_type: stored in the dataset metadata.
        state_names, joint_names, cameras: the robot's layout.

    Raises:
        FileExistsError: if ``cfg.root`` already exists (LeRobot refuses to overwrite).
    """

    def __init__(
        self,
        cfg: DatasetConfig,
        fps: int,
        robot_type: str,
        state_names: list[str],
        joint_names: list[str],
        cameras: dict[str, tuple[int, int]],
    ) -> None:
        from lerobot.datasets.lerobot_dataset import LeRobotDataset

        root = Path(cfg.root) if cfg.root else None
        if root is not None and root.exists():
            raise FileExistsError(f"dataset.root {root} already exists; choose a new folder")
        self.cameras = dict(cameras)
        self.features = dataset_features(state_names, joint_names, cameras, cfg.use_videos)
        self.dataset = LeRobotDataset.create(
            cfg.repo_id, fps, self.features, root=root, robot_type=robot_type, use_videos=cfg.use_videos
        )
        self.frames_in_episode = 0
        self.episodes_saved = 0

    @property
    def root(self) -> Path:
        """The dataset folder."""
        return Path(self.dataset.root)

    def add(self, obs: RobotObservation, action: np.ndarray, task: str, intervention: bool, modified: bool,
            label: Label | None = None) -> None:
        """Buffer one frame: ``obs`` as the policy saw it, ``action [A]`` as sent; ``label`` defaults to
        ``correction`` for an intervention step and ``policy`` otherwise."""
        if label is None:
            label = Label.CORRECTION if intervention else Label.POLICY
        frame: dict = {
            "observation.state": np.asarray(obs.state, dtype=np.float32),
            "action": np.asarray(action, dtype=np.float32).reshape(-1),
            INTERVENTION: np.array([intervention], dtype=bool),
            INTERVENTION_LABEL: np.array([int(label)], dtype=np.int64),
            ACTION_MODIFIED: np.array([modified], dtype=bool),
            "task": task,
        }
        for cam in self.cameras:
            frame[f"observation.images.{cam}"] = obs.images[cam]
        self.dataset.add_frame(frame)
        self.frames_in_episode += 1

    def save_episode(self) -> bool:
        """Write the buffered episode; False (nothing written) when it has no frames."""
        if self.frames_in_episode == 0:
            return False
        self.dataset.save_episode()
        self.frames_in_episode = 0
        self.episodes_saved += 1
        return True

    def discard_episode(self) -> None:
        """Drop the buffered episode (re-record)."""
        if self.frames_in_episode:
            self.dataset.clear_episode_buffer()
        self.frames_in_episode = 0

    def finalize(self) -> None:
        """Flush metadata and close writers (the dataset is invalid without it). Idempotent."""
        self.dataset.finalize()
