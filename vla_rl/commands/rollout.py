"""``vla-rl rollout`` and ``vla-rl envs``: run a policy in any env, with video."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from sim import Obs, VecEnv, list_envs
from vla_rl.commands import COMMANDS
from vla_rl.config import ConfigError, RolloutConfig, default_runs_dir
from vla_rl.evaluation import EvalResult, evaluate_episodes, evaluate_policy

ActionFn = Callable[[Obs], torch.Tensor]  # obs -> actions [B, H, A]


def action_source(name: str, env: VecEnv, seed: int) -> ActionFn:
    """``random`` (uniform in the action box) or ``expert`` actions.

    Raises:
        ConfigError: for any other name (a checkpoint folder is evaluated by :func:`rollout` itself).
    """
    if name == "random":
        gen = torch.Generator().manual_seed(seed)
        shape = (env.num_envs, 1, env.spec.action_dim)
        return lambda obs: torch.rand(shape, generator=gen) * 2 - 1
    if name == "expert":
        return lambda obs: env.expert_actions()[:, None, :]
    raise ConfigError(f"policy: expected 'random', 'expert' or a checkpoint folder, got {name!r}")


@COMMANDS.register("rollout", config=RolloutConfig, help="run a policy (random, expert or checkpoint) in an env")
def rollout(cfg: RolloutConfig) -> EvalResult:
    """Run ``cfg.policy`` in ``cfg.env`` for ``cfg.episodes`` episodes and write ``rollout.json``.

    Raises:
        ConfigError: for a ``policy`` that is neither ``random``, ``expert`` nor an existing folder.
        CheckpointError: for a policy folder with a missing, damaged or malformed file (naming it).
    """
    out = Path(cfg.output_dir) if cfg.output_dir else default_runs_dir() / f"rollout-{cfg.env.id.replace('/', '-')}"
    policy = None
    if cfg.policy not in ("random", "expert") and not Path(cfg.policy).is_dir():
        raise ConfigError(f"policy: {cfg.policy!r} is neither a known policy name (random, expert) nor a policy "
                          "folder (one with config.json and model.safetensors)")
    if cfg.policy not in ("random", "expert"):  # a checkpoint folder
        from policies.io import checkpoint_cameras
        from policies.loading import load_policy

        policy = load_policy(cfg.policy)
        policy.eval()
        cfg = replace(cfg, env=cfg.env.with_policy_cameras(checkpoint_cameras(cfg.policy), cfg.policy))
    with cfg.env.make() as env:
        video = out / "rollout.mp4" if cfg.video else None
        if policy is None:
            act = action_source(cfg.policy, env, cfg.env.seed)
            stats = evaluate_episodes(env, act, cfg.episodes, cfg.env.seed, video_path=video, desc="rollout")
        else:  # its deterministic actions on a noise stream seeded like the env: the same score on every run
            stats = evaluate_policy(env, policy, cfg.episodes, cfg.env.seed, video_path=video, desc="rollout")
    out.mkdir(parents=True, exist_ok=True)
    summary = {**asdict(stats), "env_id": cfg.env.id, "policy": cfg.policy}
    (out / "rollout.json").write_text(json.dumps(summary, indent=2))
    print(
        f"{cfg.env.id}: success {stats.successes}/{stats.episodes} "
        f"(95% CI {stats.ci_low:.2f}-{stats.ci_high:.2f}), mean return {stats.mean_return:.2f}"
    )
    if stats.video:
        print(f"video: {stats.video}")
    print(f"summary: {out / 'rollout.json'}")
    return stats


@dataclass
class EnvsConfig:
    """``vla-rl envs``: list every env id."""

    prefix: str = ""
    """Only ids starting with this."""


@COMMANDS.register("envs", config=EnvsConfig, help="list env ids")
def envs(cfg: EnvsConfig) -> list[str]:
    ids = [e for e in list_envs() if e.startswith(cfg.prefix)]
    print("\n".join(ids))
    return ids
