"""Models behind one RL-facing interface (:class:`policies.base.Policy`).

Importing this package registers every policy in :data:`POLICIES` (the
modules import LeRobot / transformers lazily, so this stays cheap).
"""

from policies.base import ActMode, ActOutput, LogProbLevel, Policy, reduce_logp
from policies.registry import POLICIES

from policies import autoregressive, compact  # noqa: E402,F401  isort: skip
from policies.flow import lerobot  # noqa: E402,F401  isort: skip

__all__ = ["POLICIES", "ActMode", "ActOutput", "LogProbLevel", "Policy", "reduce_logp"]
