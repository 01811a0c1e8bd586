"""Human takeover in ``vla-rl intervene``: session keys, LeRobot teleoperators as action sources, a camera view.

Keys (single characters; from the terminal, the camera window, or a test):

- ``t``: take over (the operator is in control; steps are ``recovery``);
- ``m``: mark the switch from recovery to correction (steps are ``correction``);
- ``h``: hand back to the policy;
- ``s`` / ``f``: end the episode as success / failure; ``n``: end it (the env's verdict);
- ``q``: end the episode and the session.

The operator's motion comes from a LeRobot end-effector teleoperator
(``keyboard_ee``: arrow keys, shift, ctrl; ``gamepad``: sticks and buttons),
whose action ``{delta_x, delta_y, delta_z, gripper}`` (gripper 0 close,
1 stay, 2 open: LeRobot's ``GripperAction``) becomes the tabletop's
``[dx, dy, dz, grip]`` (grip +1 closed, -1 open, held between presses).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from vla_core.labels import Label


class SessionKeys:
    """Thread-safe session state set by keys (module doc); read once per control step."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.in_control = False
        self.correcting = False
        self.end_episode = False
        self.success: bool | None = None
        self.quit = False

    def handle_key(self, key: str) -> None:
        """Apply one key press."""
        with self._lock:
            if key == "t":
                self.in_control, self.correcting = True, False
            elif key == "m" and self.in_control:
                self.correcting = True
            elif key == "h":
                self.in_control, self.correcting = False, False
            elif key in ("s", "f", "n"):
                self.end_episode, self.success = True, {"s": True, "f": False, "n": None}[key]
            elif key == "q":
                self.end_episode, self.quit = True, True

    def label(self) -> Label:
        """The label of a step taken now."""
        with self._lock:
            if not self.in_control:
                return Label.POLICY
            return Label.CORRECTION if self.correcting else Label.RECOVERY

    def take_episode_end(self) -> tuple[bool, bool | None]:
        """``(ended, success verdict)``; clears the end flag and hands control back for the next episode."""
        with self._lock:
            ended, verdict = self.end_episode, self.success
            if ended:
                self.end_episode, self.success, self.in_control, self.correcting = False, None, False, False
            return ended, verdict


class ActionSource(Protocol):
    """Where the operator's action ``[A]`` comes from (None: nothing this tick; the arm holds still)."""

    def action(self) -> np.ndarray | None: ...

    def close(self) -> None: ...


class LeRobotEETeleop:
    """A LeRobot end-effector teleoperator (``keyboard_ee``, ``gamepad``) as an :class:`ActionSource`.

    Args:
        teleop: a connected LeRobot ``Teleoperator`` whose action has ``delta_x``, ``delta_y``, ``delta_z``
            (and ``gripper``), or its ``TeleoperatorConfig`` (then it is built and connected here).
        scale: multiplies the deltas (LeRobot's keyboard gives -1, 0, 1; our action box is [-1, 1]).

    Raises:
        ValueError: naming the keys the teleoperator's action lacks.
        RuntimeError: when a teleoperator built from its config does not connect (LeRobot's keyboard needs
            ``pynput`` and an X display; a gamepad must be plugged in).
    """

    KEYS = ("delta_x", "delta_y", "delta_z")

    def __init__(self, teleop: Any, scale: float = 1.0) -> None:
        if not hasattr(teleop, "get_action"):
            from lerobot.teleoperators import make_teleoperator_from_config

            kind = getattr(teleop, "type", "teleoperator")
            teleop = make_teleoperator_from_config(teleop)
            try:
                teleop.connect()
            except Exception as exc:  # noqa: BLE001  (device / display errors of any kind: one line)
                raise RuntimeError(f"LeRobot {kind} teleoperator failed to connect: {exc}") from None
            if not getattr(teleop, "is_connected", True):
                raise RuntimeError(f"LeRobot {kind} teleoperator did not connect (the keyboard needs pynput and an "
                                   "X display, a gamepad must be plugged in); use --operator sim or another device")
        self.teleop = teleop
        self.scale = scale
        self.grip = -1.0

    def action(self) -> np.ndarray | None:
        raw = self.teleop.get_action()
        missing = [k for k in self.KEYS if k not in raw]
        if missing:
            raise ValueError(f"teleoperator action lacks {missing}; it has {sorted(raw)} (use keyboard_ee or gamepad)")
        g = raw.get("gripper", 1)
        if int(round(float(g))) == 0:
            self.grip = 1.0
        elif int(round(float(g))) == 2:
            self.grip = -1.0
        delta = np.clip(np.array([float(raw[k]) for k in self.KEYS]) * self.scale, -1.0, 1.0)
        return np.array([*delta, self.grip], dtype=np.float32)

    def close(self) -> None:
        disconnect = getattr(self.teleop, "disconnect", None)
        if disconnect is not None and getattr(self.teleop, "is_connected", True):
            disconnect()


class ScriptedKeys:
    """Key events at given session steps (tests, demos): ``ScriptedKeys({5: "t", 9: "c", 14: "h"})``."""

    def __init__(self, events: dict[int, str | Iterable[str]]) -> None:
        self.events = {int(k): ([v] if isinstance(v, str) else list(v)) for k, v in events.items()}

    def feed(self, step: int, keys: SessionKeys) -> None:
        """Press the keys scheduled for ``step``."""
        for key in self.events.get(step, []):
            keys.handle_key(key)


@dataclass
class CameraView:
    """Shows the operator the env's camera: ``window`` (an OpenCV window, whose key presses also reach the
    session), ``file`` (the latest frame written to ``path`` as PNG, for a remote viewer) or ``none``."""

    mode: str = "none"
    path: str = ""
    scale: int = 4

    def __post_init__(self) -> None:
        if self.mode not in ("none", "window", "file"):
            raise ValueError(f"view must be none, window or file, got {self.mode!r}")
        if self.mode == "file" and not self.path:
            raise ValueError("view=file needs a path for the frame")

    def show(self, image: np.ndarray, caption: str, keys: SessionKeys | None) -> None:
        """Display ``image`` (uint8 ``[H, W, 3]``) with ``caption``; in a window, pass its key presses to ``keys``."""
        if self.mode == "none":
            return
        import cv2

        big = cv2.resize(image[..., ::-1], None, fx=self.scale, fy=self.scale, interpolation=cv2.INTER_NEAREST)
        cv2.putText(big, caption, (4, 14), cv2.FONT_HERSHEY_SIMPLEX, 0.45, (255, 255, 255), 1)
        if self.mode == "file":
            out = Path(self.path)
            tmp = out.with_name(out.name + ".tmp.png")
            cv2.imwrite(str(tmp), big)
            tmp.replace(out)
            return
        cv2.imshow("vla-rl intervene", big)
        code = cv2.waitKey(1)
        if code >= 0 and keys is not None:
            keys.handle_key(chr(code & 0xFF))

    def close(self) -> None:
        if self.mode == "window":
            import cv2

            cv2.destroyAllWindows()
