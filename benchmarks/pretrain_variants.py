"""Pre-training variants on ``mujoco/pick-any`` side by side: what each change to the camera + language policy or
its imitation stage does to success on 400 held-out episodes before any RL.

Each variant is a ``vla-rl quickstart`` run that stops after pre-training (``--iterations 0``), for example::

    vla-rl quickstart --preset pick_any_ceiling --seed 0 --iterations 0 --run_dir runs/pre/wide \\
        --policy.cnn_channels "[32,64,128]" --sft.steps 2000

then this script reads the runs' reports (success from zero noise with its 95% Wilson interval, pre-training
steps and wall seconds) and publishes them (``benchmarks/harness.py``)::

    python benchmarks/pretrain_variants.py --run "LABEL=RUN_DIR" [...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import harness


def read_run(label: str, run: Path) -> dict[str, Any]:
    """One variant's row from its run folder's ``report.json``."""
    path = run / "report.json"
    if not path.is_file():
        raise SystemExit(f"pretrain_variants: --run {label}={run}: no report.json there (has the run finished?)")
    r = json.loads(path.read_text())
    return {"label": label, "run_dir": str(run), "seed": r["seed"], "demos": r["demos"], "sft_steps": r["sft_steps"],
            "success": r["success_before"], "ci": r["success_before_ci"], "episodes": r["episodes_per_eval"],
            "pretrain_s": r["stages"]["pretrain"], "wall_s": r["wall_seconds"]}


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| variant | seed | demos | pre-training steps | success [95% CI] | episodes | pre-training s |",
             "|---|---:|---:|---:|---|---:|---:|"]
    for r in rows:
        lo, hi = r["ci"]
        pre = f"{r['pretrain_s']:.0f}"
        lines.append(f"| {r['label']} | {r['seed']} | {r['demos']} | {r['sft_steps']} | {r['success']:.3f} "
                     f"[{lo:.2f}-{hi:.2f}] | {r['episodes']} | {pre} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", action="append", required=True, help="LABEL=RUN_DIR (repeat)")
    args = harness.add_output_args(ap).parse_args()
    rows = []
    for spec in args.run:
        label, sep, run = spec.partition("=")
        if not sep:
            raise SystemExit(f"pretrain_variants: --run {spec!r}: expected LABEL=RUN_DIR")
        rows.append(read_run(label, Path(run)))
    print(table(rows))
    text = ("Each row: `vla-rl quickstart --preset pick_any_ceiling --iterations 0` with the variant's overrides, "
            "success of the pre-trained policy on the quickstart's 400 held-out episodes (ODE from zero noise).\n\n"
            + table(rows))
    harness.publish("pretrain_variants", args, text, rows=rows)


if __name__ == "__main__":
    main()
