"""Datasets under faults: SIGKILL while recording and sealing, every file truncated, emptied or bit-flipped,
and the commands that read a dataset.

After a kill, either the dataset does not exist under its final name (the recording was in ``<root>.partial``),
or it exists, verifies and opens with LeRobot's own ``LeRobotDataset``, holding every episode; the next
recording moves the unfinished ``.partial`` aside instead of deleting it. A damaged file is named in one line
and no other file is touched.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from pathlib import Path

import pytest

from sim.dataset import load_dataset, verify_dataset
from vla_core.manifest import MANIFEST, IntegrityError
from vla_rl.cli import run
from vla_rl.faults.inject import count_events, flip_bit, run_forked, truncate
from vla_rl.faults.scenarios import EPISODES, LENGTH, record

pytestmark = pytest.mark.timeout(300)

def _digests(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def sealed(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("sealed") / "ds"
    record(root)
    return root


def test_a_recorded_dataset_is_sealed_and_opens_with_lerobot(sealed: Path) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    files = json.loads((sealed / MANIFEST).read_text())["files"]
    assert any(f.startswith("data/") and f.endswith(".parquet") for f in files)
    assert "meta/info.json" in files and verify_dataset(sealed) is True
    ds = LeRobotDataset("local/faults", root=sealed)  # the manifest does not disturb LeRobot
    assert ds.num_episodes == EPISODES and len(ds) == EPISODES * LENGTH
    assert not sealed.with_name("ds.partial").exists()


@pytest.mark.parametrize("every_point", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_sigkill_while_recording_and_sealing_never_leaves_a_broken_dataset(tmp_path: Path, every_point: bool) -> None:
    probe = tmp_path / "probe"
    probe.mkdir()
    n = count_events(lambda: record(probe / "ds"), probe).events
    assert n >= 20, n
    # fast: the end of the sealing (the manifest written, the rename: the last 6 events) and 2 seeded random
    # points of the recording before it; slow: every point
    points = range(1, n + 1) if every_point else sorted({*random.Random(0).sample(range(1, n - 6), 2),
                                                         *range(n - 5, n + 1)})
    outcomes = []
    for k in points:
        base = tmp_path / f"k{k:03d}"
        base.mkdir()
        root = base / "ds"
        out = run_forked(lambda root=root: record(root), base, kill_at=k)
        assert out.status == "killed", (k, out)
        if root.exists():  # the rename happened: complete, verified, every episode there
            assert verify_dataset(root) is True
            assert load_dataset(root).num_episodes == EPISODES
            outcomes.append("complete")
        else:
            outcomes.append("absent")
            leftover = root.with_name("ds.partial")
            assert record(root)  # recording again works; the unfinished folder is moved aside, not deleted
            assert verify_dataset(root) and load_dataset(root).num_episodes == EPISODES
            if leftover.exists() or any(base.glob("ds.partial.damaged-*")):
                assert list(base.glob("ds.partial.damaged-*")) and not leftover.exists()
        shutil.rmtree(base)
    assert set(outcomes) == {"complete", "absent"}, outcomes


@pytest.mark.parametrize("damage", ["truncate", "empty", "flip"])
def test_every_damaged_dataset_file_is_named_and_nothing_else_is_touched(sealed: Path, tmp_path: Path,
                                                                        damage: str) -> None:
    names = sorted(json.loads((sealed / MANIFEST).read_text())["files"]) + [MANIFEST]
    for i, name in enumerate(names):
        root = tmp_path / f"{damage}{i}"
        shutil.copytree(sealed, root)
        target = root / name
        {"truncate": lambda: truncate(target), "empty": lambda: truncate(target, 0),
         "flip": lambda: flip_bit(target, seed=i)}[damage]()
        before = _digests(root)
        with pytest.raises(IntegrityError) as err:
            load_dataset(root)
        line = str(err.value)
        assert "\n" not in line and str(target) in line, (name, line)
        assert _digests(root) == before  # nothing moved, deleted or rewritten
        shutil.rmtree(root)


def test_a_dataset_from_another_tool_without_manifest_still_names_a_truncated_file(sealed: Path,
                                                                                   tmp_path: Path) -> None:
    root = tmp_path / "foreign"
    shutil.copytree(sealed, root)
    (root / MANIFEST).unlink()
    assert verify_dataset(root) is False  # unverified, but complete
    data = sorted((root / "data").rglob("*.parquet"))[0]
    truncate(data)
    with pytest.raises(IntegrityError, match=f"{data} has .* bytes and is not a complete parquet file"):
        load_dataset(root)
    (root / "meta" / "info.json").write_text('{"fps": 10,\n "features": }')
    with pytest.raises(IntegrityError, match=r"info.json: not valid JSON \(line 2, column 14"):
        verify_dataset(root)


def _sft(dataset: Path, tmp: Path, *extra: str) -> list[str]:
    return ["sft", "--dataset", str(dataset), "--output", str(tmp / "policy"), "--steps", "1", "--env.id", "",
            *extra]


def test_sft_on_a_damaged_dataset_prints_one_line_naming_the_file_and_exits_2(sealed: Path, tmp_path: Path,
                                                                              capsys) -> None:
    root = tmp_path / "ds"
    shutil.copytree(sealed, root)
    data = sorted((root / "data").rglob("*.parquet"))[0]
    truncate(data, 100)
    with pytest.raises(SystemExit) as exc:
        run(_sft(root, tmp_path))
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("vla-rl sft: ") and f"{data} has 100 bytes, the manifest says" in err


def _policy_folder(tmp: Path, **fields) -> Path:
    from policies.compact.config import CompactFlowConfig
    from policies.compact.policy import CompactFlowPolicy

    cfg = dict(cameras=(), state_dim=3, action_dim=2, chunk_size=2, width=32, heads=2, expert_layers=1,
               text_encoder="hashed", text_buckets=64, value_hidden=16, noise_hidden=8)
    folder = tmp / "policy_in"
    CompactFlowPolicy(CompactFlowConfig(**{**cfg, **fields})).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("fields, message", [
    ({"state_dim": 5}, "feature 'observation.state' has shape (3,) in the dataset but the policy expects (5,)"),
    ({"action_dim": 7}, "feature 'action' has shape (2,) in the dataset but the policy expects (7,)"),
    ({"cameras": ("wrist",), "image_size": (8, 8)}, "the dataset has no feature 'observation.images.wrist', which "
                                                     "the policy reads"),
])
def test_a_missing_or_misshapen_feature_names_it_and_both_shapes(sealed: Path, tmp_path: Path, capsys, fields,
                                                                  message) -> None:
    policy = _policy_folder(tmp_path, **fields)
    with pytest.raises(SystemExit) as exc:
        run(_sft(sealed, tmp_path, "--policy.path", str(policy)))
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"vla-rl sft: {sealed}: ") and message in err, err


def test_the_quickstart_reuses_a_verified_stage_and_redoes_a_damaged_one(sealed: Path, tmp_path: Path,
                                                                        capsys) -> None:
    from vla_rl.commands.quickstart import _reusable, _verify_demos

    root = tmp_path / "demos"
    shutil.copytree(sealed, root)
    assert _reusable(root, "demo cache", _verify_demos) is True
    flip_bit(sorted((root / "data").rglob("*.parquet"))[0], seed=3)
    capsys.readouterr()
    assert _reusable(root, "demo cache", _verify_demos) is False  # so the stage collects again
    out = capsys.readouterr().out
    assert out.startswith(f"note: demo cache {root} does not verify (") and "moved aside to demos.damaged-1" in out
    assert not root.exists() and (tmp_path / "demos.damaged-1").is_dir()  # kept, not deleted
    assert _reusable(tmp_path / "absent", "demo cache", _verify_demos) is False


def _hold_then_write(folder: str, hold_s: float, order: str) -> None:
    """Child process: inside the lock, wait, then append its name to ``order`` (one line per writer)."""
    import os
    import time

    from vla_core.manifest import exclusive

    with exclusive(folder, "a test folder"):
        time.sleep(hold_s)
        with open(order, "a") as f:
            f.write(f"{os.getpid()} start\n")
            f.flush()
            time.sleep(0.05)
            f.write(f"{os.getpid()} end\n")


def test_two_processes_writing_one_cache_folder_take_turns(tmp_path: Path) -> None:
    """The demo cache's lock: a second writer waits for the first instead of interleaving with it (two quickstarts
    of one seed started together used to move each other's unfinished recording aside)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    order = tmp_path / "order.txt"
    first = ctx.Process(target=_hold_then_write, args=(str(tmp_path / "demos"), 1.0, str(order)))
    first.start()
    deadline = 30.0
    lock = tmp_path / "demos.lock"
    import time

    t0 = time.monotonic()
    while not lock.exists() and time.monotonic() - t0 < deadline:
        time.sleep(0.02)
    time.sleep(0.2)  # the first holds the lock now
    second = ctx.Process(target=_hold_then_write, args=(str(tmp_path / "demos"), 0.0, str(order)))
    second.start()
    first.join(deadline)
    second.join(deadline)
    assert first.exitcode == 0 and second.exitcode == 0
    lines = order.read_text().split()
    words = [w for w in lines if w in ("start", "end")]
    assert words == ["start", "end", "start", "end"], order.read_text()
    pids = [w for w in lines if w not in ("start", "end")]
    assert pids[0] == pids[1] == str(first.pid) and pids[2] == pids[3] == str(second.pid)
