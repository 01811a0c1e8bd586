"""Fixtures for the hardware tests: private ROS domains.

ROS traffic stays on loopback (``ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST``) and
every simulated arm gets its own ``ROS_DOMAIN_ID`` (an flock-ed id in 30..99,
see :mod:`tests.hardware.domains`), so tests and concurrent test runs on one
machine never hear each other.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hardware.domains import DomainPool

os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
os.environ.setdefault("ROS_LOG_DIR", str(Path(tempfile.gettempdir()) / "vla-rl-test-roslog"))
os.environ.setdefault("RMW_IMPLEMENTATION", "rmw_fastrtps_cpp")
os.environ.setdefault("LP_NUM_THREADS", "1")


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
