"""Operator inputs: keyboard events, e-stop keys, and teleoperation takeover (interventions).

While *takeover* is on, the runner executes the teleoperator's target instead
of the policy's (still through the safety envelope) and records the step
with LeRobot's ``intervention = True`` and a RaC label (``recovery`` from the
takeover until the operator marks the correction, ``correction`` after;
:mod:`vla_core.labels`); with no teleop target available it holds position. This is the hook the RaC intervention pipeline builds on: a
:class:`TeleopSource` provides the human's action, :class:`OperatorEvents`
says when the human is in control.

Keys (single characters, no Enter needed on a terminal):
``e`` or space: e-stop (latched); ``c``: clear the e-stop; ``t``: toggle
takeover; ``m``: mark the switch from recovery to correction; ``h``: hand
back to the policy; ``s`` / ``f``: end the episode as success / failure;
``n``: end the episode; ``r``: end and re-record it; ``q``: end the run.
"""

from __future__ import annotations

import logging
import os
import select
import sys
import threading
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from hardware.watchdog import EStop
from vla_core.labels import Label

log = logging.getLogger(__name__)


class OperatorEvents:
    """Thread-safe operator flags set by keys (or programmatically, e.g. by a GUI or a test)."""

    def __init__(self, estop: EStop, estop_key: str = "e", clear_key: str = "c") -> None:
        self.estop = estop
        self.estop_keys = {estop_key, " "}
        self.clear_key = clear_key
        self._lock = threading.Lock()
        self.takeover = False
        self.correcting = False
        self.end_episode = False
        self.success: bool | None = None
        self.rerecord = False
        self.quit = False

    def handle_key(self, key: str) -> None:
        """Apply one key press (see the module docstring for the map)."""
        if key in self.estop_keys:
            self.estop.fire(f"key {key!r}")
            return
        with self._lock:
            if key == self.clear_key:
                self.estop.clear(f"key {key!r}")
            elif key in ("t", "h"):
                self.takeover = not self.takeover if key == "t" else False
                self.correcting = False
                log.warning("takeover %s", "ON: teleoperator in control" if self.takeover else "off: policy in control")
            elif key == "m" and self.takeover:
                self.correcting = True
                log.warning("takeover: correction (recovery done)")
            elif key in ("s", "f", "n"):
                self.end_episode = True
                self.success = {"s": True, "f": False, "n": None}[key]
            elif key == "r":
                self.end_episode, self.rerecord = True, True
            elif key == "q":
                self.end_episode, self.quit = True, True

    def label(self) -> Label:
        """The RaC label of a step taken now: ``policy``, ``recovery`` (takeover) or ``correction`` (marked)."""
        with self._lock:
            if not self.takeover:
                return Label.POLICY
            return Label.CORRECTION if self.correcting else Label.RECOVERY

    def new_episode(self) -> None:
        """Reset the per-episode flags (takeover stays as the operator left it)."""
        with self._lock:
            self.end_episode, self.success, self.rerecord = False, None, False


class KeyboardListener:
    """Feeds key presses from a file descriptor (the terminal by default) to :class:`OperatorEvents`.

    On a TTY the terminal is put in cbreak mode (keys arrive without Enter)
    and restored on :meth:`close`. Without a TTY and without an explicit
    ``fd`` it does nothing (headless runs use the e-stop topic instead).
    """

    def __init__(self, events: OperatorEvents, fd: int | None = None) -> None:
        self.events = events
        self._fd = fd
        self._old_attrs: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> bool:
        """Start listening; returns False when there is nothing to listen to."""
        fd = self._fd
        if fd is None:
            if not sys.stdin.isatty():
                log.info("keyboard: stdin is not a terminal; keys disabled")
                return False
            fd = sys.stdin.fileno()
            import termios
            import tty

            self._old_attrs = termios.tcgetattr(fd)
            tty.setcbreak(fd)
        self._fd = fd
        self._thread = threading.Thread(target=self._loop, name="keyboard", daemon=True)
        self._thread.start()
        return True

    def _loop(self) -> None:
        assert self._fd is not None
        while not self._stop.is_set():
            ready, _, _ = select.select([self._fd], [], [], 0.05)
            if not ready:
                continue
            data = os.read(self._fd, 64)
            if not data:
                return
            for ch in data.decode(errors="ignore"):
                self.events.handle_key(ch)

    def close(self) -> None:
        """Stop listening and restore the terminal."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        if self._old_attrs is not None and self._fd is not None:
            import termios

            termios.tcsetattr(self._fd, termios.TCSADRAIN, self._old_attrs)
            self._old_attrs = None


class TeleopSource(Protocol):
    """Where the human's joint targets come from during a takeover."""

    def action(self) -> np.ndarray | None:
        """The newest target ``[A]`` in command order, or None if none is available."""

    def close(self) -> None:
        """Release the device."""


class LeRobotTeleop:
    """A LeRobot ``Teleoperator`` (SO-101 leader arm, Koch leader, ...) as a :class:`TeleopSource`.

    Args:
        config: a ``lerobot.teleoperators.TeleoperatorConfig``.
        joint_names: the robot's action keys; the teleoperator's action must
            provide each of them (leader arms use the same ``<joint>.pos`` keys).

    Raises:
        ValueError: naming the keys the teleoperator does not provide.
    """

    def __init__(self, config: Any, joint_names: Sequence[str]) -> None:
        from lerobot.teleoperators import make_teleoperator_from_config

        self.teleop = make_teleoperator_from_config(config)
        self.joint_names = list(joint_names)
        missing = [k for k in self.joint_names if k not in self.teleop.action_features]
        if missing:
            raise ValueError(
                f"teleop {config.type!r} does not provide action key(s) {missing}; it provides "
                f"{list(self.teleop.action_features)}"
            )
        self.teleop.connect()

    def action(self) -> np.ndarray | None:
        """Read the teleoperator (None if it fails this tick)."""
        try:
            raw = self.teleop.get_action()
        except Exception as e:  # noqa: BLE001  (a dropped USB packet must not kill the run)
            log.warning("teleop read failed: %s", e)
            return None
        return np.array([float(raw[k]) for k in self.joint_names], dtype=np.float64)

    def close(self) -> None:
        """Disconnect the device."""
        try:
            self.teleop.disconnect()
        except Exception as e:  # noqa: BLE001  (best-effort release of the device)
            log.warning("teleop disconnect failed: %s", e)


class ScriptedTeleop:
    """A :class:`TeleopSource` fed programmatically (tests, GUIs, a remote operator over another channel)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._target: np.ndarray | None = None

    def set(self, target: np.ndarray | None) -> None:
        """Set (or clear with None) the current target ``[A]``."""
        with self._lock:
            self._target = None if target is None else np.asarray(target, dtype=np.float64).copy()

    def action(self) -> np.ndarray | None:
        """The target last set."""
        with self._lock:
            return None if self._target is None else self._target.copy()

    def close(self) -> None:
        """Nothing to release."""
