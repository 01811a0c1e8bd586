"""Latent-noise RL (DSRL; GR-RL's online stage): a small actor chooses the initial noise of a frozen flow policy.

The flow model stays frozen. A :class:`LatentNoiseActor` maps a per-observation
conditioning vector to a Gaussian over the initial sample ``x_1 [H, A_model]``
of the denoising chain; the frozen model's deterministic ODE maps ``x_1`` to the
action chunk. Exploration therefore only moves along what the flow model can
produce (its demonstrated action manifold), and the log-prob is that of ``x_1``
under the actor's Gaussian: no chain log-likelihood and no backpropagation
through the flow model.

- Mean: ``bound * tanh(MLP(cond))`` (DSRL's bound keeps ``x_1`` where the flow
  model was trained, about ``N(0, I)``); the last layer starts at zero, so the
  mean starts at 0.
- Std: a learned, state-independent ``exp(log_std) [H, A_model]``, starting at
  ``std_init``. With ``std_init = 1`` the initial actor samples exactly the
  base policy's ``N(0, I)`` noise, so RL starts from the base policy.
- Conditioning: ``[LayerNorm(mean-pooled prefix features), state]``, the
  prefix (image + language) features the ``prefix`` critic pools and the robot
  state as the model reads it (normalized). The prefix carries what the task
  asks for and where the objects are; the state carries where the arm is, which
  a prefix of a VLM (pi0, SmolVLA) does not contain.

DSRL trains this actor off-policy (SAC on ``(obs, x_1, r, obs')``); here it is
trained on-policy (PPO / GRPO) through the ordinary learners, with the log-prob
of ``x_1`` as the action log-prob.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from policies.flow.sde import gaussian_entropy, gaussian_logp

EXTRA_LATENT = "flow.latent"
"""Extras key of the sampled initial noise ``x_1 [B, H, A_model]`` (what ``evaluate`` re-scores)."""


class LatentNoiseActor(nn.Module):
    """The noise policy: ``(pooled prefix [B, D], state [B, S]) -> N(mean [B, H, A], std [H, A])``.

    Args:
        prefix_dim: D of the pooled prefix features.
        state_dim: S of the state (0: the actor reads the prefix only).
        horizon: H of the chunk the model denoises.
        action_dim: A_model, the action dims the model denoises (padding included).
        hidden_dim: width of the two hidden layers.
        bound: the mean is ``bound * tanh(.)``.
        std_init: the initial std (1.0 samples the base policy's ``N(0, I)``).

    Raises:
        ValueError: for a non-positive ``bound`` or ``std_init``.
    """

    def __init__(
        self, prefix_dim: int, state_dim: int, horizon: int, action_dim: int, hidden_dim: int, bound: float,
        std_init: float,
    ) -> None:
        super().__init__()
        if std_init <= 0:
            raise ValueError(f"LatentNoiseActor needs std_init > 0, got {std_init}")
        self.shape = (horizon, action_dim)
        self.state_dim = state_dim
        self.prefix_norm = nn.LayerNorm(prefix_dim)
        self.net = nn.Sequential(
            nn.Linear(prefix_dim + state_dim, hidden_dim), nn.SiLU(), nn.Linear(hidden_dim, hidden_dim), nn.SiLU(),
            nn.Linear(hidden_dim, horizon * action_dim),
        )
        last = self.net[-1]
        nn.init.zeros_(last.weight)  # the mean starts at 0: the start is the base policy
        nn.init.zeros_(last.bias)
        self.log_std = nn.Parameter(torch.full(self.shape, math.log(std_init)))
        self.set_bound(bound)

    def set_bound(self, bound: float) -> None:
        """Set the bound of the mean, ``|mean| < bound``."""
        if bound <= 0:
            raise ValueError(f"LatentNoiseActor needs bound > 0, got {bound}")
        self.bound = float(bound)

    def forward(self, pooled: Tensor, state: Tensor | None) -> tuple[Tensor, Tensor]:
        """``(pooled [B, D], state [B, S] or None) -> (mean [B, H, A], std [H, A])`` (float32).

        Raises:
            ValueError: if the state is missing or has the wrong size.
        """
        x = self.prefix_norm(pooled.float())
        if self.state_dim:
            if state is None or state.ndim != 2 or state.shape[1] != self.state_dim:
                got = None if state is None else list(state.shape)
                raise ValueError(f"the latent-noise actor reads the state [B, {self.state_dim}], got {got}")
            x = torch.cat([x, state.float()], dim=-1)
        mean = self.bound * torch.tanh(self.net(x)).view(-1, *self.shape)
        return mean, self.log_std.exp()


def latent_noise_log_prob(x1: Tensor, mean: Tensor, std: Tensor, dim_mask: Tensor) -> tuple[Tensor, Tensor]:
    """Elementwise log-prob and entropy of ``x_1`` under the actor's Gaussian.

    Args:
        x1: ``[B, H, A]`` the initial noise.
        mean: ``[B, H, A]`` the actor's mean.
        std: ``[H, A]`` (or broadcastable) the actor's std.
        dim_mask: ``[A]`` 1 for real action dims, 0 for padding dims (which add nothing).

    Returns:
        ``(logp, entropy)``, elementwise ``[B, H, A]``.
    """
    std = (std * dim_mask).expand_as(mean)
    return gaussian_logp(x1, mean, std), gaussian_entropy(std)
