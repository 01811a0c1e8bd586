"""Fixtures for the hardware tests: private ROS domains.

ROS traffic stays on loopback (``ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST``) and
every simulated arm gets its own ``ROS_DOMAIN_ID`` (an flock-ed id in 30..99),
so tests and concurrent test runs on one machine never hear each other.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
os.environ.setdefault("ROS_LOG_DIR", str(Path(tempfile.gettempdir()) / "vla-rl-test-roslog"))
os.environ.setdefault("RMW_IMPLEMENTATION", "rmw_fastrtps_cpp")
os.environ.setdefault("LP_NUM_THREADS", "1")


class DomainPool:
    """Hands out ROS domain ids that no other process on this machine holds (flock-ed until closed)."""

    def __init__(self, first: int = 30, last: int = 99) -> None:
        self.folder = Path(tempfile.gettempdir()) / "vla-rl-ros-domains"
        self.folder.mkdir(exist_ok=True)
        self.first, self.last = first, last
        self._held: list = []

    def take(self) -> int:
        """A fresh domain id for this session."""
        for domain in range(self.first, self.last + 1):
            handle = open(self.folder / f"{domain}.lock", "w")  # noqa: SIM115
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                handle.close()
                continue
            self._held.append(handle)
            return domain
        pytest.skip(f"no free ROS domain id in {self.first}..{self.last} (too many concurrent test runs)")

    def close(self) -> None:
        """Release every id."""
        for handle in self._held:
            fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()
        self._held.clear()


@pytest.fixture(scope="session")
def domain_pool() -> Iterator[DomainPool]:
    """The session's source of private ROS domain ids."""
    pool = DomainPool()
    yield pool
    pool.close()


@pytest.fixture
def ros_domain(domain_pool: DomainPool) -> int:
    """A private ROS domain for one test (each simulated arm gets its own, so arms never hear each other)."""
    domain = domain_pool.take()
    os.environ["ROS_DOMAIN_ID"] = str(domain)
    return domain
