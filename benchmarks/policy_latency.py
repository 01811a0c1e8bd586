"""Act latency and train-step time per policy, published as a markdown table (``benchmarks/harness.py``).

    OMP_NUM_THREADS=1 python benchmarks/policy_latency.py [--batch 16] [--repeats 5] [--only compact-flow,pi0]

Each row is a :class:`BenchCase`: how to build the policy, an observation
batch for it, and (optionally) a supervised loss. Other policy families add
rows with :func:`register_case` (the autoregressive policies append theirs the
same way, through :data:`PROVIDERS`). For every case we time, after one warm-up call:

- ``act eval``: ``act(obs, EVAL)`` (ODE / greedy), per batch;
- ``act explore``: ``act(obs, EXPLORE)`` (stochastic, with log-probs);
- ``RL step``: ``evaluate(obs, extras)`` + a PPO-style surrogate and value loss, backward, Adam step;
- ``SFT step``: the case's supervised loss, backward, Adam step (if it has one).

Times are medians in milliseconds on one thread, wall clock / process CPU
(on a shared machine the CPU time is the better measure of the compute cost).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import harness
import torch

from policies.base import ActMode, Policy


@dataclass
class BenchCase:
    """One benchmark row.

    Attributes:
        name: row label.
        build: returns a fresh policy.
        make_obs: ``batch size -> observation batch`` matching the policy.
        sft_loss: optional ``(policy, obs) -> scalar loss`` for a supervised step.
        notes: short description (sizes, steps) printed in the table.
    """

    name: str
    build: Callable[[], Policy]
    make_obs: Callable[[int], dict[str, Any]]
    sft_loss: Callable[[Policy, dict[str, Any]], torch.Tensor] | None = None
    notes: str = ""


CASES: list[BenchCase] = []


def register_case(case: BenchCase) -> BenchCase:
    """Add a row to the benchmark (rows print in registration order)."""
    CASES.append(case)
    return case


def image_obs(batch: int, cameras: tuple[str, ...], size: int, state_dim: int) -> dict[str, Any]:
    """A random observation batch: uint8 images per camera, float state, one instruction per env."""
    g = torch.Generator().manual_seed(0)
    obs: dict[str, Any] = {
        f"observation.images.{c}": torch.randint(0, 256, (batch, size, size, 3), dtype=torch.uint8, generator=g)
        for c in cameras
    }
    obs["observation.state"] = torch.randn(batch, state_dim, generator=g)
    obs["task"] = [("pick up the red cube", "push the block to the goal")[i % 2] for i in range(batch)]
    return obs


def _median_ms(fn: Callable[[], Any], repeats: int) -> tuple[float, float]:
    """Median wall-clock and process-CPU milliseconds of ``fn`` (after one warm-up call).

    With one torch thread the CPU time is the compute cost even on a machine
    shared with other jobs, where the wall-clock time also counts waiting.
    """
    fn()  # warm-up (lazy loads, caches, allocator)
    wall, cpu = [], []
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append((time.perf_counter() - w0) * 1000.0)
        cpu.append((time.process_time() - c0) * 1000.0)
    return statistics.median(wall), statistics.median(cpu)


def rl_step(policy: Policy, optimizer: torch.optim.Optimizer, obs: dict[str, Any], extras: dict) -> None:
    """One PPO-style update on a recorded act(): ratio * advantage surrogate + value regression."""
    logp, entropy, value = policy.evaluate(obs, extras)
    advantage = torch.ones_like(logp)
    loss = -(torch.exp(logp - logp.detach()) * advantage).mean() - 0.005 * entropy.mean()
    if value is not None:
        loss = loss + 0.5 * (value - 1.0).pow(2).mean()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def measure(case: BenchCase, batch: int, repeats: int) -> dict[str, Any]:
    """Time one case; returns the table row."""
    torch.manual_seed(0)
    policy = case.build()
    params = sum(p.numel() for p in policy.parameters())
    trainable = [p for p in policy.parameters() if p.requires_grad]
    obs = case.make_obs(batch)
    act_eval = _median_ms(lambda: policy.act(obs, ActMode.EVAL), repeats)
    act_explore = _median_ms(lambda: policy.act(obs, ActMode.EXPLORE), repeats)
    out = policy.act(obs, ActMode.EXPLORE)
    optimizer = torch.optim.Adam(trainable, lr=1e-5)
    rl = _median_ms(lambda: rl_step(policy, optimizer, obs, out.extras), repeats)
    sft = None
    if case.sft_loss is not None:
        sft_fn = case.sft_loss

        def sft_step() -> None:
            loss = sft_fn(policy, obs)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

        sft = _median_ms(sft_step, repeats)
    return {"name": case.name, "params": params, "trainable": sum(p.numel() for p in trainable),
            "act_eval": act_eval, "act_explore": act_explore, "rl": rl, "sft": sft, "notes": case.notes}


def markdown_table(rows: list[dict[str, Any]], batch: int) -> str:
    """Render rows as a markdown table."""
    head = (f"| policy | params (trainable) | act eval (B={batch}) | act explore | RL step | SFT step "
            "| notes |\n|---|---|---|---|---|---|---|")
    lines = [head]

    def ms(pair: tuple[float, float] | None) -> str:
        return "-" if pair is None else f"{pair[0]:.1f} / {pair[1]:.1f}"

    for r in rows:
        lines.append(
            f"| {r['name']} | {r['params'] / 1e6:.2f}M ({r['trainable'] / 1e6:.2f}M) | {ms(r['act_eval'])} "
            f"| {ms(r['act_explore'])} | {ms(r['rl'])} | {ms(r['sft'])} | {r['notes']} |"
        )
    lines.append("\nTimes: median wall-clock ms / process-CPU ms per call, one torch thread.")
    return "\n".join(lines)


# -- flow-matching rows ------------------------------------------------------------------------
def _compact_cases() -> None:
    from policies.compact import CompactFlowConfig, CompactFlowPolicy

    default = CompactFlowConfig()

    def sft(policy: Policy, obs: dict[str, Any]) -> torch.Tensor:
        b = obs["observation.state"].shape[0]
        actions = torch.zeros(b, default.chunk_size, default.action_dim)
        return policy.sft_loss(obs, actions)  # type: ignore[attr-defined]

    register_case(BenchCase(
        name="compact-flow", build=lambda: CompactFlowPolicy(CompactFlowConfig()),
        make_obs=lambda b: image_obs(b, default.cameras, default.image_size[0], default.state_dim), sft_loss=sft,
        notes=f"1 cam 64px, H={default.chunk_size}, K={default.sampler.num_steps}, Flow-SDE one-step, MiniLM frozen",
    ))


_TMP = tempfile.TemporaryDirectory(prefix="vla-rl-bench-")


def _lerobot_cases() -> None:
    try:
        import lerobot.policies.pi0  # noqa: F401
    except ImportError:
        print("lerobot[pi,smolvla] not installed: skipping pi0 / pi05 / smolvla rows", file=sys.stderr)
        return
    from policies.flow.tiny import build_tiny_lerobot_policy

    def builder(kind: str) -> Callable[[], Policy]:
        return lambda: build_tiny_lerobot_policy(kind, vlm_folder=Path(_TMP.name) / f"smolvlm-{kind}")

    def sft(policy: Policy, obs: dict[str, Any]) -> torch.Tensor:
        return policy.sft_loss(obs, torch.zeros(obs["observation.state"].shape[0], 4, 3))  # type: ignore[attr-defined]

    for kind in ("pi0", "pi05", "smolvla"):
        register_case(BenchCase(
            name=f"{kind} (tiny)", build=builder(kind), make_obs=lambda b: image_obs(b, ("front",), 64, 5),
            sft_loss=sft,
            notes="width 64, 2 layers, 1 cam 64px, H=4, K=10, Flow-SDE one-step",
        ))


PROVIDERS: list[Callable[[], None]] = [_compact_cases, _lerobot_cases]
"""Functions that register rows; a policy family adds its provider here (e.g. the autoregressive VLAs)."""


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, run the selected cases, print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=16, help="envs per act() call")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per measurement (median)")
    parser.add_argument("--only", default="", help="comma-separated row names (prefix match)")
    args = harness.add_output_args(parser).parse_args(argv)
    torch.set_num_threads(1)
    for provider in PROVIDERS:
        provider()
    wanted = [w for w in args.only.split(",") if w]
    selected = [c for c in CASES if not wanted or any(c.name.startswith(w) for w in wanted)]
    rows = [measure(c, args.batch, args.repeats) for c in selected]
    table = markdown_table(rows, args.batch)
    print(table)
    harness.publish("policy_latency", args, table, rows=rows, command=harness.command_line(argv))


if __name__ == "__main__":
    main()
