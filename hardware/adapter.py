"""The robot adapter interface: a robot seen as a one-env ``sim`` env.

An adapter produces the :mod:`sim.core` observation dict with batch size 1
(``observation.state`` ``float32 [1, S]`` joint positions in the adapter's
joint order, ``observation.images.<cam>`` ``uint8 [1, H, W, 3]``, ``task``
a one-element list) and takes joint-position targets in the same order, so
a policy's action chunk ``[1, H, A]`` maps straight onto commands.

Adapters are transports only: they never decide whether a command is safe.
The deployment runner hands them commands exclusively through
:class:`hardware.guard.GuardedRobot`, which runs the safety envelope first.
"""

from __future__ import annotations

import abc
import time
from dataclasses import dataclass, field
from typing import Self

import numpy as np
import torch

from sim.core import OBS_STATE, TASK, EnvSpec, Obs, TensorSpec, image_key


@dataclass
class RobotObservation:
    """One observation of a robot with its timing.

    Attributes:
        state: ``float64 [S]`` proprioception the policy sees (``observation.state``).
        position: ``float64 [A]`` measured joint positions in command order (what
            the safety envelope starts from); for most arms the same values as ``state``.
        images: camera name -> ``uint8 [H, W, 3]`` RGB frame.
        state_stamp: ``time.monotonic()`` when the joint state arrived.
        image_stamps: camera name -> ``time.monotonic()`` when its frame arrived.
    """

    state: np.ndarray
    position: np.ndarray
    images: dict[str, np.ndarray] = field(default_factory=dict)
    state_stamp: float = 0.0
    image_stamps: dict[str, float] = field(default_factory=dict)

    def state_age(self, now: float | None = None) -> float:
        """Seconds since the joint state arrived."""
        return (time.monotonic() if now is None else now) - self.state_stamp

    def camera_age(self, now: float | None = None) -> float:
        """Seconds since the *oldest* camera's newest frame arrived (0 without cameras)."""
        if not self.image_stamps:
            return 0.0
        now = time.monotonic() if now is None else now
        return now - min(self.image_stamps.values())

    def to_obs(self, task: str) -> Obs:
        """The :mod:`sim.core` observation dict (batch of one)."""
        obs: Obs = {OBS_STATE: torch.as_tensor(self.state, dtype=torch.float32)[None]}
        for cam, img in self.images.items():
            obs[image_key(cam)] = torch.from_numpy(np.ascontiguousarray(img))[None]
        obs[TASK] = [task]
        return obs


class RobotAdapter(abc.ABC):
    """Connect, observe, send a chunk of joint targets, disconnect.

    Subclasses set :attr:`joint_names` (command order), :attr:`state_names`
    (``observation.state`` order) and :attr:`cameras` (name -> ``(H, W)``)
    before :meth:`connect` returns.
    """

    joint_names: list[str]
    state_names: list[str]
    cameras: dict[str, tuple[int, int]]
    robot_type: str = "robot"

    @abc.abstractmethod
    def connect(self) -> None:
        """Open the transport and wait for the first complete observation.

        Raises:
            ConnectionError: naming what never arrived (topic, port, camera) and how to check it.
        """

    @abc.abstractmethod
    def observe(self) -> RobotObservation:
        """The newest observation (non-blocking for streaming transports).

        Raises:
            ConnectionError: if the adapter is not connected.
        """

    @abc.abstractmethod
    def send_chunk(self, targets: np.ndarray, dt: float) -> None:
        """Send joint-position targets ``float64 [n, A]``; point ``i`` is due ``(i + 1) * dt`` s from now.

        Transports without trajectories (LeRobot robots, position
        controllers) apply point 0 only. Called only by the guard.
        """

    @abc.abstractmethod
    def disconnect(self) -> None:
        """Close the transport. Idempotent; must not raise when the robot already vanished."""

    @property
    @abc.abstractmethod
    def is_connected(self) -> bool:
        """True between :meth:`connect` and :meth:`disconnect`."""

    def default_limits(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The robot's own joint position limits ``([A], [A])``, or None if it has none to offer."""
        return None

    @property
    def num_joints(self) -> int:
        """A, the number of joints (state and action dimension)."""
        return len(self.joint_names)

    def spec(self, control_freq: float, max_episode_steps: int) -> EnvSpec:
        """The :class:`sim.core.EnvSpec` of this robot as a one-env env."""
        lim = self.default_limits()
        lo, hi = (float(lim[0].min()), float(lim[1].max())) if lim is not None else (None, None)
        observation = {OBS_STATE: TensorSpec((len(self.state_names),), torch.float32)}
        for cam, (h, w) in self.cameras.items():
            observation[image_key(cam)] = TensorSpec((h, w, 3), torch.uint8, 0, 255)
        return EnvSpec(
            env_id=f"hardware/{self.robot_type}",
            observation=observation,
            action=TensorSpec((self.num_joints,), torch.float32, lo, hi),
            max_episode_steps=max_episode_steps,
            control_freq=control_freq,
            cameras=tuple(self.cameras),
        )

    def __enter__(self) -> Self:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.disconnect()
