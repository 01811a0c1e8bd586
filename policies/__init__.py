"""Models behind one RL-facing interface (:class:`policies.base.Policy`).

Importing this package registers every policy in :data:`POLICIES` (through
:mod:`policies.loading`) and its tiny variant in :data:`policies.smoke.SMOKE_VARIANTS`
(the modules import LeRobot / transformers lazily, so this stays cheap).
"""

from policies.base import ActMode, ActOutput, LogProbLevel, Policy, reduce_logp
from policies.loading import load_policy
from policies.registry import POLICIES

from policies.autoregressive import smoke as _ar_smoke  # noqa: E402,F401  isort: skip
from policies.compact import smoke as _compact_smoke  # noqa: E402,F401  isort: skip
from policies.mlp import smoke as _mlp_smoke  # noqa: E402,F401  isort: skip
from policies.flow import lerobot_smoke  # noqa: E402,F401  isort: skip

__all__ = ["POLICIES", "ActMode", "ActOutput", "LogProbLevel", "Policy", "load_policy", "reduce_logp"]
