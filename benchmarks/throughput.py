"""Training throughput of the quickstart's RL stage: where an iteration's time goes, against the limits.

    OMP_NUM_THREADS=1 python benchmarks/throughput.py [--policy DIR] [--demos DIR] [--repeats 3] [--iterations 4]
        [--variants NAME,...]

The quickstart's RL stage (``mujoco/pick-any``, 32 envs on 2 worker processes, front + wrist cameras at 64x64, the
compact flow policy, chunks of 4, 6 decisions per env per iteration) is built once per variant and timed, variants
interleaved (ABAB...) so that all of them see the same load on a shared machine:

- **env only**: the same envs executing the same number of chunks of random actions, no policy (the simulator limit);
- **rollout**: the collection with the policy acting (env steps / s); with an overlapped update it includes
  waiting for that update;
- **update**: the learner's update as the loop waits for it (an overlapped update's own seconds are reported apart);
- **iteration**: rollout + update (env steps / s of the whole loop); the RL stage at the quickstart's 200 iterations
  is estimated from it plus two 400-episode evaluations timed once.

Variants (``VARIANTS``) are switches of the same code:

- the Flow-SDE PPO stage (``--preset quickstart_ppo``: full chain, 2 epochs x minibatch 192), with
  ``--threads.update`` / ``--threads.rollout`` at 1 (the first row every ratio is taken against) or 2;
- the quickstart's own stage, ``filtered_bc`` (8 supervised steps of 64 rows per iteration), with ``--algo.overlap``
  off (1 or 2 update threads) and on (the update of each iteration trains in a thread while the next one collects:
  the quickstart's default), with the env workers' nice value raised (``--algo.overlap_worker_nice``, default 10)
  or not, and with pipelined collection.

Medians over repeats; the ratios are what we track. Published by ``benchmarks/harness.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import harness
import torch

VARIANTS: dict[str, dict[str, Any]] = {
    "PPO 1 thread": {"algo": "ppo", "update_threads": 1, "rollout_threads": 1},
    "PPO update on 2 threads": {"algo": "ppo", "update_threads": 2, "rollout_threads": 1},
    "PPO update + acting on 2 threads": {"algo": "ppo", "update_threads": 2, "rollout_threads": 2},
    "filtered_bc 1 thread": {"algo": "filtered_bc", "overlap": False},
    "filtered_bc update on 2 threads": {"algo": "filtered_bc", "overlap": False, "update_threads": 2},
    "filtered_bc overlapped update (workers not reniced)": {"algo": "filtered_bc", "overlap": True, "worker_nice": 0},
    "filtered_bc overlapped update (quickstart)": {"algo": "filtered_bc", "overlap": True},
    "filtered_bc pipelined collection": {"algo": "filtered_bc", "overlap": False, "pipelined": True},
    "filtered_bc overlapped + pipelined": {"algo": "filtered_bc", "overlap": True, "pipelined": True},
}
DEFAULT_VARIANTS = ("PPO 1 thread", "filtered_bc 1 thread", "filtered_bc update on 2 threads",
                    "filtered_bc overlapped update (workers not reniced)", "filtered_bc overlapped update (quickstart)")
WARMUP_ITERATIONS = 20
"""At most this many untimed iterations per variant, until ``filtered_bc``'s success buffer yields minibatches."""


@dataclass
class Setup:
    """One variant's env, policy, learner and rollout engine (the quickstart's RL stage)."""

    env: Any
    policy: Any
    learner: Any
    engine: Any
    algo: str
    update_threads: int = 1
    rollout_threads: int = 1
    overlap: bool = False


def _quickstart(config_class: Any, algo: str, overlap: bool) -> Any:
    """The quickstart at 200 iterations: with ``algo`` ``ppo`` its Flow-SDE PPO stage (``--preset quickstart_ppo``);
    else its own ``filtered_bc`` stage."""
    from vla_rl.cli import parse_config

    args = ["--preset", "quickstart_ppo"] if algo == "ppo" else ["--algo.overlap", str(overlap).lower()]
    return parse_config(config_class, [*args, "--iterations", "200"])


def build(policy_path: str, demos: str, seed: int, algo: str, update_threads: int = 1, rollout_threads: int = 1,
          overlap: bool = False, pipelined: bool = False, worker_nice: int | None = None) -> Setup:
    from policies.io import checkpoint_cameras
    from policies.loading import load_policy
    from vla_rl.algorithms.base import ALGORITHMS
    from vla_rl.commands.quickstart import QuickstartConfig, _train_config
    from vla_rl.policy_factory import build_policy
    from vla_rl.rollout import RolloutEngine
    from vla_rl.trainer import seed_everything

    cfg = _train_config(_quickstart(QuickstartConfig, algo, overlap), Path("/nonexistent"), policy_path=policy_path)
    if algo == "filtered_bc":
        nice = cfg.algo.overlap_worker_nice if worker_nice is None else worker_nice
        cfg = dataclasses.replace(cfg, algo=dataclasses.replace(cfg.algo, demos=demos, overlap_worker_nice=nice)
                                  .for_run(cfg.iterations))
    env_cfg = cfg.env
    if policy_path:
        env_cfg = env_cfg.with_policy_cameras(checkpoint_cameras(policy_path), policy_path)
    seed_everything(seed)
    env = env_cfg.make()
    policy = load_policy(policy_path) if policy_path else build_policy(cfg.policy, env.spec)
    learner = ALGORITHMS.get(cfg.algo.type).obj(cfg.algo, policy)
    if algo == "ppo":
        learner.iteration = 10**6  # past critic warmup: time the full actor + critic update
    engine = RolloutEngine(env, policy, cfg.exec_steps, use_critic=learner.uses_critic, reward=cfg.reward,
                           pipelined=pipelined)
    engine.reset(seed=seed)
    return Setup(env, policy, learner, engine, algo, update_threads, rollout_threads, overlap)


def workers_cpu_s(env: Any) -> float:
    """CPU seconds (user + system) the env's worker processes have used so far; NaN without worker processes or
    ``/proc`` (not Linux)."""
    procs = getattr(env, "_procs", None)
    if not procs or not Path("/proc").is_dir():
        return float("nan")
    total = 0
    for p in procs:
        fields = Path(f"/proc/{p.pid}/stat").read_text().rpartition(")")[2].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of proc(5))
    return total / os.sysconf("SC_CLK_TCK")


def iteration(s: Setup, decisions: int) -> dict[str, float]:
    """One collect + update as the training loop runs it; seconds, env steps, and the CPU seconds of this process
    (the learner: acting and updating, every thread) and of the env workers."""
    from vla_rl.algorithms.base import IterationInputs
    from vla_rl.threads import torch_threads

    s.policy.train()
    cpu0, wcpu0 = time.process_time(), workers_cpu_s(s.env)
    t0 = time.perf_counter()
    with torch_threads(s.rollout_threads):
        if s.algo == "ppo":
            rollout = s.engine.collect(decisions)
        else:  # the learner collects (and, overlapped, trains the previous iteration's minibatches meanwhile)
            rollout = s.learner.collect(IterationInputs(iteration=0, seed_base=0, reset=False, engine=s.engine,
                                                        sync=not s.overlap))
    t1 = time.perf_counter()
    with torch_threads(s.update_threads):
        stats = s.learner.update(rollout)
    t2 = time.perf_counter()
    out = {"rollout_s": t1 - t0, "update_s": t2 - t1, "env_steps": rollout.env_steps,
           "learner_cpu_s": time.process_time() - cpu0, "workers_cpu_s": workers_cpu_s(s.env) - wcpu0,
           **{k.removeprefix("time/").removesuffix("_s") + "_s": v for k, v in rollout.times.items()}}
    out["update_steps"] = stats.get("update/steps", 1.0)  # PPO reports none: it always updates
    if "update/overlapped_s" in stats:
        out["overlapped_update_s"] = stats["update/overlapped_s"]
    return out


def warm_up(s: Setup, decisions: int) -> int:
    """Untimed iterations (worker start, first renders, allocator) until the learner trains every iteration."""
    for n in range(1, WARMUP_ITERATIONS + 1):
        steps = iteration(s, decisions)["update_steps"]
        if steps > 0 or getattr(s.learner, "_deferred", None):
            return n
    raise RuntimeError(f"filtered_bc drew no minibatch in {WARMUP_ITERATIONS} iterations: pass --policy, a "
                       "pre-trained policy that succeeds sometimes")


def env_only(s: Setup, decisions: int, exec_steps: int) -> dict[str, float]:
    """The same number of chunks of uniform random actions in the action box, no policy."""
    spec = s.env.spec.action
    lo = spec.low if spec.low is not None else -1.0
    hi = spec.high if spec.high is not None else 1.0
    g = torch.Generator().manual_seed(0)
    t0 = time.perf_counter()
    steps = 0
    for _ in range(decisions):
        acts = lo + (hi - lo) * torch.rand((s.env.num_envs, exec_steps, *spec.shape), generator=g)
        s.env.step_chunk(acts)
        steps += s.env.num_envs * exec_steps
    return {"env_only_s": time.perf_counter() - t0, "env_steps": steps}


def eval_seconds(s: Setup, episodes: int) -> float:
    from vla_rl.evaluation import evaluate_policy

    s.policy.eval()
    t0 = time.perf_counter()
    evaluate_policy(s.env, s.policy, episodes, 123, s.engine.exec_steps, progress=False)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", default="", help="a pre-trained policy folder (e.g. a quickstart's sft_policy); "
                    "default: a fresh quickstart policy (its episodes never succeed, so they all run to the limit "
                    "and the filtered_bc variants, which need successes, stop with an error)")
    ap.add_argument("--demos", default="", help="the demo dataset filtered_bc mixes in (the quickstart's, under "
                    "$VLA_RL_HOME/demos); default: none (the same supervised step on buffer rows only)")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds over the variants")
    ap.add_argument("--iterations", type=int, default=4, help="timed iterations per variant per round")
    ap.add_argument("--eval_episodes", type=int, default=400, help="episodes of the one timed evaluation")
    ap.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                    help=f"comma-separated names of variants, of: {', '.join(VARIANTS)}")
    args = harness.add_output_args(ap).parse_args()
    torch.set_num_threads(1)
    from vla_rl.commands.quickstart import QuickstartConfig
    from vla_rl.threads import usable_cores

    cores = usable_cores()
    qs = _quickstart(QuickstartConfig, "ppo", False)
    decisions, iterations = qs.algo.decisions_per_iter, qs.iterations
    names = [n.strip() for n in args.variants.split(",")]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        ap.error(f"--variants: unknown {unknown}; valid: {list(VARIANTS)}")
    setups = {n: build(args.policy, args.demos, seed=0, **VARIANTS[n]) for n in names}
    exec_steps = next(iter(setups.values())).engine.exec_steps
    samples: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    env_samples: list[dict[str, float]] = []
    try:
        for n in names:
            print(f"{n}: warmed up in {warm_up(setups[n], decisions)} iteration(s)", flush=True)
        for r in range(args.repeats):
            for n in names:
                for _ in range(args.iterations):
                    samples[n].append(iteration(setups[n], decisions))
                print(f"round {r + 1}/{args.repeats} {n}: "
                      f"rollout {statistics.median(x['rollout_s'] for x in samples[n]):.2f} s, "
                      f"update {statistics.median(x['update_s'] for x in samples[n]):.2f} s", flush=True)
            env_samples.append(env_only(setups[names[0]], decisions, exec_steps))
        eval_s = eval_seconds(setups[names[0]], args.eval_episodes)
    finally:
        for s in setups.values():
            s.env.close()
    env_steps = env_samples[0]["env_steps"]
    env_sps = env_steps / statistics.median(x["env_only_s"] for x in env_samples)
    rows = []
    for n in names:
        med = {k: statistics.median(x[k] for x in samples[n]) for k in samples[n][0]}
        it_s = med["rollout_s"] + med["update_s"]
        rows.append({
            "variant": n, **VARIANTS[n], **{k: round(v, 4) for k, v in med.items()},
            "update_own_s": med.get("overlapped_update_s", med["update_s"]),
            "rollout_steps_per_s": med["env_steps"] / med["rollout_s"],
            "iteration_steps_per_s": med["env_steps"] / it_s,
            "rollout_vs_env_only": med["env_steps"] / med["rollout_s"] / env_sps,
            "update_vs_rollout": med["update_s"] / med["rollout_s"],
            "update_own_vs_rollout": med.get("overlapped_update_s", med["update_s"]) / med["rollout_s"],
            "rl_stage_estimate_s": iterations * it_s + 2 * eval_s,
            # all the CPU work of an iteration spread over every usable core: no schedule beats it
            "cpu_floor_s": (med["learner_cpu_s"] + med["workers_cpu_s"]) / cores,
        })
    base = rows[0]["rl_stage_estimate_s"]
    for row in rows:
        row["rl_stage_vs_first"] = row["rl_stage_estimate_s"] / base
    result = {
        "usable_cpus": cores, "torch": torch.__version__, "load_average_end": os.getloadavg()[0],
        "policy": args.policy or "fresh quickstart policy", "demos": args.demos,
        "repeats": args.repeats, "iterations_per_repeat": args.iterations,
        "env_only_steps_per_s": env_sps, "eval_episodes": args.eval_episodes, "eval_seconds": eval_s, "rows": rows,
    }
    md = render(result)
    print(md)
    harness.publish("throughput", args, md, rows=rows, summary={k: v for k, v in result.items() if k != "rows"})


def render(r: dict[str, Any]) -> str:
    lines = [
        "The quickstart's RL stage (`mujoco/pick-any`, 32 envs on 2 workers, front + wrist camera 64x64, compact flow policy, chunks of 4, "
        "6 decisions per env per iteration; PPO: full-chain Flow-SDE, 2 epochs x minibatch 192; filtered_bc: 8 "
        "supervised steps of 64 rows), each variant built once and timed interleaved, median of "
        f"{r['repeats']} x {r['iterations_per_repeat']} iterations, load average {r['load_average_end']:.1f} at the end; policy: {r['policy']}; demos: "
        f"{r.get('demos') or 'none'}. Env only: {r['env_only_steps_per_s']:.0f} env steps / s (random actions, same "
        f"envs). One {r['eval_episodes']}-episode evaluation: {r['eval_seconds']:.0f} s. RL stage = 200 x (rollout + "
        "update) + 2 evaluations. *update s* is what the loop waits for; *own* is the update's own wall time (run "
        "beside the next collection when overlapped). *CPU s* per iteration: this process (acting and updating, all "
        f"threads) and the env worker processes; *CPU floor*: their sum over the {r['usable_cpus']} usable "
        "cores, the shortest iteration any schedule of the same work could reach.",
        "",
        "| variant | rollout s | env s | act s | update s (own) | rollout steps/s | x env only | update own / rollout "
        "| iteration steps/s | CPU s: learner + workers | CPU floor s | RL stage s (est.) | x first |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in r["rows"]:
        own = row["update_own_s"]
        lines.append(
            f"| {row['variant']} | {row['rollout_s']:.2f} | {row['rollout_env_s']:.2f} "
            f"| {row['rollout_act_s']:.2f} | {row['update_s']:.2f} ({own:.2f}) "
            f"| {row['rollout_steps_per_s']:.0f} | {row['rollout_vs_env_only']:.2f} "
            f"| {row['update_own_vs_rollout']:.2f} | {row['iteration_steps_per_s']:.0f} "
            f"| {row['learner_cpu_s']:.2f} + {row['workers_cpu_s']:.2f} "
            f"| {row['cpu_floor_s']:.2f} | {row['rl_stage_estimate_s']:.0f} | {row['rl_stage_vs_first']:.2f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
