"""The RL-facing policy interface every model implements.

Algorithms (PPO, GRPO, GRAPE, RaC) and the deployment runner talk to models
only through :class:`Policy`; they never branch on the model type.

Observation: the :mod:`sim.core` dict (``observation.images.<cam>`` uint8
``[B, H, W, 3]``, ``observation.state`` float32 ``[B, S]``, ``task`` list of B
strings).
"""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn


class ActMode(str, enum.Enum):
    """``EVAL``: deterministic (ODE / greedy). ``EXPLORE``: stochastic, with log-probs."""

    EVAL = "eval"
    EXPLORE = "explore"


class LogProbLevel(str, enum.Enum):
    """Granularity of the log-probability returned by ``act`` / ``evaluate``.

    ``TOKEN``: one term per action token / action dimension, ``[B, H, A]``;
    ``ACTION``: summed over action dims, ``[B, H]``; ``CHUNK``: summed over the
    whole chunk, ``[B]``.
    """

    TOKEN = "token"
    ACTION = "action"
    CHUNK = "chunk"


def reduce_logp(logp: torch.Tensor, level: LogProbLevel) -> torch.Tensor:
    """Reduce per-element log-probs ``[B, H, A]`` to ``level``."""
    if level is LogProbLevel.TOKEN:
        return logp
    if level is LogProbLevel.ACTION:
        return logp.sum(-1)
    return logp.sum((-1, -2))


def masked_step_mean(err: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """The mean of a per-element loss ``err [B, H, A]`` over the action dims of the chunk steps ``mask [B, H]``
    marks valid (every step without a mask): the supervised losses' reduction. A step the mask drops is replaced
    by 0; an ``err`` computed from ``nan`` padding must be made finite before the operation that would spread it
    into the gradient (:func:`masked_mse` does). 0 when the mask selects nothing."""
    if mask is None:
        return err.mean()
    valid = mask.to(device=err.device, dtype=torch.bool)
    per_step = torch.where(valid, err.mean(-1), torch.zeros((), dtype=err.dtype, device=err.device))
    return per_step.sum() / valid.sum().clamp_min(1).to(err.dtype)


def masked_mse(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean squared error of ``pred`` against ``target`` (``[B, H, A]``) over the action dims of the chunk steps
    ``mask [B, H]`` marks valid: padded steps count neither in the loss nor in its gradient, even when ``pred`` or
    ``target`` holds ``nan`` there (the difference is zeroed before the square). 0 when the mask selects nothing."""
    diff = pred - target
    if mask is not None:
        diff = torch.where(mask.to(device=diff.device, dtype=torch.bool)[..., None], diff, torch.zeros_like(diff))
    return masked_step_mean(diff.pow(2), mask)


@dataclass
class ActOutput:
    """What ``Policy.act`` returns.

    Attributes:
        actions: ``float32 [B, H, A]`` action chunk in the env's action space.
        logp: log-probability of the sampled chunk at the policy's
            ``LogProbLevel`` (``[B]``, ``[B, H]`` or ``[B, H, A]``); zeros in eval mode.
        value: ``float32 [B]`` critic estimate, or None for critic-free policies.
        extras: tensors (batch-first) that ``evaluate`` needs to recompute
            ``logp`` exactly (chain states, noise, token ids...).
    """

    actions: torch.Tensor
    logp: torch.Tensor
    value: torch.Tensor | None
    extras: dict[str, torch.Tensor] = field(default_factory=dict)


class Policy(nn.Module, abc.ABC):
    """A model that acts in action chunks and re-scores what it did."""

    logp_level: LogProbLevel = LogProbLevel.CHUNK
    reads_env_state: bool = False
    """Whether the actor reads the privileged ``observation.env_state`` (then offline data must carry it)."""

    @property
    @abc.abstractmethod
    def chunk_size(self) -> int:
        """H, the number of actions one ``act`` call returns per env."""

    @abc.abstractmethod
    def act(self, obs: dict[str, Any], mode: ActMode = ActMode.EXPLORE,
            generator: torch.Generator | None = None) -> ActOutput:
        """Act on a batch of observations; ``generator`` (default: torch's global RNG) draws every random number of
        the sample, so a caller acting in one thread while another trains keeps both streams reproducible."""

    @abc.abstractmethod
    def evaluate(self, obs: dict[str, Any], extras: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Recompute ``(logp, entropy, value)`` of the sample recorded in ``extras`` (differentiable)."""

    def value(self, obs: dict[str, Any]) -> torch.Tensor:
        """Critic estimate ``[B]`` for observations (used for bootstrapping final observations)."""
        raise NotImplementedError(f"{type(self).__name__} has no value head")

    def critic_parameters(self) -> list[nn.Parameter]:
        """Parameters trained by the value loss (default: those under a ``value_head`` attribute)."""
        return [p for n, p in self.named_parameters() if n.startswith("value_head.") and p.requires_grad]

    def encoder_parameters(self) -> list[nn.Parameter]:
        """The parameters of the observation encoder (vision and language, trainable or not), which
        ``algo.freeze_encoder`` keeps fixed during RL. Default: none declared."""
        return []

    def actor_parameters(self) -> list[nn.Parameter]:
        """Parameters trained by the policy loss: every trainable parameter that is not the critic's."""
        critic = {id(p) for p in self.critic_parameters()}
        return [p for p in self.parameters() if p.requires_grad and id(p) not in critic]

    def sft_loss(self, obs: dict[str, Any], actions: torch.Tensor, action_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Supervised (imitation) loss on demo chunks ``actions [B, H, A]``; ``action_mask [B, H]`` marks real steps.

        Raises:
            NotImplementedError: for policies that cannot be pre-trained by imitation here.
        """
        raise NotImplementedError(f"{type(self).__name__} has no supervised loss")

    def fit_normalization(self, states: torch.Tensor, actions: torch.Tensor) -> None:
        """Set state / action normalization from demonstrations (``[N, S]``, ``[N, A]``). Default: none kept."""

    def fit_input_normalization(self, obs: dict[str, Any]) -> None:
        """Fit input statistics from the demonstrations' observation batch (every frame, the keys the policy
        reads), for policies whose inputs are more than ``observation.state``. Default: nothing to fit."""

    def reset(self) -> None:
        """Forget per-episode state (queued actions, caches). Default: nothing to forget."""

    @abc.abstractmethod
    def save_pretrained(self, directory: str | Path) -> None:
        """Write weights, config and normalization statistics to ``directory`` (atomically)."""

    @classmethod
    @abc.abstractmethod
    def from_pretrained(cls, path_or_id: str | Path, **overrides: Any) -> Policy:
        """Load a checkpoint folder (or a hub id, when the weights are cached locally)."""
