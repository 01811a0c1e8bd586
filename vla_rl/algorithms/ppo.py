"""PPO: GAE over decisions with a critic (see ALGORITHMS.md, "PPO and GAE").

Clipped (asymmetric, dual-clip) policy loss from
:class:`~vla_rl.algorithms.policy_gradient.PolicyGradientLearner`, plus a clipped
Huber value loss with its own learning rate, and critic warmup (the first
iterations train only the critic).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor

from policies.base import Policy
from vla_rl.algorithms.advantages import gae
from vla_rl.algorithms.base import IterationInputs, Needs, register_learner
from vla_rl.algorithms.losses import value_loss
from vla_rl.algorithms.policy_gradient import PolicyGradientConfig, PolicyGradientLearner
from vla_rl.rollout import Rollout


@dataclass
class PPOConfig(PolicyGradientConfig):
    """PPO with GAE and a critic (``--algo.type ppo``)."""

    gamma: float = 0.99
    """Discount per decision (action chunk)."""
    lam: float = 0.95
    """GAE lambda."""
    lr_critic: float = 1e-3
    """Learning rate of the value head."""
    value_clip: float = 0.2
    """Value clipping range around the old values; 0 disables."""
    huber_delta: float = 10.0
    """Huber delta of the value loss; 0 = squared error."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    value_grad_to_actor: bool = False
    """Let the value loss also update the actor's parameters it flows through (a shared trunk). Off: the
    value loss trains only the critic's own parameters, so critic noise cannot move the policy."""
    critic_warmup_iters: int = 0
    """Iterations at the start during which only the critic learns."""


@register_learner("ppo", PPOConfig, help="PPO: GAE with a critic, clipped policy and value losses")
class PPOLearner(PolicyGradientLearner):
    """PPO with GAE and a critic (see module doc)."""

    needs = Needs.ON_POLICY
    uses_critic = True
    cfg: PPOConfig

    def critic_param_groups(self, policy: Policy) -> list[dict[str, Any]]:
        critic = policy.critic_parameters()
        if not critic:
            raise ValueError("algo.type=ppo needs a critic but the policy has no value head; "
                             "enable one in the policy config (value_placement) or use --algo.type grpo")
        return [{"params": critic, "lr": self.cfg.lr_critic, "name": "critic"}]

    def collect(self, inputs: IterationInputs) -> Rollout:
        engine = inputs.engine
        assert engine is not None, "ppo collects on-policy rollouts: the loop must pass an engine"
        if inputs.reset:
            engine.reset(seed=inputs.seed_base)
        return engine.collect(self.cfg.decisions_per_iter)

    def advantages(self, rollout: Rollout) -> tuple[Tensor, Tensor, Tensor]:
        adv, ret = gae(rollout.rewards, rollout.values, rollout.next_values, rollout.terminated,
                       rollout.truncated, self.cfg.gamma, self.cfg.lam)
        return adv, ret, rollout.valid

    def actor_frozen(self) -> bool:
        return self.iteration < self.cfg.critic_warmup_iters

    def value_loss(self, value: Tensor | None, old_values: Tensor, returns: Tensor) -> tuple[Tensor, dict[str, Any]] | None:
        if value is None:
            return None
        cfg = self.cfg
        return value_loss(value.float(), old_values, returns, cfg.value_clip or None, cfg.huber_delta or None)

    def value_to_actor(self) -> bool:
        return self.cfg.value_grad_to_actor

    def value_coef(self) -> float:
        return self.cfg.vf_coef
