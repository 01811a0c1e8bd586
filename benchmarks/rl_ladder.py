"""The RL diagnostic ladder on ``mujoco/pick-any``: where does the learning signal get lost?

Each rung trains through our own env layer, rollout engine and PPO learner, one process per run, seeds one after
another, and records held-out success (400 episodes, 95% Wilson interval) against env steps:

================  ==========================================================================================
rung              what it isolates
================  ==========================================================================================
``mlp-scratch``   Gaussian-MLP actor-critic on privileged state, from scratch (cleanrl's PPO settings): is the
                  task learnable with our PPO core, and with how many env steps?
``mlp-bc``        the same MLP, behaviour-cloned to a start of about 0.4, then the same PPO
``flow-state-*``  the compact flow policy on privileged state only (no camera, no language needed: the state
                  names the cube), cloned to about 0.4, then the quickstart's PPO recipe with one-step
                  Flow-SDE (``sde1``), full-chain Flow-SDE (``sde``) or Flow-Noise (``noise``)
``flow-camera``   the quickstart's camera + language flow policy cloned to about 0.4 (``vla-rl quickstart``
                  with ``--sft.stop_at_success 0.4``), then the quickstart's RL stage
``flow-latent``   the same camera + language start, the flow model frozen, PPO on its initial noise
                  (``--policy.sampler.kind latent_noise``, DSRL's idea on-policy)
================  ==========================================================================================

"About 0.4": pre-training stops at the first success check (64 episodes on seeds of their own) that reaches 0.4,
scored with the run's evaluation (the ODE from zero noise, ``policy.sampler.eval_noise``). The privileged-state
rungs clone from state-observation demos that record ``observation.env_state``. The first rung that fails to
improve names the culprit.

    python benchmarks/rl_ladder.py --rungs mlp-scratch mlp-bc --seeds 0 1 2

Runs live in ``runs/ladder/<rung>-s<seed>`` (a finished run is read, not re-run: delete its folder to redo it);
published by ``benchmarks/harness.py``, the plot beside the page (``img/rl_ladder.png``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import harness
from harness import eval_curve as curve
from harness import metric_rows

ROOT = harness.ROOT
ENV = ["--env.id", "mujoco/pick-any", "--env.num_envs", "32", "--env.num_workers", "2"]
STATE_ENV = [*ENV, "--env.obs_mode", "state"]
EVAL = ["--eval.episodes", "400", "--eval.video", "false"]
START = 0.4  # pre-training stops at the first success check reaching this
DEMOS = 50
DEMO_NOISE = "0.3"  # the quickstart's demo noise on the MuJoCo tabletop

# cleanrl's ppo_continuous_action settings on 32 envs: 2048 steps per update (16 decisions of 4-action chunks, as the
# flow policies act; one-step BC of the MLP stays at 0.1 success), 10 epochs, minibatches of 64 decisions
MLP_PPO = ["--algo.type", "ppo", "--algo.decisions_per_iter", "16", "--algo.epochs", "10",
           "--algo.minibatch_size", "64", "--algo.lr_actor", "3e-4", "--algo.lr_critic", "3e-4",
           "--algo.clip_low", "0.2", "--algo.clip_high", "0.2", "--algo.dual_clip", "0", "--algo.gamma", "0.99",
           "--algo.lam", "0.95", "--algo.max_grad_norm", "0.5", "--algo.value_clip", "0.2", "--algo.huber_delta", "0",
           "--reset_every_iteration", "false"]
# the quickstart's RL stage (vla_rl/commands/quickstart.py)
FLOW_PPO = ["--algo.type", "ppo", "--algo.decisions_per_iter", "6", "--algo.epochs", "2", "--algo.minibatch_size", "192",
            "--algo.lr_actor", "3e-5", "--algo.lr_critic", "1e-3", "--algo.target_kl", "0.05",
            "--algo.critic_warmup_iters", "3", "--reset_every_iteration", "false"]
# the quickstart's RL stage for the small, fresh noise actor: a 100x larger step (3e-5 barely moves it) and 4 epochs
LATENT_PPO = ["--algo.type", "ppo", "--algo.decisions_per_iter", "6", "--algo.epochs", "4", "--algo.minibatch_size",
              "96", "--algo.lr_actor", "3e-3", "--algo.lr_critic", "1e-3", "--algo.critic_warmup_iters", "3",
              "--reset_every_iteration", "false"]
FLOW_STATE = ["--policy.type", "compact-flow", "--policy.cameras", "[]", "--policy.actor_env_state", "true",
              "--policy.chunk_size", "4"]
SAMPLERS = {
    "sde1": ["--policy.sampler.kind", "flow_sde", "--policy.sampler.sde_mode", "one_step"],
    "sde": ["--policy.sampler.kind", "flow_sde", "--policy.sampler.sde_mode", "full_chain"],
    "noise": ["--policy.sampler.kind", "flow_noise"],
}


def vla_rl(*args: str, log: Path) -> None:
    """Run ``python -m vla_rl ARGS`` alone, its output appended to ``log``; raise on failure."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with log.open("a") as f:
        f.write(f"\n$ vla-rl {' '.join(args)}\n")
        f.flush()
        proc = subprocess.run([sys.executable, "-m", "vla_rl", *args], stdout=f, stderr=subprocess.STDOUT, env=env,
                              cwd=ROOT)
    if proc.returncode:
        raise SystemExit(f"rl_ladder: `vla-rl {' '.join(args[:3])} ...` failed (exit {proc.returncode}); see {log}")


def state_demos(seed: int, out: Path, log: Path) -> Path:
    """Scripted-expert demos on privileged-state observations (cached per seed)."""
    root = out / f"demos-state-s{seed}"
    if not root.exists():
        vla_rl("collect", *STATE_ENV[:2], "--env.obs_mode", "state", "--env.num_envs", "16", "--env.seed", str(seed),
               "--episodes", str(DEMOS), "--action_noise", DEMO_NOISE, "--output", str(root), log=log)
    return root


def clone(seed: int, demos: Path, policy: list[str], out: Path, log: Path, steps: int) -> Path:
    """Pre-train ``policy`` on ``demos`` until a success check reaches :data:`START` (or ``steps``)."""
    sft = out / "sft"
    if not sft.exists():
        vla_rl("sft", "--dataset", str(demos), *policy, *STATE_ENV[:2], "--env.obs_mode", "state",
               "--env.num_envs", "16", "--steps", str(steps), "--stop_at_success", str(START), "--check_from", "100",
               "--check_every", "100", "--eval_episodes", "64", "--seed", str(seed), "--output", str(sft), log=log)
    return sft


def train(seed: int, run: Path, args: list[str], iterations: int, eval_every: int, log: Path) -> None:
    vla_rl("train", *args, *EVAL, "--eval.every", str(eval_every), "--iterations", str(iterations), "--seed", str(seed),
           "--run_dir", str(run), "--checkpoint_every", "10", *(["--resume", "true"] if (run / "checkpoints").exists()
                                                               else []), log=log)


def run_rung(rung: str, seed: int, out: Path, budget: int) -> Path:
    """Run one (rung, seed) and return its run folder (the one holding ``metrics.jsonl``)."""
    run = out / f"{rung}-s{seed}"
    run.mkdir(parents=True, exist_ok=True)
    log = run / "ladder.log"
    if rung.startswith("mlp-"):
        iters = max(1, budget // (32 * 64))
        mlp = ["--policy.type", "gaussian-mlp", "--policy.chunk_size", "4"]
        if rung == "mlp-scratch":
            policy = [*mlp, "--policy.init_log_std", "0"]
        else:
            sft = clone(seed, state_demos(seed, out, log), [*mlp, "--policy.init_log_std", "-1.6"], run, log, steps=5000)
            policy = ["--policy.path", str(sft)]
        train(seed, run / "rl", [*STATE_ENV, *policy, *MLP_PPO], iters, max(1, iters // 5), log)
    elif rung.startswith("flow-state-"):
        sampler = SAMPLERS[rung.removeprefix("flow-state-")]
        sft = clone(seed, state_demos(seed, out, log), [*FLOW_STATE, *SAMPLERS["sde"]], run, log, steps=3000)
        iters = max(1, budget // (32 * 6 * 4))
        train(seed, run / "rl", [*STATE_ENV, "--policy.path", str(sft), *sampler, *FLOW_PPO], iters,
              max(1, iters // 4), log)
    elif rung == "flow-camera":
        iters = max(1, budget // (32 * 6 * 4))
        if not (run / "rl" / "report.json").exists():
            vla_rl("quickstart", "--seed", str(seed), "--iterations", str(iters), "--eval_every", str(max(1, iters // 4)),
                   "--sft.steps", "2000", "--sft.stop_at_success", str(START), "--run_dir", str(run / "rl"), log=log)
    elif rung == "flow-latent":
        start = out / f"flow-camera-s{seed}" / "rl" / "sft_policy"
        if not start.exists():
            raise SystemExit(f"rl_ladder: flow-latent starts from {start}; run the flow-camera rung first")
        iters = max(1, budget // (32 * 6 * 4))
        train(seed, run / "rl", [*ENV, "--env.obs_mode", "rgb", "--env.wrist_camera", "true", "--policy.path",
                                 str(start), "--policy.sampler.kind", "latent_noise", *LATENT_PPO], iters,
              max(1, iters // 4), log)
    else:
        raise SystemExit(f"rl_ladder: unknown rung {rung!r}; valid: {', '.join(RUNGS)}")
    return run / "rl"


RUNGS = ["mlp-scratch", "mlp-bc", *[f"flow-state-{k}" for k in SAMPLERS], "flow-camera", "flow-latent"]
BUDGET = {"mlp-scratch": 500_000, "mlp-bc": 300_000}  # env steps; the flow rungs: the quickstart's 153,600


def episodes(rows: list[dict[str, Any]]) -> int:
    """Training episodes finished over a run's metric rows."""
    return sum(int(r.get("rollout/episodes", 0)) for r in rows)


def summarize(rung: str, seed: int, run: Path, wall: float | None) -> dict[str, Any]:
    rows = metric_rows(run)
    points = curve(rows)
    report = json.loads((run / "report.json").read_text()) if (run / "report.json").exists() else {}
    return {"rung": rung, "seed": seed, "start": points[0]["success"], "final": points[-1]["success"],
            "final_ci": [points[-1]["lo"], points[-1]["hi"]], "best": max(p["success"] for p in points),
            "env_steps": points[-1]["env_steps"], "episodes": episodes(rows),
            "wall_s": wall or report.get("wall_seconds"), "sft_steps": report.get("sft_steps"),
            "eval_noise": eval_noise(report), "curve": points, "run_dir": str(run)}


def eval_noise(report: dict[str, Any]) -> str:
    """The evaluation's initial noise of a flow run; ``-`` for a policy without a sampler."""
    sampler = report.get("config", {}).get("policy", {}).get("sampler")
    return sampler["eval_noise"] if isinstance(sampler, dict) else "-"


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rungs = list(dict.fromkeys(r["rung"] for r in results))
    fig, axes = plt.subplots(1, len(rungs), figsize=(3.2 * len(rungs), 3.0), sharey=True, squeeze=False)
    for ax, rung in zip(axes[0], rungs):
        for r in (r for r in results if r["rung"] == rung):
            xs = [p["env_steps"] / 1e3 for p in r["curve"]]
            ax.plot(xs, [p["success"] for p in r["curve"]], marker="o", ms=3, label=f"seed {r['seed']}")
            ax.fill_between(xs, [p["lo"] for p in r["curve"]], [p["hi"] for p in r["curve"]], alpha=0.15)
        ax.set_title(rung, fontsize=9)
        ax.set_xlabel("env steps (k)")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("held-out success (400 ep.)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def table(results: list[dict[str, Any]]) -> str:
    lines = ["| rung | seed | eval x_1 | start | final [95% CI] | best | gain | env steps | episodes | wall s |",
             "|---|---:|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in results:
        lo, hi = r["final_ci"]
        wall = f"{r['wall_s']:.0f}" if r.get("wall_s") else "-"
        lines.append(f"| {r['rung']} | {r['seed']} | {r.get('eval_noise', '-')} | {r['start']:.3f} | {r['final']:.3f} [{lo:.2f}-{hi:.2f}] | "
                     f"{r['best']:.3f} | {r['final'] - r['start']:+.3f} | {r['env_steps']:,} | {r['episodes']} | {wall} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rungs", nargs="+", default=RUNGS, choices=RUNGS)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--budget", type=int, default=0, help="env steps per run (0: the rung's default)")
    ap.add_argument("--out", default="runs/ladder")
    ap.add_argument("--workers", type=int, default=2, help="env worker processes per run (0: step in the run's process)")
    args = harness.add_output_args(ap).parse_args()
    out = Path(args.out)
    ENV[ENV.index("--env.num_workers") + 1] = STATE_ENV[STATE_ENV.index("--env.num_workers") + 1] = str(args.workers)
    results = []
    for rung in args.rungs:
        for seed in args.seeds:
            t0 = time.time()
            fresh = not (out / f"{rung}-s{seed}" / "rl" / "report.json").exists()
            run = (run_rung(rung, seed, out, args.budget or BUDGET.get(rung, 153_600)) if fresh
                   else out / f"{rung}-s{seed}" / "rl")
            results.append(summarize(rung, seed, run, time.time() - t0 if fresh else None))
            r = results[-1]
            print(f"{rung} seed {seed}: {r['start']:.3f} -> {r['final']:.3f} in {r['env_steps']:,} env steps", flush=True)
    plot(results, Path(args.page).parent / "img" / "rl_ladder.png")
    print(table(results))
    body = ("Success = 400 held-out episodes, deterministic actions, 95% Wilson interval.\n\n"
            f"{table(results)}\n\n![success against env steps per rung](img/rl_ladder.png)")
    harness.publish("rl_ladder", args, body, rows=results)


if __name__ == "__main__":
    main()
