"""Reward terms and reward models: named ``[B]`` per-step terms, weighted in one place.

- :mod:`rewards.terms`: what each term means (``env``, ``success``, backend breakdown terms), the
  term interface (:class:`~rewards.terms.StepInput` -> ``float32 [B]``) and the :data:`REWARDS`
  registry of computed terms (learned reward models and constraint costs register there);
- :mod:`rewards.config`: :class:`~rewards.config.RewardConfig`, term -> weight;
- :mod:`rewards.costs`: constraint costs (collision, table force, path length, steps, joint limits,
  jerk, keypoint clearance) computed from the env's privileged signals, registered as terms;
- :mod:`rewards.compose`: :class:`~rewards.compose.RewardFunction`, a chunk's terms and weighted
  reward (the one place weights are applied; the rollout engine calls it);
- :mod:`rewards.learned`: a success classifier and a process reward model trained on episodes, used as the
  ``classifier`` and ``prm`` terms.
"""

from rewards.compose import ChunkReward, RewardFunction, chunk_sum, weighted_step_reward
from rewards.config import RewardConfig
from rewards.costs import COSTS, KeypointProvider, Keypoints, PrivilegedKeypoints, check_costs
from rewards.terms import REWARDS, RewardTerm, RewardTermError, StepInput, env_step_terms, env_terms, make_term

__all__ = [
    "COSTS", "REWARDS", "ChunkReward", "KeypointProvider", "Keypoints", "PrivilegedKeypoints", "check_costs", "RewardConfig", "RewardFunction", "RewardTerm", "RewardTermError", "StepInput",
    "chunk_sum", "env_step_terms", "env_terms", "make_term", "weighted_step_reward",
]
