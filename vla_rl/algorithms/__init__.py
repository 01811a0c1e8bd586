"""RL math as pure functions: advantage estimators and losses (docs/training.md, "`vla-rl train`").

Learners (PPO, GRPO, SFT) only wire these functions; they hold no math of their own.
"""

from vla_rl.algorithms.advantages import (
    dynamic_sampling_mask,
    gae,
    group_relative,
    masked_mean,
    normalize_advantages,
)
from vla_rl.algorithms.losses import (
    entropy_bonus,
    kl_k3,
    ppo_policy_loss,
    value_loss,
)

__all__ = [
    "dynamic_sampling_mask",
    "entropy_bonus",
    "gae",
    "group_relative",
    "kl_k3",
    "masked_mean",
    "normalize_advantages",
    "ppo_policy_loss",
    "value_loss",
]
