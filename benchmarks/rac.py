"""RaC vs more demos vs DAgger-style corrections at equal operator steps, on ``mujoco/pick-place-stack``.

    OMP_NUM_THREADS=1 python benchmarks/rac.py [--seeds 0 1 2] [--eval-episodes 400] [--budget 3600]

Per seed, from one pre-trained policy, the quickstart's recipe on this task (``vla-rl quickstart --env.id
mujoco/pick-place-stack --iterations 0``: the compact flow policy on the front and wrist cameras, pre-trained on
``--demos`` noisy scripted-expert episodes for ``--pretrain-steps``, 6000: at 3000 the arms mostly made up for
under-training), the first three arms spend the same operator budget
(``--budget`` env steps controlled by the operator; the demos arm as expert episodes, the last one cut at the
budget) and the same number of gradient steps:

- ``rac``: ``--rounds`` rounds of the RaC learner (``--algo.type rac``): the current policy runs with the
  simulated operator (recovery, then correction; :mod:`vla_rl.intervention.operator`) until the round's share
  of the budget is spent, then fine-tunes on the demos mixed 1:1 with every intervention segment so far
  (policy steps masked);
- ``dagger``: the same with ``operator.recover=False`` (corrections without recovery);
- ``demos``: the budget spent on full scripted-expert episodes (the last one cut where the budget ends), fine-tuned
  the same way (the new demos in place of the intervention data);
- ``rac_third``: RaC rounds on a third of the budget (the other test: RaC matching the demos arm with at
  most a third of its operator steps), the same gradient steps.

Asked for with ``--arms`` (not run by default), two controls: ``control``, the same gradient steps on the pre-training
demos alone (what more training gives without operator data), and ``demos_pooled``, the demos arm's new episodes
pooled with the pre-training's so every frame is drawn alike (the demos arm mixes them 1:1, so a few new episodes
fill half of every batch).

With ``--draws N`` every arm is trained N times from the same pre-trained policy, each draw with its own
collection and training seeds (draw 0 keeps the seeds of a single-draw run, so its results stay valid), and its
success is pooled over the draws' N x ``--eval-episodes`` episodes: one draw of 1500 gradient steps moves an arm by
as much as 0.1, as much as the arms differ, so comparing data sources on one
draw each compares training noise too.

Each final policy (and the pre-trained one) is evaluated on ``--eval-episodes`` held-out episodes
(deterministic, seeds disjoint from everything else), with 95% Wilson intervals; and, for the test-time
scaling plot, every arm's policy runs ``--scaling-episodes`` episodes alone while its own recovery
manoeuvres are counted (:func:`vla_rl.intervention.operator.count_recoveries`): success against the number of
recoveries per episode. The same episodes record the furthest task stage each reached, so the report says where a
policy's failures stop (``reach`` .. ``stack``). Each arm's fine-tuned policy is kept in
``<work>/s<seed>/arms/<arm>/policy`` (loadable with :func:`policies.loading.load_policy`). A seed is published once
the arms of one of the two tests are done (``rac``, ``dagger`` and ``demos``; or ``rac_third`` and ``demos``),
with the arms every published seed has: a check on more seeds can run only the arms of one test. Seeds are pooled
with equal weight; where every seed has two draws or more, a second interval counts the spread between draws too
(:func:`draw_interval`). Published by ``benchmarks/harness.py`` (per seed and arm: operator steps, success with
interval, wall seconds), the test-time scaling plot beside the page (``img/rac_scaling.png``).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import itertools
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import harness
import torch

from policies.base import ActMode
from policies.loading import load_policy
from sim.mujoco_tasks.tasks import STAGES
from vla_rl.algorithms.base import IterationInputs
from vla_rl.algorithms.rac import RaCLearner, RaCLearnerConfig
from vla_rl.config import EnvConfig
from vla_rl.data import check_inputs, collect_demos, dataset_spec, load_policy_chunks, policy_inputs
from vla_rl.evaluation import evaluate_policy, wilson_interval
from vla_rl.intervention.operator import CORRECT_FROM, OperatorConfig
from vla_rl.intervention.session import PassiveController, run_session, tabletop_progress
from vla_rl.rollout import RolloutEngine

ENV_ID = "mujoco/pick-place-stack"
ROOT = harness.ROOT
EVAL_SEED = 9_000_000  # held-out episodes: far from demo, round and scaling seeds
ARMS = ("rac", "dagger", "demos", "rac_third")
CONTROLS = ("control", "demos_pooled")  # run only when asked for (--arms); reported when every seed has them
ROUND_ARMS = ("rac", "dagger", "rac_third")
ALL_ARMS = (*ARMS, *CONTROLS)
# the two tests and the arms each needs: a seed is published once the arms of one of them are done
TESTS = {"equal": ("rac", "demos", "dagger"), "third": ("rac_third", "demos")}
ARM_SETTINGS = ("budget", "rounds", "finetune_steps", "batch", "lr", "warmup", "ema", "envs", "reaction_delay",
                "operator_noise", "correct_from", "eval_episodes")  # what an arm's result depends on
DRAW_SEEDS = 100_000  # a training draw's seeds are its draw 0's plus draw x this (far from every seed range above)


def make_env(num_envs: int, seed: int) -> Any:
    """The task as the quickstart's recipe sees it: rendered front and wrist cameras."""
    return EnvConfig(id=ENV_ID, num_envs=num_envs, obs_mode="rgb", wrist_camera=True).make(seed=seed)


def pretrain(seed: int, args: argparse.Namespace, work: Path) -> tuple[Any, Path]:
    """The quickstart's pre-trained policy on the task (demos cached in ``work/demos``) and its demo dataset."""
    run_dir = work / "pretrain"
    if not (run_dir / "sft_policy" / "config.json").exists():
        cmd = [sys.executable, "-m", "vla_rl.cli", "quickstart", "--env.id", ENV_ID, "--iterations", "0",
               "--demos", str(args.demos), "--sft.episodes", str(args.demos), "--sft.steps", str(args.pretrain_steps),
               "--eval_episodes", "1", "--seed", str(seed), "--run_dir", str(run_dir),
               "--demo_cache", str(work / "demos"), "--logging.wandb", "false",
               *(["--resume", "true"] if run_dir.exists() else [])]
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    report = run_dir / "report.json"
    if report.exists():  # a kept pre-training is reused only if it is the one asked for
        made = json.loads(report.read_text())
        if (made.get("sft_steps"), made.get("sft_episodes")) != (args.pretrain_steps, args.demos):
            raise SystemExit(f"{report}: pre-trained with {made.get('sft_steps')} steps on {made.get('sft_episodes')} "
                             f"demos, but --pretrain-steps {args.pretrain_steps} --demos {args.demos} were asked for; "
                             "pass those or another --work")
    demos = [d for d in sorted((work / "demos").glob(f"*-n{args.demos}-*-s{seed}")) if d.is_dir()]
    if not demos:
        raise FileNotFoundError(f"no demo dataset for seed {seed} under {work / 'demos'}")
    return load_policy(run_dir / "sft_policy"), demos[0]


def draw_name(arm: str, draw: int) -> str:
    """The arm's files and folder for a training draw: ``rac``, ``rac-d1``, ``rac-d2``..."""
    return arm if draw == 0 else f"{arm}-d{draw}"


def finetune(policy: Any, arm: str, args: argparse.Namespace, seed: int, demos: Path, work: Path,
             draw: int = 0) -> dict[str, Any]:
    """Spend the arm's operator budget and fine-tune ``policy`` in place; returns the arm's counts. ``draw`` > 0
    moves every collection seed (operator rounds, extra demos) to a range of its own."""
    t0 = time.perf_counter()
    shift = DRAW_SEEDS * draw
    arm_dir = work / "arms" / draw_name(arm, draw)  # apart from the pre-training's demo cache (work/demos)
    if arm_dir.exists():  # left by a run of this arm that did not finish (its result file is missing): the
        print(f"removing {arm_dir}, an unfinished run's", flush=True)  # learner would reload its stale rounds
        shutil.rmtree(arm_dir)
    env = make_env(args.envs, seed * 1000 + 500 + shift)
    rounds = args.rounds if arm in ROUND_ARMS else 1
    budget = math.ceil(args.budget / 3) if arm == "rac_third" else args.budget
    steps = args.finetune_steps // rounds
    cfg = RaCLearnerConfig(
        steps=args.finetune_steps, steps_per_iter=steps, batch_size=args.batch, lr=args.lr, ema=args.ema,
        warmup_steps=args.warmup,
        demos=str(demos), demo_ratio=0.5, episodes_per_round=100_000 if arm in ROUND_ARMS else 0, iters_per_round=1,
        round_operator_steps=math.ceil(budget / rounds), rounds_dir=str(arm_dir / "rounds"),
        operator=OperatorConfig(recover=arm.startswith("rac"), reaction_delay=args.reaction_delay,
                                action_noise=args.operator_noise, correct_from=args.correct_from),
    )
    data = None
    operator_steps: dict[str, int] = {"recovery": 0, "correction": 0}
    if arm in ("demos", "demos_pooled"):  # whole expert episodes, the last one cut at the budget: the budget's steps
        extra = arm_dir / "extra-demos"
        got = collect_demos(env, extra, args.budget, "local/rac-bench-extra", seed=seed + 77 + shift,
                            max_frames=args.budget)
        operator_steps["correction"] = got["frames"]
        data = load_policy_chunks(extra, policy)
        if arm == "demos_pooled":  # the new episodes pooled with the pre-training's: every frame drawn alike
            old = dataset_spec(demos).frames
            cfg = dataclasses.replace(cfg, demo_ratio=old / (old + got["frames"]))
    elif arm == "control":  # no operator data: the same gradient steps on the pre-training demos alone
        data = load_policy_chunks(demos, policy)
    learner = RaCLearner(cfg, policy)
    engine = RolloutEngine(env, policy, 0)
    for it in range(rounds):
        batches = learner.collect(IterationInputs(iteration=it, seed_base=seed * 1000 + 100 * it + shift, reset=True,
                                                  engine=engine if arm in ROUND_ARMS else None, data=data))
        learner.update(batches)
    env.close()
    for r in learner.round_stats:
        operator_steps["recovery"] += r["steps"]["recovery"]
        operator_steps["correction"] += r["steps"]["correction"]
    policy.eval()
    return {"operator_steps": operator_steps["recovery"] + operator_steps["correction"],
            "recovery_steps": operator_steps["recovery"], "correction_steps": operator_steps["correction"],
            "takeover_episodes": sum(r["takeovers"] for r in learner.round_stats),
            "finetune_wall_s": time.perf_counter() - t0}


def evaluate(policy: Any, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    env = make_env(args.envs, EVAL_SEED + seed)
    res = evaluate_policy(env, policy, args.eval_episodes, EVAL_SEED + seed, desc="eval")
    env.close()
    out = {"episodes": res.episodes, "success": res.success_rate, "ci": [res.ci_low, res.ci_high],
           "eval_wall_s": time.perf_counter() - t0}
    if args.scaling_episodes:
        out.update(alone(policy, args, seed))
    return out


def alone(policy: Any, args: argparse.Namespace, seed: int) -> dict[str, list]:
    """``--scaling-episodes`` episodes the policy plays alone: per episode ``recoveries``, ``(recovery manoeuvres,
    success)``, and ``furthest_stage``, the most task stages held at once (all of them when it succeeded)."""
    env = make_env(args.envs, EVAL_SEED // 2 + seed)

    def act(obs: dict) -> torch.Tensor:
        return policy.act(obs, ActMode.EVAL).actions

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        stats = run_session(env, act, [PassiveController() for _ in range(args.envs)], args.scaling_episodes,
                            EVAL_SEED // 2 + seed, progress_of=tabletop_progress, progress=False)
    env.close()
    top = len(STAGES["sequence"])
    return {"recoveries": list(zip(stats.recoveries, stats.outcomes)),
            "furthest_stage": [top if ok else f for f, ok in zip(stats.furthest, stats.outcomes)]}


def run_seed(seed: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """The seed's pre-trained policy and the arms of ``--arms`` (with its evaluation, ``base``), each kept in
    ``work/<arm>.json`` (a later draw in ``work/<arm>-d<k>.json``) once done, so arms of one seed can run in
    separate processes and a killed run resumes. Returns every arm found done, its draws combined."""
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    base, demos = pretrain(seed, args, work)
    spec = dataset_spec(demos)  # the metadata: the learner reads the frames itself
    check_inputs(spec, policy_inputs(base))
    base.eval()
    out: dict[str, Any] = {"seed": seed, "demo_frames": spec.frames, "pretrain_wall_s": time.perf_counter() - t0}
    base_file = work / "base.json"
    kept = kept_row(base_file, args) if base_file.exists() else None
    if "base" in args.arms and kept is None:
        kept = {**evaluate(base, args, seed), "settings": settings(args)}
        _write_json(base_file, kept)
    elif "base" in args.arms and args.scaling_episodes and "furthest_stage" not in kept:
        kept.update(alone(base, args, seed))  # evaluated without (some of) the scaling episodes: add only those
        _write_json(base_file, kept)
    if kept is not None:
        out["base"] = kept
        print(f"seed {seed}: pre-trained success {kept['success']:.3f}", flush=True)
    for arm in ALL_ARMS:
        rows = []
        for draw in itertools.count():  # every draw kept, then (for an arm asked for) the missing ones up to --draws
            path = work / f"{draw_name(arm, draw)}.json"
            if path.exists():
                rows.append(kept_row(path, args))
                continue
            if arm not in args.arms or draw >= args.draws:
                break
            policy = copy.deepcopy(base)
            policy.train()
            torch.manual_seed(seed * 10 + ALL_ARMS.index(arm) + DRAW_SEEDS * draw)
            row = finetune(policy, arm, args, seed, demos, work, draw)
            policy.save_pretrained(work / "arms" / draw_name(arm, draw) / "policy")  # kept for a later look
            row.update(evaluate(policy, args, seed))
            row["wall_s"] = row["finetune_wall_s"] + row["eval_wall_s"]
            row["settings"] = settings(args)
            rows.append(row)
            _write_json(path, row)
            print(f"seed {seed} {draw_name(arm, draw)}: operator steps {row['operator_steps']}, success "
                  f"{row['success']:.3f} [{row['ci'][0]:.3f}, {row['ci'][1]:.3f}]", flush=True)
        if rows:
            out[arm] = combine(rows)
    return out


def settings(args: argparse.Namespace) -> dict[str, Any]:
    return {k: getattr(args, k) for k in ARM_SETTINGS}


def kept_row(path: Path, args: argparse.Namespace) -> dict[str, Any]:
    """A finished arm's (or the base's) result, refused when it was made with other settings than asked for (a
    rerun with ``--lr 3e-4`` in the same ``--work`` would otherwise report the old rate's arms)."""
    row = json.loads(path.read_text())
    made = row["settings"]
    keys = ARM_SETTINGS if "operator_steps" in row else ("envs", "eval_episodes")  # the base: its evaluation's
    differ = [f"{k} {made[k]} (asked: {getattr(args, k)})" for k in keys if made[k] != getattr(args, k)]
    if differ:
        raise SystemExit(f"{path}: made with " + ", ".join(differ) + "; pass those or another --work")
    return row


def combine(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """An arm's training draws as one row: success pooled over every draw's episodes (the interval counts
    episodes, not the spread between draws, which ``draws`` keeps), operator steps averaged, wall times summed."""
    if len(rows) == 1:
        return rows[0]
    out = pooled_success(rows)
    for key in ("operator_steps", "recovery_steps", "correction_steps", "takeover_episodes"):
        out[key] = round(sum(r[key] for r in rows) / len(rows))
    for key in ("finetune_wall_s", "eval_wall_s", "wall_s"):
        out[key] = sum(r[key] for r in rows)
    for key in ("recoveries", "furthest_stage"):
        if any(key in r for r in rows):
            out[key] = [x for r in rows for x in r.get(key, [])]
    out["draws"] = [{key: r[key] for key in ("success", "ci", "operator_steps")} for r in rows]
    if "settings" in rows[0]:
        out["settings"] = rows[0]["settings"]
    return out


def n_draws(row: dict[str, Any]) -> int:
    return len(row.get("draws", [row]))


def pooled_success(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Success over all of ``rows``' evaluation episodes (each row: ``success``, ``episodes``), Wilson interval."""
    n = sum(r["episodes"] for r in rows)
    k = sum(round(r["success"] * r["episodes"]) for r in rows)
    lo, hi = wilson_interval(k, n)
    return {"success": k / max(1, n), "ci": [lo, hi], "episodes": n}


def seed_pooled(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Success over seeds (each row: one seed's ``success`` over its ``episodes``, all its draws), every seed weighing
    the same whatever its number of draws: a seed with two draws would otherwise count twice. The Wilson interval is
    taken at the effective sample size of an equal-weight mean, ``S^2 / sum(1 / n_s)`` (the episodes' total when
    every seed has as many)."""
    n = [r["episodes"] for r in rows]
    success = sum(r["success"] for r in rows) / len(rows)
    n_eff = len(rows) ** 2 / sum(1 / x for x in n)
    lo, hi = wilson_interval(success * n_eff, n_eff)
    return {"success": success, "ci": [lo, hi], "episodes": sum(n), "effective_episodes": round(n_eff)}


def draw_interval(rows: list[dict[str, Any]]) -> list[float] | None:
    """95% interval of the equal-weight mean over seeds that counts the spread between training draws, not only
    the episodes. The draws' successes (each with its episode noise) spread about their seed's mean with a variance
    pooled over seeds (one-way analysis of variance: the sum of squared deviations over ``sum(k_s - 1)`` degrees of
    freedom, so two draws a seed suffice), the mean over ``S`` seeds has variance ``s_p^2 sum(1 / k_s) / S^2``,
    and the interval takes a Student t quantile. None unless every seed has two draws or more (one draw says
    nothing of the spread)."""
    from scipy.stats import t as student_t

    draws = [[d["success"] for d in r.get("draws", [r])] for r in rows]
    if any(len(d) < 2 for d in draws):
        return None
    means = [sum(d) / len(d) for d in draws]
    dof = sum(len(d) - 1 for d in draws)
    within = sum((x - m) ** 2 for d, m in zip(draws, means) for x in d) / dof
    s = len(draws)
    half = float(student_t.ppf(0.975, dof)) * (within * sum(1 / len(d) for d in draws) / s**2) ** 0.5
    mean = sum(means) / s
    return [max(0.0, mean - half), min(1.0, mean + half)]


def pooled(results: list[dict[str, Any]], arm: str) -> dict[str, Any]:
    rows = [r[arm] for r in results]
    return {**seed_pooled(rows), "ci_draws": draw_interval(rows),
            "operator_steps": [r[arm].get("operator_steps", 0) for r in results]}


def scaling(results: list[dict[str, Any]], arm: str) -> dict[int, list[int]]:
    """Recoveries per episode -> [successes, episodes] (episodes pooled over seeds)."""
    table: dict[int, list[int]] = {}
    for r in results:
        for rec, ok in r[arm].get("recoveries", []):
            row = table.setdefault(min(int(rec), 3), [0, 0])
            row[0] += int(ok)
            row[1] += 1
    return dict(sorted(table.items()))


def plot(results: list[dict[str, Any]], arms: tuple[str, ...], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    for arm in (a for a in arms if a in ("base", *ARMS)):  # the controls' curves are left out
        table = scaling(results, arm)
        if not table:
            continue
        xs = list(table)
        ys = [table[x][0] / table[x][1] for x in xs]
        ax.plot(xs, ys, marker="o", label=f"{arm} (n={sum(v[1] for v in table.values())})")
    ax.set_xlabel("recovery manoeuvres by the policy per episode (3 = 3+)")
    ax.set_ylabel("success rate")
    ax.set_xticks(range(4))
    ax.legend(fontsize=7)
    ax.set_title("test-time scaling: success vs own recoveries", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def report(summary: dict[str, Any]) -> str:
    a = summary["args"]
    most = max(n_draws(r[arm]) for r in summary["seeds"] for arm in summary["pooled"])
    lines = [
        f"{summary['wall_s'] / 60:.1f} min of fine-tuning and evaluation summed over the arms, which may run in "
        "several processes (`--arms`); wall times are noisy on a shared machine.",
        "",
        f"Task `{ENV_ID}` (front and wrist cameras + proprioception), the quickstart's compact flow policy pre-trained "
        f"on {a['demos']} noisy expert demos for {a['pretrain_steps']} steps; each arm spends an operator budget of "
        f"{a['budget']} env steps and "
        f"{a['finetune_steps']} gradient steps (batch {a['batch']}, lr {a['lr']:g}"
        + (f" after a {a['warmup']}-step warm-up" if a["warmup"] else "") + ", demos mixed 1:1"
        + (f", weights averaged with EMA decay {a['ema']}" if a["ema"] else "") + "); RaC and DAgger in "
        f"{a['rounds']} rounds; `rac_third`: RaC on a third of the budget; the demos arm's last episode is cut at the "
        f"budget. Simulated operator: reaction delay {a['reaction_delay']} steps, action noise "
        f"{a['operator_noise']}, corrections from `{a['correct_from']}`. Success over {a['eval_episodes']} held-out "
        "episodes per seed, 95% Wilson intervals."
        + (f" Arms with several training draws (own collection and training seeds; up to {most} here) pool the "
           "draws' episodes, the same held-out episodes for each; their interval counts episodes, not the spread "
           "between draws (listed in the row; the pooled table's last column counts it)." if most > 1 else ""),
        "",
        "| arm | seed | operator steps (recovery / correction) | success [95% CI] | wall s |",
        "|---|---|---|---|---|",
    ]
    for r in summary["seeds"]:
        b = r["base"]
        lines.append(f"| pre-trained | {r['seed']} | 0 | {b['success']:.3f} [{b['ci'][0]:.3f}, {b['ci'][1]:.3f}] "
                     f"| {b['eval_wall_s']:.0f} |")
        for arm in (a for a in summary["pooled"] if a != "base"):
            x = r[arm]
            each = " (draws: " + " / ".join(f"{d['success']:.3f}" for d in x["draws"]) + ")" if "draws" in x else ""
            lines.append(f"| {arm} | {r['seed']} | {x['operator_steps']} ({x['recovery_steps']} / "
                         f"{x['correction_steps']}) | {x['success']:.3f} [{x['ci'][0]:.3f}, {x['ci'][1]:.3f}]{each} | "
                         f"{x['wall_s']:.0f} |")
    lines += ["", "Pooled over seeds, each seed weighing the same (its draws pooled first; where seeds have unequal "
              "draws the interval is at the effective number of episodes, in brackets). The last column's interval "
              "counts the spread between training draws as well (Student t over the draws' means, where every seed "
              "has two draws or more):", "",
              "| arm | success [95% CI] | episodes | 95% CI over draws |", "|---|---|---|---|"]
    for arm, p in summary["pooled"].items():
        eff = p.get("effective_episodes", p["episodes"])
        over = p.get("ci_draws")
        lines.append(f"| {arm} | {p['success']:.3f} [{p['ci'][0]:.3f}, {p['ci'][1]:.3f}] | {p['episodes']}"
                     + (f" ({eff})" if eff != p["episodes"] else "") + " | "
                     + (f"[{over[0]:.3f}, {over[1]:.3f}]" if over else "-") + " |")
    lines += ["", "Test-time scaling (success by the number of recovery manoeuvres the policy itself makes per "
              "episode, its own episodes without an operator; `k: successes/episodes`):", ""]
    for arm, table in summary["scaling"].items():
        if not table:  # evaluated without scaling episodes
            continue
        lines.append(f"- {arm}: " + ", ".join(f"{k}: {v[0]}/{v[1]}" for k, v in table.items()))
    lines += ["", "![success vs recoveries](img/rac_scaling.png)", ""]
    lines += stage_table(summary)
    lines += [summary["verdict"]]
    return "\n".join(lines)


def reached(furthest: list[int]) -> list[float]:
    """Share of episodes that reached each stage of the task (``STAGES["sequence"]``, in order): furthest >= k."""
    n = max(1, len(furthest))
    return [sum(f >= k for f in furthest) / n for k in range(1, len(STAGES["sequence"]) + 1)]


def stage_table(summary: dict[str, Any]) -> list[str]:
    """Where the policy's own episodes stop: per seed and arm with recorded stages, the share of its scaling
    episodes that reached each stage (markdown lines; none when no arm recorded them)."""
    names = STAGES["sequence"]
    rows = [(r["seed"], arm, r[arm]["furthest_stage"]) for r in summary["seeds"]
            for arm in summary["pooled"] if r[arm].get("furthest_stage")]
    if not rows:
        return []
    lines = ["Where the policy's own episodes stop (the scaling episodes, counted as above: share that reached each "
             "stage; success also needs the stack at rest and released):", "",
             "| seed | arm | episodes | " + " | ".join(names) + " |", "|---|---|---|" + "---|" * len(names)]
    for seed, arm, furthest in rows:
        shares = " | ".join(f"{x:.2f}" for x in reached(furthest))
        lines.append(f"| {seed} | {arm} | {len(furthest)} | {shares} |")
    return lines + [""]


def verdict(pool: dict[str, Any], results: list[dict[str, Any]]) -> str:
    """The two tests on the pooled success, each where its arms were run on every seed: RaC above both
    other arms at equal operator steps, or RaC on a third of the budget at least as high as the demos arm on all
    of it; and on how many seeds each holds."""
    steps = {arm: sum(pool[arm]["operator_steps"]) for arm in pool if arm != "base"}
    sr = [{arm: r[arm]["success"] for arm in pool} for r in results]
    parts = []
    if all(arm in pool for arm in TESTS["equal"]):
        rac, dem, dag = (pool[a]["success"] for a in TESTS["equal"])
        sep = pool["rac"]["ci"][0] > max(pool["demos"]["ci"][1], pool["dagger"]["ci"][1])
        highest = sum(x["rac"] > max(x["demos"], x["dagger"]) for x in sr)
        parts.append(f"RaC {rac:.3f} ({steps['rac']} operator steps) vs demos {dem:.3f} ({steps['demos']}) vs "
                     f"DAgger-style {dag:.3f} ({steps['dagger']}): "
                     + ("RaC highest" + (" with non-overlapping intervals." if sep else ", but the intervals overlap.")
                        if rac > dem and rac > dag else "RaC is not the highest in this run.")
                     + f" Per seed: RaC highest on {highest} of {len(results)}.")
    if all(arm in pool for arm in TESTS["third"]):
        third, dem = (pool[a]["success"] for a in TESTS["third"])
        overlap = not disjoint(pool["rac_third"]["ci"], pool["demos"]["ci"])
        third_ok = sum(x["rac_third"] >= x["demos"] for x in sr)
        parts.append(f"RaC on a third of the budget: {third:.3f} ({steps['rac_third']} operator steps) against the "
                     f"demos arm's {dem:.3f} ({steps['demos']}): "
                     + ("as high or higher." if third >= dem else
                        "lower" + (", the intervals overlapping." if overlap else "."))
                     + f" Per seed: RaC on a third at least the demos arm on {third_ok} of {len(results)}."
                     + draws_said(pool["rac_third"].get("ci_draws"), pool["demos"].get("ci_draws")))
    if not parts:
        return "Verdict: no test's arms were run on every seed (rac, dagger and demos; or rac_third and demos)."
    return "Verdict: " + " ".join(parts) + controls(pool)


def disjoint(a: list[float], b: list[float]) -> bool:
    """Whether intervals ``[lo, hi]`` ``a`` and ``b`` share no point."""
    return a[0] > b[1] or b[0] > a[1]


def draws_said(a: list[float] | None, b: list[float] | None) -> str:
    """Whether two arms' intervals over training draws overlap (empty when either has none)."""
    if not a or not b:
        return ""
    return (f" Counting the spread between draws: [{a[0]:.3f}, {a[1]:.3f}] against [{b[0]:.3f}, {b[1]:.3f}], "
            + ("disjoint." if disjoint(a, b) else "overlapping."))


def controls(pool: dict[str, Any]) -> str:
    """What the control arms (when run on every seed) say beside the verdict."""
    out = ""
    if "control" in pool and "rac" in pool:
        out += (f" Control (the same gradient steps, no operator data): {pool['control']['success']:.3f}; RaC "
                f"{pool['rac']['success'] - pool['control']['success']:+.3f} over it.")
    if "demos_pooled" in pool:
        p = pool["demos_pooled"]["success"]
        out += f" The new demos pooled with the pre-training's (every frame drawn alike): {p:.3f}"
        if "rac" in pool:
            out += f"; RaC {pool['rac']['success'] - p:+.3f} over it at equal operator steps"
        if "rac_third" in pool:
            out += f"; RaC on a third {'at least as high' if pool['rac_third']['success'] >= p else 'lower'}"
        out += "."
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--eval-episodes", type=int, default=400)
    ap.add_argument("--scaling-episodes", type=int, default=200)
    ap.add_argument("--demos", type=int, default=100, help="expert demos of the pre-training (noisy, the quickstart's)")
    ap.add_argument("--pretrain-steps", type=int, default=6000)
    ap.add_argument("--budget", type=int, default=3600, help="operator-controlled env steps per arm (1200 is too "
                    "few for the data to show beyond the extra training)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--finetune-steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=0, help="linear learning-rate warm-up of the fine-tuning, in "
                    "gradient steps (algo.warmup_steps; 0: none)")
    ap.add_argument("--ema", type=float, default=0.0, help="decay of the fine-tuning's weight average (algo.ema; 0: "
                    "none): each round's collection and the evaluation use the averaged weights")
    ap.add_argument("--draws", type=int, default=1, help="training draws per arm (own collection and training "
                    "seeds each), success pooled over them; draw 0 is a single-draw run's")
    ap.add_argument("--envs", type=int, default=8)
    ap.add_argument("--reaction-delay", type=int, default=2)
    ap.add_argument("--operator-noise", type=float, default=0.05)
    ap.add_argument("--correct-from", default="approach", choices=CORRECT_FROM,
                    help="where the operator's corrections start (operator.correct_from)")
    ap.add_argument("--arms", nargs="+", default=["base", *ARMS], choices=["base", *ALL_ARMS],
                    help="arms this process runs (the others are read from the work folder when done there)")
    ap.add_argument("--work", default="", help="folder of the runs (pre-training, demos, rounds; kept, so a second "
                    "run reuses the pre-trained policies); default runs/bench-rac-<time>")
    args = harness.add_output_args(ap).parse_args()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    results = []
    root = Path(args.work) if args.work else ROOT / "runs" / f"bench-rac-{time.strftime('%Y%m%d-%H%M%S')}"
    for seed in args.seeds:
        # every finished arm and draw is kept in its own file, read again here (another process may have added
        # some since): a second run reruns nothing that is done
        result = run_seed(seed, args, root / f"s{seed}")
        if "base" not in result or not any(all(arm in result for arm in test) for test in TESTS.values()):
            print(f"seed {seed}: arms done so far {[a for a in ('base', *ARMS) if a in result]}; the others run "
                  "in another process (--arms) or on a second call", flush=True)
            continue
        results.append(result)
        _write_json(root / f"s{seed}" / "result.json", result)  # the seed's summary
        publish(results, args, time.perf_counter() - t0)  # what is done so far survives a kill


def publish(results: list[dict[str, Any]], args: argparse.Namespace, wall: float) -> None:
    """Publish the results and the scaling plot beside the page."""
    arms = ("base", *(a for a in ALL_ARMS if all(a in r for r in results)))  # those every seed has
    pool = {arm: pooled(results, arm) for arm in arms}
    summary = {
        "args": {k: v for k, v in vars(args).items() if k not in ("results_dir", "page")}, "pooled": pool,
        "scaling": {arm: scaling(results, arm) for arm in arms}, "verdict": verdict(pool, results),
        "wall_s": sum(r["base"]["eval_wall_s"] + sum(r[a]["wall_s"] for a in arms[1:]) for r in results),
        "this_call_wall_s": wall,
    }
    plot(results, arms, Path(args.page).parent / "img" / "rac_scaling.png")
    print(summary["verdict"])
    harness.publish("rac", args, report({**summary, "seeds": results}), rows=results, summary=summary)


def _write_json(path: Path, data: Any) -> None:
    """``data`` as JSON at ``path`` (a kept arm or seed result in the work folder)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
