"""GRAPE's trajectory score and the env signals it reads.

``R(tau) = lam_self * log R_self + lam_ext * R_ext + lam_success * 1[success]`` with
``R_ext = prod_stages exp(-sum_j beta_j * max(0, C_j,stage - tau_j))`` (:func:`score_trajectory`); the costs
``C_j`` come from the env's privileged signals through :mod:`rewards.costs`, and :func:`check_scoring` tells,
before a run starts, whether an env reports the ones a score needs.

``R_self = prod_t max(p_t, min_prob)`` with ``p_t`` the probability of decision ``t``'s sample. GRAPE's
``p_t`` is a token probability; for a continuous (flow) policy the recorded log-density is per
element, so here ``log p_t`` is the mean log-prob per element of the decision (the geometric-mean
token probability for an autoregressive policy), clipped to ``[log min_prob, 0]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from rewards.costs import COSTS, STAGE_SIGNAL, check_costs
from rewards.terms import RewardTermError, StepInput, make_term
from sim.core import VecEnv
from vla_rl.grape.trajectory import Trajectory


@dataclass
class ScoreConfig:
    """How trajectories are scored: ``R = lam_self * log R_self + lam_ext * R_ext + lam_success * success``."""

    lam_self: float = 0.01
    """Weight of ``log R_self``, the policy's own log-likelihood of the trajectory (GRAPE: 0.01)."""
    lam_ext: float = 1.0
    """Weight of ``R_ext``, the constraint reward in (0, 1] (GRAPE: 1)."""
    lam_success: float = 5.0
    """Weight of task success (GRAPE: 5)."""
    costs: dict[str, float] = field(default_factory=dict)
    """Cost term -> ``beta_j`` in ``R_ext`` (GRAPE: 0.01 each; the presets ``configs/align_*.yaml`` set them).
    Terms: ``collision``, ``table_force``, ``path_length``, ``episode_steps``, ``joint_limit``, ``action_jerk``,
    ``keypoint_obstacle``, ``keypoint_target`` (rewards/costs.py). A command-line value is merged into the preset's, so
    ``--grape.score.costs '{collision: 2.0}'`` changes one weight; a weight of 0 turns a cost off."""
    thresholds: dict[str, float] = field(default_factory=dict)
    """Cost term -> ``tau_j``, the cost allowed per stage before it counts; missing terms: 0."""
    stagewise: bool = True
    """Sum each cost per task stage (the task's stage predicates, the ``stage_progress`` signal) and apply the
    thresholds per stage, as GRAPE does; false: the whole episode is one stage (tasks without stages)."""
    min_prob: float = 0.05
    """Floor of each decision's probability in ``R_self`` (GRAPE: 0.05)."""

    def __post_init__(self) -> None:
        check_costs(list(self.costs))
        bad = [k for k, v in self.costs.items() if not math.isfinite(v) or v < 0]
        if bad:
            raise ValueError(f"score.costs: weights must be finite and >= 0, got {({k: self.costs[k] for k in bad})}")
        unknown = [k for k in self.thresholds if k not in self.costs]
        if unknown:
            raise ValueError(f"score.thresholds: {unknown} are not among score.costs ({', '.join(self.costs)})")
        if not 0 < self.min_prob <= 1:
            raise ValueError(f"score.min_prob must be in (0, 1], got {self.min_prob}")
        for name in ("lam_self", "lam_ext", "lam_success"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"score.{name} must be finite, got {getattr(self, name)}")

    def active(self) -> dict[str, float]:
        """The costs with a nonzero weight: the ones scored (and that the env must report)."""
        return {k: float(v) for k, v in self.costs.items() if v != 0}


def probe_signals(env: VecEnv, seed: int) -> dict[str, torch.Tensor]:
    """The privileged signals ``env`` reports (name -> ``[B]``): resets it from ``seed``, steps it once, held still."""
    env.reset(seed=seed)
    return {k: v[0] for k, v in env.step_chunk(torch.from_numpy(env.still_actions())[:, None]).signals.items()}


def available_costs(env: VecEnv, signals: dict[str, torch.Tensor]) -> list[str]:
    """The cost terms of :data:`rewards.costs.COSTS` that ``env`` has the ``signals`` for (:func:`probe_signals`)."""
    b = env.num_envs
    flags = torch.zeros(b, dtype=torch.bool)
    probe = StepInput(env_id=env.spec.env_id, step=0, obs={}, action=torch.zeros(b, env.spec.action_dim),
                      env_terms={}, success=flags, terminated=flags, truncated=flags,
                      signals=signals, executed=None)
    out = []
    for name in COSTS:
        try:
            make_term(name)(probe)
            out.append(name)
        except RewardTermError:
            pass
    return out


def check_scoring(env: VecEnv, score: ScoreConfig, seed: int) -> list[str]:
    """The costs ``env`` can report; raises ``ValueError`` for a configured cost or stage-wise scoring it cannot.

    The message names the env id (the task), the missing cost and what the env offers.
    """
    signals = probe_signals(env, seed)
    have = available_costs(env, signals)
    missing = [c for c in score.active() if c not in have]
    if missing:
        raise ValueError(f"score.costs: {env.spec.env_id} does not report the signals of {missing}; its costs: "
                         f"{', '.join(have) or '(none)'} (docs/sim.md lists each backend's signals)")
    if score.stagewise and STAGE_SIGNAL not in signals:
        raise ValueError(f"score.stagewise: task {env.spec.env_id} declares no stage predicates; pass "
                         "--score.stagewise false to score whole episodes as one stage")
    return have


def score_trajectory(traj: Trajectory, score: ScoreConfig) -> float:
    """GRAPE's ``R(tau)`` (module doc); also fills ``traj.score`` and ``traj.score_parts``."""
    floor = math.log(score.min_prob)
    log_r_self = float(traj.logp.double().clamp(floor, 0.0).sum())
    penalty = 0.0
    for name, beta in score.active().items():
        tau = score.thresholds.get(name, 0.0)
        penalty += sum(beta * max(0.0, c - tau) for c in traj.stage_costs[name])
    r_ext = math.exp(-penalty)
    traj.score = score.lam_self * log_r_self + score.lam_ext * r_ext + score.lam_success * float(traj.success)
    traj.score_parts = {"log_r_self": log_r_self, "r_ext": r_ext, "success": float(traj.success)}
    return traj.score
