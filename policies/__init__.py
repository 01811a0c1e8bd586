"""Models behind one RL-facing interface (:class:`policies.base.Policy`).

Importing this package registers every policy in :data:`POLICIES` (through
:mod:`policies.loading`; the modules import LeRobot / transformers lazily, so
this stays cheap).
"""

from policies.base import ActMode, ActOutput, LogProbLevel, Policy, reduce_logp
from policies.loading import load_policy
from policies.registry import POLICIES

__all__ = ["POLICIES", "ActMode", "ActOutput", "LogProbLevel", "Policy", "load_policy", "reduce_logp"]
