"""Is sparse PPO's update better than noise? Sparse-reward PPO from the weak starts against a noise control.

From weak starts (imitation stopped at 0.15 success) sparse PPO often ends below its start, and at a 3.3x actor
step (1e-4) on every seed. This benchmark asks what those collapses are. Each variant is the sparse run of
``benchmarks/learned_rewards.py --parts prm --start_success 0.15`` (``quickstart_ppo``'s PPO on
``{success: 1.0}``, the same pre-trained start per seed, the same 400 held-out episodes) with one change:

- ``preset``: no change, the sparse run itself (the reference the others are read against);
- ``shuffled``: every rollout's advantages are permuted among its valid decisions before the update (a fixed
  generator per iteration). The update keeps its size, its clipping and its critic, but carries no
  information about which decision did well: the noise control;
- ``success-gated``: a rollout in which no decision earned the success term gives the actor zero advantages (the
  critic still learns from it): the update's size follows whether the rollout holds any information;
- ``no-norm``: ``algo.normalize_advantages false``. Per-rollout normalization gives a rollout without a success
  the same advantage scale as one with several, so Adam steps as far on noise as on signal;
- ``shuffled-no-norm``: the noise control of ``no-norm`` (both changes), the drift its update size causes;
- ``warmup-20``: ``algo.critic_warmup_iters 20`` (the preset's 3), a critic fitted longer before the actor moves;
- ``zero-start``: ``policy.sampler.explore_noise zero``, exploring around the chain evaluation runs;
- ``batch-2x``: twice the decisions per update (64 envs, minibatch 384) for half the iterations: the same env
  steps in half the Adam steps, each on twice the decisions.

    python benchmarks/ppo_noise_control.py --variants preset shuffled --iterations 200 --seeds 0 1 \\
        --out runs/noise-control

Runs are written under ``--out`` (``<variant>-lr<step>-it<iterations>-s<seed>``; the seed's pre-trained start in
``pretrained-s<seed>``, the same as ``learned_rewards.py --start_success 0.15`` makes); a finished run is read, not
run again. Published by ``benchmarks/harness.py``, the plot beside the page (``img/ppo_noise_control.png``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import harness
import learned_rewards as lr
import torch

START = 0.15
"""The weak starts (``learned_rewards.Start(success=0.15)``)."""
STEPS_PER_ITERATION = 768
"""Env steps of one ``quickstart_ppo`` iteration (32 envs x 6 decisions x 4-step chunks)."""


@dataclasses.dataclass(frozen=True)
class Variant:
    """One change to the ``prm`` part's sparse run."""

    help: str
    algo: dict[str, Any] = dataclasses.field(default_factory=dict)
    sampler: dict[str, Any] = dataclasses.field(default_factory=dict)
    advantages: str = ""
    """``shuffle`` or ``gate``: how :func:`patched_advantages` changes PPO's advantages (empty: not at all)."""
    batch: int = 1
    """Decisions per update as a multiple of the preset's (32 envs x 6, one minibatch of 192): this many times the
    envs and the minibatch, for as many fewer iterations, so the run has the same env steps, evaluations at the same
    env steps, and this many times fewer Adam steps, each on this many times the decisions."""


VARIANTS = {
    "preset": Variant("no change: the preset's sparse run, at --lr_actor"),
    "shuffled": Variant("advantages permuted among each rollout's decisions (noise control)", advantages="shuffle"),
    "success-gated": Variant("no actor signal from a rollout without a success", advantages="gate"),
    "no-norm": Variant("algo.normalize_advantages false", algo={"normalize_advantages": False}),
    "shuffled-no-norm": Variant("the noise control without advantage normalization", advantages="shuffle",
                                algo={"normalize_advantages": False}),
    "warmup-20": Variant("algo.critic_warmup_iters 20", algo={"critic_warmup_iters": 20}),
    "zero-start": Variant("policy.sampler.explore_noise zero", sampler={"explore_noise": "zero"}),
    "batch-2x": Variant("64 envs, algo.minibatch_size 384, half the iterations", algo={"minibatch_size": 384},
                        batch=2),
}
def shuffle_within(adv: torch.Tensor, mask: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """``adv`` with its valid entries (``mask``) permuted among themselves; invalid entries unchanged."""
    idx = mask.flatten().nonzero().flatten()
    flat = adv.flatten().clone()
    flat[idx] = flat[idx][torch.randperm(idx.numel(), generator=generator)]
    return flat.view_as(adv)


def gate_on_success(adv: torch.Tensor, rollout: Any) -> torch.Tensor:
    """``adv`` where some decision of ``rollout`` earned its ``success`` term, zeros where none did: a sparse
    rollout without a success holds only the critic's errors, and normalized they would move the actor as far as
    a rollout with a success does."""
    success = rollout.reward_terms.get("success")
    return adv if success is not None and bool((success > 0).any()) else torch.zeros_like(adv)


@contextlib.contextmanager
def patched_advantages(kind: str) -> Iterator[None]:
    """PPO's advantages changed while the block runs, the learner's own method restored after: ``shuffle``
    (:func:`shuffle_within`, a generator seeded by the iteration; the runs' own seeds already differ in their
    rollouts) or ``gate`` (:func:`gate_on_success`)."""
    from vla_rl.algorithms.ppo import PPOLearner

    if kind not in ("shuffle", "gate"):
        raise ValueError(f"Variant.advantages must be 'shuffle' or 'gate', got {kind!r}")
    original = PPOLearner.advantages

    def advantages(self: Any, rollout: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        adv, ret, mask = original(self, rollout)
        if kind == "gate":
            return gate_on_success(adv, rollout), ret, mask
        gen = torch.Generator().manual_seed(int(self.iteration))
        return shuffle_within(adv, mask, gen), ret, mask

    PPOLearner.advantages = advantages
    try:
        yield
    finally:
        PPOLearner.advantages = original


def run_dir(out: Path, variant: str, lr_actor: float, iterations: int, seed: int) -> Path:
    return out / f"{variant}-lr{lr_actor:g}-it{iterations}-s{seed}"


def _window(rows: list[dict[str, Any]], key: str, lo: int, hi: int) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None][lo:hi]
    return sum(vals) / len(vals) if vals else None


def run_variant(name: str, seed: int, lr_actor: float, iterations: int, eval_every: int, out: Path) -> dict[str, Any]:
    """The sparse run of ``seed`` with variant ``name`` (run unless finished), as a results row."""
    from rewards import RewardConfig

    variant, start = VARIANTS[name], lr.Start(success=START)
    run = run_dir(out, name, lr_actor, iterations, seed)
    t0 = time.perf_counter()
    if not (run / "report.json").exists():
        fields = {"policy": lr.preset_policy(variant.sampler)} if variant.sampler else {}
        env = start.env()
        with patched_advantages(variant.advantages) if variant.advantages else contextlib.nullcontext():
            lr.quickstart_run(seed, run, RewardConfig(terms={"success": 1.0}), iterations // variant.batch,
                              eval_every // variant.batch, sft_from=lr.pretrained(seed, out, start),
                              env=dataclasses.replace(env, num_envs=env.num_envs * variant.batch),
                              algo={"lr_actor": lr_actor, **variant.algo}, eval_envs=env.num_envs, **fields)
    rows = lr.metrics(run)
    curve = lr.evals(rows)
    final = [r for r in rows if "eval/success" in r][-1]
    return {"variant": name, "change": variant.help, "seed": seed, "lr_actor": lr_actor, "iterations": iterations,
            "curve": curve, "final_ci": [final["eval/success_ci_low"], final["eval/success_ci_high"]],
            "run_iterations": iterations // variant.batch,  # iterations: the preset's with the same env steps
            "rollout_success_21_40": _window(rows, "rollout/success", 20 // variant.batch, 40 // variant.batch),
            "rollout_success_last_20": _window(rows, "rollout/success", -20 // variant.batch, None),
            "approx_kl": _window(rows, "update/approx_kl", 0, None),
            "wall_s": json.loads((run / "report.json").read_text()).get("wall_seconds"),
            "read_s": time.perf_counter() - t0, "run": str(run)}


def _f(v: float | None, fmt: str = ".3f") -> str:
    return "-" if v is None else format(v, fmt)


def render(rows: list[dict[str, Any]], iterations: int) -> str:
    """What the rows are, and the table: a row per variant, the final held-out success per seed."""
    seeds = sorted({r["seed"] for r in rows})
    start = {r["seed"]: r["curve"][0][1] for r in rows}
    final = {(r["variant"], r["seed"]): r["curve"][-1][1] for r in rows}
    variants = [v for v in VARIANTS if any(r["variant"] == v for r in rows)]
    steps = ", ".join(sorted({f"{r['lr_actor']:g}" for r in rows}))
    table = harness.markdown_table(
        ["variant", *(f"seed {s} (start {start[s]:.3f})" for s in seeds)],
        [[v, *(_f(final.get((v, s))) for s in seeds)] for v in variants])
    return (f"The sparse run from the weak starts (`--start_success {START}`), `quickstart_ppo`'s PPO on "
            f"`{{success: 1.0}}` at actor step {steps}, {iterations} iterations ({iterations * STEPS_PER_ITERATION:,} "
            "env steps), with one change per row (the script's doc; `preset`: no change); final success on the same "
            "400 held-out episodes per seed.\n\n"
            f"{table}\n\n![held-out success per variant](img/ppo_noise_control.png)")


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Held-out success against env steps, one panel per (actor step, seed), one line per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels: dict[tuple[float, int], list[dict[str, Any]]] = {}
    for row in rows:
        panels.setdefault((row["lr_actor"], row["seed"]), []).append(row)
    keys = sorted(panels)
    names = sorted({r["variant"] for rows in panels.values() for r in rows})
    # one colour per variant in every panel (tab20: the default cycle repeats after 10)
    color = {name: plt.get_cmap("tab20")(i % 20) for i, name in enumerate(names)}
    color.update({"shuffled": "black", "shuffled-no-norm": "grey"})
    fig, axes = plt.subplots(1, len(keys), figsize=(3.4 * len(keys), 3.4), squeeze=False, sharey=True)
    for ax, key in zip(axes[0], keys):
        for r in sorted(panels[key], key=lambda r: r["variant"]):
            ax.plot([c[0] / 1e3 for c in r["curve"]], [c[1] for c in r["curve"]], marker="o", ms=3, lw=1.2,
                    color=color[r["variant"]], label=r["variant"])
        ax.set_title(f"actor step {key[0]:g}, seed {key[1]}", fontsize=9)
        ax.set_xlabel("env steps (k)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("held-out success (400 episodes)")
    handles = [plt.Line2D([], [], color=color[n], marker="o", ms=3, label=n) for n in names]
    fig.legend(handles=handles, loc="lower center", ncol=len(names), fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", nargs="+", default=["preset", "shuffled"], choices=sorted(VARIANTS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    p.add_argument("--lr_actor", type=float, default=None, help="PPO actor step (default: the preset's)")
    p.add_argument("--iterations", type=int, default=200)
    p.add_argument("--eval_every", type=int, default=40)
    p.add_argument("--out", default="runs/noise-control", help="run folders go here")
    args = harness.add_output_args(p).parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    step = args.lr_actor if args.lr_actor is not None else lr.preset_lr_actor()
    rows = []
    for name in args.variants:
        for seed in args.seeds:
            rows.append(run_variant(name, seed, step, args.iterations, args.eval_every, Path(args.out)))
            print(json.dumps(rows[-1])[:400], flush=True)
    plot(rows, Path(args.page).parent / "img" / "ppo_noise_control.png")
    harness.publish("ppo_noise_control", args, render(rows, args.iterations), rows=rows)


if __name__ == "__main__":
    main()
