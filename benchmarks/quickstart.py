"""``vla-rl quickstart`` end to end for several seeds: success before / after RL and wall time.

    OMP_NUM_THREADS=1 python benchmarks/quickstart.py [--seeds 0 1 2] [-- QUICKSTART ARGS]

Each seed runs the real command (``python -m vla_rl.cli quickstart --seed S``, defaults unless extra
arguments follow ``--``) in a fresh run folder under ``--runs`` and in its own process, one seed after the
other, so its wall time includes demo collection (a per-seed demo cache inside the run folder, i.e. never
reused), pre-training, the RL stage and both evaluations. The targets: every seed finishes in <= 15 min and
gains ``success_after - success_before >= 0.20`` over >= 100 held-out episodes per evaluation, and the mean
success after RL is >= 0.75. A seed whose run folder already holds a ``report.json`` (``--runs`` of an earlier
call) is read, not run again. Published by ``benchmarks/harness.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import harness
import torch

BUDGET_S = 15 * 60
MIN_GAIN = 0.20
MIN_EPISODES = 100
MIN_MEAN_AFTER = 0.75


def run_seed(seed: int, runs: Path, extra: list[str], code: Path = harness.ROOT, run_dir: Path | None = None) -> dict:
    """Run the quickstart for ``seed`` in ``run_dir`` (default ``runs/seed<seed>``) with the code of the checkout
    ``code`` (default this one); return its report plus the measured wall time. A folder that holds a report was
    finished by an earlier call: its report is returned with its own wall time, nothing runs."""
    run_dir = run_dir or runs / f"seed{seed}"
    report = run_dir / "report.json"
    if report.exists():
        rep = json.loads(report.read_text())
        return {**rep, "wall": rep["wall_seconds"]}
    cmd = [sys.executable, "-m", "vla_rl.cli", "quickstart", "--seed", "{seed}", "--run_dir", str(run_dir),
           "--demo_cache", str(run_dir / "demos"), *extra]
    [ran] = harness.run_seeds(cmd, [seed], env={"PYTHONPATH": str(code)}, check=False, cwd=code)
    if ran.returncode != 0 or not report.exists():
        return {"seed": seed, "failed": f"exit code {ran.returncode}", "wall": ran.wall_s}
    return {**json.loads(report.read_text()), "wall": ran.wall_s}


def _ci(lo_hi: list[float]) -> str:
    return f"{lo_hi[0]:.2f}-{lo_hi[1]:.2f}"


def _episodes_gained(r: dict) -> int:
    """Successes after minus before, from the episode counts (0.59 - 0.39 is 20 of 100, not 0.19999...)."""
    n = r["episodes_per_eval"]
    return round(r["success_after"] * n) - round(r["success_before"] * n)


def gain_of(r: dict) -> float:
    """``success_after - success_before``, exact for the episode counts."""
    return _episodes_gained(r) / r["episodes_per_eval"]


def meets_target(r: dict) -> bool:
    """The per-seed target: gain >= MIN_GAIN over >= MIN_EPISODES episodes, within the time budget."""
    n = r["episodes_per_eval"]
    return _episodes_gained(r) >= round(MIN_GAIN * n) and n >= MIN_EPISODES and r["wall"] <= BUDGET_S


def table(rows: list[dict]) -> str:
    lines = [
        "| seed | success before [95% CI] | success after [95% CI] | gain | episodes / eval | wall s | ok |",
        "|---:|---|---|---:|---:|---:|---|",
    ]
    for r in rows:
        if "failed" in r:
            lines.append(f"| {r['seed']} | - | - | - | - | {r['wall']:.0f} | no ({r['failed']}) |")
            continue
        gain, ok = gain_of(r), meets_target(r)
        lines.append(
            f"| {r['seed']} | {r['success_before']:.2f} [{_ci(r['success_before_ci'])}] "
            f"| {r['success_after']:.2f} [{_ci(r['success_after_ci'])}] | {gain:+.2f} | {r['episodes_per_eval']} "
            f"| {r['wall']:.0f} | {'yes' if ok else 'no'} |"
        )
    return "\n".join(lines)


def main() -> None:
    argv, extra = harness.split_passthrough(sys.argv[1:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--runs", type=Path, default=None, help="parent folder of the run folders (default: new)")
    args = harness.add_output_args(parser).parse_args(argv)
    runs = args.runs or harness.ROOT / "runs" / f"bench-quickstart-{time.strftime('%Y%m%d-%H%M%S')}"
    rows = [run_seed(s, runs, extra) for s in args.seeds]
    ok_rows = [r for r in rows if "failed" not in r]
    env_id = ok_rows[0]["config"]["env"]["id"] if ok_rows else "?"
    passed = sum(1 for r in ok_rows if meets_target(r))
    mean_after = sum(r["success_after"] for r in ok_rows) / max(1, len(ok_rows))
    algorithm = ok_rows[0]["algorithm"] if ok_rows else "?"
    body = "\n".join([
        f"`vla-rl quickstart` (defaults{', plus ' + ' '.join(extra) if extra else ''}) on `{env_id}`, one process "
        "per seed, fresh demos each. Success = held-out episodes solved by the deterministic (ODE, zero initial "
        f"noise) policy before and after the RL stage ({algorithm}), same seeds for both; 95% Wilson CI. Wall time "
        f"covers demos, pre-training, RL and both evaluations, each seed alone; torch {torch.__version__}, "
        f"OMP_NUM_THREADS=1, load average {os.getloadavg()[0]:.1f} at the end.",
        "",
        table(rows),
        "",
        f"Target per seed: gain >= {MIN_GAIN:.2f}, >= {MIN_EPISODES} episodes per evaluation, <= {BUDGET_S // 60} "
        f"min wall: met by {passed} of {len(rows)} seeds. Mean success after RL {mean_after:.3f} (target >= "
        f"{MIN_MEAN_AFTER:.2f}: {'met' if mean_after >= MIN_MEAN_AFTER else 'not met'}).",
    ])
    print("\n" + body)
    seeds = [{k: r.get(k) for k in ("seed", "success_before", "success_before_ci", "success_after", "success_after_ci",
                                    "episodes_per_eval", "iterations", "env_steps", "stages", "failed")}
             | {"wall_s": r["wall"], "gain": gain_of(r) if "failed" not in r else None,
                "ok": "failed" not in r and meets_target(r)} for r in rows]
    harness.publish("quickstart", args, body, rows=seeds,
                    summary={"algorithm": algorithm, "env_id": env_id, "mean_after": mean_after, "seeds_met": passed})


if __name__ == "__main__":
    main()
