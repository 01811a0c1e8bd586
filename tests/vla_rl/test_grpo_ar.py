"""GRPO and the autoregressive (openvla-style) path learn on a tiny task: short seeded runs improve their objective.

Each test builds env and policy exactly as ``vla-rl train`` does (:func:`vla_rl.policy_factory.build_policy` from
a parsed :class:`TrainConfig`), runs a few collect + update iterations, and measures on every iteration's
own rollout the learner's objective before and after its update:

- the clipped PPO surrogate ``mean(min(r A, clip(r) A))`` with the learner's (normalized) advantages;
  it is ``mean(A) = 0`` at ``r = 1`` and must rise by a real margin;
- the advantage-weighted log-prob change ``mean(A * (logp_new - logp_old))``, which must be positive.

Before the update, ``evaluate`` must reproduce the rollout's log-probs (the ratio starts at 1).
"""

from __future__ import annotations

import torch

from vla_rl.algorithms.advantages import normalize_advantages
from vla_rl.algorithms.base import ALGORITHMS, IterationInputs, Learner
from vla_rl.algorithms.losses import ppo_policy_loss
from vla_rl.cli import parse_config
from vla_rl.rollout import Rollout, RolloutEngine
from vla_rl.train_config import TrainConfig
from vla_rl.train_config import training_seed_range
from vla_rl.policy_factory import build_policy
from vla_rl.trainer import seed_everything

MARGIN = 0.02  # surrogate gain per iteration, in units of normalized advantage (max about clip_high = 0.2)


def _objective(learner: Learner, rollout: Rollout) -> tuple[float, float, torch.Tensor]:
    """(clipped surrogate, advantage-weighted logp change, max |logp - old_logp|) on the rollout's valid decisions."""
    cfg = learner.cfg
    adv, _, mask = learner.advantages(rollout)
    adv = normalize_advantages(adv, mask) if cfg.normalize_advantages else adv
    idx = mask.flatten().nonzero().flatten()
    extras = {k: v.flatten(0, 1)[idx] for k, v in rollout.extras.items()}
    old = rollout.logp.flatten(0, 1)[idx]
    with torch.no_grad():
        logp, _, _ = learner.policy.evaluate(rollout.flat_obs(idx), extras)
    a = adv.flatten()[idx]
    loss, _ = ppo_policy_loss(logp, old, a, cfg.clip_low, cfg.clip_high, cfg.dual_clip or None)
    weighted = (a.view(-1, *([1] * (logp.ndim - 1))) * (logp - old)).mean()
    return -float(loss), float(weighted), (logp - old).abs().max()


def _run(args: list[str], iterations: int) -> list[tuple[float, float, float]]:
    """Train ``iterations`` iterations; per iteration (surrogate before, surrogate after, weighted logp change)."""
    cfg = parse_config(TrainConfig, [*args, "--logging.wandb", "false", "--logging.tensorboard", "false"])
    seed_everything(cfg.seed)
    env = cfg.env.make()
    try:
        policy = build_policy(cfg.policy, env.spec, smoke=cfg.smoke)
        learner = ALGORITHMS.get(cfg.algo.type).obj(cfg.algo, policy)
        engine = RolloutEngine(env, policy, cfg.exec_steps, use_critic=learner.uses_critic)
        out = []
        for it in range(iterations):
            base, _ = training_seed_range(cfg, it)
            policy.train()
            rollout = learner.collect(IterationInputs(iteration=it, seed_base=base, reset=True, engine=engine))
            before, _, drift = _objective(learner, rollout)
            assert drift < 1e-3, f"evaluate does not reproduce the rollout's log-probs (max diff {float(drift):.2e})"
            stats = learner.update(rollout)
            assert "update/skipped" not in stats, stats
            after, weighted, _ = _objective(learner, rollout)
            out.append((before, after, weighted))
        return out
    finally:
        env.close()


def _assert_improves(rows: list[tuple[float, float, float]]) -> None:
    for it, (before, after, weighted) in enumerate(rows):
        assert abs(before) < 1e-3, (it, rows)  # ratio 1: mean of normalized advantages
        assert after > before + MARGIN and weighted > 0, (it, rows)


COMPACT_STATE = [
    "--env.id", "mujoco/pick-red", "--env.obs_mode", "state", "--env.num_envs", "8", "--env.max_episode_steps", "16",
    "--env.num_workers", "0",
    "--policy.type", "compact-flow", "--policy.width", "32", "--policy.heads", "2", "--policy.chunk_size", "4",
    "--policy.text_encoder", "hashed", "--policy.text_buckets", "64", "--policy.expert_layers", "1",
    "--policy.value_hidden", "32", "--policy.sampler.num_steps", "2", "--policy.sampler.noise_level", "0.7",
    "--seed", "3",
]


def test_grpo_on_the_compact_policy_improves_its_surrogate():
    rows = _run([*COMPACT_STATE, "--algo.type", "grpo", "--algo.group_size", "4", "--algo.dynamic_sampling", "false",
                 "--algo.decisions_per_iter", "4", "--algo.epochs", "4", "--algo.minibatch_size", "16",
                 "--algo.lr_actor", "1e-4"], iterations=3)
    _assert_improves(rows)


AR_IMAGES = [
    "--env.id", "mujoco/pick-red", "--env.obs_mode", "rgb", "--env.image_size", "32", "--env.num_envs", "4",
    "--env.max_episode_steps", "6", "--env.num_workers", "0",
    "--policy.type", "openvla-style", "--policy.backbone", "tiny-llava", "--policy.chunk_size", "1",
    "--policy.value_hidden_dim", "32", "--policy.temperature", "1.0",
    "--algo.decisions_per_iter", "6", "--algo.epochs", "3", "--algo.minibatch_size", "12", "--algo.lr_actor", "1e-3",
    "--seed", "5",
]


def test_autoregressive_ppo_improves_its_surrogate():
    rows = _run([*AR_IMAGES, "--algo.type", "ppo", "--algo.lr_critic", "1e-3"], iterations=2)
    _assert_improves(rows)


def test_autoregressive_grpo_improves_its_surrogate():
    rows = _run([*AR_IMAGES, "--algo.type", "grpo", "--algo.group_size", "2", "--algo.dynamic_sampling", "false"],
                iterations=2)
    _assert_improves(rows)
