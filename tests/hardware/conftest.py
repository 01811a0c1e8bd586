"""Fixtures for the hardware tests: private ROS domains, loopback UDP without shared memory.

ROS traffic stays on loopback and every simulated arm gets its own
``ROS_DOMAIN_ID`` (an flock-ed id in 30..99, see :mod:`tests.hardware.domains`),
so tests and concurrent test runs on one machine never hear each other.

Fast DDS runs without its shared-memory transport here: the fault
tests SIGKILL a simulated arm, which leaves its shared-memory state behind, and
the test process crashed tearing down next to it. ``ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST``
makes rmw_fastrtps add shared memory whatever the XML profile or
``FASTDDS_BUILTIN_TRANSPORTS`` say, so the tests use ``SYSTEM_DEFAULT`` (rmw_fastrtps
then keeps the profile's transports) with ``fastdds_udp_loopback.xml``: UDPv4 on
127.0.0.1 only, discovery by unicast to 127.0.0.1, which is what LOCALHOST did.
Set here, before any participant exists; the arm subprocesses inherit it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hardware.domains import DomainPool

FASTDDS_PROFILE = Path(__file__).with_name("fastdds_udp_loopback.xml")
os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "SYSTEM_DEFAULT"  # not LOCALHOST: that one adds shared memory back
os.environ["FASTDDS_DEFAULT_PROFILES_FILE"] = str(FASTDDS_PROFILE)
os.environ.pop("FASTRTPS_DEFAULT_PROFILES_FILE", None)  # the older name: no second profile file beside ours
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
