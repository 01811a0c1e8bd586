"""The single-environment protocol that backends implement.

A backend that simulates one environment per instance (ManiSkill's CPU
backend, LIBERO, a MuJoCo task, gym-hil) implements :class:`SingleEnv` with
numpy arrays; :mod:`sim.vector` batches any number of them in-process or over
worker processes, and adds auto-reset, final observations, episode statistics
and action checking, so backends never re-implement those.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class StepOut:
    """One env step. ``obs`` maps observation keys (no ``task``) to numpy arrays without batch dim."""

    obs: dict[str, np.ndarray]
    reward: float
    terminated: bool
    truncated: bool
    success: bool
    reward_terms: dict[str, float] | None = None


class SingleEnv(abc.ABC):
    """One simulated environment, numpy in and out.

    Subclasses set ``spec`` (an :class:`sim.core.EnvSpec` with the batch
    dimension left out) in ``__init__``.
    """

    spec: Any  # sim.core.EnvSpec

    @abc.abstractmethod
    def reset(self, seed: int | None) -> tuple[dict[str, np.ndarray], str]:
        """Start an episode; ``seed=None`` continues the env's RNG. Returns (obs, instruction)."""

    @abc.abstractmethod
    def step(self, action: np.ndarray) -> StepOut:
        """Apply one action ``float32 [A]``. Truncation at ``spec.max_episode_steps`` is the env's job."""

    def step_unrendered(self, action: np.ndarray) -> StepOut:
        """:meth:`step`, for a step whose observation nobody reads (inside an action chunk).

        Backends that can skip rendering override this and may leave the camera images out of
        ``obs``, except on a step where the episode ends (its final observation is read). The
        default renders as :meth:`step` does.
        """
        return self.step(action)

    def expert_action(self) -> np.ndarray:
        """The scripted expert's next action ``float32 [A]`` from privileged simulator state.

        Raises:
            NotImplementedError: if this task has no scripted expert.
        """
        raise NotImplementedError(f"{self.spec.env_id} has no scripted expert")

    def schedule_tasks(self, weights: np.ndarray | None, plan: list[Any] | None) -> None:
        """A multi-task env's task weights and queued assignments (see :meth:`sim.core.VecEnv.schedule_tasks`).

        Raises:
            NotImplementedError: for a single-task env.
        """
        raise NotImplementedError(f"{self.spec.env_id} is a single-task env")

    def close(self) -> None:
        """Release resources."""
