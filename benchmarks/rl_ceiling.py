"""How far RL lifts a decent camera + language policy on ``mujoco/pick-any``, per seed: the ceiling preset
(``configs/pick_any_ceiling.yaml``: the quickstart pre-trained to a >= 0.4 start, then its RL stage for longer).

The preset runs per seed, one seed after the other, each in its own process and run folder with fresh demos
(``benchmarks/quickstart.py``'s runner: a seed whose folder already holds a ``report.json`` is read, not run
again); runs made otherwise (for example from a copied pre-trained policy, ``vla-rl quickstart --resume true``)
are read with ``--recipe``::

    python benchmarks/rl_ceiling.py --preset pick_any_ceiling --seeds 0 1 2 --out runs/ceiling \\
        [--recipe "LABEL=DIR,DIR,DIR"] [-- QUICKSTART ARGS]

A row gives every evaluation on the way (success on 400 held-out episodes from zero noise, 95% Wilson interval,
against the RL stage's own wall time: the sum of its iterations' ``time/iteration_s``, evaluations included),
the final success and when the run first reached 0.90. Published by ``benchmarks/harness.py``, the plot beside
the page (``img/rl_ceiling.png``).
"""

from __future__ import annotations

import argparse
import json
import sys
from itertools import accumulate
from pathlib import Path
from typing import Any

import harness
from harness import eval_curve as curve
from harness import metric_rows
from quickstart import run_seed
from rl_ladder import episodes

TARGET_MEDIAN, TARGET_EACH, TARGET_WALL = 0.90, 0.85, 3600


def targets_met(finals: list[float]) -> bool:
    """The targets on per-seed final successes: the median seed >= 0.90 and every seed >= 0.85."""
    ranked = sorted(finals)
    return bool(ranked) and ranked[len(ranked) // 2] >= TARGET_MEDIAN and ranked[0] >= TARGET_EACH


def recipe_run(label: str, run: Path, ran_wall: float | None = None) -> dict[str, Any]:
    """One seed of a recipe: its evaluations against RL wall seconds, final success, first time at the target."""
    report = json.loads((run / "report.json").read_text())
    rows = metric_rows(run)
    walls = [w for r, w in zip(rows, accumulate(r.get("time/iteration_s", 0.0) for r in rows)) if "eval/success" in r]
    points = [{**p, "rl_wall_s": w} for p, w in zip(curve(rows), walls)]
    reached = next((p for p in points[1:] if p["success"] >= TARGET_MEDIAN), None)
    return {"recipe": label, "seed": report["seed"], "run_dir": str(run), "start": points[0]["success"],
            "final": points[-1]["success"], "final_ci": [points[-1]["lo"], points[-1]["hi"]],
            "best": max(p["success"] for p in points[1:]), "env_steps": points[-1]["env_steps"],
            "episodes": episodes(rows), "rl_wall_s": points[-1]["rl_wall_s"],
            "wall_s": ran_wall or report.get("wall_seconds"), "sft_steps": report.get("sft_steps"),
            "iterations": report.get("iterations"), "curve": points,
            "reached_target_at": None if reached is None else {"env_steps": reached["env_steps"],
                                                                "rl_wall_s": reached["rl_wall_s"]}}


def recipe_table(rows: list[dict[str, Any]]) -> str:
    marks = sorted({p["env_steps"] for r in rows for p in r["curve"][1:]})
    lines = ["| recipe | seed | start | " + " | ".join(f"{m // 1000}k" for m in marks)
             + " | final [95% CI] | gain | first >= 0.90 (RL min) | RL wall s | run wall s |",
             "|---|---:|---:|" + "---:|" * len(marks) + "---|---:|---:|---:|---:|"]
    for r in rows:
        at = {p["env_steps"]: p["success"] for p in r["curve"][1:]}
        lo, hi = r["final_ci"]
        hit = r["reached_target_at"]
        lines.append(f"| {r['recipe']} | {r['seed']} | {r['start']:.3f} | "
                     + " | ".join(f"{at[m]:.3f}" if m in at else "-" for m in marks)
                     + f" | {r['final']:.3f} [{lo:.2f}-{hi:.2f}] | {r['final'] - r['start']:+.3f} | "
                     + (f"{hit['rl_wall_s'] / 60:.0f}" if hit else "no") + f" | {r['rl_wall_s']:.0f} | "
                     + (f"{r['wall_s']:.0f}" if r.get("wall_s") else "-") + " |")
    return "\n".join(lines)


def recipe_plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for r in rows:
        xs = [p["rl_wall_s"] / 60 for p in r["curve"]]
        ax.plot(xs, [p["success"] for p in r["curve"]], marker="o", ms=3, label=f"{r['recipe']} s{r['seed']}")
        ax.fill_between(xs, [p["lo"] for p in r["curve"]], [p["hi"] for p in r["curve"]], alpha=0.12)
    ax.axhline(TARGET_MEDIAN, color="k", lw=0.8, ls="--")
    ax.axvline(TARGET_WALL / 60, color="k", lw=0.8, ls=":")
    ax.set_xlabel("RL wall time (min)")
    ax.set_ylabel("success (400 held-out, ODE from 0)")
    ax.set_ylim(0.3, 1.0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="", help="run this quickstart preset per --seeds (configs/NAME.yaml)")
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    ap.add_argument("--out", type=Path, default=harness.ROOT / "runs" / "ceiling", help="run folders of --preset")
    ap.add_argument("--label", default="", help="the recipe's name in the tables (default: the preset's)")
    ap.add_argument("--recipe", nargs="*", default=[], help="LABEL=DIR,DIR,...: finished runs of a recipe")
    own, extra = harness.split_passthrough(sys.argv[1:])
    args = harness.add_output_args(ap).parse_args(own)
    recipes = []
    for seed in args.seeds if args.preset else []:  # the quickstart benchmark's runner, with the preset
        ran = run_seed(seed, args.out / args.preset, ["--preset", args.preset, *extra])
        if "failed" in ran:
            raise SystemExit(f"rl_ceiling: the {args.preset} run of seed {seed} failed ({ran['failed']})")
        recipes.append(recipe_run(args.label or args.preset, args.out / args.preset / f"seed{seed}", ran["wall"]))
    for spec in args.recipe:
        label, _, dirs = spec.partition("=")
        recipes += [recipe_run(label, Path(d)) for d in dirs.split(",") if d]
    if not recipes:
        raise SystemExit("rl_ceiling: nothing to measure: give --preset or --recipe")
    by_recipe: dict[str, list[float]] = {}
    for r in recipes:  # a run past the wall budget counts as missing its target
        by_recipe.setdefault(r["recipe"], []).append(r["final"] if r["rl_wall_s"] <= TARGET_WALL else 0.0)
    met = {k: len(v) >= 3 and targets_met(v) for k, v in by_recipe.items()}
    print(recipe_table(recipes))
    recipe_plot(recipes, Path(args.page).parent / "img" / "rl_ceiling.png")
    body = (f"Success = 400 held-out episodes, ODE from zero noise, 95% Wilson interval. Targets: median seed >= "
            f"{TARGET_MEDIAN}, every seed >= {TARGET_EACH}, within {TARGET_WALL // 60} min of RL: "
            + ", ".join(f"{k}: {'met' if v else 'not met'}" for k, v in met.items())
            + f".\n\n{recipe_table(recipes)}\n\n![ceiling](img/rl_ceiling.png)")
    harness.publish("rl_ceiling", args, body, rows=recipes,
                    summary={"targets": {"median_final": TARGET_MEDIAN, "each_final": TARGET_EACH,
                                         "wall_s": TARGET_WALL}, "met": met})


if __name__ == "__main__":
    main()
