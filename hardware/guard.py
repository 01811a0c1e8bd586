"""The only path from a policy to an arm: adapter + safety envelope (+ dry run)."""

from __future__ import annotations

import logging
import time

import numpy as np

from hardware.adapter import RobotAdapter
from hardware.safety import FilterResult, SafetyEnvelope
from hardware.watchdog import EStop

log = logging.getLogger(__name__)


class GuardedRobot:
    """Wraps an adapter so that every command passes the envelope first.

    Args:
        adapter: the transport.
        envelope: the safety envelope for this robot.
        dt: control period in seconds (spacing of chunk points).
        dry_run: filter and count commands but never hand them to the adapter.
        estop: the e-stop latch. Once it has fired, :meth:`command` sends the hold
            instead of the targets, and a command already being sent finishes before
            the latch takes effect, so no command goes out after the e-stop but holds.
    """

    def __init__(
        self,
        adapter: RobotAdapter,
        envelope: SafetyEnvelope,
        dt: float,
        dry_run: bool = False,
        estop: EStop | None = None,
    ) -> None:
        self._adapter = adapter
        self._estop = estop
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
        """Filter ``targets [n, A]`` through the envelope (``measured [A]``: newest joint positions) and send what passes.

        With the e-stop latched, nothing is filtered and the hold is sent instead (``held`` is True).
        """

        def filter_and_send() -> FilterResult:
            result = self.envelope.filter(targets, step, measured)
            self._send(result.targets, hold=result.held)
            return result

        if self._estop is None:
            return filter_and_send()
        result = self._estop.unless_set(filter_and_send)
        if result is None:  # latched since the caller last looked: the arm gets the hold, never these targets
            return FilterResult(self.hold(), modified=True, held=True, stopped=self.envelope.stopped, violations=[])
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
