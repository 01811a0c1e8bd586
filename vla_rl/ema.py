"""An exponential moving average of a policy's trainable weights, evaluated and checkpointed in their place.

RL fine-tuning scores one checkpoint's deterministic chain, and that score swings from checkpoint to checkpoint
far more than the episodes' sampling explains (docs/results.md, "Learned rewards"). As
Diffusion Policy does for imitation, ``--eval.ema D`` keeps ``shadow <- D * shadow + (1 - D) * weights`` after
every update and evaluates the shadow: the trend of the last ``~1 / (1 - D)`` iterations rather than the last
step. Rollouts and updates keep using the weights as trained (PPO stays on-policy).

Checkpoints hold what was evaluated: a checkpoint's ``policy/`` folder (and ``best/policy``, which is what a user
deploys) holds the average, and ``trainer.pt`` holds the weights as trained under ``"ema"``, so ``--resume``
continues the same run (:meth:`WeightEMA.resume`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from vla_rl.config import ConfigError


class WeightEMA:
    """The moving average of ``policy``'s trainable parameters (those with ``requires_grad``), with ``decay`` in
    ``(0, 1)`` per :meth:`update`; it starts at the current weights."""

    def __init__(self, policy: torch.nn.Module, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"eval.ema must lie in (0, 1) to average (0: no moving average), got {decay}")
        self.decay = decay
        self.params = [p for p in policy.parameters() if p.requires_grad]
        # float32 whatever the policy's dtype: a bf16 average would round away updates of 1 - decay
        self.shadow = [p.detach().float().clone() for p in self.params]
        self.updates = 0
        self._trained: list[torch.Tensor] | None = None  # the weights as trained while the average is applied

    def to(self, device: torch.device | str) -> WeightEMA:
        """Move the average next to the policy (call after the policy moved)."""
        self.shadow = [s.to(device) for s in self.shadow]
        return self

    @torch.no_grad()
    def update(self) -> None:
        """Move the average ``1 - decay`` of the way to the current weights."""
        for s, p in zip(self.shadow, self.params, strict=True):
            s.lerp_(p.detach().float(), 1.0 - self.decay)
        self.updates += 1

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        """Inside, the policy holds the average; the weights as trained are put back after, also when the body
        raises."""
        with torch.no_grad():
            self._trained = [p.detach().clone() for p in self.params]
            for p, s in zip(self.params, self.shadow, strict=True):
                p.copy_(s)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, t in zip(self.params, self._trained, strict=True):
                    p.copy_(t)
            self._trained = None

    def state_dict(self) -> dict[str, Any]:
        """For ``trainer.pt``, whose checkpoint's policy folder holds the average (written under :meth:`applied`):
        the weights as trained, on the CPU, with the decay and the update count."""
        trained = self.params if self._trained is None else self._trained
        return {"decay": self.decay, "updates": self.updates, "trained": [t.detach().cpu().clone() for t in trained]}

    @classmethod
    def resume(cls, policy: torch.nn.Module, decay: float, state: dict[str, Any] | None, where: Path) -> WeightEMA | None:
        """The average of a run resumed from checkpoint ``where``, whose policy folder ``policy`` was loaded from:
        with ``decay`` the loaded weights become the average and ``state``'s weights as trained go back into the
        policy; without it (0) nothing changes. The decay may change on resume; turning the average on or off may
        not, since the policy folder holds the average only when it was on.

        Raises:
            ConfigError: naming the checkpoint's ``trainer.pt`` and ``eval.ema``, when the run was written with the
                average and resumed without it or the reverse, or its weights do not match the policy's.
        """
        if not decay:
            if state is not None:
                raise ConfigError(f"{where}/trainer.pt holds a run with eval.ema={state['decay']} (its policy folder "
                                  "holds the average); resume it with that --eval.ema")
            return None
        if state is None:
            raise ConfigError(f"{where}/trainer.pt holds a run without eval.ema (its policy folder holds the weights "
                              f"as trained); resume it with --eval.ema 0, not {decay}")
        ema = cls(policy, decay)
        trained = state["trained"]
        shapes = [tuple(p.shape) for p in ema.params]
        if [tuple(t.shape) for t in trained] != shapes:
            raise ConfigError(f"{where}/trainer.pt: eval.ema weights as trained ({len(trained)} tensors) do not match "
                              f"the policy's {len(shapes)} trainable parameters")
        with torch.no_grad():
            for p, t in zip(ema.params, trained, strict=True):
                p.copy_(t)
        ema.updates = int(state["updates"])
        return ema
