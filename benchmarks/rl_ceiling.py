"""How far RL lifts a decent camera + language policy on ``mujoco/pick-any`` (issue 16's ceiling), per seed.

Reads finished runs of the ladder's ``flow-camera`` rung (``vla-rl quickstart`` pre-trained to a >= 0.4 start,
see ``benchmarks/rl_ladder.py``) and continuations of them (``vla-rl train --policy.path <run's final policy>``),
and records per seed the start, the final success on 400 held-out episodes (95% Wilson interval) under the
default evaluation (the ODE from zero noise), env steps, episodes and wall seconds. A run evaluated with random
initial noise (before ``sampler.eval_noise``) is scored again from zero noise on the same held-out episodes
(``benchmarks/quickstart_rescore.py``).

    python benchmarks/rl_ceiling.py --runs runs/ladder/flow-camera-s0/rl runs/ladder/flow-camera-s1/rl \\
        --continued runs/ceiling/s0-cont [--write docs/benchmarks.md]

The ceiling preset (``configs/pick_any_ceiling.yaml``: the quickstart pre-trained to a >= 0.4 start, then its RL
stage for longer) runs per seed with ``--preset``, one seed after the other, each in its own process and run
folder with fresh demos (``benchmarks/quickstart.py``'s runner: a seed whose folder already holds a
``report.json`` is read, not run again); runs made otherwise (for
example from a copied pre-trained policy, ``vla-rl quickstart --resume true``) are read with ``--recipe``:

    python benchmarks/rl_ceiling.py --runs ... --preset pick_any_ceiling --seeds 0 1 2 --out runs/ceiling \\
        [--recipe "LABEL=DIR,DIR,DIR"] [--write docs/benchmarks.md] [-- QUICKSTART ARGS]

A recipe row gives every evaluation on the way (success against the RL stage's own wall time, the sum of its
iterations' ``time/iteration_s``, evaluations included), the final success and when the run first reached 0.90.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from itertools import accumulate
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_report import split_passthrough, write_json, write_section  # noqa: E402
from quickstart import run_seed  # noqa: E402
from rl_ladder import curve, episodes, eval_noise, metric_rows  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "rl_ceiling.json"
PLOT = ROOT / "docs" / "img" / "rl_ceiling.png"
TARGET_MEDIAN, TARGET_EACH, TARGET_WALL = 0.90, 0.85, 3600


def met_line(meta: dict[str, Any]) -> str:
    """Which measured recipes meet the targets (the ladder's own runs first)."""
    met = [k for k, v in meta.get("recipes_met", {}).items() if v]
    ladder = "met by the ladder's runs" if meta["met"] else "not met by the ladder's runs"
    return f"{ladder}; met by {', '.join(met)}" if met else f"{ladder} nor by any recipe below"


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


def targets_met(finals: list[float]) -> bool:
    """Issue 16's targets on per-seed final successes: the median seed >= 0.90 and every seed >= 0.85."""
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
    ap.add_argument("--runs", type=Path, nargs="*", default=None,
                    help="flow-camera run folders (with report.json); omitted: keep the ladder rows already in "
                         "benchmarks/results/rl_ceiling.json")
    ap.add_argument("--continued", type=Path, nargs="*", default=[],
                    help="continuation run folders, matched to --runs by seed")
    ap.add_argument("--preset", default="", help="run this quickstart preset per --seeds (configs/NAME.yaml)")
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "ceiling", help="run folders of --preset")
    ap.add_argument("--label", default="", help="the recipe's name in the tables (default: the preset's)")
    ap.add_argument("--recipe", nargs="*", default=[], help="LABEL=DIR,DIR,...: finished runs of a recipe")
    ap.add_argument("--write", type=Path, default=None)
    ap.add_argument("--notes", type=Path, default=None, help="markdown appended under the tables (the reading)")
    own, extra = split_passthrough(sys.argv[1:])
    args = ap.parse_args(own)
    recipes = []
    for seed in args.seeds if args.preset else []:  # the quickstart benchmark's runner, with the preset
        ran = run_seed(seed, args.out / args.preset, ["--preset", args.preset, *extra])
        if "failed" in ran:
            raise SystemExit(f"rl_ceiling: the {args.preset} run of seed {seed} failed ({ran['failed']})")
        recipes.append(recipe_run(args.label or args.preset, args.out / args.preset / f"seed{seed}", ran["wall"]))
    for spec in args.recipe:
        label, _, dirs = spec.partition("=")
        recipes += [recipe_run(label, Path(d)) for d in dirs.split(",") if d]
    earlier = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    # recipe rows of earlier runs stay beside the new ones (a recipe and seed measured again replaces its row), so
    # one table compares every recipe measured, whichever run folders this machine still has
    fresh = {(r["recipe"], r["seed"]) for r in recipes}
    recipes = [r for r in earlier.get("recipes", []) if (r["recipe"], r["seed"]) not in fresh] + recipes
    rows = [score(r) for r in args.runs] if args.runs is not None else list(earlier.get("results", []))
    for cont in args.continued if args.runs is not None else []:
        seed = json.loads((cont / "report.json").read_text())["seed"] if (cont / "report.json").exists() else None
        i = next(i for i, r in enumerate(rows) if r["seed"] == seed)
        rows.append(extend(rows[i], cont))
    last = {r["seed"]: r for r in rows}  # a continuation (appended after its run) stands for its seed
    finals = sorted(r["final"] for r in last.values())
    meta = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "load_avg_end": os.getloadavg()[0],
            "when": time.strftime("%Y-%m-%d %H:%M"),
            "targets": {"median_final": TARGET_MEDIAN, "each_final": TARGET_EACH, "wall_s": TARGET_WALL},
            "met": targets_met(finals)}
    by_recipe: dict[str, list[float]] = {}
    for r in recipes:  # a run past the wall budget counts as missing its target
        by_recipe.setdefault(r["recipe"], []).append(r["final"] if r["rl_wall_s"] <= TARGET_WALL else 0.0)
    meta["recipes_met"] = {k: len(v) >= 3 and targets_met(v) for k, v in by_recipe.items()}
    write_json(RESULTS, {"meta": meta, "results": rows, "recipes": recipes})
    print(table(rows))
    if recipes:
        print(recipe_table(recipes))
        recipe_plot(recipes, PLOT)
    if args.write:
        write_section(args.write, "## RL ceiling on mujoco/pick-any (issue 16)",
                      f"`python benchmarks/rl_ceiling.py` ({meta['when']}; {meta['machine']}, shared with other runs: "
                      f"wall times are not a quiet machine's). Success = 400 held-out episodes, ODE from zero noise, "
                      f"95% Wilson interval. Targets: median >= {TARGET_MEDIAN}, every seed >= {TARGET_EACH}, within "
                      f"{TARGET_WALL // 60} min: {met_line(meta)}.\n\n{table(rows)}\n"
                      + (f"\nRecipes (targets met within {TARGET_WALL // 60} min of RL: "
                         + ", ".join(f"{k}: {'yes' if v else 'no'}" for k, v in meta["recipes_met"].items())
                         + f"):\n\n{recipe_table(recipes)}\n\n![ceiling](img/rl_ceiling.png)\n" if recipes else "")
                      + ("\n" + args.notes.read_text() if args.notes is not None else ""))


if __name__ == "__main__":
    main()
