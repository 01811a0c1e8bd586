"""RosNode shutdown and test-session hygiene.

rclpy must not destroy a node or context while the executor thread is inside
them (a segfault, seen in the fault tests), so :meth:`RosNode.close` stops and
joins the spin thread first. And a simulated arm must not outlive the test
session that started it: left running on its ROS domain, it would answer the
next session's runner in place of that session's own arm.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.hardware.domains import DomainPool
from tests.hardware.rosutil import REPO, requires_ros

pytestmark = requires_ros


def _node(domain: int, name: str = "runtime_test"):
    from hardware.ros2.runtime import RosNode

    return RosNode(name, "", domain)


def test_close_stops_the_spin_thread_then_releases_everything(ros_domain):
    ros = _node(ros_domain)
    ticks = []
    ros.node.create_timer(0.01, lambda: ticks.append(time.monotonic()))
    time.sleep(0.2)
    assert ticks, "the executor thread is not spinning"
    t0 = time.monotonic()
    ros.close()
    assert time.monotonic() - t0 < 2.0
    assert not ros._thread.is_alive()
    assert not ros.context.ok()
    n = len(ticks)
    time.sleep(0.1)
    assert len(ticks) == n, "a callback ran after close()"
    ros.close()  # idempotent


def test_close_of_an_idle_node_wakes_the_executor(ros_domain):
    ros = _node(ros_domain)  # nothing to wait for: only the wake guard condition ends the executor's wait
    time.sleep(0.1)
    t0 = time.monotonic()
    ros.close()
    assert time.monotonic() - t0 < 1.0 and not ros._thread.is_alive() and not ros.context.ok()


def test_close_waits_for_a_running_callback(ros_domain):
    ros = _node(ros_domain)
    entered, release = threading.Event(), threading.Event()
    seen_ok: list[bool] = []

    def slow() -> None:
        if not entered.is_set():
            entered.set()
            release.wait(5)
            seen_ok.append(ros.context.ok())

    ros.node.create_timer(0.01, slow)
    assert entered.wait(5)
    closer = threading.Thread(target=ros.close)
    closer.start()
    time.sleep(0.3)
    assert closer.is_alive() and ros.context.ok(), "close() released the node under a running callback"
    release.set()
    closer.join(5)
    assert not closer.is_alive() and seen_ok == [True]
    assert not ros._thread.is_alive() and not ros.context.ok()


def test_close_from_a_callback(ros_domain):
    ros = _node(ros_domain)
    done = threading.Event()

    def close_me() -> None:
        ros.close()
        done.set()

    ros.node.create_timer(0.02, close_me)
    assert done.wait(5)
    ros._thread.join(5)
    assert not ros._thread.is_alive() and not ros.context.ok()


def test_a_stuck_callback_leaves_the_release_to_the_spin_thread(ros_domain, caplog):
    ros = _node(ros_domain)
    ros.STOP_TIMEOUT_S = 0.3
    entered, release = threading.Event(), threading.Event()

    def stuck() -> None:
        entered.set()
        release.wait(10)

    ros.node.create_timer(0.01, stuck)
    assert entered.wait(5)
    ros.close()  # returns after STOP_TIMEOUT_S without destroying anything
    assert ros.context.ok() and "still running" in caplog.text
    release.set()
    ros._thread.join(5)
    assert not ros._thread.is_alive() and not ros.context.ok()


ORPHAN_MAKER = """
import os, signal, sys
from pathlib import Path
from tests.hardware.domains import DomainPool
from tests.hardware.rosutil import start_sim_arm
domain = DomainPool().take()
sim = start_sim_arm(Path(sys.argv[1]), domain)
os.kill(sim.proc.pid, signal.SIGSTOP)  # frozen: cannot notice its parent's death yet
print(domain, sim.proc.pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # the session dies without any teardown (a segfault)
"""


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
def test_sim_arm_does_not_outlive_its_session(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run(  # ends killed by its own SIGKILL
        [sys.executable, "-c", ORPHAN_MAKER, str(tmp_path / "arm")],
        check=False,
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert len(out.stdout.split()) == 2, f"the session stand-in failed: {out.stderr[-2000:]}"
    domain, pid = (int(x) for x in out.stdout.split())
    try:
        assert _running(pid)
        pool = DomainPool()  # the orphan still holds its domain: nobody else gets it
        try:
            taken = [pool.take() for _ in range(3)]
        finally:
            pool.close()
        assert domain not in taken
        os.kill(pid, signal.SIGCONT)  # thawed, it sees its parent is gone and exits
        deadline = time.monotonic() + 10
        while _running(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(pid), "the simulated arm outlived the session that started it"
        assert "parent process" in (tmp_path / "arm" / "node.err").read_text()
    finally:
        if _running(pid):
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads this process's mappings from /proc")
def test_test_participants_use_no_shared_memory(ros_domain):
    """The tests' Fast DDS profile (tests/hardware/conftest.py) keeps the shared-memory transport off.

    A SIGKILL-ed arm leaves its shared-memory state behind, and the test process crashed tearing down
    next to it; over UDP a dead peer leaves nothing that the survivors map.
    """
    ros = _node(ros_domain)
    try:
        shm = {line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines() if "/dev/shm/fast" in line}
    finally:
        ros.close()
    assert not shm, f"a ROS participant of the tests mapped Fast DDS shared memory: {sorted(shm)}"
