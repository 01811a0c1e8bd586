"""Success-filtered self-imitation (``--algo.type filtered_bc``): the policy imitates its own successful episodes.

Each iteration the policy explores in the training envs as PPO's rollouts do (its sampler, episodes continued
across iterations), every decision of an episode that ends in success joins a buffer
(:class:`vla_rl.data.replay.SuccessBuffer`), and ``steps_per_iter`` supervised steps
(:class:`vla_rl.sft.SFTUpdater`: the policy's own ``sft_loss``, flow matching or token cross-entropy) train on
batches of those rows, mixed with the demos (``algo.demos``) at ``demo_ratio``.

It is reward-weighted regression with a 0/1 weight (iterated filtered behaviour cloning): the policy moves
toward the actions of its successful attempts, so it keeps what already works in some episodes (the right
cube, the grasp that held) and needs no critic and no log-likelihood of the sampler. The update costs one
velocity pass per row instead of the whole denoising chain. Why it is here: PPO from a decent imitation start
moves the deployed policy little on our CPU budget (docs/benchmarks.md, "RL diagnostic ladder: reading" and
"Training the deployed policy").
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from policies.base import ActMode, Policy
from vla_rl.algorithms.base import IterationInputs, LearnerConfig, Needs, SmokeLimits, register_learner
from vla_rl.algorithms.sft import SFTLearner, SFTLearnerConfig
from vla_rl.data.chunks import ChunkBatch, ChunkDataset
from vla_rl.data.mix import MixedSource
from vla_rl.data.replay import SuccessBuffer
from vla_rl.rollout import Rollout


@dataclass
class FilteredBCConfig(SFTLearnerConfig):
    """Success-filtered self-imitation (``--algo.type filtered_bc``): SFT settings (``lr``, ``batch_size``,
    ``image_shift``, ...; ``steps`` is the cosine schedule's length, by default the run's
    ``iterations x steps_per_iter``) plus collection and the data mix."""

    lr: float = 1e-3
    """AdamW learning rate (cosine-decayed to 10% over ``steps``); the quickstart's seeds gain most at 1e-3, the
    rate of pre-training (docs/benchmarks.md, "Training the deployed policy")."""
    batch_size: int = 64
    """Rows per gradient step."""
    steps_per_iter: int = 8
    """Gradient steps per training iteration."""
    decisions_per_iter: int = 6
    """Action chunks each env plays per iteration (episodes continue across iterations)."""
    buffer_size: int = 20000
    """Decisions of successful episodes kept (the oldest leave first)."""
    min_buffer: int = 256
    """No gradient step until the buffer holds this many decisions."""
    demos: str = ""
    """Demo LeRobotDataset mixed into every batch (empty: only the policy's own successes)."""
    demo_ratio: float = 0.25
    """Fraction of each batch drawn from ``demos``."""
    explore: bool = True
    """Collect with the policy's exploration sampler (``act(EXPLORE)``); False plays the deterministic policy
    that evaluation runs, so only its own successes are imitated."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.decisions_per_iter < 1 or self.buffer_size < 1 or self.min_buffer < 1:
            raise ValueError("algo.decisions_per_iter, algo.buffer_size and algo.min_buffer must be >= 1")
        if not 0.0 <= self.demo_ratio < 1.0:
            raise ValueError(f"algo.demo_ratio must lie in [0, 1), got {self.demo_ratio}")

    def with_default_demos(self, path: str) -> LearnerConfig:
        return self if self.demos else dataclasses.replace(self, demos=path)

    def smoke(self, limits: SmokeLimits, num_envs: int) -> tuple[LearnerConfig, int]:
        small, envs = super().smoke(limits, num_envs)
        decisions = max(min(self.decisions_per_iter, limits.max_decisions), limits.episode_decisions)
        return dataclasses.replace(small, decisions_per_iter=decisions, min_buffer=1), envs


@register_learner("filtered_bc", FilteredBCConfig,
                  help="success-filtered self-imitation: SFT on the policy's own successful episodes (+ demos)")
class FilteredBCLearner(SFTLearner):
    """Collect, keep the successful episodes, imitate them (module doc)."""

    needs = Needs.ON_POLICY
    uses_critic = False
    cfg: FilteredBCConfig

    def __init__(self, cfg: FilteredBCConfig, policy: Policy) -> None:
        super().__init__(cfg, policy)
        self.demos: ChunkDataset | None = None
        self.buffer: SuccessBuffer | None = None
        self._batches: list[ChunkBatch] = []

    def _source(self) -> Any:
        assert self.buffer is not None
        if self.demos is None or self.cfg.demo_ratio == 0.0:
            return self.buffer
        return MixedSource([(self.demos, self.cfg.demo_ratio), (self.buffer, 1.0 - self.cfg.demo_ratio)])

    def collect(self, inputs: IterationInputs) -> Rollout:
        """Play ``decisions_per_iter`` chunks per env, file them in the buffer and draw this iteration's
        minibatches (none while the buffer holds fewer than ``min_buffer`` decisions); returns the rollout, whose
        episodes the loop logs as any on-policy learner's."""
        engine = inputs.engine
        assert engine is not None, "filtered_bc collects rollouts: the loop must pass an engine"
        if self.buffer is None:
            if self.cfg.demos:
                self.demos = self._load(self.cfg.demos)
            self.buffer = SuccessBuffer(self.cfg.buffer_size, list(self.demos.obs) if self.demos is not None else None)
        if self.updater is None:  # the policy keeps its normalization: it is fine-tuned, not pre-trained
            self.updater = self._start(None)
        if inputs.reset:
            engine.reset(seed=inputs.seed_base)
            self.buffer.forget_running()
        rollout = engine.collect(self.cfg.decisions_per_iter, ActMode.EXPLORE if self.cfg.explore else ActMode.EVAL)
        self.buffer.add_rollout(rollout)
        self._batches = []
        if len(self.buffer) >= self.cfg.min_buffer:
            source, gen = self._source(), self.updater.generator
            self._batches = [source.sample(self.cfg.batch_size, gen) for _ in range(self.cfg.steps_per_iter)]
        return rollout

    def update(self, batch: Rollout) -> dict[str, float]:
        """``steps_per_iter`` supervised steps on the minibatches :meth:`collect` drew (none before ``min_buffer``)."""
        batches = self._batches
        assert self.buffer is not None
        if batches:
            stats = super().update(batches)
        else:
            stats = {"update/steps": 0.0}
            self.iteration += 1
        # rows of a mixed batch come from source 0 (the demos) or 1 (the buffer); a buffer-only batch has no source
        demo_rows = sum(int((b.source == 0).sum()) for b in batches if b.source is not None)
        return {**stats, "update/buffer_decisions": float(len(self.buffer)),
                "update/buffer_episodes": float(self.buffer.episodes_kept),
                "update/demo_rows": demo_rows / max(1, sum(len(b) for b in batches))}
