"""Per-slot task assignment for multi-task envs (``mujoco/multi``, LIBERO suites, the ManiSkill set).

A multi-task env has ``T`` named tasks (``EnvSpec.tasks``). Each env slot owns a :class:`TaskSchedule`
that decides the task (and, where the backend has fixed initial states, the init state) of every
episode the slot starts, explicit resets and auto-resets alike:

1. if the slot has queued :class:`Assignment`\\ s (``VecEnv.schedule_tasks(plans=...)``), the next one
   is popped: its task, its init state and its seed are used as given (the evaluation protocols
   queue each task's init states this way);
2. otherwise the task is drawn from the slot's current weights (uniform by default; the trainer's
   curriculum sets them with ``VecEnv.schedule_tasks(weights=...)``) with the slot's own RNG, which
   a seeded reset reseeds, so the draw is a function of (seed, weights) alone.

Slots report the task they run as the observation key ``task_index`` (``int64 [B]``, an index
into ``EnvSpec.tasks``); ``final_obs["task_index"]`` names the task of an episode that ended.
Weight 0 keeps a task out of training (task hold-out).

This module imports no simulator.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sim.core import EnvError

TASK_INDEX = "task_index"
"""Observation key: ``int64 [B]`` index into ``EnvSpec.tasks`` of each slot's current task."""


@dataclass(frozen=True)
class Assignment:
    """What one episode of a slot plays.

    Attributes:
        task: index into ``EnvSpec.tasks``.
        init: the backend's fixed init state index (LIBERO: 0-49); -1 = chosen from the seed as usual.
        seed: reset seed of the episode; None = continue the slot's RNG (or the reset's own seed).
    """

    task: int
    init: int = -1
    seed: int | None = None


def check_weights(weights: Sequence[float] | np.ndarray, num_tasks: int, env_id: str) -> np.ndarray:
    """``weights`` as float64 probabilities ``[T]`` summing to 1.

    Raises:
        EnvError: naming ``env_id`` for a wrong length, a negative or non-finite weight, or all zeros.
    """
    w = np.asarray(weights, dtype=np.float64).reshape(-1)
    if w.shape != (num_tasks,):
        raise EnvError(f"{env_id}: task weights must have one entry per task ({num_tasks}), got {w.shape[0]}")
    if not np.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
        raise EnvError(f"{env_id}: task weights must be finite, >= 0 and not all 0, got {w.tolist()}")
    return w / w.sum()


class TaskSchedule:
    """One slot's task choice at every reset (see the module doc).

    Args:
        num_tasks: ``T``.
        env_id: for messages.
    """

    def __init__(self, num_tasks: int, env_id: str) -> None:
        self.num_tasks = num_tasks
        self.env_id = env_id
        self.weights: np.ndarray | None = None  # None: uniform
        self.queue: deque[Assignment] = deque()

    def set(self, weights: np.ndarray | None, plan: Sequence[Assignment] | None) -> None:
        """Replace the weights (None: keep; an empty array or equal weights: uniform) and/or the queue (None: keep)."""
        if weights is not None:
            w = None if len(weights) == 0 else check_weights(weights, self.num_tasks, self.env_id)
            # equal weights are the uniform draw: the same rng.integers stream as an env never scheduled
            self.weights = None if w is None or bool(np.all(w == w[0])) else w
        if plan is not None:
            bad = [a.task for a in plan if not 0 <= a.task < self.num_tasks]
            if bad:
                raise EnvError(f"{self.env_id}: assigned task index {bad[0]} out of range (tasks 0-{self.num_tasks - 1})")
            self.queue = deque(plan)

    def next(self, rng: np.random.Generator) -> Assignment:
        """The next episode's assignment: the queued one, else a draw from the weights with ``rng``.

        Uniform weights draw ``rng.integers(T)`` (so envs that drew their task this way before keep
        their exact streams); other weights draw by inverse CDF from one ``rng.random()``.
        """
        if self.queue:
            return self.queue.popleft()
        if self.weights is None:
            return Assignment(int(rng.integers(self.num_tasks)) if self.num_tasks > 1 else 0)
        cdf = np.cumsum(self.weights)
        return Assignment(min(int(np.searchsorted(cdf, rng.random(), side="right")), self.num_tasks - 1))


def split_plans(plan: Sequence[Assignment], num_envs: int) -> dict[int, list[Assignment]]:
    """Deal ``plan`` round-robin over ``num_envs`` slots: slot ``i`` plays ``plan[i::num_envs]`` in order."""
    return {i: list(plan[i::num_envs]) for i in range(num_envs)}
