"""Fault-injection runner: N seeded faults per kind, then recovery, counted into ``benchmarks/results/faults.json``.

Uses the fault suite's injector (:mod:`vla_rl.faults.inject`: a forked child SIGKILL-ed, or its writes failed
with ENOSPC, at the k-th file operation) and its scenarios (:mod:`vla_rl.faults.scenarios`). Kinds:

- ``checkpoint_kill``: SIGKILL at a random file operation of a checkpoint write, then resume;
- ``checkpoint_disk_full``: ENOSPC from a random write of a checkpoint on, then resume;
- ``checkpoint_damage``: a random file of the newest checkpoint truncated, emptied or bit-flipped, then resume;
- ``dataset_kill``: SIGKILL at a random file operation of recording and sealing a dataset, then reopen;
- ``dataset_damage``: a random dataset file truncated, emptied or bit-flipped, then load (must name it);
- ``train_kill``: SIGKILL at a random file operation of a ``vla-rl train`` run, then ``--resume true`` to the
  end (compared with an uninterrupted run: same metrics, weights and RNG state);
- ``ros_load``: the ROS 2 bridge fed bursts, duplicated and out-of-order JointState stamps and a camera that
  stops (:mod:`vla_rl.faults.ros_feed`), deploy run to the watchdog's stop.

Counted per kind: faults injected, runs resumed (or datasets reopened), iterations lost (max; a damaged newest
checkpoint costs its iteration by construction), files lost (files of earlier complete checkpoints or datasets
missing or changed afterwards, or a damaged folder deleted: must be 0), commands outside the envelope (must
be 0), and failures (a recovery that did not hold its promise; must be 0).

Run::

    OMP_NUM_THREADS=1 python benchmarks/faults.py --n 5 --seed 0
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import harness
import torch

from vla_rl.faults import scenarios
from vla_rl.faults.inject import count_events, flip_bit, run_forked, truncate


@dataclass
class KindResult:
    """The counts of one fault kind."""

    injected: int = 0
    resumed: int = 0
    iterations_lost_max: int = 0
    files_lost: int = 0
    commands_outside_envelope: int = 0
    failures: int = 0
    seconds: float = 0.0


def digests(root: Path, skip: Callable[[Path], bool] = lambda p: False) -> dict[str, str]:
    """sha256 of every file under ``root`` (relative path -> hex), files for which ``skip`` is true left out."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not skip(p)}


def lost(before: dict[str, str], after: dict[str, str]) -> int:
    """Files of ``before`` missing or changed in ``after``."""
    return sum(1 for k, v in before.items() if after.get(k) != v)


def damage(path: Path, how: str, seed: int) -> None:
    """Truncate (to half), empty or flip one bit of ``path``."""
    {"truncate": lambda: truncate(path), "empty": lambda: truncate(path, 0),
     "flip": lambda: flip_bit(path, seed=seed)}[how]()


def checkpoint_faults(res: dict[str, KindResult], n: int, rng: random.Random, work: Path) -> None:
    from vla_rl import checkpoint as ckpt

    (work / "ckpt").mkdir()
    base, policy, events = scenarios.prepared(work / "ckpt")
    keep = lambda p: p.name == ckpt.LATEST or any(part.startswith(".") for part in p.parts)  # noqa: E731
    for kind in ("checkpoint_kill", "checkpoint_disk_full"):
        r = res[kind]
        for i in range(n):
            run = work / f"{kind}{i}"
            shutil.copytree(base, run)
            before = digests(run, keep)
            k = rng.randrange(1, events + 1) if kind == "checkpoint_kill" else rng.randrange(1, 12)
            faults = {"kill_at": k} if kind == "checkpoint_kill" else {"enospc_from": k}
            out = run_forked(lambda run=run: str(scenarios.save(run, 2, policy)), run, **faults)
            r.injected += out.status != "ok"
            resumed = ckpt.resume_checkpoint(run, report=lambda line: None)
            if resumed is None:
                r.failures += 1
                continue
            r.resumed += 1
            r.iterations_lost_max = max(r.iterations_lost_max, 2 - ckpt.load_trainer_state(resumed)["iteration"])
            r.files_lost += lost(before, digests(run, keep))
            r.failures += any(ckpt._problem(c) for c in ckpt.checkpoints(run))  # damaged under a final name
            shutil.rmtree(run)
    r = res["checkpoint_damage"]
    scenarios.save(base, 2)
    names = sorted(json.loads((base / "iter_000002" / "manifest.json").read_text())["files"]) + ["manifest.json"]
    for i in range(n):
        run = work / f"damage{i}"
        shutil.copytree(base, run)
        name, how = rng.choice(names), rng.choice(["truncate", "empty", "flip"])
        before = digests(run / "iter_000001")
        damage(run / "iter_000002" / name, how, seed=i)
        r.injected += 1
        lines: list[str] = []
        resumed = ckpt.resume_checkpoint(run, report=lines.append)
        named = len(lines) == 1 and name in lines[0]
        if resumed != run / "iter_000001" or not named:
            r.failures += 1
            continue
        r.resumed += 1
        r.iterations_lost_max = max(r.iterations_lost_max, 1)  # the damaged checkpoint's own iteration
        r.files_lost += lost(before, digests(run / "iter_000001")) + (not (run / "iter_000002" / name).exists())
        shutil.rmtree(run)


def dataset_faults(res: dict[str, KindResult], n: int, rng: random.Random, work: Path) -> None:
    from sim.dataset import load_dataset, verify_dataset
    from vla_rl.faults.scenarios import EPISODES, record
    from vla_core.manifest import IntegrityError

    probe = work / "ds_probe"
    probe.mkdir()
    events = count_events(lambda: record(probe / "ds"), probe).events
    r = res["dataset_kill"]
    for i in range(n):
        base = work / f"ds_kill{i}"
        base.mkdir()
        root = base / "ds"
        out = run_forked(lambda root=root: record(root), base, kill_at=rng.randrange(1, events + 1))
        r.injected += out.status == "killed"
        try:
            if not root.exists():
                record(root)  # record again: the unfinished .partial is moved aside
            ok = verify_dataset(root) and load_dataset(root).num_episodes == EPISODES
        except Exception:  # noqa: BLE001  counted as a failure
            traceback.print_exc()
            ok = False
        r.resumed += ok
        r.failures += not ok
        shutil.rmtree(base)
    r = res["dataset_damage"]
    sealed = work / "ds_sealed"
    record(sealed)
    names = sorted(json.loads((sealed / "manifest.json").read_text())["files"]) + ["manifest.json"]
    for i in range(n):
        root = work / f"ds_damage{i}"
        shutil.copytree(sealed, root)
        name, how = rng.choice(names), rng.choice(["truncate", "empty", "flip"])
        damage(root / name, how, seed=i)
        before = digests(root)
        r.injected += 1
        try:
            load_dataset(root)
            r.failures += 1  # loaded a damaged dataset
        except IntegrityError as exc:
            r.resumed += str(root / name) in str(exc)
            r.failures += str(root / name) not in str(exc)
        r.files_lost += lost(before, digests(root))
        shutil.rmtree(root)


def train_faults(res: dict[str, KindResult], n: int, rng: random.Random, work: Path) -> None:
    from vla_rl.faults.scenarios import ITERATIONS, TINY, assert_same_run, kill_and_resume
    from vla_rl.cli import run

    ref = work / "train_ref"
    ref.mkdir()
    events = count_events(lambda: run(["train", *TINY, "--iterations", str(ITERATIONS), "--run_dir", str(ref)]),
                          ref).events
    r = res["train_kill"]
    for i in range(n):
        run_dir = work / f"train{i}"
        try:
            report = kill_and_resume(run_dir, [("event", rng.randrange(1, events))])
            assert_same_run(ref, run_dir)
        except AssertionError:
            traceback.print_exc()
            r.failures += 1
            continue
        r.injected += report.kills
        r.resumed += report.resumes
        r.iterations_lost_max = max([r.iterations_lost_max, *report.lost])
        shutil.rmtree(run_dir)


def ros_faults(res: dict[str, KindResult], n: int, rng: random.Random, work: Path) -> None:
    import numpy as np

    from hardware import deploy
    from vla_rl.faults.ros_feed import LOWER, MAX_DELTA, UPPER, FeedAdapter
    from vla_rl.faults.ros_feed import deploy_config as _config

    r = res["ros_load"]
    for i in range(n):
        folder = work / f"ros{i}"
        folder.mkdir()
        cfg = _config(folder, "--episode_s=8")
        adapter = FeedAdapter(cfg.robot, camera_stops_after_s=rng.uniform(1.0, 3.0),
                              burst_every_s=rng.uniform(0.05, 0.3))
        original = deploy.make_adapter
        deploy.make_adapter = lambda robot, adapter=adapter: adapter
        try:
            report = deploy.run_deploy(cfg)
        finally:
            deploy.make_adapter = original
        r.injected += adapter.injected_stale + 1  # the stale messages and the camera stop
        r.resumed += report.stop_reason.startswith("watchdog: stale_observation: camera frame")
        r.failures += adapter.stale_dropped != adapter.injected_stale
        prev = None
        for chunk in adapter.sent:
            bad = ~np.isfinite(chunk) | (chunk < LOWER - 1e-9) | (chunk > UPPER + 1e-9)
            jumps = np.abs(np.diff(chunk, axis=0)) > MAX_DELTA + 1e-9 if len(chunk) > 1 else np.zeros(1, bool)
            step = prev is not None and np.abs(chunk[0] - prev).max() > MAX_DELTA + 1e-9
            r.commands_outside_envelope += int(bad.any() or jumps.any() or step)
            prev = chunk[0]


def markdown(results: dict[str, KindResult], n: int, seconds: float) -> str:
    lines = [
        f"{n} faults per kind, {seconds:.0f} s wall on a shared, loaded machine (the times are not a speed claim). "
        "Each fault is injected in a forked child (SIGKILL or ENOSPC at a seeded random file operation, or a damaged "
        "file), then the run is resumed or the dataset reopened.",
        "",
        "| fault kind | injected | resumed / reopened | iterations lost (max) | files lost | commands outside "
        "the envelope | failures |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for kind, r in results.items():
        lines.append(f"| {kind} | {r.injected} | {r.resumed} | {r.iterations_lost_max} | {r.files_lost} | "
                     f"{r.commands_outside_envelope} | {r.failures} |")
    lines += ["", "`checkpoint_damage` loses the damaged checkpoint's iteration by construction (its newest "
              "checkpoint is the damaged one); `ros_load` counts each stale JointState message and the camera stop "
              "as injected faults and a watchdog stop as the recovery."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=5, help="faults per kind")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kinds", default="checkpoint,dataset,train,ros", help="comma-separated groups to run")
    args = harness.add_output_args(p).parse_args(argv)
    torch.set_num_threads(1)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    kinds = ["checkpoint_kill", "checkpoint_disk_full", "checkpoint_damage", "dataset_kill", "dataset_damage",
             "train_kill", "ros_load"]
    results = {k: KindResult() for k in kinds}
    groups = {"checkpoint": checkpoint_faults, "dataset": dataset_faults, "train": train_faults, "ros": ros_faults}
    rng = random.Random(args.seed)
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="vla-rl-faults-") as tmp:
        for name in args.kinds.split(","):
            t = time.time()
            before = {k: r.seconds for k, r in results.items()}
            groups[name](results, args.n, rng, Path(tmp))
            spent = time.time() - t
            touched = [k for k in kinds if k.startswith(name) or (name == "ros" and k == "ros_load")]
            for k in touched:
                results[k].seconds = before[k] + spent / len(touched)
            print(f"{name}: {spent:.0f} s", flush=True)
    results = {k: r for k, r in results.items() if r.injected}
    text = markdown(results, args.n, time.time() - t0)
    print(text)
    harness.publish("faults", args, text, rows={k: asdict(r) for k, r in results.items()},
                    summary={"n": args.n, "seed": args.seed, "load_average": os.getloadavg()[0]},
                    command=harness.command_line(argv))
    bad = sum(r.files_lost + r.commands_outside_envelope + r.failures for r in results.values())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
