"""Task sampling on a multi-task env: VLA-RL's curriculum (and the other samplers) against uniform sampling.

Per seed, the quickstart's pipeline on ``mujoco/multi`` (12 tasks: pick, push and stack, of varied difficulty):
one pre-trained start, then one RL stage per ``--samplers`` entry (``uniform``, ``curriculum``, ``progress``,
``balanced``; :mod:`vla_rl.curriculum`) at the same iterations and env steps, each scored by the per-task protocol
(``--per_task`` held-out episodes of every task; the headline is the mean over tasks, with its pooled 95% Wilson
interval). Target: every sampler's mean over tasks above uniform's.

``--reeval`` runs nothing new: it evaluates the finished runs' final policies again on ``--reeval_per_task``
episodes of every task, keeping each episode's outcome, so each sampler is read against uniform episode by episode
on the same initial states (the paired difference with its 95% interval), which two separate Wilson intervals
cannot resolve at the size of the differences measured::

    python benchmarks/curriculum.py --preset quickstart_ppo --iterations 200 --seeds 0 1 2 3 --out runs/multi
    python benchmarks/curriculum.py --reeval --iterations 200 --seeds 0 1 2 3 --out runs/multi

Runs live in ``<out>/curriculum-<sampler>-s<seed>`` (a finished run of the same length is read, not run again).
Published by ``benchmarks/harness.py`` (``curriculum``, and ``curriculum_reeval``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

import harness
import torch
from learned_rewards import metrics, quickstart_run

def gradient_steps(rows: list[dict[str, Any]]) -> int | None:
    """The gradient steps a run's RL stage took (``update/steps`` of its :func:`metrics` rows, summed); None for a
    learner that does not log them (PPO)."""
    if not any("update/steps" in r for r in rows):
        return None
    return int(sum(r.get("update/steps", 0) or 0 for r in rows))


def rl_seconds(rows: list[dict[str, Any]]) -> float:
    """The seconds a run's RL iterations took (``time/iteration_s`` of its :func:`metrics` rows, summed): unlike the
    report's wall time, this covers every segment of a run that was resumed."""
    return float(sum(r.get("time/iteration_s", 0.0) or 0.0 for r in rows))


def part_curriculum(seed: int, out: Path, iterations: int, per_task: int, demos: int, sft_steps: int,
                    samplers: list[str], min_buffer: int = 64, preset: str = "") -> dict[str, Any]:
    """The quickstart's pipeline on ``mujoco/multi`` (12 tasks: pick, push, stack), one pre-trained start, then
    one RL stage per task sampler at the same iterations (so the same env steps), each scored by the per-task
    protocol (``per_task`` episodes of every task, the headline is the mean over tasks). ``preset``: the
    quickstart preset whose RL stage runs (empty: the default, ``filtered_bc`` with ``min_buffer``;
    ``quickstart_ppo``: Flow-SDE PPO, the learner VLA-RL's curriculum was made for)."""
    from vla_rl.commands.quickstart import _quickstart_env
    from vla_rl.curriculum import TaskSamplingConfig
    from vla_rl.algorithms.sft import SFTConfig

    t0 = time.perf_counter()
    rows: dict[str, Any] = {}
    first: Path | None = None
    for sampler in samplers:
        env = dataclasses.replace(_quickstart_env(), id="mujoco/multi", tasks=TaskSamplingConfig(sampler=sampler))
        run_dir = out / f"curriculum-{sampler}-s{seed}"
        done = run_dir / "report.json"  # a finished run of the same length is kept (add samplers to a seed later)
        s = json.loads(done.read_text()) if done.exists() else {}
        if s.get("iterations") != iterations:
            s = quickstart_run(seed, run_dir, None, iterations, 0, sft_from=first, env=env,
                               per_task=per_task, eval_episodes=12 * per_task, demos=demos,
                               sft=SFTConfig(steps=sft_steps, episodes=demos),
                               preset=preset, algo=None if preset else {"min_buffer": min_buffer})
        first = first or run_dir
        logged = metrics(run_dir)
        rows[sampler] = {  # per_task protocol: success is the mean over tasks, the interval pooled (equal counts)
            "before": s["success_before"], "after": s["success_after"], "before_ci": s["success_before_ci"],
            "after_ci": s["success_after_ci"], "episodes": s["episodes_per_eval"], "env_steps": s["env_steps"],
            "per_task_before": {t: r["success"] for t, r in s["per_task_before"].items()},
            "per_task_after": {t: r["success"] for t, r in s["per_task_after"].items()},
            "gradient_steps": gradient_steps(logged), "wall_s": s["wall_seconds"], "rl_s": rl_seconds(logged)}
    base = rows.get("uniform")
    out_row: dict[str, Any] = {"seed": seed, "iterations": iterations, "episodes_per_task": per_task,
                               "demos": demos, "sft_steps": sft_steps, "min_buffer": min_buffer, "preset": preset,
                               "arms": rows, "wall_s": time.perf_counter() - t0}
    if base is not None:
        for sampler, row in rows.items():
            if sampler != "uniform":
                out_row[f"{sampler}_minus_uniform"] = row["after"] - base["after"]
        out_row["ok"] = all(row["after"] > base["after"] for name, row in rows.items() if name != "uniform")
    return out_row


def evaluate_run(run_dir: Path, sampler: str, iterations: int, per_task: int) -> Any:
    """The final policy of the curriculum run ``run_dir`` (its last checkpoint, which must be ``iterations`` in and
    trained with ``sampler``), evaluated like the run's own last evaluation (its config's env, evaluation seed and
    executed steps) but on ``per_task`` held-out episodes of every task; an :class:`EvalResult` with ``outcomes``.

    Raises:
        SystemExit: naming the folder, for a run without checkpoints or of another sampler or length.
    """
    from policies.loading import load_policy
    from vla_rl.cli import parse_config
    from vla_rl.evaluation import evaluate_policy
    from vla_rl.train_config import TrainConfig
    from vla_rl.trainer import per_task_eval_tasks, task_curriculum

    latest = run_dir / "checkpoints" / "latest"
    if not latest.is_file():
        raise SystemExit(f"{run_dir}: no checkpoints/latest (not a finished curriculum run)")
    last = latest.parent / latest.read_text().strip()
    cfg = parse_config(TrainConfig, ["--config_path", str(last / "config.json")])
    if cfg.env.tasks.sampler != sampler or last.name != f"iter_{iterations:06d}":
        raise SystemExit(f"{last}: sampler {cfg.env.tasks.sampler} at {last.name}, but the results row is {sampler} at "
                         f"{iterations} iterations: --out points at other runs")
    policy = load_policy(last / "policy")
    policy.eval()
    with cfg.env.make(num_envs=cfg.eval.num_envs or cfg.env.num_envs, seed=cfg.eval.seed) as env:
        tasks = per_task_eval_tasks(cfg, task_curriculum(cfg, env.spec))  # the tasks the run's evaluation played
        if tasks is None:
            raise SystemExit(f"{last}: eval.protocol {cfg.eval.protocol}, not per_task: no episodes to pair by task")
        return evaluate_policy(env, policy, 0, cfg.eval.seed, cfg.exec_steps, tasks=tasks,
                               episodes_per_task=per_task, first_init=cfg.env.tasks.train_init_states,
                               desc=f"{run_dir.name} x{per_task}")


def reevaluate(out: Path, seeds: list[int], samplers: list[str], iterations: int,
               per_task: int) -> list[dict[str, Any]]:
    """``--reeval``: each sampler's final curriculum policy of each seed (``out/curriculum-<sampler>-s<seed>``)
    evaluated on ``per_task`` episodes of every task (:func:`evaluate_run`), read against uniform's episode by
    episode (:func:`vla_rl.evaluation.paired_difference`); one row per seed and sampler, and one pooled over the
    seeds per sampler (seed ``all``)."""
    from vla_rl.evaluation import paired_difference

    outcomes: dict[str, list[Any]] = {s: [] for s in samplers}
    rows = []
    for seed in seeds:
        for sampler in samplers:
            res = evaluate_run(out / f"curriculum-{sampler}-s{seed}", sampler, iterations, per_task)
            outcomes[sampler].append(res.outcomes)
            rows.append({"seed": seed, "sampler": sampler, "success": res.success_rate, "ci": [res.ci_low, res.ci_high],
                         "episodes": res.episodes})
            if sampler != "uniform" and "uniform" in samplers:
                diff, lo, hi, _ = paired_difference(outcomes["uniform"][-1:], [res.outcomes])
                rows[-1]["minus_uniform"] = [diff, lo, hi]
    for sampler in samplers:
        if sampler != "uniform" and "uniform" in samplers:
            diff, lo, hi, n = paired_difference(outcomes["uniform"], outcomes[sampler])
            rows.append({"seed": "all", "sampler": sampler, "episodes": n, "minus_uniform": [diff, lo, hi]})
    return rows


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):  # [difference, low, high]
        return f"{value[0]:+.3f} [{value[1]:+.3f}, {value[2]:+.3f}]"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def table(rows: list[dict[str, Any]], samplers: list[str]) -> str:
    """A row per seed: each sampler's mean success over tasks after RL, its difference from uniform's, the target."""
    others = [s for s in samplers if s != "uniform"]
    header = ["seed", "iterations", *(f"{s} after" for s in samplers), *(f"{s} - uniform" for s in others), "met"]
    return harness.markdown_table(header, [
        [r["seed"], r["iterations"], *(_cell(r["arms"][s]["after"]) for s in samplers),
         *(_cell(r.get(f"{s}_minus_uniform")) for s in others), _cell(r.get("ok"))] for r in rows])


def reeval_table(rows: list[dict[str, Any]]) -> str:
    """A row per seed and sampler, and one per sampler over every seed (``all``): success and the paired
    difference from uniform."""
    return harness.markdown_table(
        ["seed", "sampler", "success", "episodes", "minus uniform [95% CI]"],
        [[r["seed"], r["sampler"], _cell(r.get("success")), r["episodes"], _cell(r.get("minus_uniform"))]
         for r in rows])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--samplers", nargs="+", default=["uniform", "curriculum"],
                   help="the task samplers compared (uniform first: the baseline)")
    p.add_argument("--per_task", type=int, default=34, help="held-out episodes per task (12 tasks)")
    p.add_argument("--iterations", type=int, default=120, help="RL iterations per sampler")
    p.add_argument("--demos", type=int, default=200, help="expert demos for pre-training")
    p.add_argument("--sft_steps", type=int, default=2000, help="pre-training steps")
    p.add_argument("--preset", default="",
                   help="the quickstart preset of the RL stage (empty: filtered_bc; quickstart_ppo: Flow-SDE PPO); "
                        "the pre-trained start is the sft_policy already in the first sampler's run folder under "
                        "--out, else that preset's")
    p.add_argument("--min_buffer", type=int, default=64,
                   help="filtered_bc's min_buffer (the quickstart's 256 took a 0.03 start 120 iterations without "
                        "one update)")
    p.add_argument("--out", default="runs/bench-curriculum", help="runs go here")
    p.add_argument("--reeval", action="store_true",
                   help="run nothing new: evaluate the --samplers' finished runs under --out again on "
                        "--reeval_per_task episodes of every task, read against uniform episode by episode")
    p.add_argument("--reeval_per_task", type=int, default=100, help="--reeval: held-out episodes per task")
    args = harness.add_output_args(p).parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    out = Path(args.out)
    if args.reeval:
        rows = reevaluate(out, args.seeds, args.samplers, args.iterations, args.reeval_per_task)
        harness.publish("curriculum_reeval", args, reeval_table(rows), rows=rows)
        return
    rows = []
    for seed in args.seeds:
        rows.append(part_curriculum(seed, out, args.iterations, args.per_task, args.demos, args.sft_steps,
                                    args.samplers, args.min_buffer, args.preset))
        print(json.dumps(rows[-1], default=str)[:600], flush=True)
    harness.publish("curriculum", args, table(rows, args.samplers), rows=rows,
                    summary={"load_average_at_end": os.getloadavg()[0]})


if __name__ == "__main__":
    main()
