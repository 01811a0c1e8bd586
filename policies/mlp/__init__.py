"""The Gaussian MLP actor-critic on privileged state (registry name ``gaussian-mlp``)."""

from policies.mlp.config import GaussianMLPConfig
from policies.mlp.policy import GaussianMLPPolicy

__all__ = ["GaussianMLPConfig", "GaussianMLPPolicy"]
