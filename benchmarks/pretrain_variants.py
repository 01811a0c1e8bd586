"""Pre-training variants on ``mujoco/pick-any`` side by side: what each change to the camera + language policy or
its imitation stage does to success on 400 held-out episodes before any RL (issue 16: where the wrong-cube
failures come from).

Each variant is a ``vla-rl quickstart`` run that stops after pre-training (``--iterations 0``), for example::

    vla-rl quickstart --preset pick_any_ceiling --seed 0 --iterations 0 --run_dir runs/pre/wide \\
        --policy.cnn_channels "[32,64,128]" --sft.steps 2000

then this script reads the runs' reports (success from zero noise with its 95% Wilson interval, pre-training
steps and wall seconds) and tables them::

    python benchmarks/pretrain_variants.py --run "LABEL=RUN_DIR" [...] [--notes FILE] [--write docs/benchmarks.md]

Numbers: ``benchmarks/results/pretrain_variants.json`` (rows of other labels already there are kept).
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
from bench_report import write_json, write_section  # noqa: E402

SECTION = "## Pre-training variants on mujoco/pick-any (issue 16)"
RESULTS = Path(__file__).resolve().parent / "results" / "pretrain_variants.json"


def read_run(label: str, run: Path) -> dict[str, Any]:
    """One variant's row from its run folder's ``report.json``."""
    path = run / "report.json"
    if not path.is_file():
        raise SystemExit(f"pretrain_variants: --run {label}={run}: no report.json there (has the run finished?)")
    r = json.loads(path.read_text())
    return {"label": label, "run_dir": str(run), "seed": r["seed"], "demos": r["demos"], "sft_steps": r["sft_steps"],
            "success": r["success_before"], "ci": r["success_before_ci"], "episodes": r["episodes_per_eval"],
            "pretrain_s": r.get("stages", {}).get("pretrain"), "wall_s": r.get("wall_seconds")}


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| variant | seed | demos | pre-training steps | success [95% CI] | episodes | pre-training s |",
             "|---|---:|---:|---:|---|---:|---:|"]
    for r in rows:
        lo, hi = r["ci"]
        pre = f"{r['pretrain_s']:.0f}" if r.get("pretrain_s") is not None else "-"
        lines.append(f"| {r['label']} | {r['seed']} | {r['demos']} | {r['sft_steps']} | {r['success']:.3f} "
                     f"[{lo:.2f}-{hi:.2f}] | {r['episodes']} | {pre} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", action="append", required=True, help="LABEL=RUN_DIR (repeat)")
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--notes", type=Path, default=None, help="markdown appended under the table (the reading)")
    ap.add_argument("--write", type=Path, default=None, help="markdown file whose section to replace")
    args = ap.parse_args()
    new = []
    for spec in args.run:
        label, sep, run = spec.partition("=")
        if not sep:
            raise SystemExit(f"pretrain_variants: --run {spec!r}: expected LABEL=RUN_DIR")
        new.append(read_run(label, Path(run)))
    old = json.loads(args.results.read_text())["results"] if args.results.exists() else []
    labels = {r["label"] for r in new}
    rows = [r for r in old if r["label"] not in labels] + new
    meta = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "when": time.strftime("%Y-%m-%d %H:%M")}
    write_json(args.results, {"meta": meta, "results": rows})
    print(table(rows))
    if args.write:
        notes = args.notes.read_text() if args.notes else ""
        write_section(args.write, SECTION,
                      f"`python benchmarks/pretrain_variants.py` ({meta['when']}; {meta['machine']}, shared by 2 runs "
                      f"at a time, so the seconds are contended). Each row: `vla-rl quickstart --preset "
                      f"pick_any_ceiling --iterations 0` with the variant's overrides, success of the pre-trained "
                      f"policy on the quickstart's 400 held-out episodes (ODE from zero noise).\n\n{table(rows)}\n\n"
                      f"{notes}")


if __name__ == "__main__":
    main()
