"""Which task each reset of a multi-task env plays: uniform, VLA-RL's curriculum, learning progress, or balanced.

The trainer keeps one :class:`TaskCurriculum` per run. After every collection it records each ended
episode's success under its task (``EpisodeRecord.task_index``), logs ``task/<name>/success`` (the mean
over the task's last ``window`` episodes) and ``task/<name>/weight``, and hands the env new sampling
weights (:meth:`sim.core.VecEnv.schedule_tasks`) for the next iteration's resets:

- ``uniform``: every training task alike;
- ``curriculum`` (VLA-RL, Lu et al. 2025): prefer tasks the policy solves about half the time, where
  the policy-gradient signal is largest: ``w = floor + 1 - |2 p - 1|`` with ``p`` the recent success
  (an unseen task counts as ``p = 0.5``);
- ``progress`` (absolute learning progress, Portelas et al. 2020): ``w = floor + |p_new - p_old|``,
  the change between the older and the newer half of the task's window (an unseen or barely seen
  task gets the largest weight, 1);
- ``balanced``: equal successes per task: ``w = 1 / (p + floor)``, so each task's expected successes per
  reset, ``p w``, are about alike (an unseen task counts as ``p = 0``). For learners that learn from
  successes (``filtered_bc`` imitates them; sparse-reward PPO / GRPO have no signal without them), uniform
  sampling fills the data with the easy tasks' successes; this gives a task solved 10% of the time as many
  as one solved 70%. ``floor`` caps a task's weight at ``1 / floor``, so a task never solved takes
  about ``1 / floor`` times the share of one always solved, not all resets.

Held-out tasks (:attr:`TaskSamplingConfig.holdout`) get weight 0 in every mode. The weight functions
are pure (:func:`curriculum_weights`, :func:`progress_weights`, :func:`balanced_weights`) and tested on
hand-set success rates.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vla_rl.hooks import Hook, IterationResult

SAMPLERS = ("uniform", "curriculum", "progress", "balanced")


@dataclass
class TaskSamplingConfig:
    """How a multi-task env (``mujoco/multi``, ``libero/<suite>``, ``maniskill/TabletopSet-v1``) picks
    each reset's task during training, and which tasks stay out of training."""

    sampler: str = "uniform"
    """``uniform``, ``curriculum`` (VLA-RL: prefer tasks near 50% recent success), ``progress`` (prefer
    tasks whose success changes most) or ``balanced`` (equal successes per task: weight ``1 / (p + floor)``);
    see :mod:`vla_rl.curriculum`."""
    window: int = 50
    """Recent episodes per task that its success rate (and logged ``task/<name>/success``) is computed over."""
    floor: float = 0.05
    """Weight added to every training task, so none is starved (curriculum / progress); with ``balanced``, added
    to every success rate, so a task never solved gets weight ``1 / floor``, not all resets (must be > 0)."""
    holdout: list[str] = field(default_factory=list)
    """Task names (``EnvSpec.tasks``, e.g. ``libero_spatial/3`` or ``stack-red-on-green``) kept out of
    training; evaluation then runs on these tasks only."""
    train_init_states: int = 0
    """Envs with fixed init states (LIBERO suites): training resets start from each task's first N init
    states and the ``per_task`` evaluation from init states N, N+1, ..., so the two never share one (checked
    against each task's count when the env is built). 0 = no split: training draws from all of them and
    evaluation plays init states 0, 1, ... as the published recipes do (their numbers are on init states
    also trained from)."""

    def __post_init__(self) -> None:
        if self.sampler not in SAMPLERS:
            raise ValueError(f"env.tasks.sampler must be one of {', '.join(SAMPLERS)}, got {self.sampler!r}")
        if self.window < 2:
            raise ValueError(f"env.tasks.window must be >= 2, got {self.window}")
        if self.floor < 0:
            raise ValueError(f"env.tasks.floor must be >= 0, got {self.floor}")
        if self.sampler == "balanced" and self.floor <= 0:
            raise ValueError(f"env.tasks.floor must be > 0 with env.tasks.sampler balanced (weight 1 / (p + floor)), "
                             f"got {self.floor}")
        if self.train_init_states < 0:
            raise ValueError(f"env.tasks.train_init_states must be >= 0 (0 = all), got {self.train_init_states}")


def spread(tasks: Sequence[int], limit: int) -> list[int]:
    """At most ``limit`` of ``tasks`` (0 = all), evenly spread, so a few tasks of a suite union span its suites."""
    if not 0 < limit < len(tasks):
        return list(tasks)
    return [tasks[i] for i in np.linspace(0, len(tasks) - 1, limit).round().astype(int)]


def curriculum_weights(success: np.ndarray, seen: np.ndarray, floor: float) -> np.ndarray:
    """VLA-RL-style weights ``[T]`` (unnormalized): ``floor + 1 - |2 p - 1|``, unseen tasks at ``p = 0.5``.

    Args:
        success: ``[T]`` recent success rate per task in ``[0, 1]``.
        seen: ``[T]`` bool, whether the task has any recorded episode.
        floor: added to every weight.
    """
    p = np.where(seen, np.clip(success, 0.0, 1.0), 0.5)
    return floor + 1.0 - np.abs(2.0 * p - 1.0)


def progress_weights(old: np.ndarray, new: np.ndarray, enough: np.ndarray, floor: float) -> np.ndarray:
    """Learning-progress weights ``[T]`` (unnormalized): ``floor + |new - old|``; 1 + floor where not ``enough``.

    Args:
        old, new: ``[T]`` success of the older and the newer half of each task's window.
        enough: ``[T]`` bool, whether both halves hold episodes.
        floor: added to every weight.
    """
    return floor + np.where(enough, np.abs(new - old), 1.0)


def balanced_weights(success: np.ndarray, seen: np.ndarray, floor: float) -> np.ndarray:
    """Equal-successes weights ``[T]`` (unnormalized): ``1 / (p + floor)``, unseen tasks at ``p = 0``.

    Args:
        success: ``[T]`` recent success rate per task in ``[0, 1]``.
        seen: ``[T]`` bool, whether the task has any recorded episode.
        floor: added to every rate (> 0): caps a weight at ``1 / floor``.
    """
    p = np.where(seen, np.clip(success, 0.0, 1.0), 0.0)
    return 1.0 / (p + floor)


class TaskCurriculum:
    """Per-task recent success and the resulting sampling weights (see the module doc).

    Args:
        tasks: the env's task names (``EnvSpec.tasks``).
        cfg: the sampling settings.

    Raises:
        ValueError: naming ``env.tasks.holdout`` for an unknown task, or one that holds out every task.
    """

    def __init__(self, tasks: Sequence[str], cfg: TaskSamplingConfig) -> None:
        unknown = [t for t in cfg.holdout if t not in tasks]
        if unknown:
            raise ValueError(f"env.tasks.holdout: unknown task(s) {unknown}; this env's tasks: {', '.join(tasks)}")
        self.tasks = list(tasks)
        self.cfg = cfg
        self.train_mask = np.array([t not in cfg.holdout for t in tasks])
        if not self.train_mask.any():
            raise ValueError("env.tasks.holdout holds out every task: nothing is left to train on")
        self.history: list[deque[bool]] = [deque(maxlen=cfg.window) for _ in tasks]

    @property
    def eval_tasks(self) -> list[int]:
        """Indices evaluation runs on: the held-out tasks if any, else every task."""
        held = np.flatnonzero(~self.train_mask).tolist()
        return held or list(range(len(self.tasks)))

    def observe(self, outcomes: Iterable[tuple[int, bool]]) -> None:
        """Record ``(task index, success)`` of ended episodes (indices < 0, from single-task envs, are ignored)."""
        for task, success in outcomes:
            if 0 <= task < len(self.tasks):
                self.history[task].append(bool(success))

    def success(self) -> tuple[np.ndarray, np.ndarray]:
        """``([T] recent success rate, [T] bool seen)``."""
        seen = np.array([len(h) > 0 for h in self.history])
        rate = np.array([float(np.mean(h)) if h else 0.0 for h in self.history])
        return rate, seen

    def weights(self) -> np.ndarray:
        """Normalized sampling weights ``[T]`` for the next resets (0 on held-out tasks)."""
        if self.cfg.sampler == "curriculum":
            rate, seen = self.success()
            w = curriculum_weights(rate, seen, self.cfg.floor)
        elif self.cfg.sampler == "progress":
            old, new, enough = np.zeros(len(self.tasks)), np.zeros(len(self.tasks)), np.zeros(len(self.tasks), bool)
            for i, h in enumerate(self.history):
                half = len(h) // 2
                if half >= 1:
                    items = list(h)
                    old[i], new[i], enough[i] = np.mean(items[:half]), np.mean(items[half:]), True
            w = progress_weights(old, new, enough, self.cfg.floor)
        elif self.cfg.sampler == "balanced":
            rate, seen = self.success()
            w = balanced_weights(rate, seen, self.cfg.floor)
        else:
            w = np.ones(len(self.tasks))
        w = w * self.train_mask
        return w / w.sum()

    def scalars(self) -> dict[str, float]:
        """``task/<name>/success`` (tasks with episodes) and ``task/<name>/weight`` for logging."""
        rate, seen = self.success()
        w = self.weights()
        out: dict[str, float] = {}
        for i, name in enumerate(self.tasks):
            if seen[i]:
                out[f"task/{name}/success"] = float(rate[i])
            out[f"task/{name}/weight"] = float(w[i])
        return out

    def state_dict(self) -> dict[str, Any]:
        """The recorded outcomes (saved with each checkpoint, so a resumed run samples as before)."""
        return {"tasks": self.tasks, "history": [list(h) for h in self.history]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s outcomes (tasks matched by name)."""
        by_name = dict(zip(state.get("tasks", []), state.get("history", [])))
        for i, name in enumerate(self.tasks):
            self.history[i].clear()
            self.history[i].extend(bool(x) for x in by_name.get(name, []))


class CurriculumHook(Hook):
    """The trainer's side of a :class:`TaskCurriculum`: before each iteration the training envs get its task
    weights for their resets; after the update it observes every rank's ended episodes and logs its
    ``task/<name>/*`` scalars; its state is checkpointed under ``"curriculum"``."""

    name = "curriculum"

    def __init__(self, curriculum: TaskCurriculum, env: Any) -> None:
        self.curriculum = curriculum
        self.env = env

    def before_iteration(self, iteration: int) -> None:
        self.env.schedule_tasks(weights=self.curriculum.weights())

    def after_update(self, result: IterationResult) -> None:
        if result.rollout is None:
            return
        self.curriculum.observe((e.task_index, e.success) for e in result.episodes)
        result.scalars.update(self.curriculum.scalars())

    def state_dict(self) -> dict[str, Any]:
        return self.curriculum.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.curriculum.load_state_dict(state)
