"""Checkpoint writing under faults: SIGKILL between every file operation, a disk that fills up at every write,
and every file of a checkpoint truncated, emptied or bit-flipped.

The promise checked after each fault: resuming finds a checkpoint (the new one if its rename happened, else the
previous one: at most the iteration in flight is lost), every ``iter_<k>`` under its final name verifies (no
half-written file under a final name), ``latest`` names a checkpoint that verifies, the RNG state saved with the
resumed checkpoint is the one of its iteration, and the next save succeeds.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from vla_core.manifest import MANIFEST
from vla_rl import checkpoint as ckpt
from vla_rl.faults.inject import flip_bit, run_forked, truncate
from vla_rl.faults.scenarios import prepared
from vla_rl.faults.scenarios import save as _save
from vla_rl.faults.scenarios import tiny_policy as _policy

pytestmark = pytest.mark.timeout(300)


def assert_sound(ckpt_dir: Path, newest: int) -> int:
    """The post-fault invariants (module doc); returns the iteration a resume would continue after."""
    lines: list[str] = []
    resumed = ckpt.resume_checkpoint(ckpt_dir, report=lines.append)
    assert resumed is not None, f"no checkpoint to resume from in {sorted(p.name for p in ckpt_dir.iterdir())}"
    assert lines == [], lines  # nothing under a final name is damaged, so nothing is skipped
    for cand in ckpt.checkpoints(ckpt_dir):
        assert ckpt.verify_checkpoint(cand), cand
    latest = (ckpt_dir / ckpt.LATEST).read_text().strip()
    assert ckpt.verify_checkpoint(ckpt_dir / latest)
    state = ckpt.load_trainer_state(resumed)
    iteration = state["iteration"]
    assert torch.equal(state["learner"]["w"], torch.full((4,), float(iteration)))
    assert newest - iteration <= 1, f"lost {newest - iteration} iterations"
    return iteration


def test_sigkill_between_every_file_of_a_checkpoint_write(tmp_path: Path) -> None:
    base, policy, n = prepared(tmp_path)
    assert n >= 10, f"only {n} file operations in a checkpoint write?"
    resumed_at = {}
    for k in range(1, n + 1):
        run = tmp_path / f"k{k:03d}"
        shutil.copytree(base, run)
        out = run_forked(lambda run=run: str(_save(run, 2, policy)), run, kill_at=k)
        assert out.status == "killed", (k, out)
        resumed_at[k] = assert_sound(run, newest=2)
        again = _save(run, 2, policy)  # the interrupted write does not block the next one
        assert ckpt.verify_checkpoint(again) and (run / ckpt.LATEST).read_text() == "iter_000002"
        assert not [p for p in run.iterdir() if p.name.startswith(".")], k  # leftovers cleaned
        shutil.rmtree(run)
    # both outcomes happen: killed before the rename (previous kept) and after it (new one complete)
    assert set(resumed_at.values()) == {1, 2}, resumed_at


def test_disk_full_at_every_write_of_a_checkpoint_keeps_the_previous_one(tmp_path: Path) -> None:
    base = tmp_path / "base"
    _save(base, 1)
    policy = _policy()
    for k in range(1, 40):
        run = tmp_path / f"w{k:02d}"
        shutil.copytree(base, run)
        out = run_forked(lambda run=run: str(_save(run, 2, policy)), run, enospc_from=k)
        if out.status == "ok":  # k is past the last write: the whole checkpoint fit
            assert k > 3 and assert_sound(run, newest=2) == 2
            break
        assert out.status == "error" and out.error.startswith("OSError: [Errno 28]"), (k, out)
        assert not [p for p in run.iterdir() if p.name.startswith(".")], k  # no temporary file or folder left
        if f"{run.name}/iter_000002 was written and verifies, but updating latest failed" in out.error:
            assert assert_sound(run, newest=2) == 2  # the disk filled after the rename: nothing is lost
            continue
        assert f"writing checkpoint {run.name}/iter_000002 failed" in out.error, out.error
        assert f"the previous checkpoint {run.name}/iter_000001 is kept" in out.error, out.error
        assert assert_sound(run, newest=2) == 1
        assert not (run / "iter_000002").exists()
        assert (run / ckpt.LATEST).read_text() == "iter_000001"
        shutil.rmtree(run)
    else:
        pytest.fail("the checkpoint never fit")


def _manifest_files(folder: Path) -> list[str]:
    return sorted(json.loads((folder / MANIFEST).read_text())["files"]) + [MANIFEST]


@pytest.mark.parametrize("damage", ["truncate", "empty", "flip"])
def test_every_damaged_checkpoint_file_is_named_and_resume_falls_back(tmp_path: Path, damage: str) -> None:
    base = tmp_path / "base"
    _save(base, 1)
    _save(base, 2)
    names = _manifest_files(base / "iter_000002")
    assert len(names) >= 6
    for i, name in enumerate(names):
        run = tmp_path / f"{damage}{i}"
        shutil.copytree(base, run)
        target = run / "iter_000002" / name
        before = {p: p.read_bytes() for p in (run / "iter_000001").rglob("*") if p.is_file()}
        {"truncate": lambda: truncate(target), "empty": lambda: truncate(target, 0),
         "flip": lambda: flip_bit(target, seed=i)}[damage]()
        lines: list[str] = []
        resumed = ckpt.resume_checkpoint(run, report=lines.append)
        assert resumed == run / "iter_000001", (name, lines)
        assert len(lines) == 1 and lines[0].startswith(f"skipping {run.name}/iter_000002: "), lines
        # the damaged file is named (the manifest itself, when it is the damaged one, is named as such)
        assert name in lines[0], (name, lines[0])
        assert target.exists() and (run / "iter_000002").is_dir()  # never deleted
        assert before == {p: p.read_bytes() for p in (run / "iter_000001").rglob("*") if p.is_file()}
        shutil.rmtree(run)
