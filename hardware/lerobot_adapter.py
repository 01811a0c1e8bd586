"""A robot adapter over any LeRobot ``Robot`` (SO-100/101, Koch, OMX, OpenArm, ... and plugins).

The robot is picked by LeRobot's own config registry, exactly as in
``lerobot-record``: ``--robot.type so101_follower --robot.port /dev/ttyACM0
--robot.cameras '{front: {type: opencv, index_or_path: 0, width: 640,
height: 480, fps: 30}}'``.

Mapping to the :mod:`sim.core` contract:

- ``observation.state``: every scalar observation feature, in the robot's
  ``observation_features`` order (``shoulder_pan.pos``, ...);
- ``observation.images.<cam>``: every ``(H, W, 3)`` feature;
- actions / commands: the robot's ``action_features`` order; each action key
  must also be a scalar observation (the measured joint position the safety
  envelope starts from), which holds for LeRobot's position-controlled arms.

LeRobot robots take one target per call, so :meth:`send_chunk` applies point
0 of a chunk; the runner calls it every control period.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
import time
from typing import Any

import numpy as np

from hardware.adapter import RobotAdapter, RobotObservation

log = logging.getLogger(__name__)


def register_lerobot_devices() -> None:
    """Import every robot and teleoperator package LeRobot ships, so their config types are parsable.

    Packages whose optional dependencies are missing are skipped (logged at debug level).
    """
    import lerobot.robots
    import lerobot.teleoperators

    for pkg in (lerobot.robots, lerobot.teleoperators):
        for mod in pkgutil.iter_modules(pkg.__path__):
            if mod.ispkg:
                try:
                    importlib.import_module(f"{pkg.__name__}.{mod.name}")
                except Exception as e:  # noqa: BLE001  (an optional SDK is missing: that device is unavailable)
                    log.debug("skipping %s.%s: %s", pkg.__name__, mod.name, e)


class LeRobotAdapter(RobotAdapter):
    """Wraps a LeRobot ``Robot`` built from its config (or given ready-made).

    Args:
        robot: a ``lerobot.robots.RobotConfig`` or a ``Robot`` instance.

    Raises:
        ValueError: if an action key is not also a scalar observation key.
    """

    def __init__(self, robot: Any) -> None:
        from lerobot.robots import Robot, RobotConfig, make_robot_from_config

        if isinstance(robot, RobotConfig):
            try:
                robot = make_robot_from_config(robot)
            except ImportError as e:  # the robot's motor SDK is an optional LeRobot extra
                raise ImportError(f"robot.type {robot.type!r}: {e}") from e
        if not isinstance(robot, Robot):
            raise TypeError(f"LeRobotAdapter needs a lerobot RobotConfig or Robot, got {type(robot).__name__}")
        self.robot = robot
        self.robot_type = robot.name
        obs_ft = robot.observation_features
        act_ft = robot.action_features
        self.state_names = [k for k, v in obs_ft.items() if v is float]
        self.cameras = {k: (int(v[0]), int(v[1])) for k, v in obs_ft.items() if isinstance(v, tuple) and len(v) == 3}
        self.joint_names = [k for k, v in act_ft.items() if v is float]
        missing = [k for k in self.joint_names if k not in self.state_names]
        if missing:
            raise ValueError(
                f"robot {robot.name!r}: action(s) {missing} are not measured joint positions in its observation "
                f"({self.state_names}); the safety envelope needs joint-position actions"
            )
        self._pos_index = [self.state_names.index(k) for k in self.joint_names]

    @property
    def is_connected(self) -> bool:
        """True while LeRobot reports the robot connected."""
        return bool(self.robot.is_connected)

    def connect(self) -> None:
        """Connect (LeRobot may run its interactive calibration the first time).

        Raises:
            ConnectionError: naming the robot type when LeRobot cannot open it.
        """
        if self.robot.is_connected:
            return
        try:
            self.robot.connect()
        except Exception as e:
            raise ConnectionError(f"cannot connect LeRobot robot {self.robot.name!r} ({self.robot}): {e}") from e

    def observe(self) -> RobotObservation:
        """Read joints and cameras (blocking, as LeRobot robots do)."""
        if not self.robot.is_connected:
            raise ConnectionError(f"robot {self.robot.name!r} is not connected")
        raw = self.robot.get_observation()
        now = time.monotonic()
        state = np.array([float(raw[k]) for k in self.state_names], dtype=np.float64)
        images = {cam: np.asarray(raw[cam], dtype=np.uint8) for cam in self.cameras}
        return RobotObservation(
            state=state,
            position=state[self._pos_index].copy(),
            images=images,
            state_stamp=now,
            image_stamps=dict.fromkeys(images, now),
        )

    def send_chunk(self, targets: np.ndarray, dt: float) -> None:
        """Send point 0 of ``targets [n, A]`` as a LeRobot action dict."""
        point = np.asarray(targets, dtype=np.float64).reshape(-1, self.num_joints)[0]
        self.robot.send_action({k: float(v) for k, v in zip(self.joint_names, point, strict=True)})

    def disconnect(self) -> None:
        """Disconnect (LeRobot disables torque if the robot config says so)."""
        try:
            if self.robot.is_connected:
                self.robot.disconnect()
        except Exception as e:  # noqa: BLE001  (the robot may already be gone: cable pulled)
            log.warning("disconnecting %s failed: %s", self.robot.name, e)

    def default_limits(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Limits if the robot object exposes ``joint_limits`` (name -> (lo, hi)); LeRobot's arms do not."""
        limits = getattr(self.robot, "joint_limits", None)
        if not limits:
            return None
        lo = np.array([limits[k][0] for k in self.joint_names], dtype=np.float64)
        hi = np.array([limits[k][1] for k in self.joint_names], dtype=np.float64)
        return lo, hi
