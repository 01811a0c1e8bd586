"""Critic heads for flow policies and where they read their features.

pi_RL places the critic on the action-expert output (pi0: mean over action
tokens) or on the VLM prefix (pi0.5: mean over image + language tokens). The
expert's output depends on the noisy input, so the expert placement reads it at
a fixed input, ``x = 0`` (the noise mean) and ``t = 1``, which makes
``value(obs)`` a function of the observation alone and lets ``act``,
``evaluate`` and ``value`` agree exactly.

In simulation the critic can also read what the actor cannot: the ``state``
placement is an asymmetric actor-critic (Pinto et al., 2018). Its value head is
an MLP on ``[observation.state, observation.env_state]``, the robot state and
the simulator's privileged object state, which the sim layer's backends provide.
The critic exists only during training, so a deployed policy never needs the
privileged state; a value fed object positions is far easier to fit than one
read off a few image features, and PPO's advantages are only as good as it.
"""

from __future__ import annotations

import enum

import torch
from torch import Tensor, nn


class ValuePlacement(str, enum.Enum):
    """Which features the value head reads."""

    NONE = "none"
    """No critic (GRPO-style, critic-free)."""
    EXPERT = "expert"
    """Mean over action tokens of the action-expert output at ``x = 0, t = 1`` (pi0)."""
    PREFIX = "prefix"
    """Masked mean over the prefix (image + language) features (pi0.5)."""
    STATE = "state"
    """Privileged: an MLP on ``[observation.state, observation.env_state]`` (asymmetric actor-critic, sim only)."""


class ValueHead(nn.Module):
    """A two-layer MLP ``[B, D] -> [B]`` on pooled features.

    Args:
        feature_dim: D.
        hidden_dim: width of the hidden layer.
    """

    def __init__(self, feature_dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.LayerNorm(feature_dim), nn.Linear(feature_dim, hidden_dim), nn.SiLU(), nn.Linear(hidden_dim, 1)
        )

    def forward(self, pooled: Tensor) -> Tensor:
        """``pooled [B, D] -> value [B]`` (float32)."""
        if pooled.ndim != 2:
            raise ValueError(f"value head expects pooled features [B, D], got {list(pooled.shape)}")
        return self.net(pooled.float()).squeeze(-1)


class StateValueHead(nn.Module):
    """The asymmetric critic ``[B, D] -> [B]``: a three-layer MLP on the robot + privileged env state.

    Args:
        input_dim: D, the size of ``observation.state`` plus ``observation.env_state``.
        hidden_dim: width of the hidden layers.
    """

    def __init__(self, input_dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(input_dim, hidden_dim), nn.SiLU(), nn.Linear(hidden_dim, hidden_dim), nn.SiLU(),
            nn.Linear(hidden_dim, 1),
        )

    def forward(self, state: Tensor) -> Tensor:
        """``state [B, D] -> value [B]`` (float32)."""
        if state.ndim != 2:
            raise ValueError(f"state value head expects [B, D], got {list(state.shape)}")
        return self.net(state.float()).squeeze(-1)


def mean_pool_tokens(features: Tensor, mask: Tensor | None) -> Tensor:
    """Pool token features per sample: ``features [B, N, D] -> [B, D]`` (float32).

    Averages each sample's tokens where ``mask [B, N]`` is true (every token if
    None); a sample with no valid token pools to zeros. A pooling layer, not a
    loss reduction (that is ``vla_rl.algorithms.advantages.masked_mean``).
    """
    if mask is None:
        return features.float().mean(1)
    m = mask.to(torch.float32).unsqueeze(-1)
    return (features.float() * m).sum(1) / m.sum(1).clamp_min(1.0)
