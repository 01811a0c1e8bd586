"""The time breakdown of a training run: ``time/*`` scalars that partition each iteration, the report's table
and stacked plot."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from vla_rl.cli import run
from vla_rl.run_logging import read_metrics
from vla_rl.timing import BREAKDOWN, StageTimes, split_remainder, time_summary


def test_stage_times_accumulate_and_reset() -> None:
    t = StageTimes()
    with t("a"):
        time.sleep(0.01)
    with t("a"):
        time.sleep(0.01)
    t.start("b")
    time.sleep(0.005)
    t.stop("b")
    got = t.take("time/x_")
    assert set(got) == {"time/x_a_s", "time/x_b_s"}
    assert got["time/x_a_s"] >= 0.02 and got["time/x_b_s"] >= 0.005
    assert t.take() == {}  # taken totals start again from zero
    assert split_remainder(1.0, {"p": 0.75}, "rest") == {"p": 0.75, "rest": 0.25}
    assert split_remainder(1.0, {"p": 1.5}, "rest")["rest"] == 0.0


@pytest.mark.render
def test_every_iteration_row_breaks_its_wall_time_down(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run(["train", "--env.id", "mujoco/pick-red", "--smoke", "true", "--iterations", "2", "--run_dir", str(run_dir),
         "--checkpoint_every", "1"])
    rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if "time/iteration_s" in r]
    assert len(rows) == 2  # --smoke caps the run at 2 iterations
    for r in rows:
        parts = {k: r[k] for k in BREAKDOWN}
        assert all(v >= 0 for v in parts.values()), parts
        # the stages partition the iteration: only the few statements between the timers are unaccounted
        assert sum(parts.values()) == pytest.approx(r["time/iteration_s"], rel=0.1, abs=0.02)
        assert r["time/rollout_env_s"] > 0 and r["time/rollout_act_s"] > 0
        assert r["time/update_forward_s"] > 0 and r["time/update_backward_s"] > 0
        assert "env" in time_summary(r) and "upd" in time_summary(r)
    # checkpointing happens after a row is written: it shows in the next row
    assert rows[0]["time/checkpoint_s"] == 0.0 and rows[1]["time/checkpoint_s"] > 0
    assert rows[-1]["time/eval_s"] > 0  # the final evaluation
    report = (run_dir / "report.md").read_text()
    assert "| rollout_env |" in report and "| update_backward |" in report
    assert (run_dir / "plots" / "time.png").stat().st_size > 0


def test_torch_threads_per_stage_restore_the_process_setting() -> None:
    import torch

    from vla_rl.threads import torch_threads, usable_cores

    before = torch.get_num_threads()
    with torch_threads(0):
        assert torch.get_num_threads() == usable_cores()
    with torch_threads(-1):
        assert torch.get_num_threads() == before
    try:
        with torch_threads(1):
            assert torch.get_num_threads() == 1
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert torch.get_num_threads() == before
