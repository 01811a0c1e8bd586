"""``vla-rl rollout`` and ``vla-rl envs``: run a policy in any env, with video."""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from sim import Obs, VecEnv, list_envs
from vla_core.manifest import write_text_atomic
from vla_rl.commands import COMMANDS
from vla_rl.config import ConfigError, RolloutConfig, default_runs_dir
from vla_rl.distributed import default_device
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


POLICY_NAMES = ("random", "expert")
"""The action sources ``--policy`` takes by name; anything else is a policy folder."""


def check_policy_arg(policy: str) -> None:
    """Check ``--policy``: a known name, or a path to an existing folder; the two are told apart.

    Raises:
        ConfigError: for a path-like value (it has a ``/``, or starts with ``.`` or ``~``) that is no folder,
            naming the path; for any other unknown value, naming it as an unknown name (with the close ones).
    """
    if policy in POLICY_NAMES or Path(policy).is_dir():
        return
    path = Path(policy).expanduser()
    if "/" in policy or os.sep in policy or policy.startswith((".", "~")) or path.exists():
        what = "is a file, not a folder" if path.is_file() else "does not exist"
        raise ConfigError(f"policy: the policy folder {policy} {what}; expected a folder with config.json and "
                          "model.safetensors (e.g. <run>/checkpoints/best/policy)")
    close = difflib.get_close_matches(policy, POLICY_NAMES, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ConfigError(f"policy: unknown policy name {policy!r}.{hint} Known names: {', '.join(POLICY_NAMES)}; "
                      "a policy folder is given by its path (e.g. ./runs/<run>/checkpoints/best/policy)")


@COMMANDS.register("rollout", config=RolloutConfig, help="run a policy (random, expert or checkpoint) in an env")
def rollout(cfg: RolloutConfig) -> EvalResult:
    """Run ``cfg.policy`` in ``cfg.env`` for ``cfg.episodes`` episodes and write ``rollout.json``.

    Raises:
        ConfigError: for a ``policy`` that is neither ``random``, ``expert`` nor an existing folder.
        CheckpointError: for a policy folder with a missing, damaged or malformed file (naming it).
    """
    out = Path(cfg.output_dir) if cfg.output_dir else default_runs_dir() / f"rollout-{cfg.env.id.replace('/', '-')}"
    policy = None
    check_policy_arg(cfg.policy)
    if cfg.policy not in POLICY_NAMES:  # a checkpoint folder
        from policies.io import checkpoint_cameras
        from policies.loading import load_policy

        policy = load_policy(cfg.policy).to(default_device())
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
    write_text_atomic(out / "rollout.json", json.dumps(summary, indent=2))
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
