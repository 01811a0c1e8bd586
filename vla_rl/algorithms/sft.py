"""SFT as a learner: supervised flow matching / token cross-entropy on offline chunks, inside the trainer's loop.

``vla-rl train --algo.type sft --data.path DATASET`` runs ``steps_per_iter``
gradient steps of :class:`vla_rl.sft.SFTUpdater` per iteration on minibatches
of the dataset (any LeRobotDataset, features matched by name:
:func:`vla_rl.data.load_chunks`), evaluates in the env as any run does, logs,
checkpoints and resumes (the optimizer, schedule, EMA and sampling RNG are in
the learner's state). ``vla-rl sft`` and the quickstart's pre-training run the
same updater in a plain loop (:func:`vla_rl.sft.pretrain`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from policies.base import Policy
from vla_rl.algorithms.base import (
    IterationInputs,
    Learner,
    LearnerConfig,
    Needs,
    SmokeLimits,
    freeze_encoder,
    register_learner,
)
from vla_rl.data.chunks import ChunkBatch, ChunkDataset
from vla_rl.sft import SFTConfig, SFTUpdater


@dataclass
class SFTLearnerConfig(SFTConfig, LearnerConfig):
    """Supervised fine-tuning on ``--data.path`` (``--algo.type sft``); ``steps`` is the cosine schedule's length
    (0, the default: the run's ``iterations x steps_per_iter``; after it the learning rate stays at 10%) and
    ``episodes`` is ignored (``--data.episodes`` chooses them)."""

    steps: int = 0
    """Length of the learning-rate schedule in gradient steps; 0 = the run's ``iterations x steps_per_iter``."""
    steps_per_iter: int = 100
    """Gradient steps per training iteration (between evaluations and checkpoints)."""
    ema: float = 0.0
    """Decay of an exponential moving average of the weights (per gradient step; 0: none). With it, every
    iteration ends with the averaged weights in the policy: the evaluation, the checkpoint's policy and the next
    collection (RaC's rounds) use them, while the gradient steps go on from the raw iterate, which the learner's
    state keeps (as Diffusion Policy trains and evaluates; docs/results.md, "RaC")."""

    freeze_encoder: bool = False
    """Keep the policy's observation encoder (:meth:`policies.Policy.encoder_parameters`: the camera CNNs, the
    prefix transformer, the instruction embedding) as it is and train the rest: a gradient step then skips the
    encoder's backward pass and its optimizer state (the quickstart's RL stage: 211 -> 94 ms a step of 64 rows,
    but seed 0 ends at 0.59 instead of 0.72; docs/results.md, "What does not work, and why"). Its forward
    still runs on every row, augmented images included."""

    flags: ClassVar[str] = "algo."

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.steps_per_iter < 1:
            raise ValueError(f"algo.steps_per_iter must be >= 1, got {self.steps_per_iter}")
        if self.steps < 0:
            raise ValueError(f"algo.steps must be >= 0 (0 = iterations x steps_per_iter), got {self.steps}")
        if self.stop_at_success:
            raise ValueError("algo.stop_at_success: the training loop runs its iterations; use `vla-rl sft` for a "
                             "success-based stop")

    def for_run(self, iterations: int) -> LearnerConfig:
        if self.steps:
            return self
        return dataclasses.replace(self, steps=max(1, iterations * self.steps_per_iter))

    def smoke(self, limits: SmokeLimits, num_envs: int) -> tuple[LearnerConfig, int]:
        small = dataclasses.replace(self, steps_per_iter=min(self.steps_per_iter, 4),
                                    batch_size=min(self.batch_size, limits.max_minibatch))
        return small, min(num_envs, limits.max_envs)


@register_learner("sft", SFTLearnerConfig, help="supervised fine-tuning on a LeRobotDataset (--data.path)")
class SFTLearner(Learner):
    """``steps_per_iter`` :class:`~vla_rl.sft.SFTUpdater` steps per iteration on the loop's offline data."""

    needs = Needs.DATASET
    uses_critic = False
    cfg: SFTLearnerConfig

    def __init__(self, cfg: SFTLearnerConfig, policy: Policy) -> None:
        super().__init__(cfg, policy)
        if cfg.freeze_encoder:  # before the updater collects the trainable parameters
            freeze_encoder(policy)
        self.updater: SFTUpdater | None = None
        self._raw: list[torch.Tensor] | None = None
        """With ``cfg.ema``: the raw iterate's trainable parameters while the policy shows the averaged ones."""
        self._pending_state: dict[str, Any] | None = None
        self._pending_rank_state: dict[str, Any] | None = None

    def _load(self, path: str) -> ChunkDataset:
        """The LeRobotDataset at ``path`` as chunks of this policy's inputs and horizon (demos, extra data)."""
        from vla_rl.data.dataset import load_policy_chunks

        return load_policy_chunks(path, self.policy)

    def _start(self, data: Any) -> SFTUpdater:
        """Fit the normalization on the data (first run only; ``data`` None: keep the policy's) and build the
        updater (after it, as pretrain does)."""
        if data is not None and self.iteration == 0 and self._pending_state is None:
            self.policy.fit_normalization(*data.normalization_data())
        if self.cfg.steps < 1:
            raise ValueError(f"algo.steps={self.cfg.steps}: resolve the schedule's length with "
                             "cfg.for_run(iterations) before building the learner (the trainer does)")
        updater = SFTUpdater(self.policy, self.cfg, seed=torch.initial_seed() % (2**63))
        if self._pending_state is not None:
            updater.load_state_dict(self._pending_state)
            self._pending_state = None
        if self._pending_rank_state is not None:  # this rank's own minibatch stream (rank 0's came with the state)
            updater.generator.set_state(self._pending_rank_state["generator"])
            self._pending_rank_state = None
        updater.call = self.call
        return updater

    def collect(self, inputs: IterationInputs) -> list[ChunkBatch]:
        if inputs.data is None:
            raise ValueError("algo.type=sft trains on offline data: pass --data.path DATASET")
        if self.updater is None:
            self.updater = self._start(inputs.data)
        gen = self.updater.generator
        bs = min(self.cfg.batch_size, len(inputs.data))
        if self.dist.enabled:  # batch_size is per gradient step over all ranks
            bs = self.dist.shard(bs, "algo.batch_size")
        return [inputs.data.sample(bs, gen) for _ in range(self.cfg.steps_per_iter)]

    def update(self, batches: list[ChunkBatch]) -> dict[str, float]:
        sums: dict[str, float] = {}
        self._resume_raw()
        self._train_steps(batches, sums)
        self._show_ema()
        self.iteration += 1
        return self._averages(sums)

    def _show_ema(self) -> None:
        """With ``cfg.ema``: keep the raw iterate aside and put the averaged weights in the policy."""
        if self.updater is None or self.updater.ema is None:
            return
        self._raw = [p.detach().clone() for p in self.updater.params]
        self.updater.use_ema_weights()

    def _resume_raw(self) -> None:
        """Put the raw iterate back before gradient steps (nothing unless :meth:`_show_ema` set it aside)."""
        if self._raw is None or self.updater is None:
            return
        with torch.no_grad():
            for p, raw in zip(self.updater.params, self._raw, strict=True):
                p.copy_(raw)
        self._raw = None

    def _train_steps(self, batches: list[ChunkBatch], into: dict[str, float]) -> None:
        """One gradient step per batch, adding each step's statistics and the step count (``steps``) to ``into``."""
        assert self.updater is not None
        for batch in batches:
            for k, v in self.updater.step(batch).items():
                into[k] = into.get(k, 0.0) + v
            into["steps"] = into.get("steps", 0.0) + 1.0

    @staticmethod
    def _averages(sums: dict[str, float]) -> dict[str, float]:
        """``update/<name>`` means per step of what :meth:`_train_steps` summed (nothing for no step)."""
        steps = sums.pop("steps", 0.0)
        return {f"update/{k.removeprefix('sft/')}": v / steps for k, v in sums.items()} if steps else {}

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.updater.optimizer] if self.updater is not None else []

    def state_dict(self) -> dict[str, Any]:
        return {"iteration": self.iteration, "sft": self.updater.state_dict() if self.updater is not None else None,
                "raw": self._raw}  # never changed in place (replaced each iteration), so no copy

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.iteration = state["iteration"]
        self._pending_state = state.get("sft")
        self._raw = state.get("raw")

    def rank_state(self) -> dict[str, Any]:
        """The minibatch / augmentation generator: each rank samples its own rows."""
        return {"generator": self.updater.generator.get_state()} if self.updater is not None else {}

    def load_rank_state(self, state: dict[str, Any]) -> None:
        if state.get("generator") is not None:
            self._pending_rank_state = state
