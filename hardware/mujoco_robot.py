"""``mujoco_arm``: a LeRobot ``Robot`` backed by :class:`hardware.sim_arm.MujocoArm`, stepped in real time.

It lets the LeRobot transport be exercised without hardware: observations are
``<joint>.pos`` floats plus rendered camera frames, actions are
``<joint>.pos`` targets (radians for the packaged models), exactly the shape
of LeRobot's follower arms.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
from lerobot.robots import Robot

from hardware.config_mujoco_robot import MujocoRobotConfig


class MujocoRobot(Robot):
    """A simulated arm; physics advances to wall-clock time on every call."""

    config_class = MujocoRobotConfig
    name = "mujoco_arm"

    def __init__(self, config: MujocoRobotConfig) -> None:
        super().__init__(config)
        from hardware.sim_arm import MujocoArm

        self.config = config
        self.arm = MujocoArm(config.model, image_size=(config.image_height, config.image_width))
        unknown = [c for c in config.camera_names if c not in self.arm.camera_names]
        if unknown:
            raise ValueError(f"robot.camera_names: {unknown} not in model cameras {self.arm.camera_names}")
        self._connected = False
        self._t0 = 0.0
        self._lock = threading.Lock()

    @property
    def _joint_keys(self) -> list[str]:
        return [f"{j}.pos" for j in self.arm.joint_names]

    @property
    def observation_features(self) -> dict:
        """``<joint>.pos: float`` per joint, ``<camera>: (H, W, 3)`` per camera."""
        ft: dict[str, Any] = dict.fromkeys(self._joint_keys, float)
        for cam in self.config.camera_names:
            ft[cam] = (self.config.image_height, self.config.image_width, 3)
        return ft

    @property
    def action_features(self) -> dict:
        """``<joint>.pos: float`` per joint."""
        return dict.fromkeys(self._joint_keys, float)

    @property
    def joint_limits(self) -> dict[str, tuple[float, float]]:
        """Joint position limits from the model, keyed like the actions."""
        return {
            k: (float(lo), float(hi))
            for k, lo, hi in zip(self._joint_keys, self.arm.lower, self.arm.upper, strict=True)
        }

    @property
    def is_connected(self) -> bool:
        return self._connected

    @property
    def is_calibrated(self) -> bool:
        return True

    def connect(self, calibrate: bool = True) -> None:
        """Reset the arm to its home pose and start the clock."""
        self.arm.reset()
        self._t0 = time.monotonic()
        self._connected = True

    def calibrate(self) -> None:
        """Nothing to calibrate in simulation."""

    def configure(self) -> None:
        """Nothing to configure in simulation."""

    def _sync(self) -> None:
        behind = (time.monotonic() - self._t0) - self.arm.time
        if behind > 0:
            self.arm.advance(min(behind, 0.5))  # never spend more than 0.5 s of physics in one call

    def get_observation(self) -> dict[str, Any]:
        """Joint positions and rendered frames at the current wall-clock time."""
        if not self._connected:
            raise ConnectionError("mujoco_arm is not connected")
        with self._lock:
            self._sync()
            obs: dict[str, Any] = dict(zip(self._joint_keys, self.arm.positions().tolist(), strict=True))
            for cam in self.config.camera_names:
                obs[cam] = self.arm.render(cam)
        return obs

    def send_action(self, action: dict[str, Any]) -> dict[str, Any]:
        """Set joint targets (the model's servos clip them to the joint ranges)."""
        if not self._connected:
            raise ConnectionError("mujoco_arm is not connected")
        with self._lock:
            self._sync()
            self.arm.set_targets(np.array([float(action[k]) for k in self._joint_keys]))
            return dict(zip(self._joint_keys, self.arm.targets.tolist(), strict=True))

    def disconnect(self) -> None:
        """Stop the clock and free the renderer."""
        self._connected = False
        self.arm.close()
