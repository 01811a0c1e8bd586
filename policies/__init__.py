"""Models behind one RL-facing interface (:class:`policies.base.Policy`)."""

from policies.base import ActMode, ActOutput, LogProbLevel, Policy, reduce_logp
from policies.registry import POLICIES

__all__ = ["POLICIES", "ActMode", "ActOutput", "LogProbLevel", "Policy", "reduce_logp"]
