"""Learned rewards, measured: the success classifier's held-out accuracy, PPO on the classifier alone, and the
process reward model's sample efficiency.

Parts (``--parts``; results merge into ``benchmarks/results/rewards.json`` part by part, seed by seed):

- ``classifier``: on the quickstart env (``mujoco/pick-any``, front + wrist cameras, 64 px, the compact flow
  policy's inputs), record 400 training episodes and 400 held-out episodes (other seeds) of the scripted expert
  with per-env action noise 0 / 0.5 / 1 / 2 (successes, near misses, failures), train a classifier on the
  cameras + state (privileged state excluded) and score the held-out episodes: *episode accuracy* (the
  classifier's verdict on the state each episode ended in vs the simulator's success; target >= 0.95) and
  frame precision / recall. Saves the classifier for the next part.
- ``ppo-classifier``: ``vla-rl quickstart`` (demos, few-shot imitation, Flow-SDE PPO, 400 held-out episodes
  before and after) with the reward replaced by ``{classifier: 1.0}``: the learner never sees the simulator's
  success or dense reward; evaluation scores the simulator's success. Target: after - before >= +0.15.
- ``prm``: a process reward model (``stages`` labels) trained like the classifier; then two quickstart RL runs
  from the same pre-trained start, ``{success: 1.0}`` and ``{success: 1.0, prm: <weight>}``, evaluated every
  ``--eval_every`` iterations on 400 held-out episodes; reports the env steps at which the PRM run first
  reaches the sparse run's final success (target: <= 60% of the sparse run's steps).

Run alone for numbers worth recording (``OMP_NUM_THREADS=1``); on a 2-core CPU machine the classifier part
took 12-21 minutes per seed (contended), each quickstart RL run 10-25 minutes.

    python benchmarks/learned_rewards.py --parts classifier --seeds 0 1 2
    python benchmarks/learned_rewards.py --parts ppo-classifier --seeds 0 1 2
    python benchmarks/learned_rewards.py --parts prm --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "benchmarks" / "results" / "rewards.json"
NOISE = [0.0, 0.5, 1.0, 2.0]
HELD_OUT_SEED = 7_000_000


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of ``k`` successes in ``n``."""
    if n == 0:
        return float("nan"), float("nan")
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return mid - half, mid + half


def env_config(num_envs: int = 16) -> Any:
    from vla_rl.commands.quickstart import _quickstart_env

    return dataclasses.replace(_quickstart_env(), num_envs=num_envs, num_workers=0)


def record(seed: int, episodes: int, desc: str) -> list[Any]:
    from rewards.learned.data import record_episodes
    from vla_rl.commands.reward import _actor

    cfg = env_config()
    with cfg.make(seed=seed) as env:
        return record_episodes(env, _actor("expert", env, NOISE, seed), episodes, seed, desc=desc)


def model_path(kind: str, seed: int, out: Path) -> Path:
    return out / f"{kind}-s{seed}"


def part_model(kind: str, seed: int, episodes: int, epochs: int, out: Path) -> dict[str, Any]:
    """Train a classifier (or a stage-labelled progress model) and score it on held-out episodes."""
    from rewards.learned.labels import milestone_targets, success_targets
    from rewards.learned.train import FitConfig, classifier_metrics, fit_reward_model, progress_metrics

    t0 = time.perf_counter()
    train = record(seed * 10_000, episodes, f"record train s{seed}")
    held = record(HELD_OUT_SEED + seed * 10_000, episodes, f"record held-out s{seed}")
    t1 = time.perf_counter()
    fit = FitConfig(epochs=epochs, holdout=0.0, seed=seed)
    if kind == "classifier":
        targets = [success_targets(e) for e in train]
    else:
        train, targets = milestone_targets(train, "stages")
    model, _, _ = fit_reward_model(kind, train, targets, fit, desc=f"fit {kind} s{seed}")
    t2 = time.perf_counter()
    if kind == "classifier":
        metrics = classifier_metrics(model, held)
    else:
        held, held_targets = milestone_targets(held, "stages")
        metrics = progress_metrics(model, held, held_targets)
    model.config.metrics = {"held_out": metrics}
    model.save(model_path(kind, seed, out))
    return {"seed": seed, "train_episodes": len(train), "train_successes": sum(e.succeeded for e in train),
            **metrics, "record_s": t1 - t0, "fit_s": t2 - t1, "epochs": epochs,
            "path": str(model_path(kind, seed, out))}


def quickstart_run(seed: int, run_dir: Path, reward: Any, iterations: int, eval_every: int,
                   sft_from: Path | None = None, eval_episodes: int = 400) -> dict[str, Any]:
    """``vla-rl quickstart`` with the RL stage's reward replaced by ``reward`` (a RewardConfig)."""
    import shutil

    from vla_rl.cli import parse_config
    from vla_rl.commands import quickstart as qs

    original = qs._train_config

    def with_reward(cfg: Any, run: Path, policy_path: str) -> Any:
        return dataclasses.replace(original(cfg, run, policy_path), reward=reward)

    qs._train_config = with_reward
    try:
        if sft_from is not None and not (run_dir / "sft_policy").exists():  # the same pre-trained start
            run_dir.mkdir(parents=True, exist_ok=True)
            shutil.copytree(sft_from / "sft_policy", run_dir / "sft_policy")
        # the quickstart with its Flow-SDE PPO stage: the reward drives the update (filtered_bc reads success only)
        cfg = dataclasses.replace(
            parse_config(qs.QuickstartConfig, ["--preset", "quickstart_ppo"]), seed=seed, run_dir=str(run_dir),
            iterations=iterations, eval_every=eval_every, resume=run_dir.exists(), eval_episodes=eval_episodes,
            logging=dataclasses.replace(qs.LoggingConfig(), wandb=False, tensorboard=False))
        return qs.run_quickstart(cfg)
    finally:
        qs._train_config = original


def evals(run_dir: Path) -> list[tuple[int, float]]:
    """``[(env steps, eval success)]`` of a run's evaluations, in order."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(int(r["step"]), float(r["eval/success"])) for r in rows if "eval/success" in r]


def part_ppo_classifier(seed: int, out: Path, iterations: int, eval_episodes: int) -> dict[str, Any]:
    from rewards import RewardConfig
    from rewards.learned.terms import ClassifierTermConfig

    clf = model_path("classifier", seed, out)
    if not (clf / "config.json").exists():
        raise SystemExit(f"no classifier at {clf}: run --parts classifier first")
    reward = RewardConfig(terms={"classifier": 1.0}, classifier=ClassifierTermConfig(path=str(clf)))
    t0 = time.perf_counter()
    s = quickstart_run(seed, out / f"ppo-classifier-s{seed}", reward, iterations, 0, eval_episodes=eval_episodes)
    n = s["episodes_per_eval"]
    return {"seed": seed, "before": s["success_before"], "after": s["success_after"],
            "gain": s["success_after"] - s["success_before"], "before_ci": s["success_before_ci"],
            "after_ci": s["success_after_ci"], "episodes": n, "env_steps": s["env_steps"],
            "wall_s": time.perf_counter() - t0, "ok": s["success_after"] - s["success_before"] >= 0.15}


def part_prm(seed: int, out: Path, iterations: int, eval_every: int, weight: float,
             eval_episodes: int) -> dict[str, Any]:
    from rewards import RewardConfig
    from rewards.learned.terms import ProgressTermConfig

    prm = model_path("progress", seed, out)
    if not (prm / "config.json").exists():
        part_model("progress", seed, 400, 8, out)
    t0 = time.perf_counter()
    sparse_dir = out / f"prm-sparse-s{seed}"
    quickstart_run(seed, sparse_dir, RewardConfig(terms={"success": 1.0}), iterations, eval_every,
                   eval_episodes=eval_episodes)
    mixed_dir = out / f"prm-mixed-s{seed}"
    quickstart_run(seed, mixed_dir, RewardConfig(terms={"success": 1.0, "prm": weight},
                                                 prm=ProgressTermConfig(path=str(prm))),
                   iterations, eval_every, sft_from=sparse_dir, eval_episodes=eval_episodes)
    sparse, mixed = evals(sparse_dir), evals(mixed_dir)
    target = sparse[-1][1]
    reached = next((step for step, succ in mixed if succ >= target), None)
    ratio = reached / sparse[-1][0] if reached is not None else float("nan")
    return {"seed": seed, "sparse_final": target, "sparse_steps": sparse[-1][0], "mixed_final": mixed[-1][1],
            "mixed_steps_to_sparse_final": reached, "step_ratio": ratio, "sparse_curve": sparse, "mixed_curve": mixed,
            "prm_weight": weight, "wall_s": time.perf_counter() - t0, "ok": reached is not None and ratio <= 0.6}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--parts", nargs="+", default=["classifier"], choices=["classifier", "ppo-classifier", "prm"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--episodes", type=int, default=400, help="training and held-out episodes each (classifier)")
    p.add_argument("--epochs", type=int, default=8, help="classifier training epochs")
    p.add_argument("--iterations", type=int, default=200, help="PPO iterations (the quickstart_ppo preset's length)")
    p.add_argument("--eval_every", type=int, default=25, help="prm: evaluate every this many iterations")
    p.add_argument("--prm_weight", type=float, default=1.0)
    p.add_argument("--eval_episodes", type=int, default=400, help="held-out episodes per RL evaluation")
    p.add_argument("--out", default="runs/bench-rewards", help="models and runs go here")
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    out = Path(args.out)
    for part in args.parts:
        for seed in args.seeds:
            t0 = time.perf_counter()
            if part == "classifier":
                row = part_model("classifier", seed, args.episodes, args.epochs, out)
                row["ok"] = row["episode_accuracy"] >= 0.95
            elif part == "ppo-classifier":
                row = part_ppo_classifier(seed, out, args.iterations, args.eval_episodes)
            else:
                row = part_prm(seed, out, args.iterations, args.eval_every, args.prm_weight, args.eval_episodes)
            row["wall_s"] = time.perf_counter() - t0
            results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}  # other parts may run alongside
            section = results.setdefault(part, {"seeds": {}})
            section["seeds"][str(seed)] = row
            section["conditions"] = {
                "machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "torch": torch.__version__,
                "load_average_at_end": os.getloadavg()[0], "omp_threads": os.environ.get("OMP_NUM_THREADS"),
                "date": time.strftime("%Y-%m-%d"), "args": vars(args),
            }
            RESULTS.parent.mkdir(parents=True, exist_ok=True)
            tmp = RESULTS.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(results, indent=1, default=str))
            os.replace(tmp, RESULTS)
            print(json.dumps({part: row}, default=str)[:600], flush=True)


if __name__ == "__main__":
    main()
