"""Chunk scheduling (execute / blend), the policy worker, and the loop timer."""

from __future__ import annotations

import itertools
import threading
import time

import numpy as np
import pytest

from hardware.scheduling import ChunkConfig, ChunkMode, ChunkScheduler, PolicyWorker
from hardware.timing import LatencySummary, LoopTimer


def ramp(start: float, n: int = 4) -> np.ndarray:
    """[n, 1] chunk start, start+1, ..."""
    return (start + np.arange(n, dtype=np.float64))[:, None]


def test_execute_runs_a_chunk_then_the_newest_wins():
    s = ChunkScheduler(ChunkMode.EXECUTE)
    assert s.action(0) is None and s.covered_until() == -1
    s.add(ramp(0.0), start_step=0)
    assert [s.action(k)[0] for k in range(2)] == [0.0, 1.0]
    s.add(ramp(100.0), start_step=1)  # obs of step 1; arrived at step 2
    assert s.action(2)[0] == 101.0  # its action for step 1 is in the past: skipped
    assert s.action(4)[0] == 103.0
    assert s.covered_until() == 5
    assert s.action(5) is None and s.covered_until() == -1  # ended chunks are forgotten


def test_blend_weights_overlapping_chunks():
    s = ChunkScheduler(ChunkMode.BLEND, blend_decay=0.0)
    s.add(np.zeros((4, 2)), 0)
    s.add(np.ones((4, 2)) * 3.0, 2)
    np.testing.assert_allclose(s.action(1), [0.0, 0.0])
    np.testing.assert_allclose(s.action(2), [1.5, 1.5])  # uniform average of two chunks
    d = 1.0
    s = ChunkScheduler(ChunkMode.BLEND, blend_decay=d)
    s.add(np.zeros((4, 1)), 0)
    s.add(np.ones((4, 1)), 2)
    w_old, w_new = np.exp(-d * 2), np.exp(-d * 0)  # step 2 is 2 steps into the old chunk, 0 into the new
    assert s.action(2)[0] == pytest.approx(w_new / (w_old + w_new))


def test_lookahead_stops_at_the_first_gap():
    s = ChunkScheduler()
    s.add(ramp(0.0, 3), 0)
    np.testing.assert_allclose(s.lookahead(1, 5)[:, 0], [1.0, 2.0])
    assert s.lookahead(3, 5) is None


def test_scheduler_rejects_bad_chunks():
    s = ChunkScheduler()
    with pytest.raises(ValueError, match=r"\[H, A\]"):
        s.add(np.zeros(3), 0)
    s.add(np.zeros((2, 3)), 0)
    with pytest.raises(ValueError, match="action dim changed from 3 to 2"):
        s.add(np.zeros((2, 2)), 0)


def test_chunk_config_validates_with_field_names():
    assert ChunkConfig(mode="blend").mode is ChunkMode.BLEND
    with pytest.raises(ValueError, match="chunk.mode"):
        ChunkConfig(mode="interleave")
    with pytest.raises(ValueError, match="chunk.command_horizon"):
        ChunkConfig(command_horizon=0)


def test_threaded_worker_reports_busy_time_and_results():
    gate = threading.Event()

    def infer(obs: dict) -> np.ndarray:
        gate.wait(5)
        return np.full((2, 1), obs["x"])

    w = PolicyWorker(infer, threaded=True)
    w.submit({"x": 7.0}, start_step=3, tag=9)
    time.sleep(0.05)
    assert not w.idle and w.busy_s(time.monotonic()) >= 0.04
    with pytest.raises(RuntimeError, match="while a call is running"):
        w.submit({"x": 1.0}, 4)
    gate.set()
    deadline = time.monotonic() + 5
    done = []
    while not done and time.monotonic() < deadline:
        done = w.poll()
        time.sleep(0.01)
    assert done[0].start_step == 3 and done[0].tag == 9 and done[0].actions[0, 0] == 7.0
    assert w.idle and w.busy_s(time.monotonic()) == 0.0
    w.close()


def test_inline_worker_captures_exceptions():
    def infer(obs: dict) -> np.ndarray:
        raise RuntimeError("boom")

    w = PolicyWorker(infer, threaded=False)
    w.submit({}, 0)
    (res,) = w.poll()
    assert res.actions is None and isinstance(res.error, RuntimeError)


def test_loop_timer_keeps_rate_and_skips_missed_ticks():
    dt = 0.05
    timer = LoopTimer(dt=dt)
    timer.start()
    steps = [timer.wait_next() for _ in range(5)]
    assert steps[0] == 0 and all(b > a for a, b in itertools.pairwise(steps))
    assert steps[-1] - 4 == timer.overruns  # on a loaded machine a late wake-up skips ticks
    time.sleep(3.5 * dt)  # miss about three ticks
    k = timer.wait_next()
    assert k >= steps[-1] + 3 and timer.overruns >= 2
    s = LatencySummary.of(timer.series["period"])
    assert s.n == 5 and s.p50_ms >= 0.9 * dt * 1e3
    assert max(timer.series["lateness"]) >= 0 and "| period |" in s.row("period")
