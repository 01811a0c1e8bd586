"""GRAPE's data: whole trajectories, preference pairs of them, a trajectory's log-likelihood, the round's file.

A :class:`Trajectory` keeps what its log-likelihood needs (the decision observations and the policy's
sampler extras: the denoising chain of a Flow-SDE / Flow-Noise policy, the action tokens of an
autoregressive one) and what scoring needs (success, steps, cost totals per task stage).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from policies.base import Policy
from vla_core.manifest import write_file_atomic


@dataclass
class Trajectory:
    """One episode of the policy from a seeded initial state.

    Attributes:
        id: index of the trajectory in its round.
        state: index of its initial state in the round; ``seed`` the env seed that produced it.
        obs: decision observations ``[T, ...]`` per key (``task``: ``T`` strings).
        actions: ``[T, H, A]`` the chunks the policy chose.
        extras: the policy's sampler extras ``[T, ...]`` (what :meth:`policies.Policy.evaluate` re-scores).
        logp: ``[T]`` per-decision log-prob at sampling (summed over the policy's log-prob level).
        success: whether the episode succeeded; ``steps``: env steps it took.
        costs: cost term -> its total over the episode.
        stage_costs: cost term -> ``[stages]`` its total over the steps spent in each stage (stage
            progress 0, 1, ...; one entry when the task has no stages).
        score: GRAPE's ``R(tau)`` once scored; ``score_parts``: its ``log_r_self``, ``r_ext``, ``success``.
    """

    id: int
    state: int
    seed: int
    obs: dict[str, Any]
    actions: Tensor
    extras: dict[str, Tensor]
    logp: Tensor
    success: bool
    steps: int
    costs: dict[str, float]
    stage_costs: dict[str, list[float]]
    score: float = 0.0
    score_parts: dict[str, float] = field(default_factory=dict)

    @property
    def decisions(self) -> int:
        return int(self.actions.shape[0])


@dataclass(frozen=True)
class PreferencePair:
    """A chosen (higher-scored) and a rejected trajectory of one initial state."""

    state: int
    chosen: Trajectory
    rejected: Trajectory


def trajectory_logp(policy: Policy, traj: Trajectory) -> Tensor:
    """``log pi(tau)``: the sum over the trajectory's decisions of the policy's log-prob of its recorded sample.

    Works for every policy kind: :meth:`policies.Policy.evaluate` re-scores the recorded denoising chain or
    action tokens; its log-prob (at any level) is summed over everything but the decision. 0-dim, differentiable.
    """
    logp, _, _ = policy.evaluate(traj.obs, traj.extras)
    return logp.reshape(logp.shape[0], -1).sum()


def save_trajectories(path: Path, trajs: Sequence[Trajectory]) -> None:
    """Everything needed to re-train from the round (observations, sampler extras, scores), atomically."""
    write_file_atomic(path, lambda f: torch.save([vars(t) for t in trajs], f))


def load_trajectories(path: Path) -> list[Trajectory]:
    """:func:`save_trajectories`' list back as :class:`Trajectory` objects."""
    return [Trajectory(**row) for row in torch.load(path, weights_only=False)]
