"""How far RL lifts a decent camera + language policy on ``mujoco/pick-any`` (issue 16's ceiling), per seed.

Reads finished runs of the ladder's ``flow-camera`` rung (``vla-rl quickstart`` pre-trained to a >= 0.4 start,
see ``benchmarks/rl_ladder.py``) and continuations of them (``vla-rl train --policy.path <run's final policy>``),
and records per seed the start, the final success on 400 held-out episodes (95% Wilson interval) under the
default evaluation (the ODE from zero noise), env steps, episodes and wall seconds. A run evaluated with random
initial noise (before ``sampler.eval_noise``) is scored again from zero noise on the same held-out episodes
(``benchmarks/quickstart_rescore.py``).

    python benchmarks/rl_ceiling.py --runs runs/ladder/flow-camera-s0/rl runs/ladder/flow-camera-s1/rl \\
        --continued runs/ceiling/s0-cont [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_report import write_section  # noqa: E402
from rl_ladder import curve, episodes, eval_noise, metric_rows  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "rl_ceiling.json"
TARGET_MEDIAN, TARGET_EACH, TARGET_WALL = 0.90, 0.85, 3600


def score(run: Path) -> dict[str, Any]:
    """Start and final success from zero noise of one quickstart-style run (rescored when it used random noise)."""
    report = json.loads((run / "report.json").read_text())
    rows = metric_rows(run)
    points = curve(rows)
    out = {"seed": report["seed"], "run_dir": str(run), "env_steps": points[-1]["env_steps"],
           "episodes": episodes(rows), "wall_s": report.get("wall_seconds"), "sft_steps": report.get("sft_steps"),
           "start_random": None, "final_random": None}
    if eval_noise(report) == "zero":
        out.update(start=points[0]["success"], final=points[-1]["success"],
                   final_ci=[points[-1]["lo"], points[-1]["hi"]])
        return out
    from quickstart_rescore import rescore

    zero = rescore(run, "zero")
    out.update(start=zero["before"], final=zero["after"], final_ci=zero["after_ci"],
               start_random=points[0]["success"], final_random=points[-1]["success"])
    return out


def extend(base: dict[str, Any], cont: Path) -> dict[str, Any]:
    """``base`` continued by the run ``cont`` (``vla-rl train`` from its final policy, evaluated from zero noise)."""
    rows = metric_rows(cont)
    points = curve(rows)
    report = json.loads((cont / "report.json").read_text()) if (cont / "report.json").exists() else {}
    return {**base, "continued": str(cont), "final": points[-1]["success"],
            "final_ci": [points[-1]["lo"], points[-1]["hi"]],
            "env_steps": base["env_steps"] + points[-1]["env_steps"],
            "episodes": base["episodes"] + episodes(rows),
            "wall_s": (base["wall_s"] or 0) + (report.get("wall_seconds") or 0),
            "curve_continued": [(p["env_steps"], p["success"]) for p in points]}


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| seed | start | final [95% CI] | gain | env steps | episodes | wall s (shared machine) | run |",
             "|---:|---:|---|---:|---:|---:|---:|---|"]
    for r in rows:
        lo, hi = r["final_ci"]
        kind = "+ continuation" if r.get("continued") else "ladder run"
        lines.append(f"| {r['seed']} | {r['start']:.3f} | {r['final']:.3f} [{lo:.2f}-{hi:.2f}] | "
                     f"{r['final'] - r['start']:+.3f} | {r['env_steps']:,} | {r['episodes']} | {r['wall_s'] or 0:.0f} | "
                     f"{kind} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=Path, nargs="+", required=True, help="flow-camera run folders (with report.json)")
    ap.add_argument("--continued", type=Path, nargs="*", default=[],
                    help="continuation run folders, matched to --runs by seed")
    ap.add_argument("--write", type=Path, default=None)
    args = ap.parse_args()
    rows = [score(r) for r in args.runs]
    for cont in args.continued:
        seed = json.loads((cont / "report.json").read_text())["seed"] if (cont / "report.json").exists() else None
        i = next(i for i, r in enumerate(rows) if r["seed"] == seed)
        rows.append(extend(rows[i], cont))
    last = {r["seed"]: r for r in rows}  # a continuation (appended after its run) stands for its seed
    finals = sorted(r["final"] for r in last.values())
    meta = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "load_avg_end": os.getloadavg()[0],
            "when": time.strftime("%Y-%m-%d %H:%M"),
            "targets": {"median_final": TARGET_MEDIAN, "each_final": TARGET_EACH, "wall_s": TARGET_WALL},
            "met": bool(finals) and finals[len(finals) // 2] >= TARGET_MEDIAN and finals[0] >= TARGET_EACH}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    tmp = RESULTS.with_suffix(".tmp")
    tmp.write_text(json.dumps({"meta": meta, "results": rows}, indent=1))
    tmp.replace(RESULTS)
    print(table(rows))
    if args.write:
        write_section(args.write, "## RL ceiling on mujoco/pick-any (issue 16)",
                      f"`python benchmarks/rl_ceiling.py` ({meta['when']}; {meta['machine']}, shared with other runs: "
                      f"wall times are not a quiet machine's). Success = 400 held-out episodes, ODE from zero noise, "
                      f"95% Wilson interval. Targets: median >= {TARGET_MEDIAN}, every seed >= {TARGET_EACH}, within "
                      f"{TARGET_WALL // 60} min: {'met' if meta['met'] else 'not met'}.\n\n{table(rows)}\n")


if __name__ == "__main__":
    main()
