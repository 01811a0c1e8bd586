"""One process against two: env steps/s by executor and PPO update time under DDP, on this machine.

    python benchmarks/scale.py            # published by benchmarks/harness.py

Env stepping: ``mujoco/pick-red`` (state observations), 8 envs, chunks of 4 random actions, with the envs in this
process, on 1 and 2 worker processes, and on 2 Ray actors (when Ray is installed). Update: one PPO update (2 epochs,
whole-batch minibatches) of the smoke compact-flow policy on a rollout of 8 envs x 4 decisions, in one process and
as two DDP ranks (gloo) on 4 envs each, launched with ``torch.distributed.run``; the time is the slowest rank's.
Every figure is the median of ``--repeats`` runs. GPU-scale figures are not measured here (docs/scaling.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time

import harness
import torch

ROOT = harness.ROOT
ENV = "mujoco/pick-red"


def env_steps_per_s(executor: str, workers: int, chunks: int) -> float:
    from sim import make_env

    env = make_env(ENV, num_envs=8, seed=0, obs_mode="state", num_workers=workers, executor=executor)
    try:
        env.reset(seed=0)
        gen = torch.Generator().manual_seed(0)
        acts = [torch.rand((8, 4, env.spec.action_dim), generator=gen) * 2 - 1 for _ in range(chunks + 2)]
        env.step_chunk(acts[0])
        env.step_chunk(acts[1])  # warm
        t0 = time.perf_counter()
        for a in acts[2:]:
            env.step_chunk(a)
        return 8 * 4 * chunks / (time.perf_counter() - t0)
    finally:
        env.close()


def ppo_update_s(repeats: int) -> list[float]:
    """Seconds per PPO update on this rank's share of the 8-env rollout (one process: all of it)."""
    from vla_rl.algorithms.ppo import PPOLearner
    from vla_rl.cli import parse_config
    from vla_rl.distributed import Distributed
    from vla_rl.policy_factory import build_policy
    from vla_rl.rollout import RolloutEngine
    from vla_rl.smoke import apply_smoke
    from vla_rl.train_config import TrainConfig

    dist = Distributed.from_environment()
    torch.manual_seed(0)
    cfg = apply_smoke(parse_config(TrainConfig, ["--smoke", "true", "--env.id", ENV, "--env.obs_mode", "state",
                                                 "--policy.type", "compact-flow"]))
    n, first = dist.env_shard(8, 0)
    env = cfg.env.make(num_envs=n, seed=first)
    times = []
    try:
        policy = build_policy(cfg.policy, env.spec, smoke=True)
        learner = PPOLearner(dataclasses.replace(cfg.algo, epochs=2, minibatch_size=32, decisions_per_iter=4), policy)
        learner.distribute(dist)
        engine = RolloutEngine(env, policy, cfg.exec_steps, use_critic=True, reward=cfg.reward)
        engine.reset(seed=100 + first)
        with torch.no_grad():
            rollout = engine.collect(4)
        for _ in range(repeats + 1):
            dist.barrier()
            t0 = time.perf_counter()
            learner.update(rollout)
            dist.barrier()
            times.append(time.perf_counter() - t0)
    finally:
        env.close()
    return times[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--chunks", type=int, default=40)
    parser.add_argument("--worker", action="store_true", help="internal: one DDP rank of the update timing")
    args = harness.add_output_args(parser).parse_args()
    torch.set_num_threads(1)
    if args.worker:
        times = ppo_update_s(args.repeats)
        if int(os.environ.get("RANK", "0")) == 0:
            print("TIMES", json.dumps(times))
        return
    steps: dict[str, float] = {}
    for name, executor, workers in [("in_process", "process", 0), ("process_1_worker", "process", 1),
                                    ("process_2_workers", "process", 2), ("ray_2_actors", "ray", 2)]:
        if executor == "ray":
            try:
                import ray
            except ImportError:
                continue
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        runs = [env_steps_per_s(executor, workers, args.chunks) for _ in range(args.repeats)]
        steps[name] = statistics.median(runs)
        if executor == "ray":
            ray.shutdown()
        print(f"env steps/s {name}: {steps[name]:.0f} (runs {[round(r) for r in runs]})", flush=True)
    one = statistics.median(ppo_update_s(args.repeats))
    print(f"PPO update, 1 process on 8 envs: {one:.3f} s", flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           __file__, "--worker", "--repeats", str(args.repeats)], env=env, capture_output=True,
                          text=True, cwd=ROOT, timeout=600)
    line = [x for x in proc.stdout.splitlines() if x.startswith("TIMES")]
    if not line:
        raise SystemExit(f"DDP timing failed:\n{proc.stderr[-3000:]}")
    two = statistics.median(json.loads(line[0].split(" ", 1)[1]))
    print(f"PPO update, 2 DDP ranks on 4 envs each: {two:.3f} s", flush=True)
    result = {
        "env": ENV, "num_envs": 8, "chunk": 4, "obs_mode": "state",
        "env_steps_per_s": steps,
        "ppo_update_s": {"1_process_8_envs": one, "2_ddp_ranks_4_envs_each": two},
        "conditions": {"load_average_1min_at_end": os.getloadavg()[0], "torch": torch.__version__,
                       "threads_per_process": 1, "repeats": args.repeats},
    }
    table = harness.markdown_table(
        ["measured", "1 process", "2 processes"],
        [["env steps/s (8 envs)", f"{steps['in_process']:.0f} (in process)",
          f"{steps['process_2_workers']:.0f} (2 workers)"
          + (f", {steps['ray_2_actors']:.0f} (2 Ray actors)" if "ray_2_actors" in steps else "")],
         ["PPO update s", f"{one:.3f} (8 envs)", f"{two:.3f} (2 DDP ranks, 4 envs each)"]])
    harness.publish("scale", args, f"`{ENV}`, state observations, chunks of 4; medians of {args.repeats} runs, one "
                    f"torch thread per process; a shared machine: read as lower bounds.\n\n{table}", rows=result)


if __name__ == "__main__":
    main()
