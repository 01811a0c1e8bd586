"""RL recipes side by side from the same pre-trained policies: success before / after, per seed, on 400 held-out
episodes (the ODE from zero noise, the default evaluation), with what each run cost.

Every run is a ``vla-rl quickstart`` run folder whose pre-trained policy (``sft_policy/``) was copied in from an
earlier quickstart of the same seed, then resumed with the recipe's overrides, so all recipes of a seed start
from the same weights and play the same held-out episodes::

    mkdir -p runs/fbc-s1 && cp -r runs/quickstart-s1/sft_policy runs/fbc-s1/
    vla-rl quickstart --seed 1 --run_dir runs/fbc-s1 --resume true --algo.type filtered_bc \\
        --policy.sampler.explore_noise zero

A run stopped early (no ``eval_after.json``) is listed with its last evaluation, or its rollouts' success at the
start and at the end. Published by ``benchmarks/harness.py``::

    python benchmarks/rl_recipes.py --run "ppo (default)=runs/quickstart-s1" --run "filtered_bc=runs/fbc-s1"
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import harness
from harness import eval_curve as curve
from harness import metric_rows

DIAGNOSTICS = ("update/approx_kl", "update/clip_fraction", "update/explained_variance")


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def score(label: str, run: Path) -> dict[str, Any]:
    """One run's row: seed, start / final success (zero-noise ODE, 400 held-out episodes) or, for a run stopped
    early, its rollouts' success at the start and the end; env steps, iterations, wall seconds, PPO diagnostics."""
    rows = metric_rows(run)
    report = json.loads((run / "report.json").read_text()) if (run / "report.json").exists() else {}
    config = {}
    ckpts = sorted((run / "checkpoints").glob("iter_*/config.json"))
    if ckpts:
        config = json.loads(ckpts[-1].read_text())
    train = [r for r in rows if "rollout/success" in r]
    out: dict[str, Any] = {
        "label": label, "run_dir": str(run), "seed": report.get("seed", config.get("seed")),
        "algorithm": report.get("algorithm", (config.get("algo") or {}).get("type")),
        "iterations": len(train), "env_steps": train[-1]["step"] if train else 0,
        "wall_s": report.get("wall_seconds"),
        "rollout_success_first20": _mean([r["rollout/success"] for r in train[:20]]),
        "rollout_success_last20": _mean([r["rollout/success"] for r in train[-20:]]),
        **{k.split("/")[1]: _mean([r[k] for r in train if k in r]) for k in DIAGNOSTICS},
    }
    if (run / "eval_after.json").exists():
        before = json.loads((run / "eval_before.json").read_text())
        after = json.loads((run / "eval_after.json").read_text())
        out.update(start=before["success_rate"], final=after["success_rate"],
                   final_ci=[after["ci_low"], after["ci_high"]], episodes=after["episodes"], scored="run's own evals")
    elif len(points := curve(rows)) >= 2:  # stopped early after evaluating on the way: its last evaluation
        out.update(start=points[0]["success"], final=points[-1]["success"],
                   final_ci=[points[-1]["lo"], points[-1]["hi"]], episodes=report.get("episodes_per_eval"),
                   scored=f"stopped early; last evaluation at {points[-1]['env_steps']:,} env steps",
                   curve=points)
    else:
        out.update(start=None, final=None, final_ci=None, episodes=0, scored="stopped early")
    return out


def _f(x: float | None, fmt: str = ".3f") -> str:
    return "-" if x is None else format(x, fmt)


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| recipe | seed | start | after [95% CI] | gain | iterations | env steps | rollout success first / last 20 it "
             "| approx KL | clip frac | expl. var. | wall s |",
             "|---|---:|---:|---|---:|---:|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        ci = f" [{r['final_ci'][0]:.2f}-{r['final_ci'][1]:.2f}]" if r["final_ci"] else " (stopped)"
        if r["final_ci"] and r["scored"].startswith("stopped early"):
            ci += f" at {r['curve'][-1]['env_steps']:,}"
        gain = _f(r["final"] - r["start"], "+.3f") if r["final"] is not None else "-"
        lines.append(
            f"| {r['label']} | {r['seed']} | {_f(r['start'])} | {_f(r['final'])}{ci} | {gain} | {r['iterations']} | "
            f"{r['env_steps']:,} | {_f(r['rollout_success_first20'], '.2f')} / {_f(r['rollout_success_last20'], '.2f')} | "
            f"{_f(r['approx_kl'], '.1e')} | {_f(r['clip_fraction'], '.3f')} | {_f(r['explained_variance'], '.2f')} | "
            f"{_f(r['wall_s'], '.0f')} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", action="append", required=True, help="LABEL=RUN_DIR (repeat)")
    args = harness.add_output_args(ap).parse_args()
    rows = []
    for item in args.run:
        label, sep, path = item.partition("=")
        if not sep:
            raise SystemExit(f"--run expects LABEL=RUN_DIR, got {item!r}")
        rows.append(score(label, Path(path)))
    body = table(rows)
    print(body)
    intro = ("Same pre-trained policy per seed (a quickstart run's `sft_policy/`), 200 iterations of 32 envs x 6 "
             "decisions, 400 held-out episodes scored from zero noise. A run stopped early after evaluating on the "
             "way shows its last evaluation and when it was.\n\n")
    harness.publish("rl_recipes", args, intro + body, rows=rows)


if __name__ == "__main__":
    main()
