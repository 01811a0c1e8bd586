"""Private ROS domain ids for the hardware tests, reserved machine-wide with ``flock``.

A reserved id stays reserved while any process holding its lock lives: the
simulated arm subprocess inherits its domain's lock (:func:`lock_fd`), so an
arm that outlives a crashed test session keeps its domain out of the next
session's hands instead of answering that session's runner.
"""

from __future__ import annotations

import fcntl
import tempfile
from pathlib import Path
from typing import IO

import pytest

_HELD: dict[int, IO[str]] = {}  # domain -> open lock file, for every pool of this process


def lock_fd(domain: int) -> int | None:
    """File descriptor of this process's lock on ``domain`` (to pass to a child), or None if not held here."""
    handle = _HELD.get(domain)
    return None if handle is None else handle.fileno()


class DomainPool:
    """Hands out ROS domain ids that no other process on this machine holds (flock-ed until closed)."""

    def __init__(self, first: int = 30, last: int = 99) -> None:
        self.folder = Path(tempfile.gettempdir()) / "vla-rl-ros-domains"
        self.folder.mkdir(exist_ok=True)
        self.first, self.last = first, last
        self._held: list[int] = []

    def take(self) -> int:
        """A fresh domain id for this session."""
        for domain in range(self.first, self.last + 1):
            if domain in _HELD:
                continue
            handle = open(self.folder / f"{domain}.lock", "w")  # noqa: SIM115
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                handle.close()
                continue
            _HELD[domain] = handle
            self._held.append(domain)
            return domain
        pytest.skip(f"no free ROS domain id in {self.first}..{self.last} (too many concurrent test runs)")

    def close(self) -> None:
        """Release every id (its arms have been stopped by then)."""
        for domain in self._held:
            handle = _HELD.pop(domain)
            fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()
        self._held.clear()
