"""Time-based safety: the watchdog (stale observations, late policy) and the latched e-stop."""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class EStop:
    """A latched emergency stop, safe to fire from any thread (key listener, ROS callback).

    Once fired it stays set until :meth:`clear`; firing again while set only
    records the event. Senders put their sends inside :meth:`unless_set`, which
    makes "nothing sent after the e-stop" exact rather than a polling race.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._set = False
        self._reason = ""
        self._fired_at: float | None = None  # wall clock (time.time()), comparable with ROS message stamps
        self.events: list[tuple[float, str]] = []

    def fire(self, reason: str) -> None:
        """Latch the e-stop; ``reason`` names the source (``key 'e'``, ``topic /estop``...)."""
        with self._lock:
            now = time.monotonic()
            self.events.append((now, f"fire: {reason}"))
            if not self._set:
                self._set, self._reason, self._fired_at = True, reason, time.time()
                log.error("E-STOP fired: %s", reason)

    def clear(self, reason: str = "cleared") -> None:
        """Release the latch (an operator decision)."""
        with self._lock:
            self.events.append((time.monotonic(), f"clear: {reason}"))
            if self._set:
                log.warning("e-stop cleared: %s", reason)
            self._set, self._reason, self._fired_at = False, "", None

    def unless_set(self, fn: Callable[[], T]) -> T | None:
        """Run ``fn`` unless latched, and return its result (None, without running it, when latched).

        ``fn`` runs under the latch's lock, so a :meth:`fire` from another thread waits until
        ``fn`` returns: whatever ``fn`` sends went out before the moment the e-stop latched.
        Keep ``fn`` short (one transport send).
        """
        with self._lock:
            return None if self._set else fn()

    @property
    def fired_at(self) -> float | None:
        """Wall-clock time (``time.time()``) at which the current latch fired; None when clear."""
        with self._lock:
            return self._fired_at

    @property
    def is_set(self) -> bool:
        """True while latched."""
        with self._lock:
            return self._set

    @property
    def reason(self) -> str:
        """What fired it (empty when clear)."""
        with self._lock:
            return self._reason


class WatchState(str, enum.Enum):
    """The watchdog's verdict for one control tick."""

    OK = "ok"
    HOLD = "hold"
    STOP = "stop"


@dataclass
class WatchVerdict:
    """``state`` plus the fault that caused it (empty when OK)."""

    state: WatchState
    fault: str = ""
    detail: str = ""


class Watchdog:
    """Holds position while a fault lasts, and stops once it lasted ``hold_s``.

    Faults: the joint observation is older than ``obs_timeout_s``, a camera
    frame is older than ``camera_timeout_s``, or a policy call has run longer
    than ``policy_timeout_s``. A fault that clears before ``hold_s`` returns
    the loop to OK; a STOP verdict is final for the run (the caller latches it).
    """

    def __init__(self, obs_timeout_s: float, camera_timeout_s: float, policy_timeout_s: float, hold_s: float) -> None:
        self.obs_timeout_s = obs_timeout_s
        self.camera_timeout_s = camera_timeout_s
        self.policy_timeout_s = policy_timeout_s
        self.hold_s = hold_s
        self._fault_since: float | None = None

    def reset(self) -> None:
        """Forget an ongoing fault (start of an episode)."""
        self._fault_since = None

    def check(self, now: float, state_age: float, camera_age: float, policy_busy_s: float) -> WatchVerdict:
        """Verdict at time ``now`` (monotonic seconds).

        Args:
            now: current monotonic time.
            state_age: seconds since the newest joint state arrived.
            camera_age: seconds since the oldest camera's newest frame (0 without cameras).
            policy_busy_s: seconds the running policy call has taken (0 if idle).
        """
        fault, detail = "", ""
        if state_age > self.obs_timeout_s:
            fault, detail = "stale_observation", f"joint state is {state_age:.3f} s old (> {self.obs_timeout_s} s)"
        elif camera_age > self.camera_timeout_s:
            fault, detail = "stale_observation", f"camera frame is {camera_age:.3f} s old (> {self.camera_timeout_s} s)"
        elif policy_busy_s > self.policy_timeout_s:
            fault, detail = (
                "policy_deadline",
                f"policy call running for {policy_busy_s:.3f} s (> {self.policy_timeout_s} s)",
            )
        if not fault:
            if self._fault_since is not None:
                log.warning("watchdog: fault cleared after %.3f s", now - self._fault_since)
            self._fault_since = None
            return WatchVerdict(WatchState.OK)
        if self._fault_since is None:
            self._fault_since = now
            log.warning("watchdog: %s (%s): holding position", fault, detail)
        if now - self._fault_since >= self.hold_s:
            return WatchVerdict(WatchState.STOP, fault, f"{detail}; held {now - self._fault_since:.3f} s")
        return WatchVerdict(WatchState.HOLD, fault, detail)
