"""The only path from a policy to an arm: adapter + safety envelope (+ dry run)."""

from __future__ import annotations

import logging
import time

import numpy as np

from hardware.adapter import RobotAdapter
from hardware.safety import FilterResult, SafetyEnvelope

log = logging.getLogger(__name__)


class GuardedRobot:
    """Wraps an adapter so that every command passes the envelope first.

    Args:
        adapter: the transport.
        envelope: the safety envelope for this robot.
        dt: control period in seconds (spacing of chunk points).
        dry_run: filter and count commands but never hand them to the adapter.
    """

    def __init__(self, adapter: RobotAdapter, envelope: SafetyEnvelope, dt: float, dry_run: bool = False) -> None:
        self._adapter = adapter
        self.envelope = envelope
        self.dt = dt
        self.dry_run = dry_run
        self.commands_sent = 0
        self.holds_sent = 0
        self.last_send_s = 0.0

    def start(self, position: np.ndarray) -> None:
        """Reference the envelope to the measured ``position`` (start of an episode / after an e-stop).

        Raises:
            ValueError: if the pose is outside the envelope (see :meth:`SafetyEnvelope.reset`).
        """
        self.envelope.reset(position)

    def command(self, targets: np.ndarray, step: int, measured: np.ndarray | None = None) -> FilterResult:
        """Filter ``targets [n, A]`` through the envelope (``measured [A]``: newest joint positions) and send what passes."""
        result = self.envelope.filter(targets, step, measured)
        self._send(result.targets, hold=result.held)
        return result

    def hold(self) -> np.ndarray:
        """Send the hold command (last accepted target) and return it ``[1, A]``."""
        target = self.envelope.hold()
        self._send(target, hold=True)
        return target

    def _send(self, targets: np.ndarray, hold: bool) -> None:
        if hold:
            self.holds_sent += 1
        else:
            self.commands_sent += 1
        if self.dry_run:
            return
        t0 = time.perf_counter()
        self._adapter.send_chunk(targets, self.dt)
        self.last_send_s = time.perf_counter() - t0
