"""A small Gaussian MLP policy implementing :class:`policies.base.Policy`, for testing the RL loop itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from policies.base import ActMode, ActOutput, LogProbLevel, Policy
from sim.core import OBS_STATE


class GaussianPolicy(Policy):
    """``a ~ N(mu(state), exp(log_std))`` repeated over a chunk of H actions; value head on the state."""

    logp_level = LogProbLevel.CHUNK

    def __init__(self, state_dim: int, action_dim: int, horizon: int = 2, init_mean: float = 0.0) -> None:
        super().__init__()
        self.h = horizon
        self.mu = nn.Linear(state_dim, action_dim * horizon)
        nn.init.zeros_(self.mu.weight)
        nn.init.constant_(self.mu.bias, init_mean)
        self.log_std = nn.Parameter(torch.full((action_dim * horizon,), -0.5))
        self.value_head = nn.Sequential(nn.Linear(state_dim, 32), nn.Tanh(), nn.Linear(32, 1))
        self.action_dim = action_dim

    @property
    def chunk_size(self) -> int:
        return self.h

    def _dist(self, obs: dict[str, Any]) -> torch.distributions.Normal:
        return torch.distributions.Normal(self.mu(obs[OBS_STATE]), self.log_std.exp())

    def act(self, obs: dict[str, Any], mode: ActMode = ActMode.EXPLORE,
            generator: torch.Generator | None = None) -> ActOutput:
        d = self._dist(obs)
        raw = d.mean if mode is ActMode.EVAL else torch.normal(d.loc, d.scale.expand_as(d.loc), generator=generator)
        logp = d.log_prob(raw).sum(-1) if mode is ActMode.EXPLORE else torch.zeros(raw.shape[0])
        actions = raw.clamp(-1, 1).view(-1, self.h, self.action_dim)
        return ActOutput(actions, logp, self.value(obs), {"raw": raw})

    def evaluate(self, obs, extras):
        d = self._dist(obs)
        return d.log_prob(extras["raw"]).sum(-1), d.entropy().sum(-1), self.value(obs)

    def value(self, obs):
        return self.value_head(obs[OBS_STATE]).squeeze(-1)

    def save_pretrained(self, directory: str | Path) -> None:
        Path(directory).mkdir(parents=True, exist_ok=True)
        torch.save(self.state_dict(), Path(directory) / "w.pt")

    @classmethod
    def from_pretrained(cls, path_or_id, **overrides):
        raise NotImplementedError
