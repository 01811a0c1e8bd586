"""PPO update cost per sampler vs supervised flow matching, and pipelined vs sequential rollouts.

    OMP_NUM_THREADS=1 python benchmarks/train_step.py [--batch 32] [--repeats 9]

1. **Update step** (compact-flow policy, one batch of B observations): per-sample time of one PPO step
   (``evaluate`` of the recorded sample + clipped surrogate + clipped value loss, backward, AdamW step)
   for Flow-SDE one-step, Flow-SDE full chain and Flow-Noise, against one supervised flow-matching step
   (``sft_loss``, backward, AdamW step) on the same batch. Targets: one-step <= 1.5x SFT (it re-runs
   one denoising step), full chain <= (K+1)x SFT (K velocity calls). Process CPU time, median of
   interleaved repeats (robust on a shared machine); wall time is printed too.
2. **Rollout** on ``mujoco/pick-red`` with 2 worker processes: wall time of ``RolloutEngine.collect`` in
   sequential and pipelined mode, against env-only (the same chunks executed on both worker groups with
   no policy) and policy-only (the same ``act`` calls with no env). Target: pipelined <= 1.15x
   max(env-only, policy-only), i.e. near-perfect overlap. Median of interleaved repeats. Two policy sizes
   (:data:`ROLLOUT_CASES`): with 2 cores, overlap can hide the env stepping behind a policy that outweighs
   it, but not the reverse (both workers already fill both cores while the envs step).

Published by ``benchmarks/harness.py``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import harness
import torch

from policies.base import ActMode, Policy
from policies.compact import CompactFlowConfig, CompactFlowPolicy
from policies.flow.sampler import SamplerConfig
from sim.core import OBS_STATE, TASK, image_key
from vla_rl.algorithms.losses import ppo_policy_loss, value_loss

SAMPLERS = {
    "Flow-SDE one-step": dict(kind="flow_sde", sde_mode="one_step"),
    "Flow-SDE full chain": dict(kind="flow_sde", sde_mode="full_chain"),
    "Flow-Noise": dict(kind="flow_noise"),
}


# ------------------------------------------------------------------------------ update step


def _obs(batch: int, cfg: CompactFlowConfig, seed: int = 0) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    obs: dict[str, Any] = {OBS_STATE: torch.randn(batch, cfg.state_dim, generator=g)}
    for cam in cfg.cameras:
        obs[image_key(cam)] = torch.randint(0, 256, (batch, *cfg.image_size, 3), generator=g, dtype=torch.uint8)
    obs[TASK] = ["pick up the red cube"] * batch
    return obs


def _policy(cfg: CompactFlowConfig, sampler: dict[str, Any], steps: int) -> CompactFlowPolicy:
    torch.manual_seed(0)
    return CompactFlowPolicy(CompactFlowConfig(**{**cfg.__dict__, "sampler": SamplerConfig(num_steps=steps, **sampler)}))


def _timed(fn: Callable[[], Any]) -> tuple[float, float]:
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.process_time() - c, time.perf_counter() - w


def bench_update(batch: int, repeats: int, steps: int) -> dict[str, Any]:
    """Per-sample CPU / wall milliseconds of each PPO variant and of SFT (see module doc)."""
    base = CompactFlowConfig(text_encoder="hashed")
    obs = _obs(batch, base)
    fns: dict[str, Callable[[], None]] = {}
    for name, sampler in SAMPLERS.items():
        policy = _policy(base, sampler, steps)
        opt = torch.optim.AdamW(policy.parameters(), lr=1e-5)
        with torch.no_grad():
            out = policy.act(obs, ActMode.EXPLORE)
        adv = torch.randn(batch)
        returns = torch.randn(batch)

        def ppo(policy: Policy = policy, opt: torch.optim.Optimizer = opt, out: Any = out, adv: torch.Tensor = adv,
                returns: torch.Tensor = returns) -> None:
            logp, entropy, value = policy.evaluate(obs, out.extras)
            pl, _ = ppo_policy_loss(logp, out.logp, adv, 0.2, 0.28, 3.0)
            vl, _ = value_loss(value, out.value, returns, 0.2, 10.0)
            (pl + 0.5 * vl - 0.005 * entropy.mean()).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        fns[name] = ppo
    sft_policy = _policy(base, SAMPLERS["Flow-SDE one-step"], steps)
    sft_opt = torch.optim.AdamW(sft_policy.parameters(), lr=1e-5)
    actions = torch.rand(batch, base.chunk_size, base.action_dim) * 2 - 1

    def sft() -> None:
        sft_policy.sft_loss(obs, actions).backward()
        sft_opt.step()
        sft_opt.zero_grad(set_to_none=True)

    fns["SFT (flow matching)"] = sft
    for fn in fns.values():  # warm-up
        fn()
    samples: dict[str, list[tuple[float, float]]] = {k: [] for k in fns}
    for _ in range(repeats):  # interleaved: load changes hit every variant alike
        for name, fn in fns.items():
            samples[name].append(_timed(fn))
    rows = {}
    for name, s in samples.items():
        cpu = statistics.median(c for c, _ in s) / batch * 1e3
        wall = statistics.median(w for _, w in s) / batch * 1e3
        rows[name] = (cpu, wall)
    return {"rows": rows, "batch": batch, "steps": steps, "config": base}


def update_markdown(res: dict[str, Any]) -> str:
    rows, k = res["rows"], res["steps"]
    sft_cpu = rows["SFT (flow matching)"][0]
    target = {"Flow-SDE one-step": 1.5, "Flow-SDE full chain": float(k + 1), "Flow-Noise": float(k + 1),
              "SFT (flow matching)": None}
    c = res["config"]
    lines = [
        f"Compact flow policy (width {c.width}, {c.prefix_layers}+{c.expert_layers} layers, 1 camera "
        f"{c.image_size[0]}x{c.image_size[1]}, chunk {c.chunk_size}x{c.action_dim}, K = {k} denoising steps), "
        f"batch {res['batch']}, one update step = forward + backward + AdamW. Per-sample process CPU time "
        "(median of interleaved repeats; wall clock in brackets).",
        "",
        "| update step | ms / sample CPU (wall) | x SFT | target | ok |",
        "|---|---|---|---|---|",
    ]
    for name, (cpu, wall) in rows.items():
        ratio = cpu / sft_cpu
        t = target[name]
        lines.append(f"| {name} | {cpu:.2f} ({wall:.2f}) | {ratio:.2f} | {'-' if t is None else f'<= {t:g}'} | "
                     f"{'-' if t is None else ('yes' if ratio <= t else 'no')} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ rollout


ROLLOUT_CASES = {
    # the compact policy's defaults: the two workers' env stepping outweighs the policy
    "env-bound": dict(width=128, steps=4),
    # a heavier policy (wider, 10 denoising steps as pi0 samples): the policy outweighs the env stepping
    "policy-bound": dict(width=384, steps=10),
}


def bench_rollout(num_envs: int, decisions: int, repeats: int, image_size: int, width: int = 128,
                  steps: int = 4) -> dict[str, Any]:
    """Wall seconds of one ``collect(decisions)`` per mode (see module doc); ``width`` and ``steps`` (K) size
    the policy."""
    from sim import make_env
    from vla_rl.rollout import RolloutEngine

    env = make_env("mujoco/pick-red", num_envs=num_envs, num_workers=2, image_size=image_size, seed=0)
    try:
        spec = env.spec
        torch.manual_seed(0)
        policy = CompactFlowPolicy(CompactFlowConfig(
            cameras=tuple(spec.cameras), image_size=(image_size, image_size), action_dim=spec.action_dim,
            state_dim=spec.observation[OBS_STATE].shape[0], text_encoder="hashed", chunk_size=8, width=width,
            sampler=SamplerConfig(num_steps=steps),
        )).eval()
        seq = RolloutEngine(env, policy, pipelined=False)
        pipe = RolloutEngine(env, policy, pipelined=True)
        groups = pipe.pipeline_groups
        assert groups is not None, "mujoco/pick-red with 2 workers must support pipelining"
        h = policy.chunk_size

        def run_seq() -> None:
            seq.reset(seed=1)
            seq.collect(decisions)

        def run_pipe() -> None:
            pipe.reset(seed=1)
            pipe.collect(decisions)

        obs = env.reset(seed=1)
        halves = [{k: (v[g[0]: g[-1] + 1]) for k, v in obs.items()} for g in groups]
        chunk = torch.zeros(num_envs, h, spec.action_dim)

        def env_only() -> None:
            env.reset(seed=1)
            for _ in range(decisions):
                for g in groups:
                    env.chunk_async(chunk[g[0]: g[-1] + 1], g)
                for g in groups:
                    env.chunk_wait(g)

        def policy_only() -> None:
            with torch.no_grad():
                for _ in range(decisions):
                    for half in halves:
                        policy.act(half, ActMode.EXPLORE)

        fns = {"sequential": run_seq, "pipelined": run_pipe, "env only": env_only, "policy only": policy_only}
        for fn in fns.values():
            fn()
        samples: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(repeats):
            for name, fn in fns.items():
                samples[name].append(_timed(fn)[1])
        med = {k: statistics.median(v) for k, v in samples.items()}
        return {"wall": med, "num_envs": num_envs, "decisions": decisions, "chunk": h, "image_size": image_size,
                "groups": [len(g) for g in groups], "width": width, "steps": steps}
    finally:
        env.close()


def rollout_markdown(results: dict[str, dict[str, Any]]) -> str:
    first = next(iter(results.values()))
    steps = first["num_envs"] * first["decisions"] * first["chunk"]
    lines = [
        f"`mujoco/pick-red`, {first['num_envs']} envs on 2 worker processes (halves of {first['groups']} envs), "
        f"{first['image_size']}x{first['image_size']} camera, compact-flow policy acting in chunks of {first['chunk']}, "
        f"{first['decisions']} decisions = {steps} env steps per collect. Wall time, median of interleaved repeats. "
        "Two policy sizes: the default compact policy (env-bound) and a wider one sampling with 10 denoising "
        "steps (policy-bound, as a VLA's inference usually is).",
        "",
        "| case | policy | mode | wall s | env steps / s | x max(env, policy) |",
        "|---|---|---|---|---|---|",
    ]
    verdicts = []
    for case, res in results.items():
        wall = res["wall"]
        bound = max(wall["env only"], wall["policy only"])
        for name in ("sequential", "pipelined", "env only", "policy only"):
            lines.append(f"| {case} | width {res['width']}, K = {res['steps']} | {name} | {wall[name]:.2f} | "
                         f"{steps / wall[name]:.0f} | {wall[name] / bound:.2f} |")
        ratio = wall["pipelined"] / bound
        verdicts.append(f"{case}: pipelined / max(env only, policy only) = {ratio:.2f} (target <= 1.15: "
                        f"{'met' if ratio <= 1.15 else 'not met'}), pipelined / sequential = "
                        f"{wall['pipelined'] / wall['sequential']:.2f}.")
    return "\n".join([*lines, "", *[f"- {v}" for v in verdicts], *_reading(results)])


def _reading(results: dict[str, dict[str, Any]]) -> list[str]:
    """What the two cases say about overlap on this machine (computed from the measurement)."""
    out = []
    if "env-bound" in results:
        w = results["env-bound"]["wall"]
        e, p = w["env only"], w["policy only"]
        floor = (2 * e + p) / 2
        out.append(
            f"Env-bound: while the envs step, the two workers fill both cores ({2 * e:.2f} core-s), and the policy "
            f"needs another {p:.2f} core-s; on {os.cpu_count()} cores no schedule beats (2 x {e:.2f} + {p:.2f}) / 2 "
            f"= {floor:.2f} s, already {floor / max(e, p):.2f}x the max. Pipelined collection takes "
            f"{w['pipelined'] / floor:.2f}x that floor. Overlap pays where a core idles while the envs step "
            "(more cores than workers, or a GPU policy).")
    if "policy-bound" in results:
        w = results["policy-bound"]["wall"]
        bound = max(w["env only"], w["policy only"])
        out.append(
            f"Policy-bound: sequential collection is within {w['sequential'] / bound:.2f}x the max as well, since "
            f"the env stepping ({w['env only']:.2f} s) is small next to the policy. Pipelining hides it behind "
            "the policy but acts on half-batches, two calls per decision instead of one; here that costs about "
            f"what it hides (pipelined / sequential = {w['pipelined'] / w['sequential']:.2f}).")
    return [line for paragraph in out for line in ("", paragraph)]


# ------------------------------------------------------------------------------ output


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=32, help="observations per update step")
    parser.add_argument("--steps", type=int, default=4, help="K, denoising steps")
    parser.add_argument("--repeats", type=int, default=9, help="interleaved timing repeats")
    parser.add_argument("--envs", type=int, default=8, help="rollout envs (split over 2 workers)")
    parser.add_argument("--decisions", type=int, default=6, help="decisions per collect")
    parser.add_argument("--rollout-repeats", type=int, default=5)
    parser.add_argument("--image-size", type=int, default=64)
    args = harness.add_output_args(parser).parse_args(argv)
    torch.set_num_threads(1)
    update = bench_update(args.batch, args.repeats, args.steps)
    rollout = {case: bench_rollout(args.envs, args.decisions, args.rollout_repeats, args.image_size, **sizes)
               for case, sizes in ROLLOUT_CASES.items()}
    body = "\n".join([
        f"Torch {torch.__version__}, 1 torch thread; a shared machine: read ratios, not absolutes.",
        "",
        "### PPO update step vs supervised flow matching",
        "",
        update_markdown(update),
        "",
        "### Rollout: pipelined vs sequential",
        "",
        rollout_markdown(rollout),
    ])
    print(body)
    harness.publish("train_step", args, body, rows={"update": update, "rollout": rollout},
                    command=harness.command_line(argv))
    return body


if __name__ == "__main__":
    main()
