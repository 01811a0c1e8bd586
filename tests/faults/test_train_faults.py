"""Training runs under faults: SIGKILL at random points (file operations and wall-clock times, seeded), then
``--resume true``; a disk that fills up while a checkpoint is written; a damaged newest checkpoint.

Each run is ``vla-rl train`` in a forked child of the test process (the imports are already done, so a run costs
its own work only). After every kill the resumed run continues from the newest checkpoint that verifies, loses
at most the iteration in flight (``iterations lost`` = iterations logged before the kill minus the iteration
resumed from, at most 1), and the run's end state is the uninterrupted run's: the same metrics at every step,
the same weights and the same RNG state (the config and the RNG stream continue).
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.faults.inject import count_events, run_forked, truncate
from tests.vla_rl.test_train import TINY as TRAIN_TINY
from vla_rl import checkpoint as ckpt
from vla_rl.cli import run

pytestmark = pytest.mark.timeout(600)

TINY = [*TRAIN_TINY, "--env.num_workers", "0"]  # envs in the run's own process: a SIGKILL leaves no orphan
ITERATIONS = 5


def train_forked(run_dir: Path, iterations: int = ITERATIONS, resume: bool = False, **faults):
    """``vla-rl train`` (:data:`TINY`) in a forked child; ``faults`` go to :func:`run_forked` (its file-system
    events count under ``run_dir``)."""
    args = ["train", *TINY, "--iterations", str(iterations), "--run_dir", str(run_dir)]
    if resume:
        args += ["--resume", "true"]
    run_dir.mkdir(parents=True, exist_ok=True)

    def work() -> None:
        run(args)

    faults.setdefault("capture", True)
    return run_forked(work, run_dir, **faults)


def metric_rows(run_dir: Path) -> dict[int, dict]:
    """``metrics.jsonl`` as ``{step: row}`` (a step logged twice, before a kill and after the resume, keeps the
    later row), without timings."""
    rows: dict[int, dict] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        rows[r["step"]] = {k: v for k, v in r.items() if not k.startswith("time/")}
    return rows


def logged_iterations(run_dir: Path) -> int:
    """Training iterations whose metrics reached ``metrics.jsonl``: its distinct steps (env steps, one per
    iteration; a resumed run logs an iteration again under the same step) less the evaluation before training
    (step 0). A line torn by the kill does not count."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return 0
    steps = {json.loads(line)["step"] for line in path.read_text().splitlines() if line.endswith("}")}
    return max(len(steps - {0}), 0)


_RESUMED = re.compile(r"resuming .* at iteration (\d+) from")


@dataclass
class KillReport:
    """What the kills of one run cost."""

    kills: int = 0
    resumes: int = 0
    lost: list[int] = field(default_factory=list)
    """Per kill: iterations logged before it minus the iteration resumed from."""


def kill_and_resume(run_dir: Path, points: list[tuple[str, float]]) -> KillReport:
    """Start the run, SIGKILL it at each of ``points`` in turn (``("event", k)``: at the k-th file operation,
    ``("time", s)``: after s seconds), resuming after each, then let it finish."""
    report = KillReport()
    resume = False
    for kind, at in points:
        faults = {"kill_at": int(at)} if kind == "event" else {"kill_after_s": at}
        out = train_forked(run_dir, resume=resume, **faults)
        if out.status == "ok":  # the run finished before the kill point
            return report
        assert out.status == "killed", out
        report.kills += 1
        done = logged_iterations(run_dir)
        lines: list[str] = []
        resumed = ckpt.resume_checkpoint(run_dir / "checkpoints", report=lines.append)
        assert lines == [], lines  # nothing under a final name is damaged
        at_iter = ckpt.load_trainer_state(resumed)["iteration"] if resumed is not None else 0
        report.lost.append(done - at_iter)
        resume = True
    out = train_forked(run_dir, resume=resume)
    assert out.status == "ok", out
    if resume:
        report.resumes = report.kills
        match = _RESUMED.search(out.stdout)
        assert match or "starting from scratch" in out.stdout, out.stdout
    return report


def assert_same_run(a: Path, b: Path, iterations: int = ITERATIONS) -> None:
    """The metrics at every step, the final weights and RNG state of two runs are the same."""
    ra, rb = metric_rows(a), metric_rows(b)
    assert sorted(ra) == sorted(rb)
    for step, row in ra.items():
        for key, value in row.items():
            if value is None:
                assert rb[step].get(key, 0) is None, (step, key)
            else:
                assert rb[step].get(key) == pytest.approx(value, rel=1e-5, abs=1e-6), (step, key)
    last = f"iter_{iterations:06d}"
    sa = torch.load(a / "checkpoints" / last / "trainer.pt", weights_only=True)
    sb = torch.load(b / "checkpoints" / last / "trainer.pt", weights_only=True)
    assert torch.equal(sa["rng"]["torch"], sb["rng"]["torch"])
    assert torch.equal(sa["rng"]["numpy"]["key"], sb["rng"]["numpy"]["key"])
    assert sa["rng"]["python"] == sb["rng"]["python"]
    pa = load_file(a / "checkpoints" / last / "policy" / "model.safetensors")
    pb = load_file(b / "checkpoints" / last / "policy" / "model.safetensors")
    assert pa.keys() == pb.keys() and all(torch.allclose(pa[k], pb[k], atol=1e-6) for k in pa)


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> tuple[Path, int]:
    """An uninterrupted run and the number of file operations it does."""
    run_dir = tmp_path_factory.mktemp("straight") / "run"
    run_dir.mkdir()
    out = count_events(lambda: run(["train", *TINY, "--iterations", str(ITERATIONS), "--run_dir", str(run_dir)]),
                       run_dir)
    return run_dir, out.events


def test_sigkill_at_seeded_random_points_then_resume_continues_exactly(straight, tmp_path: Path) -> None:
    ref, n = straight
    rng = random.Random(21)
    # two kills in one run: at a random file operation of the first half, then at a random one of the resumed
    # run (whose own count starts at 1 again)
    points = [("event", rng.randrange(n // 4, n // 2)), ("event", rng.randrange(n // 8, n // 3))]
    report = kill_and_resume(tmp_path / "run", points)
    assert report.kills >= 1 and max(report.lost) <= 1, report
    assert_same_run(ref, tmp_path / "run")


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sigkill_at_many_random_points_and_times(straight, tmp_path: Path, seed: int) -> None:
    ref, n = straight
    rng = random.Random(seed)
    points = [("event", rng.randrange(1, n)) for _ in range(3)] + [("time", rng.uniform(0.5, 4.0)) for _ in range(2)]
    rng.shuffle(points)
    report = kill_and_resume(tmp_path / "run", points)
    assert max(report.lost, default=0) <= 1, report
    assert_same_run(ref, tmp_path / "run")


def test_disk_full_during_a_checkpoint_says_so_in_one_line_and_the_run_resumes(straight, tmp_path: Path) -> None:
    ref, _ = straight
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # the disk fills up while iteration 3's checkpoint is written
    args = ["train", *TINY, "--iterations", str(ITERATIONS), "--run_dir", str(run_dir)]

    def work() -> None:
        import sys

        def full(event: str, a: tuple) -> None:
            if event == "open" and ".iter_000003.tmp" in str(a[0]) and isinstance(a[1], str) and "w" in a[1]:
                raise OSError(28, "No space left on device", str(a[0]))

        sys.addaudithook(full)
        run(args)

    out = run_forked(work, run_dir, capture=True)
    assert out.status == "error" and out.value == 1, out  # SystemExit(1): a runtime failure
    err = [line for line in out.stderr.splitlines() if line.startswith("vla-rl")]
    assert len(err) == 1 and "Traceback" not in out.stderr, out.stderr
    assert err[0].startswith("vla-rl train: [Errno 28] writing checkpoint checkpoints/iter_000003 failed "
                             "(No space left on device); nothing was written under its name, the previous "
                             "checkpoint checkpoints/iter_000002 is kept"), err[0]
    assert ckpt.latest_checkpoint(run_dir / "checkpoints") == run_dir / "checkpoints" / "iter_000002"
    assert not (run_dir / "checkpoints" / "iter_000003").exists()
    assert not [p for p in (run_dir / "checkpoints").iterdir() if p.name.startswith(".")]
    out = train_forked(run_dir, resume=True)
    assert out.status == "ok" and f"resuming {run_dir} at iteration 2" in out.stdout, out
    assert_same_run(ref, run_dir)


@pytest.mark.slow  # the fallback itself is tested fast in tests/vla_rl/test_checkpoint.py
def test_a_truncated_newest_trainer_pt_is_skipped_in_one_line_and_the_run_resumes(straight, tmp_path: Path) -> None:
    """The issue's first case as a user meets it: ``trainer.pt`` of the newest checkpoint truncated."""
    ref, _ = straight
    run_dir = tmp_path / "run"
    assert train_forked(run_dir, iterations=3).status == "ok"
    truncate(run_dir / "checkpoints" / "iter_000003" / "trainer.pt", 1024)
    out = train_forked(run_dir, resume=True)
    assert out.status == "ok", out
    skip = [line for line in out.stdout.splitlines() if line.startswith("skipping")]
    assert len(skip) == 1 and skip[0].startswith("skipping checkpoints/iter_000003: trainer.pt has 1024 bytes, "
                                                 "the manifest says "), out.stdout
    assert f"resuming {run_dir} at iteration 2" in out.stdout
    assert (run_dir / "checkpoints" / "iter_000003.damaged-1").is_dir()  # moved aside when iteration 3 was redone
    assert_same_run(ref, run_dir)
