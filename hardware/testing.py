"""Tiny policies for bringing up a robot and for fault tests.

:class:`TinyJointPolicy` (registered as ``tiny-joint``) is a real
:class:`policies.base.Policy`: a small MLP on ``observation.state`` that
proposes joint targets drifting at most ``max_step`` per step away from the
current position, with a Gaussian head for ``explore`` mode. It moves an arm
gently, which makes it the smoke test for a new robot setup::

    python -c "from hardware.testing import TinyJointPolicy; TinyJointPolicy.build(6, 6).save_pretrained('tiny')"
    vla-rl deploy --robot.type ... --policy.path tiny --dry-run

:class:`FaultyPolicy` wraps any policy and injects one fault (NaN, huge
jumps, out-of-limit targets, missed deadlines, exceptions) after a number of
calls.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from policies.base import ActMode, ActOutput, LogProbLevel, Policy
from policies.registry import POLICIES
from sim.core import OBS_STATE

TINY_TYPE = "tiny-joint"


@dataclass
class TinyJointConfig:
    """Shape and behaviour of :class:`TinyJointPolicy`."""

    state_dim: int = 6
    """S, length of ``observation.state``."""
    action_dim: int = 6
    """A, number of joints commanded (the first A state entries are their positions)."""
    chunk_size: int = 10
    """H, actions per chunk."""
    max_step: float = 0.01
    """Largest change per step of the mean action (robot units, e.g. radians)."""
    hidden: int = 16
    """MLP width."""
    sigma: float = 0.002
    """Standard deviation of the explore-mode noise."""
    seed: int = 0
    """Seed of the initial weights."""


@POLICIES.register(TINY_TYPE, config=TinyJointConfig)
class TinyJointPolicy(Policy):
    """Joint targets ``state + (h + 1) * max_step * tanh(MLP(state))`` for ``h < H``."""

    logp_level = LogProbLevel.CHUNK

    def __init__(self, cfg: TinyJointConfig) -> None:
        super().__init__()
        if cfg.action_dim > cfg.state_dim:
            raise ValueError(f"tiny-joint: action_dim {cfg.action_dim} > state_dim {cfg.state_dim}")
        self.cfg = cfg
        gen = torch.Generator().manual_seed(cfg.seed)
        self.net = nn.Sequential(nn.Linear(cfg.state_dim, cfg.hidden), nn.Tanh(), nn.Linear(cfg.hidden, cfg.action_dim))
        with torch.no_grad():
            for p in self.net.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)

    @classmethod
    def build(cls, state_dim: int, action_dim: int, **kwargs: Any) -> TinyJointPolicy:
        """Construct from dimensions plus any :class:`TinyJointConfig` field."""
        return cls(TinyJointConfig(state_dim=state_dim, action_dim=action_dim, **kwargs))

    @property
    def chunk_size(self) -> int:
        """H."""
        return self.cfg.chunk_size

    def _mean(self, obs: dict[str, Any]) -> torch.Tensor:
        state = obs[OBS_STATE]
        if state.ndim != 2 or state.shape[1] != self.cfg.state_dim:
            raise ValueError(f"tiny-joint: {OBS_STATE} must be [B, {self.cfg.state_dim}], got {list(state.shape)}")
        state = state.to(torch.float32)
        direction = torch.tanh(self.net(state))  # [B, A]
        steps = torch.arange(1, self.cfg.chunk_size + 1, dtype=torch.float32)[None, :, None]
        return state[:, None, : self.cfg.action_dim] + steps * self.cfg.max_step * direction[:, None]  # [B, H, A]

    def _logp(self, mean: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        var = self.cfg.sigma**2
        per = -((actions - mean) ** 2) / (2 * var) - 0.5 * math.log(2 * math.pi * var)
        return per.sum((-1, -2))  # [B]

    def act(self, obs: dict[str, Any], mode: ActMode = ActMode.EXPLORE) -> ActOutput:
        """Chunk ``[B, H, A]``; explore mode adds N(0, sigma^2) noise and returns its log-prob ``[B]``."""
        mean = self._mean(obs)
        if ActMode(mode) is ActMode.EVAL:
            return ActOutput(mean, torch.zeros(mean.shape[0]), None, {"actions": mean})
        actions = mean + self.cfg.sigma * torch.randn_like(mean)
        return ActOutput(actions, self._logp(mean, actions), None, {"actions": actions})

    def evaluate(self, obs: dict[str, Any], extras: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, None]:
        """``(logp [B], entropy [B], None)`` of ``extras["actions"]``."""
        mean = self._mean(obs)
        logp = self._logp(mean, extras["actions"])
        ent = 0.5 * math.log(2 * math.pi * math.e * self.cfg.sigma**2) * mean.shape[1] * mean.shape[2]
        return logp, torch.full_like(logp, ent), None

    def save_pretrained(self, directory: str | Path) -> None:
        """Write ``config.json`` (with ``"type": "tiny-joint"``) and ``model.safetensors``."""
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.state_dict().items()}, str(path / "model.safetensors"))
        (path / "config.json").write_text(json.dumps({"type": TINY_TYPE, **asdict(self.cfg)}, indent=2))

    @classmethod
    def from_pretrained(cls, path_or_id: str | Path, **overrides: Any) -> TinyJointPolicy:
        """Load a folder written by :meth:`save_pretrained`; ``overrides`` replace config fields.

        Raises:
            FileNotFoundError: naming the missing file.
            ValueError: if the folder holds another policy type.
        """
        path = Path(path_or_id)
        saved = json.loads((path / "config.json").read_text())
        if saved.pop("type", None) != TINY_TYPE:
            raise ValueError(f"{path}: not a {TINY_TYPE} checkpoint")
        policy = cls(TinyJointConfig(**{**saved, **overrides}))
        policy.load_state_dict(load_file(str(path / "model.safetensors")))
        return policy


class FaultyPolicy(Policy):
    """Wraps ``inner`` and misbehaves from call number ``after_calls`` (0-based) on.

    Faults: ``nan`` (every action NaN), ``inf`` (one joint +Inf), ``jump``
    (targets offset by ``magnitude``), ``out_of_limits`` (targets at
    ``magnitude`` in every joint), ``slow`` (sleep ``magnitude`` seconds
    before answering), ``raise`` (RuntimeError).
    """

    FAULTS = ("nan", "inf", "jump", "out_of_limits", "slow", "raise")

    def __init__(self, inner: Policy, fault: str, after_calls: int = 0, magnitude: float = 10.0) -> None:
        super().__init__()
        if fault not in self.FAULTS:
            raise ValueError(f"fault must be one of {self.FAULTS}, got {fault!r}")
        self.inner, self.fault, self.after_calls, self.magnitude = inner, fault, after_calls, magnitude
        self.calls = 0

    @property
    def chunk_size(self) -> int:
        """The inner policy's H."""
        return self.inner.chunk_size

    def act(self, obs: dict[str, Any], mode: ActMode = ActMode.EXPLORE) -> ActOutput:
        """The inner policy's output, corrupted once ``after_calls`` calls have passed."""
        out = self.inner.act(obs, mode)
        n, self.calls = self.calls, self.calls + 1
        if n < self.after_calls:
            return out
        a = out.actions.clone()
        if self.fault == "nan":
            a[:] = float("nan")
        elif self.fault == "inf":
            a[..., 0] = float("inf")
        elif self.fault == "jump":
            a = a + self.magnitude
        elif self.fault == "out_of_limits":
            a[:] = self.magnitude
        elif self.fault == "slow":
            time.sleep(self.magnitude)
        else:
            raise RuntimeError(f"injected policy failure at call {n}")
        return ActOutput(a, out.logp, out.value, out.extras)

    def evaluate(
        self, obs: dict[str, Any], extras: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Delegates to the inner policy."""
        return self.inner.evaluate(obs, extras)

    def reset(self) -> None:
        """Resets the inner policy (the call counter keeps counting)."""
        self.inner.reset()

    def save_pretrained(self, directory: str | Path) -> None:
        """Not saveable: a test wrapper."""
        raise NotImplementedError("FaultyPolicy is a test wrapper; save the inner policy instead")

    @classmethod
    def from_pretrained(cls, path_or_id: str | Path, **overrides: Any) -> FaultyPolicy:
        """Not loadable: a test wrapper."""
        raise NotImplementedError("FaultyPolicy is a test wrapper")
