"""Trainer hooks: what attaches to the training loop without being the loop.

:class:`vla_rl.trainer.Trainer` runs one pipeline per iteration::

    before_iteration -> collect -> update -> after_update -> evaluate -> before_log -> log -> after_round
    -> ends_run? -> checkpoint

and calls every :class:`Hook` it was given at the points named above, in the order of its hook list. The task
curriculum, reward annealing, the weight EMA (:mod:`vla_rl.ema`), reward traces (:mod:`vla_rl.reweigh`) and the
``time/*`` scalars (:mod:`vla_rl.timing`) are such hooks, attached by the trainer from its config; a command
adds its own with ``Trainer(cfg, hooks=[...])`` (e.g. ``vla-rl align``'s per-round files).

A hook overrides only what it needs; every method's default does nothing. Hooks with a :attr:`Hook.name` keep
state across ``--resume``: :meth:`Hook.state_dict` is saved in the checkpoint's ``trainer.pt`` under that name
and handed back to :meth:`Hook.load_state_dict` when the run resumes.

Rounds: a hook with :attr:`Hook.every` ``N`` sees :meth:`Hook.after_round` after iterations ``N, 2N, ...``
(1-based), e.g. one GRAPE round per iteration (``N = 1``) or a reward trace every ``N`` iterations; a hook ends
the run early by returning True from :meth:`Hook.ends_run` after an iteration (which is then checkpointed, and
evaluated when it was not, as the last), e.g. pre-training that stops at a success check.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from policies.base import Policy
    from vla_rl.algorithms.base import Learner
    from vla_rl.distributed import Distributed
    from vla_rl.evaluation import EvalResult
    from vla_rl.rollout import EpisodeRecord, Rollout, RolloutEngine
    from vla_rl.train_config import TrainConfig

STAGES = ("collect", "update", "evaluate", "log", "checkpoint")
"""The pipeline stages :meth:`Hook.stage` wraps (``checkpoint``: the writing of the checkpoint on rank 0)."""


@dataclass
class RunContext:
    """What a hook sees of the run, handed to :meth:`Hook.start` once everything is built.

    Attributes:
        cfg: the run's config.
        run_dir: the run folder.
        policy: the policy being trained.
        learner: the learner wired to it (its state already loaded on resume).
        env: the training envs (this rank's share).
        eval_env: the evaluation envs.
        engine: the rollout engine of the training envs (``engine.reward`` is the reward being paid).
        dist: the ranks of the run (:data:`vla_rl.distributed.SINGLE` in a one-process run).
        logger: the run's logger (``log(step, scalars)``, ``log_video``; a no-op on ranks other than 0).
        start_iteration: the first iteration this process runs (0, or where a resumed run goes on).
        data: the offline dataset of a learner that trains on one (:attr:`Needs.DATASET`), else None.
    """

    cfg: TrainConfig
    run_dir: Path
    policy: Policy
    learner: Learner
    env: Any
    eval_env: Any
    engine: RolloutEngine
    dist: Distributed
    logger: Any
    start_iteration: int
    data: Any = None


@dataclass
class IterationResult:
    """One iteration as the hooks after the update see it.

    Attributes:
        iteration: the iteration index (0-based); ``iteration + 1`` iterations are done after it.
        batch: what :meth:`Learner.collect` returned (a :class:`vla_rl.rollout.Rollout`, data batches, ...).
        rollout: ``batch`` when it is a :class:`vla_rl.rollout.Rollout` (the learner stepped the envs), else None.
        scalars: the row to be logged; hooks add their own keys to it (``after_update``, ``before_log``).
        episodes: the episodes that ended in this iteration's collection, every rank's (empty for a learner that
            does not step the envs).
        env_steps: the run's env steps so far (all ranks), the step the row is logged at.
        last: whether this is the run's planned last iteration (``cfg.iterations``; a hook may end it earlier).
        evaluation: this iteration's evaluation (None when it did not evaluate); set before ``before_log``.
    """

    iteration: int
    batch: Any
    scalars: dict[str, float]
    rollout: Rollout | None = None
    episodes: list[EpisodeRecord] = field(default_factory=list)
    env_steps: int = 0
    last: bool = False
    evaluation: EvalResult | None = None


class Hook:
    """A piece of the training run outside the loop proper (see the module doc). Every method defaults to nothing.

    Class attributes:
        name: the key of this hook's state in a checkpoint's ``trainer.pt``; empty = the hook keeps no state.
        every: iterations per round: :meth:`after_round` runs after every ``every``-th iteration.
    """

    name: ClassVar[str] = ""
    every: int = 1

    def start(self, run: RunContext) -> None:
        """Called once per process, after the policy, learner, envs and logger are built and a resumed run's state
        (the learner's, :meth:`load_state_dict`'s) is loaded, before the evaluation that precedes training."""

    def ends_run(self, iteration: int) -> bool:
        """Asked after ``iteration`` (0-based) is logged and its rounds ran: True ends the run after it, before
        ``cfg.iterations``: the iteration is checkpointed, and evaluated (logged on a row of its own) if it was not.
        Every rank must answer alike. (A learner that defers an update to the next collection, ``filtered_bc`` with
        ``algo.overlap``, loses that update when the run ends on an iteration that did not evaluate.)"""
        return False

    def before_iteration(self, iteration: int) -> None:
        """Called before ``iteration`` collects (e.g. hand the envs this iteration's task weights)."""

    def stage(self, name: str) -> contextlib.AbstractContextManager[None]:
        """A context the trainer runs pipeline stage ``name`` (one of :data:`STAGES`) inside: timing it, or the
        EMA's averaged weights around ``evaluate`` and ``checkpoint``. Hooks' contexts nest in list order."""
        return contextlib.nullcontext()

    def after_update(self, result: IterationResult) -> None:
        """Called after the learner's update, before the evaluation; may add keys to ``result.scalars``."""

    def before_log(self, result: IterationResult) -> None:
        """Called after the evaluation, just before ``result.scalars`` is logged; may add keys to it."""

    def after_round(self, round_index: int, result: IterationResult) -> None:
        """Called after the row of iteration ``result.iteration`` is logged, when ``result.iteration + 1`` is a
        multiple of :attr:`every` (round ``round_index``, 0-based, just ended), before the checkpoint."""

    def end(self, result: dict[str, Any]) -> None:
        """Called once after the last iteration (not when the run fails) with what :meth:`Trainer.run` returns."""

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs of this hook (saved under :attr:`name`, on rank 0, inside the ``checkpoint``
        stage). Default: nothing."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output: called on resume before :meth:`start`, when the checkpoint has this
        hook's key."""


class RewardAnnealing(Hook):
    """Moves the annealed reward weights (``reward.anneal``) to the iteration's progress ``iteration / iterations``
    before it collects (a function of the iteration alone, so a resumed run anneals the same) and logs them as
    ``reward/weight/<term>``."""

    def __init__(self, terms: dict[str, float], iterations: int) -> None:
        self.terms = terms
        self.iterations = iterations
        self.reward: Any = None

    def start(self, run: RunContext) -> None:
        self.reward = run.engine.reward

    def before_iteration(self, iteration: int) -> None:
        self.reward.set_progress(iteration / self.iterations)

    def after_update(self, result: IterationResult) -> None:
        result.scalars.update({f"reward/weight/{k}": w for k, w in self.reward.weights if k in self.terms})
