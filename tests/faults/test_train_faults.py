"""Training runs under faults: SIGKILL at random points (file operations and wall-clock times, seeded), then
``--resume true``; a disk that fills up while a checkpoint is written; a damaged newest checkpoint.

Each run is ``vla-rl train`` in a forked child of the test process (the imports are already done, so a run costs
its own work only). After every kill the resumed run continues from the newest checkpoint that verifies, loses
at most the iteration in flight (``iterations lost`` = iterations logged before the kill minus the iteration
resumed from, at most 1), and the run's end state is the uninterrupted run's: the same metrics at every step,
the same weights and the same RNG state (the config and the RNG stream continue).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from vla_rl import checkpoint as ckpt
from vla_rl.cli import run
from vla_rl.faults.inject import count_events, run_forked, truncate
from vla_rl.faults.scenarios import ITERATIONS, TINY, assert_same_run, kill_and_resume, train_forked

pytestmark = pytest.mark.timeout(600)

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
    """The first case as a user meets it: ``trainer.pt`` of the newest checkpoint truncated."""
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
