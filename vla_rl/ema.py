"""An exponential moving average of a policy's trainable weights, evaluated and checkpointed in their place.

RL fine-tuning scores one checkpoint's deterministic chain, and that score swings from checkpoint to checkpoint
far more than the episodes' sampling explains (docs/results.md, "Learned rewards"). As
Diffusion Policy does for imitation, ``--eval.ema D`` keeps ``shadow <- D * shadow + (1 - D) * weights`` after
every update and evaluates the shadow: the trend of the last ``~1 / (1 - D)`` iterations rather than the last
step. Rollouts and updates keep using the weights as trained (PPO stays on-policy).

Checkpoints hold what was evaluated: a checkpoint's ``policy/`` folder (and ``best/policy``, which is what a user
deploys) holds the average, and ``trainer.pt`` holds the weights as trained under ``"ema"``, so ``--resume``
continues the same run (:meth:`WeightEMA.load_state_dict`, :func:`check_ema_resume`). The trainer attaches the
average as a hook (:mod:`vla_rl.hooks`): updated after every update, applied around evaluations and checkpoints.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from vla_rl.config import ConfigError
from vla_rl.hooks import STAGES, Hook, IterationResult, RunContext

APPLIED_STAGES = ("evaluate", "checkpoint")
"""The trainer's pipeline stages (:data:`vla_rl.hooks.STAGES`) that see the average in the policy."""
assert set(APPLIED_STAGES) <= set(STAGES)


class WeightEMA(Hook):
    """The moving average of ``policy``'s trainable parameters (those with ``requires_grad``), with ``decay`` in
    ``(0, 1)`` per :meth:`update`.

    It starts at the current weights, or with ``from_first_update`` at the weights after the first update (as
    torch's ``AveragedModel`` does: pre-training from random weights keeps them out of the average).

    As a trainer hook (``--eval.ema``): :meth:`update` after every learner update, the average :meth:`applied`
    around evaluations and checkpoint writes, its state under ``"ema"`` in ``trainer.pt``. The SFT updater
    (:mod:`vla_rl.algorithms.sft`, ``ema``) updates it after every gradient step and shows the average between
    iterations (:meth:`apply` / :meth:`restore`).
    """

    name = "ema"

    def __init__(self, policy: torch.nn.Module, decay: float, from_first_update: bool = False) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"an EMA decay must lie in (0, 1) to average (0: no moving average), got {decay}")
        self.decay = decay
        self.from_first_update = from_first_update
        self.params = [p for p in policy.parameters() if p.requires_grad]
        # float32 whatever the policy's dtype: a bf16 average would round away updates of 1 - decay
        self.shadow = [p.detach().float().clone() for p in self.params]
        self.updates = 0
        self._trained: list[torch.Tensor] | None = None  # the weights as trained while the average is applied

    def start(self, run: RunContext) -> None:
        self.to(run.dist.device)

    def after_update(self, result: IterationResult) -> None:
        self.update()

    def stage(self, name: str) -> contextlib.AbstractContextManager[None]:
        return self.applied() if name in APPLIED_STAGES else contextlib.nullcontext()

    def to(self, device: torch.device | str) -> WeightEMA:
        """Move the average next to the policy (call after the policy moved)."""
        self.shadow = [s.to(device) for s in self.shadow]
        return self

    @torch.no_grad()
    def update(self) -> None:
        """Move the average ``1 - decay`` of the way to the current weights (onto them, for the first update
        with ``from_first_update``)."""
        for s, p in zip(self.shadow, self.params, strict=True):
            if self.from_first_update and self.updates == 0:
                s.copy_(p.detach())
            else:
                s.lerp_(p.detach().float(), 1.0 - self.decay)
        self.updates += 1

    @property
    def is_applied(self) -> bool:
        """Whether the policy holds the average (between :meth:`apply` and :meth:`restore`)."""
        return self._trained is not None

    @torch.no_grad()
    def apply(self) -> None:
        """Put the average into the policy, keeping the weights as trained aside (no-op when already applied)."""
        if self._trained is not None:
            return
        self._trained = [p.detach().clone() for p in self.params]
        for p, s in zip(self.params, self.shadow, strict=True):
            p.copy_(s)

    @torch.no_grad()
    def restore(self) -> None:
        """Put the weights as trained back into the policy (no-op when the average is not applied)."""
        if self._trained is None:
            return
        for p, t in zip(self.params, self._trained, strict=True):
            p.copy_(t)
        self._trained = None

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        """Inside, the policy holds the average; the weights as trained are put back after, also when the body
        raises."""
        self.apply()
        try:
            yield
        finally:
            self.restore()

    def state_dict(self) -> dict[str, Any]:
        """The average and the weights as trained (applied or not), on the CPU, with the decay and the update count;
        the policy's own weights need not be saved with it."""
        trained = self.params if self._trained is None else self._trained
        return {"decay": self.decay, "updates": self.updates, "trained": [t.detach().cpu().clone() for t in trained],
                "shadow": [s.detach().cpu().clone() for s in self.shadow]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output: the weights as trained go into the policy (the average is not
        applied). A state without ``shadow`` (written by an earlier version) takes the policy's current weights, those
        of a checkpoint folder that holds the average, as the average.

        Raises:
            ValueError: when the saved weights do not match the policy's trainable parameters.
        """
        trained = state["trained"]
        shapes = [tuple(p.shape) for p in self.params]
        if [tuple(t.shape) for t in trained] != shapes:
            raise ValueError(f"eval.ema weights as trained ({len(trained)} tensors) do not match the policy's "
                             f"{len(shapes)} trainable parameters")
        device = self.shadow[0].device if self.shadow else "cpu"
        self._trained = None
        with torch.no_grad():
            if "shadow" in state:
                self.shadow = [s.to(device).float().clone() for s in state["shadow"]]
            else:
                self.shadow = [p.detach().float().clone() for p in self.params]
            for p, t in zip(self.params, trained, strict=True):
                p.copy_(t)
        self.updates = int(state["updates"])


def check_ema_resume(decay: float, state: dict[str, Any] | None, where: Path) -> None:
    """Check that a run resumed from checkpoint ``where`` keeps its average on or off: its policy folder holds the
    average only when it was on (``state``: what :meth:`WeightEMA.state_dict` saved there, None without one). The
    decay itself may change on resume.

    Raises:
        ConfigError: naming the checkpoint's ``trainer.pt`` and ``eval.ema``, when the run was written with the
            average and resumed without it or the reverse.
    """
    if not decay and state is not None:
        raise ConfigError(f"{where}/trainer.pt holds a run with eval.ema={state['decay']} (its policy folder "
                          "holds the average); resume it with that --eval.ema")
    if decay and state is None:
        raise ConfigError(f"{where}/trainer.pt holds a run without eval.ema (its policy folder holds the weights "
                          f"as trained); resume it with --eval.ema 0, not {decay}")
