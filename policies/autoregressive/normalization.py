"""Dataset normalization statistics carried by a policy checkpoint.

Actions use OpenVLA's bounds normalization: an env action ``a`` in
``[low, high]`` maps to ``2 (a - low) / (high - low) - 1`` in ``[-1, 1]``
(the range the action tokenizer bins), and back with
``low + (x + 1) / 2 (high - low)``. Dimensions with ``high == low`` map to 0.
OpenVLA uses the dataset's 1st / 99th percentiles as ``low`` / ``high``; the
defaults (-1, 1) leave actions unchanged, which suits envs whose action space
is already normalized to ``[-1, 1]`` (the :mod:`sim` contract's default).

State statistics (mean / std) are stored alongside so a checkpoint carries
the full dataset normalization used for fine-tuning data and deployment, even
though OpenVLA-style prompts do not read the state.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass
class NormalizationStats:
    """Statistics to install with :meth:`ActionNormalizer.set_stats`.

    Attributes:
        action_low: ``[A]`` env action mapped to -1 (OpenVLA: q01).
        action_high: ``[A]`` env action mapped to +1 (OpenVLA: q99).
        state_mean: ``[S]``, or None to keep the stored state mean.
        state_std: ``[S]``, or None to keep the stored state std.
    """

    action_low: Tensor
    action_high: Tensor
    state_mean: Tensor | None = None
    state_std: Tensor | None = None


class ActionNormalizer(nn.Module):
    """Maps env actions to ``[-1, 1]`` and back; stores state mean/std (buffers, saved with the weights).

    Args:
        action_dim: A.
        state_dim: S (0 when no state statistics are kept).
    """

    action_low: Tensor
    action_high: Tensor
    state_mean: Tensor
    state_std: Tensor

    def __init__(self, action_dim: int, state_dim: int = 0) -> None:
        super().__init__()
        self.register_buffer("action_low", -torch.ones(action_dim))
        self.register_buffer("action_high", torch.ones(action_dim))
        self.register_buffer("state_mean", torch.zeros(state_dim))
        self.register_buffer("state_std", torch.ones(state_dim))

    def set_stats(self, stats: NormalizationStats) -> None:
        """Install dataset statistics (all fields are validated before any is installed).

        Raises:
            ValueError: naming the field and the expected vs given shape, or the dims where ``high < low``.
        """
        values: dict[str, Tensor] = {}
        for name in ("action_low", "action_high", "state_mean", "state_std"):
            value = getattr(stats, name)
            if value is None:
                continue  # optional state statistics: keep the stored ones
            shape = getattr(self, name).shape
            value = torch.as_tensor(value, dtype=torch.float32)
            if value.shape != shape:
                raise ValueError(f"NormalizationStats.{name} must have shape {list(shape)}, got {list(value.shape)}")
            values[name] = value
        low = values.get("action_low", self.action_low.cpu())
        high = values.get("action_high", self.action_high.cpu())
        if bool((high < low).any()):
            raise ValueError(f"NormalizationStats: action_high < action_low in dims "
                             f"{torch.nonzero(high < low).flatten().tolist()}")
        for name, value in values.items():
            getattr(self, name).copy_(value)

    def unnormalize_actions(self, normalized: Tensor) -> Tensor:
        """``[..., A]`` in ``[-1, 1]`` -> env actions ``float32 [..., A]``."""
        low, high = self.action_low.to(normalized.device), self.action_high.to(normalized.device)
        return (low + (normalized.float() + 1.0) * 0.5 * (high - low)).float()

    def normalize_actions(self, actions: Tensor) -> Tensor:
        """Env actions ``[..., A]`` -> ``[-1, 1]`` (values beyond the bounds fall outside it)."""
        low, high = self.action_low.to(actions.device), self.action_high.to(actions.device)
        span = high - low
        safe = torch.where(span > 0, span, torch.ones_like(span))
        return torch.where(span > 0, 2.0 * (actions.float() - low) / safe - 1.0, torch.zeros_like(span))

    def normalize_state(self, state: Tensor) -> Tensor:
        """``(state - mean) / std`` for ``[..., S]`` (std below 1e-8 is treated as 1).

        Raises:
            ValueError: if no state statistics are kept or S differs.
        """
        if state.shape[-1] != self.state_mean.shape[0] or self.state_mean.numel() == 0:
            raise ValueError(f"normalize_state: expected state [..., {self.state_mean.shape[0]}], got "
                             f"{list(state.shape)} (set the policy's state_dim to keep state statistics)")
        std = torch.where(self.state_std > 1e-8, self.state_std, torch.ones_like(self.state_std))
        return (state.float() - self.state_mean) / std
