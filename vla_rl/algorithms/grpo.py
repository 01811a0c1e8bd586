"""GRPO: critic-free group-relative policy optimization (see ALGORITHMS.md, "GRPO").

G rollouts per initial state, advantage ``(R - mean_group) / (std_group + 1e-6)``
broadcast to every decision of an episode; dynamic sampling drops groups whose
success rate lies outside a band (all-success or all-fail groups carry no signal).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from vla_rl.algorithms.advantages import dynamic_sampling_mask, group_relative
from vla_rl.algorithms.base import IterationInputs, LearnerConfig, Needs, SmokeLimits, register_learner
from vla_rl.algorithms.policy_gradient import PolicyGradientConfig, PolicyGradientLearner
from vla_rl.rollout import Rollout


@dataclass
class GRPOConfig(PolicyGradientConfig):
    """Critic-free GRPO (``--algo.type grpo``)."""

    group_size: int = 8
    """Rollouts per initial state (``env.num_envs`` must be a multiple)."""
    success_band_low: float = 0.1
    """Dynamic sampling: keep groups with success rate >= this."""
    success_band_high: float = 0.9
    """Dynamic sampling: keep groups with success rate <= this."""
    dynamic_sampling: bool = True
    """Drop groups outside the success band."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.group_size < 1:
            raise ValueError(f"algo.group_size must be >= 1, got {self.group_size}")
        if not 0 <= self.success_band_low <= self.success_band_high <= 1:
            raise ValueError("algo.success_band_low/high must satisfy 0 <= low <= high <= 1")

    def check_run(self, num_envs: int) -> None:
        if num_envs % self.group_size:
            raise ValueError(
                f"algo.group_size={self.group_size} must divide env.num_envs={num_envs} "
                "(GRPO plays group_size rollouts from each initial state)"
            )

    def smoke(self, limits: SmokeLimits, num_envs: int) -> tuple[LearnerConfig, int]:
        small, _ = super().smoke(limits, num_envs)
        group = min(self.group_size, limits.max_group)
        return dataclasses.replace(small, group_size=group), group


@register_learner("grpo", GRPOConfig, help="GRPO: critic-free, group-relative advantages, dynamic sampling")
class GRPOLearner(PolicyGradientLearner):
    """Critic-free group-relative policy optimization (see module doc)."""

    needs = Needs.GROUPS
    uses_critic = False
    cfg: GRPOConfig

    def collect(self, inputs: IterationInputs) -> Rollout:
        engine = inputs.engine
        assert engine is not None, "grpo collects grouped rollouts: the loop must pass an engine"
        groups = max(1, engine.env.num_envs // self.cfg.group_size)
        seeds = [inputs.seed_base + g for g in range(groups)]
        return engine.collect_groups(seeds, self.cfg.group_size, self.cfg.decisions_per_iter)

    def advantages(self, rollout: Rollout) -> tuple[Tensor, Tensor, Tensor]:
        if rollout.group_ids is None:
            raise ValueError("grpo needs grouped rollouts (RolloutEngine.collect_groups)")
        returns = rollout.episode_returns()
        adv_env = group_relative(returns, rollout.group_ids)
        mask = rollout.valid.clone()
        if self.cfg.dynamic_sampling:
            success = torch.zeros(rollout.valid.shape[1])
            for ep in rollout.episodes:
                success[ep.env] = float(ep.success)
            keep = dynamic_sampling_mask(success, rollout.group_ids, self.cfg.success_band_low, self.cfg.success_band_high)
            mask &= keep[None, :]
        t = rollout.valid.shape[0]
        return adv_env[None, :].expand(t, -1).clone(), returns[None, :].expand(t, -1).clone(), mask
