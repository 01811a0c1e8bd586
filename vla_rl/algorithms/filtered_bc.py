"""Success-filtered self-imitation (``--algo.type filtered_bc``): the policy imitates its own successful episodes.

Each iteration the policy explores in the training envs as PPO's rollouts do (its sampler, episodes continued
across iterations), every decision of an episode that ends in success joins a buffer
(:class:`vla_rl.data.replay.SuccessBuffer`), and ``steps_per_iter`` supervised steps
(:class:`vla_rl.algorithms.sft.SFTUpdater`: the policy's own ``sft_loss``, flow matching or token cross-entropy) train on
batches of those rows, mixed with the demos (``algo.demos``) at ``demo_ratio``.

It is reward-weighted regression with a 0/1 weight (iterated filtered behaviour cloning): the policy moves
toward the actions of its successful attempts, so it keeps what already works in some episodes (the right
cube, the grasp that held) and needs no critic and no log-likelihood of the sampler. The update costs one
velocity pass per row instead of the whole denoising chain. Why it is here: PPO from a decent imitation start
moves the deployed policy little on our CPU budget (docs/results.md, "Training the deployed policy").
"""

from __future__ import annotations

import copy
import dataclasses
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from policies.base import ActMode, Policy
from vla_rl.algorithms.base import IterationInputs, LearnerConfig, Needs, SmokeLimits, register_learner
from vla_rl.algorithms.sft import SFTConfig, SFTLearner
from vla_rl.config import ConfigError
from vla_rl.data.chunks import ChunkBatch, ChunkDataset
from vla_rl.data.mix import MixedSource
from vla_rl.data.replay import SuccessBuffer
from vla_rl.rollout import Rollout


@dataclass
class FilteredBCConfig(SFTConfig):
    """Success-filtered self-imitation (``--algo.type filtered_bc``): SFT settings (``lr``, ``batch_size``,
    ``image_shift``, ...; ``steps`` is the cosine schedule's length, by default the run's
    ``iterations x steps_per_iter``) plus collection and the data mix."""

    lr: float = 1e-3
    """AdamW learning rate (cosine-decayed to 10% over ``steps``); the quickstart's seeds gain most at 1e-3, the
    rate of pre-training (docs/results.md, "Training the deployed policy")."""
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
    hindsight: bool = False
    """Hindsight relabeling: a failed episode that accomplished another task of a multi-task env (the env's
    ``achieved_task`` signal: it lifted the green cube when told to lift the red one) joins the buffer as a
    success of that task, under its instruction (:mod:`vla_rl.data.replay`). Needs an env that reports it and
    its tasks' instructions (``mujoco/pick-any`` and the other tabletop ``-any`` / ``multi`` ids)."""
    success_return: float = 0.0
    """0: an episode counts as a success when the env reports success. Above 0: when the run's reward
    (``--reward.terms``) summed over the episode reaches this, so the learner never reads the simulator's
    success: with ``--reward.terms '{classifier: 1.0}' --algo.success_return 1`` a learned success classifier
    decides which episodes are imitated (what fine-tuning on a real robot needs; docs/results.md, "Learned
    rewards")."""
    explore: bool = True
    """Collect with the policy's exploration sampler (``act(EXPLORE)``); False plays the deterministic policy
    that evaluation runs, so only its own successes are imitated."""
    overlap: bool = False
    """Run each iteration's gradient steps in a background thread while the next iteration collects, acting
    with a copy of the weights from before those steps (one update behind), so the learner's core works while
    the env workers step. The policy is brought up to date before every evaluation and at the end of the run; a
    checkpoint in between holds the weights without the deferred steps (resuming loses that one update). Single
    process only; pays on a machine the run has to itself (docs/results.md, "Training throughput")."""
    overlap_worker_nice: int = 10
    """With ``overlap``: raise the nice value of the env's worker processes by this much (once, for the run), so
    that the update thread, the critical path, is not descheduled for workers that have time to spare; 0 leaves
    them. The quickstart's iteration: 1.50 -> 1.35 s (docs/results.md, "Training throughput")."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.decisions_per_iter < 1 or self.buffer_size < 1 or self.min_buffer < 1:
            raise ValueError("algo.decisions_per_iter, algo.buffer_size and algo.min_buffer must be >= 1")
        if self.success_return < 0:
            raise ValueError(f"algo.success_return must be >= 0 (0: the env's success), got {self.success_return}")
        if not 0 <= self.overlap_worker_nice <= 19:
            raise ValueError(f"algo.overlap_worker_nice must lie in [0, 19], got {self.overlap_worker_nice}")
        if not 0.0 <= self.demo_ratio < 1.0:
            raise ValueError(f"algo.demo_ratio must lie in [0, 1), got {self.demo_ratio}")
        if self.ema:
            raise ValueError("algo.ema: filtered_bc trains the weights it collects with (and with algo.overlap in a "
                             "background thread); the moving average is for algo.type sft and rac")

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
        self._deferred: list[ChunkBatch] = []  # overlap: drawn last iteration, trained while this one collects
        self._background: dict[str, float] = {}  # overlap: sums of the steps that ran beside this collection
        self._sync = True
        self._actor: Policy | None = None  # overlap: the weights the envs are played with while the policy trains
        self.act_generator: torch.Generator | None = None  # overlap: the actor's own RNG (module doc of rollout)
        self._reniced: Any = None  # overlap: the env whose workers yield to the update thread
        self._store: tuple[Path, int] | None = None  # the success buffer's store and how many states it keeps
        self._buffer_state: dict[str, Any] | None = None  # a resumed run's buffer, loaded once the buffer exists

    def distribute(self, dist: Any) -> None:
        if self.cfg.overlap and dist.enabled:
            raise ConfigError("algo.overlap trains in a thread beside the collection, which one process only "
                              "supports; run with --algo.overlap false under accelerate / torch.distributed")
        super().distribute(dist)

    def _source(self) -> Any:
        assert self.buffer is not None
        if self.demos is None or self.cfg.demo_ratio == 0.0:
            return self.buffer
        return MixedSource([(self.demos, self.cfg.demo_ratio), (self.buffer, 1.0 - self.cfg.demo_ratio)])

    def _actor_weights(self) -> Policy:
        """The policy copy the envs are played with during an overlapped update, holding the current weights."""
        if self._actor is None:
            self._actor = copy.deepcopy(self.policy)
        self._actor.load_state_dict(self.policy.state_dict())
        self._actor.train(self.policy.training)
        return self._actor

    @staticmethod
    def _instructions(engine: Any) -> tuple[str, ...]:
        """The env's task instructions, indexed like its ``achieved_task`` signal (``algo.hindsight``)."""
        spec = engine.env.spec
        if not spec.instructions:
            raise ConfigError(f"algo.hindsight relabels episodes with the instruction of the task they accomplished; "
                              f"env {spec.env_id} names no task instructions (use a multi-task env that reports "
                              "achieved_task, e.g. mujoco/pick-any, or --algo.hindsight false)")
        return tuple(spec.instructions)

    def collect(self, inputs: IterationInputs) -> Rollout:
        """Play ``decisions_per_iter`` chunks per env, file them in the buffer and draw this iteration's
        minibatches (none while the buffer holds fewer than ``min_buffer`` decisions); returns the rollout, whose
        episodes the loop logs as any on-policy learner's. With ``overlap``, the previous iteration's deferred
        minibatches train the policy in a background thread meanwhile, and a copy of the weights from before them
        acts."""
        engine = inputs.engine
        assert engine is not None, "filtered_bc collects rollouts: the loop must pass an engine"
        if self.buffer is None:
            if self.cfg.demos:
                self.demos = self._load(self.cfg.demos)
            self.buffer = SuccessBuffer(self.cfg.buffer_size, list(self.demos.obs) if self.demos is not None else None,
                                        relabel=self._instructions(engine) if self.cfg.hindsight else None,
                                        success_return=self.cfg.success_return or None)
            self._restore_buffer()
        if self.updater is None:  # the policy keeps its normalization: it is fine-tuned, not pre-trained
            self.updater = self._start(None)
        if self.cfg.overlap:
            if self.act_generator is None:
                self.act_generator = torch.Generator().manual_seed(int(torch.randint(0, 2**62, ()).item()))
            engine.generator = self.act_generator
            if self._reniced is not engine.env and self.cfg.overlap_worker_nice:
                engine.env.lower_worker_priority(self.cfg.overlap_worker_nice)
                self._reniced = engine.env
        self._sync = inputs.sync
        deferred, self._deferred, self._background = self._deferred, [], {}
        live = engine.policy
        worker: threading.Thread | None = None
        failure: list[BaseException] = []
        if deferred:
            engine.policy = self._actor_weights()
            started = time.perf_counter()

            def train() -> None:
                try:
                    self._train_steps(deferred, self._background)
                except BaseException as e:  # re-raised in the collecting thread
                    failure.append(e)
                self._background["overlap_s"] = time.perf_counter() - started

            worker = threading.Thread(target=train, name="filtered_bc-update", daemon=True)
            worker.start()
        try:
            if inputs.reset:
                engine.reset(seed=inputs.seed_base)
                self.buffer.forget_running()
            rollout = engine.collect(self.cfg.decisions_per_iter,
                                     ActMode.EXPLORE if self.cfg.explore else ActMode.EVAL)
        finally:
            if worker is not None:
                worker.join()
                engine.policy = live
        if failure:
            raise failure[0]
        self.buffer.add_rollout(rollout)
        self._batches = []
        if len(self.buffer) >= self.cfg.min_buffer:
            source, gen = self._source(), self.updater.generator
            self._batches = [source.sample(self.cfg.batch_size, gen) for _ in range(self.cfg.steps_per_iter)]
        return rollout

    def update(self, batch: Rollout) -> dict[str, float]:
        """``steps_per_iter`` supervised steps on the minibatches :meth:`collect` drew (none before ``min_buffer``).
        With ``overlap`` they are deferred to the next collection unless the loop evaluates or stops after this
        iteration; the statistics are those of the steps taken during this iteration."""
        assert self.buffer is not None
        batches, self._batches = self._batches, []
        sums = dict(self._background)
        overlapped = sums.pop("overlap_s", None)
        if self.cfg.overlap and not self._sync:
            self._deferred = batches
        else:
            self._train_steps(batches, sums)
        self.iteration += 1
        steps = sums.get("steps", 0.0)
        stats = {**self._averages(sums), "update/steps": steps}
        if overlapped is not None:
            stats["update/overlapped_s"] = overlapped
        # rows of a mixed batch come from source 0 (the demos) or 1 (the buffer); a buffer-only batch has no source
        demo_rows = sum(int((b.source == 0).sum()) for b in batches if b.source is not None)
        return {**stats, "update/buffer_decisions": float(len(self.buffer)),
                "update/buffer_episodes": float(self.buffer.episodes_kept),
                "update/relabeled_episodes": float(self.buffer.episodes_relabeled),
                "update/demo_rows": demo_rows / max(1, sum(len(b) for b in batches))}

    def use_store(self, folder: Path, keep: int) -> None:
        """The success buffer's rows go to an append-only store in ``folder``
        (:meth:`vla_rl.data.replay.SuccessBuffer.persist`), so a checkpoint names them and a resumed run keeps
        imitating them."""
        self._store = (Path(folder), keep)

    def _restore_buffer(self) -> None:
        """Give the new buffer its store and, in a resumed run, the rows its checkpoint names."""
        assert self.buffer is not None
        if self._store is None:
            return
        self.buffer.persist(*self._store)
        if self._buffer_state is not None:
            self.buffer.load_state_dict(self._buffer_state)
            if self.dist.is_main:  # above the trainer's progress bar, not inside its line
                tqdm.write(f"success buffer: {len(self.buffer)} decisions of {self.buffer.episodes_kept} "
                           f"successful episodes restored from {self._store[0]}")
        elif self.iteration > 0 and self.dist.is_main:
            tqdm.write("success buffer: the checkpoint names none (written before buffers were saved); it refills "
                       "from the episodes of the resumed run")
        self._buffer_state = None

    def _saved_buffer(self) -> dict[str, Any] | None:
        """The buffer's state for a checkpoint (its rows written to the store first); None without a store."""
        if self.buffer is None or self.buffer.store is None:
            return self._buffer_state  # not built yet: a resumed state still waiting for it, or nothing
        return self.buffer.state_dict()

    def state_dict(self) -> dict[str, Any]:
        """The SFT state, the actor's RNG and the success buffer's (its rows are in the store, :meth:`use_store`);
        with ``overlap``, deferred minibatches are not saved (the weights and optimizer saved are those before
        them, consistent with each other)."""
        state = super().state_dict()
        if self.act_generator is not None:
            state["act_generator"] = self.act_generator.get_state()
        state["buffer"] = self._saved_buffer()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if state.get("act_generator") is not None:
            self.act_generator = torch.Generator()
            self.act_generator.set_state(state["act_generator"])
        self._buffer_state = state.get("buffer")

    def rank_state(self) -> dict[str, Any]:
        """Each rank's own success buffer, besides its minibatch generator."""
        return {**super().rank_state(), "buffer": self._saved_buffer()}

    def load_rank_state(self, state: dict[str, Any]) -> None:
        super().load_rank_state(state)
        self._buffer_state = state.get("buffer")
