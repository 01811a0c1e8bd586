"""Hold-after-done: the one rule for executing an action chunk on a batch of envs.

A chunked policy decides once per chunk ``[n, H, A]``; the chunk runs open-loop for ``H`` env steps.
When an env's episode ends at step ``h`` of the chunk (terminated or truncated), the env is
auto-reset and *held still* for steps ``h+1 .. H-1`` (the env's :meth:`sim.core.VecEnv.still_actions`:
zero actions, i.e. no end-effector motion, for the simulators' delta control; the last accepted joint
target for a robot, :class:`hardware.env.RobotEnv`): no
action of the old chunk runs in the new episode, and the env's next decision starts from the new
episode's observation (after those held steps). Only the first end of an env inside a chunk is that
chunk's outcome (its final observation, its episode); the held steps belong to the next episode.

Every chunk executor applies the rule through this module: :meth:`sim.core.VecEnv.step_chunk` (the
batched default on top of ``step``), :func:`sim.vector.run_chunk` (in-process and worker-process
envs, pipelined chunks included), and the readers of a chunk's outcome, the rollout engine
(:mod:`vla_rl.rollout`) and evaluation (:mod:`vla_rl.evaluation`), through :func:`first_episode_steps`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch


class ChunkHold:
    """The hold state of one chunk on ``n`` envs: which envs' episodes already ended.

    Use per step ``h``: ``a = hold.actions(chunk[:, h])``, step the envs with ``a``, then
    ``first = hold.end(done)``.

    Args:
        n: envs.
        still: returns the ``[n, A]`` actions that hold the envs still, called only at steps where an
            env is held; None means zero actions.

    Attributes:
        ended: ``bool [n]``, True for envs whose episode ended at an earlier step of this chunk.
    """

    def __init__(self, n: int, still: Callable[[], np.ndarray] | None = None) -> None:
        self.ended = np.zeros(n, dtype=bool)
        self._still = still

    def actions(self, step_actions: np.ndarray) -> np.ndarray:
        """The actions ``[n, A]`` to execute at this step: ``step_actions`` with ended envs' rows held still."""
        if not self.ended.any():
            return step_actions
        still = np.zeros_like(step_actions) if self._still is None else np.asarray(self._still(), step_actions.dtype)
        return np.where(self.ended[:, None], still, step_actions)

    def end(self, done: np.ndarray) -> np.ndarray:
        """Record this step's ends ``done bool [n]``; returns ``bool [n]``: envs whose first end this is."""
        first = done & ~self.ended
        self.ended |= done
        return first


def first_episode_steps(terminated: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """Which steps of a chunk belong to the episode each env was in when the chunk started.

    Args:
        terminated, truncated: ``bool [H, n]`` per-step end flags of one chunk.

    Returns:
        ``bool [H, n]``: True up to and including each env's first end (all True if it did not end),
        False on the held steps after it (they belong to the env's next episode).
    """
    done = (terminated | truncated).to(torch.int32)
    ended_before = (done.cumsum(0) - done) > 0
    return ~ended_before
