"""What our CPU machines cannot show, measured on one CUDA GPU: ManiSkill's GPU backend through our sim layer, a
policy acting on the GPU envs, and full-size LeRobot pi0 in bf16 through our adapter.

    python benchmarks/gpu.py [--parts envs rollout pi0]

Parts (each runs on its own; an error is recorded in the results, and the next part still runs):

- ``envs``: ``maniskill/PickCube-v1`` on PhysX's CUDA backend, random actions in the action box: ManiSkill's own
  ``gym.make(..., sim_backend="physx_cuda")`` env ("raw", the same ``gym.make`` arguments our layer passes) against
  ``sim.make_env(..., sim_backend="gpu")`` ("ours": partial auto-reset, our observation dict, episode bookkeeping),
  for ``state`` and ``rgb`` observations and several env counts. Env steps per second, warm-up excluded, CUDA
  synchronized at both ends of the timed block.
- ``rollout``: the compact flow policy (hashed instruction words: the MiniLM package is not on the GPU machine)
  placed on the GPU, acting (Flow-SDE exploration, chunks of 4) on the same GPU envs with ``rgb`` observations,
  against env-only chunks of random actions on the same envs: the rollout's fraction of the env-only speed.
- ``pi0``: LeRobot's ``PI0Policy`` at its real size (PaliGemma 2B + the 300M action expert, SigLIP at 224 px), random
  weights (no download), ``dtype=bfloat16`` as LeRobot loads the released checkpoints, wrapped by our adapter on
  CUDA: parameters, act latency (ODE eval and Flow-SDE explore, 10 steps), one PPO-style update (re-scoring the
  recorded chains, backward, AdamW), the peak GPU memory, and how far the re-scored log-prob of the recorded chain
  is from the one returned while acting (the PPO ratio's error at ratio 1).

Needs CUDA, ManiSkill 3 with SAPIEN and a Vulkan driver (``rgb``), and LeRobot (``pi0``).
"""

from __future__ import annotations

import argparse
import statistics
import time
import traceback
from collections.abc import Callable
from typing import Any

import harness
import torch

ENV_ID = "maniskill/PickCube-v1"
TASK = "PickCube-v1"
DEVICE = "cuda"
FULL_SIZE = True


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(fn: Callable[[], Any], repeats: int) -> float:
    """Median seconds of ``fn`` over ``repeats`` calls after one warm-up call, CUDA synchronized."""
    fn()
    times = []
    for _ in range(repeats):
        _sync()
        t0 = time.perf_counter()
        fn()
        _sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _random_actions(low: torch.Tensor, high: torch.Tensor, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    return low + (high - low) * torch.rand(shape, generator=gen, device=low.device)


# ------------------------------------------------------------------------------------------------------------ envs
def bench_envs(counts: list[int], rgb_counts: list[int], steps: int, image_size: int) -> list[dict[str, Any]]:
    import gymnasium as gym
    import mani_skill.envs  # noqa: F401  registers the tasks

    from sim import make_env
    from sim.backends.maniskill_common import ManiSkillOptions, gym_make_kwargs

    rows = []
    for obs_mode, ns in (("state", counts), ("rgb", rgb_counts)):
        for n in ns:
            row: dict[str, Any] = {"obs_mode": obs_mode, "num_envs": n, "steps": steps}
            opts = ManiSkillOptions(obs_mode=obs_mode, sim_backend="gpu", image_size=image_size)
            try:
                raw = gym.make(TASK, num_envs=n, sim_backend="physx_cuda", **gym_make_kwargs(opts))
                gen = torch.Generator(device=DEVICE).manual_seed(0)
                space = raw.unwrapped.single_action_space
                low = torch.as_tensor(space.low, device=DEVICE)
                high = torch.as_tensor(space.high, device=DEVICE)
                raw.reset(seed=0)

                def raw_block() -> None:
                    for _ in range(steps):
                        raw.step(_random_actions(low, high, (n, low.shape[0]), gen))

                row["raw_s"] = _timed(raw_block, 3)
                raw.close()
                env = make_env(ENV_ID, num_envs=n, seed=0, obs_mode=obs_mode, sim_backend="gpu", image_size=image_size)
                env.reset(seed=0)

                def ours_block() -> None:
                    for _ in range(steps):
                        env.step(_random_actions(low, high, (n, low.shape[0]), gen))

                row["ours_s"] = _timed(ours_block, 3)
                env.close()
                row["raw_steps_per_s"] = n * steps / row["raw_s"]
                row["ours_steps_per_s"] = n * steps / row["ours_s"]
                row["ratio"] = row["ours_steps_per_s"] / row["raw_steps_per_s"]
            except Exception as exc:  # record and go on: the next size may still run
                row["error"] = f"{type(exc).__name__}: {exc}"
                traceback.print_exc()
            print(row, flush=True)
            rows.append(row)
    return rows


# --------------------------------------------------------------------------------------------------------- rollout
def bench_rollout(counts: list[int], chunks: int, image_size: int) -> list[dict[str, Any]]:
    from policies.base import ActMode
    from sim import make_env
    from vla_rl.policy_factory import build_policy_from_fields, spec_fields

    rows = []
    for n in counts:
        row: dict[str, Any] = {"num_envs": n, "chunks": chunks, "chunk_size": 4}
        try:
            env = make_env(ENV_ID, num_envs=n, seed=0, obs_mode="rgb", sim_backend="gpu", image_size=image_size)
            torch.manual_seed(0)
            policy = build_policy_from_fields(
                "compact-flow", {"text_encoder": "hashed", "chunk_size": 4}, spec_fields(env.spec)).to(DEVICE)
            row["policy_device"] = str(next(policy.parameters()).device)
            low = torch.full((env.spec.action.shape[0],), env.spec.action.low or -1.0, device=DEVICE)
            high = torch.full_like(low, env.spec.action.high or 1.0)
            gen = torch.Generator(device=DEVICE).manual_seed(0)
            state = {"obs": env.reset(seed=0)}
            act_s: list[float] = []

            def with_policy() -> None:
                for _ in range(chunks):
                    _sync()
                    t0 = time.perf_counter()
                    with torch.inference_mode():
                        out = policy.act(state["obs"], ActMode.EXPLORE)
                    _sync()
                    act_s.append(time.perf_counter() - t0)
                    steps = env.step_chunk(out.actions.to(env.device))
                    state["obs"] = steps.obs

            def env_only() -> None:
                for _ in range(chunks):
                    env.step_chunk(_random_actions(low, high, (n, 4, low.shape[0]), gen))

            row["env_only_s"] = _timed(env_only, 3)
            row["rollout_s"] = _timed(with_policy, 3)
            row["act_s_per_chunk"] = statistics.median(act_s)
            env.close()
            row["env_only_steps_per_s"] = n * 4 * chunks / row["env_only_s"]
            row["rollout_steps_per_s"] = n * 4 * chunks / row["rollout_s"]
            row["ratio"] = row["rollout_steps_per_s"] / row["env_only_steps_per_s"]
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
        print(row, flush=True)
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------------------------------------- pi0
def bench_pi0(batches: list[int], repeats: int) -> list[dict[str, Any]]:
    from policies.base import ActMode
    from policies.flow.tiny import build_tiny_lerobot_policy

    from policy_latency import image_obs, rl_step

    rows = []
    try:
        torch.manual_seed(0)
        t0 = time.perf_counter()
        policy = build_tiny_lerobot_policy("pi0", full_size=FULL_SIZE, dtype="bfloat16", device=DEVICE,
                                           image_size=224, state_dim=8, action_dim=7, chunk_size=50, max_dim=32)
        build_s = time.perf_counter() - t0
        params = sum(p.numel() for p in policy.parameters())
        dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in policy.parameters()})
        devices = sorted({str(p.device) for p in policy.parameters()})
        print(f"pi0 full size: {params / 1e9:.2f}B parameters, {dtypes}, {devices}, built in {build_s:.0f} s", flush=True)
    except Exception as exc:
        traceback.print_exc()
        return [{"error": f"{type(exc).__name__}: {exc}"}]
    trainable = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-6, foreach=False)
    for b in batches:
        row: dict[str, Any] = {"batch": b, "params": params, "dtypes": dtypes, "devices": devices,
                               "build_s": build_s, "sampler_steps": policy.config.sampler.num_steps}
        try:
            obs = image_obs(b, ("front",), 224, 8)
            obs = {k: (v.to(DEVICE) if torch.is_tensor(v) else v) for k, v in obs.items()}
            torch.cuda.reset_peak_memory_stats()
            with torch.inference_mode():
                row["act_eval_s"] = _timed(lambda: policy.act(obs, ActMode.EVAL), repeats)
                row["act_explore_s"] = _timed(lambda: policy.act(obs, ActMode.EXPLORE), repeats)
                out = policy.act(obs, ActMode.EXPLORE)
            row["act_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
            extras = {k: v.clone() for k, v in out.extras.items()}
            logp_act = out.logp.float().clone()
            with torch.no_grad():
                logp_eval, _, _ = policy.evaluate(obs, extras)
            diff = (logp_eval.float() - logp_act).abs()
            row["logp_abs_diff_max"] = float(diff.max())
            row["logp_abs_mean"] = float(logp_act.abs().mean())
            torch.cuda.reset_peak_memory_stats()
            row["update_s"] = _timed(lambda: rl_step(policy, optimizer, obs, extras), repeats)
            row["update_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
            optimizer.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
        print(row, flush=True)
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------------------- report
def _fmt(x: Any, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _row(lead: list[Any], r: dict[str, Any], cells: Callable[[], list[str]], ncols: int) -> str:
    """One table row: ``lead`` cells, then ``cells()`` or the part's error in the rest."""
    rest = [f"error: {r['error'][:160]}"] + [""] * (ncols - len(lead) - 1) if "error" in r else cells()
    return "| " + " | ".join(str(c) for c in [*lead, *rest]) + " |"


def markdown(res: dict[str, Any]) -> str:
    out = [f"{res['device']}, torch {res['torch']}. One run; each part on its own (see the script's doc)."]
    if res.get("envs"):
        out += ["", f"ManiSkill `{TASK}` on PhysX CUDA, random actions, env steps / s (median of 3 blocks of "
                    f"{res['envs'][0]['steps']} steps); raw = ManiSkill's env, ours = `sim.make_env(..., sim_backend='gpu')`.",
                "", "| obs | envs | raw steps/s | ours steps/s | ours / raw |", "|---|---:|---:|---:|---:|"]
        for r in res["envs"]:
            out.append(_row([r["obs_mode"], r["num_envs"]], r, lambda r=r: [
                f"{r['raw_steps_per_s']:.0f}", f"{r['ours_steps_per_s']:.0f}", f"{r['ratio']:.2f}"], 5))
    if res.get("rollout"):
        out += ["", "Compact flow policy on the GPU acting on the same envs (`rgb`, chunks of 4, Flow-SDE explore) "
                    "against env-only chunks of random actions:", "",
                "| envs | env-only steps/s | rollout steps/s | rollout / env-only | act s per chunk | policy device |",
                "|---:|---:|---:|---:|---:|---|"]
        for r in res["rollout"]:
            out.append(_row([r["num_envs"]], r, lambda r=r: [
                f"{r['env_only_steps_per_s']:.0f}", f"{r['rollout_steps_per_s']:.0f}", f"{r['ratio']:.2f}",
                f"{r['act_s_per_chunk']:.4f}", r["policy_device"]], 6))
    if res.get("pi0"):
        first = res["pi0"][0]
        if "params" in first:
            out += ["", f"LeRobot pi0 at full size ({first['params'] / 1e9:.2f}B parameters, "
                        f"{'/'.join(first['dtypes'])}, random weights), our adapter on CUDA, one 224 px camera, "
                        f"chunk 50, {first['sampler_steps']} denoising steps; update = re-score the recorded chains, "
                        "backward, AdamW:", "",
                    "| batch | act eval s | act explore s | update s | peak GiB act / update | "
                    "max abs logp error (re-scored vs acting) |", "|---:|---:|---:|---:|---|---|"]
        for r in res["pi0"]:
            out.append(_row([r.get("batch", "-")], r, lambda r=r: [
                f"{r['act_eval_s']:.3f}", f"{r['act_explore_s']:.3f}", _fmt(r.get("update_s"), ".3f"),
                f"{r['act_peak_gib']:.1f} / {_fmt(r.get('update_peak_gib'), '.1f')}",
                f"{r['logp_abs_diff_max']:.3g} (of mean abs {r['logp_abs_mean']:.3g})"], 6))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", default=["envs", "rollout", "pi0"], choices=["envs", "rollout", "pi0"])
    parser.add_argument("--envs", type=int, nargs="+", default=[64, 256, 1024], help="env counts, state obs")
    parser.add_argument("--rgb_envs", type=int, nargs="+", default=[64, 256], help="env counts, rgb obs")
    parser.add_argument("--steps", type=int, default=50, help="env steps per timed block")
    parser.add_argument("--image_size", type=int, default=64)
    parser.add_argument("--chunks", type=int, default=10, help="policy chunks per timed rollout block")
    parser.add_argument("--pi0_batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--repeats", type=int, default=3)
    args = harness.add_output_args(parser).parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/gpu.py needs a CUDA GPU (torch.cuda.is_available() is False)")
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    if "envs" in args.parts:
        res["envs"] = bench_envs(args.envs, args.rgb_envs, args.steps, args.image_size)
    if "rollout" in args.parts:
        res["rollout"] = bench_rollout(args.rgb_envs, args.chunks, args.image_size)
    if "pi0" in args.parts:
        res["pi0"] = bench_pi0(args.pi0_batches, args.repeats)
    table = markdown(res)
    print(table)
    harness.publish("gpu", args, table, rows=res, command=harness.command_line(argv))


if __name__ == "__main__":
    main()
