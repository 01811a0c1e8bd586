"""Recompute a rollout's rewards, advantages and returns under other term weights, without new rollouts.

The rollout engine stores every reward term per executed step (``Rollout.step_reward_terms [T, B, H]``, 0 on
held steps). The decision reward under any weights is the weighted sum of those terms summed over the
chunk's steps (:func:`reweighted_rewards`, the same float32 operations in the same order as
:class:`rewards.compose.RewardFunction`, so the run's own weights give its rewards back bit for bit); the
learner's own :meth:`~vla_rl.algorithms.base.Learner.advantages` then turns them into advantages and returns
with the run's stored values (the critic is not re-fit: this says how the learning signal of the collected
data moves, the question to answer before spending env steps on another weighting).

The trainer writes each iteration's reward trace (:func:`save_reward_trace`: terms, values, episode ends, the
algorithm's config; no observations) to ``<run>/reward_terms/iter_<k>.pt`` (``--reward.save_terms_every``);
``vla-rl reward reweigh --run <run> --terms '{success: 1.0, prm: 0.5}'`` loads them and reports, per
iteration and overall, how rewards, returns and advantages moved (:func:`advantage_shift`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from rewards import weighted_step_reward
from vla_core.manifest import write_file_atomic
from vla_rl.algorithms.advantages import normalize_advantages
from vla_rl.hooks import Hook, IterationResult, RunContext
from vla_rl.rollout import EpisodeRecord, Rollout

TRACE_DIR = "reward_terms"
"""Folder of a run holding its reward traces (``iter_<k>.pt``)."""
TRACE_VERSION = 1


class ReweighError(ValueError):
    """New weights naming a term the rollout did not store, or a trace that cannot be read."""


def reweighted_rewards(step_terms: dict[str, Tensor], weights: list[tuple[str, float]]) -> Tensor:
    """``float32 [T, B]`` decision rewards under ``weights`` from per-step terms ``[T, B, H]`` (0 on held steps).

    Raises:
        ReweighError: naming a weighted term that is not in ``step_terms`` and the ones that are.
    """
    missing = [name for name, _ in weights if name not in step_terms]
    if missing:
        raise ReweighError(f"reward term {missing[0]!r} was not stored with this rollout; stored terms: "
                           f"{', '.join(sorted(step_terms))} (a term must be configured during the run to be stored)")
    per_step = weighted_step_reward(step_terms, weights)  # [T, B, H]
    out = torch.zeros(per_step.shape[:2], dtype=torch.float32)
    for h in range(per_step.shape[2]):  # step order, as the engine summed them
        out += per_step[..., h]
    return out


def with_rewards(rollout: Rollout, rewards: Tensor) -> Rollout:
    """A shallow copy of ``rollout`` with other decision rewards."""
    import dataclasses

    return dataclasses.replace(rollout, rewards=rewards)


def advantage_shift(old: tuple[Tensor, Tensor, Tensor], new: tuple[Tensor, Tensor, Tensor],
                    normalize: bool) -> dict[str, float]:
    """How advantages and returns moved from ``old`` to ``new`` (each ``(advantages, returns, mask)``).

    Returns (over the decisions both masks keep): ``return_old`` / ``return_new`` (mean returns),
    ``adv_abs_change`` (mean ``|new - old|`` of the advantages the update uses: normalized when ``normalize``),
    ``adv_corr`` (their Pearson correlation), ``adv_sign_flips`` (fraction of decisions whose advantage changed
    sign: pushed the other way by the update).
    """
    (a0, r0, m0), (a1, r1, m1) = old, new
    mask = m0 & m1
    if normalize:
        a0, a1 = normalize_advantages(a0, mask), normalize_advantages(a1, mask)
    x, y = a0[mask].double(), a1[mask].double()
    xc, yc = x - x.mean(), y - y.mean()
    denom = float(xc.norm() * yc.norm())
    return {
        "decisions": int(mask.sum()),
        "return_old": float(r0[mask].mean()), "return_new": float(r1[mask].mean()),
        "adv_abs_change": float((y - x).abs().mean()),
        "adv_corr": float((xc * yc).sum() / denom) if denom > 0 else float("nan"),
        "adv_sign_flips": float(((x > 0) != (y > 0)).double().mean()),
    }


# ----------------------------------------------------------------------------- traces on disk


def save_reward_trace(rollout: Rollout, path: str | Path, algo: dict[str, Any],
                      weights: list[tuple[str, float]]) -> Path:
    """Write what :func:`load_reward_trace` needs to recompute advantages (no observations), atomically.

    Args:
        rollout: the iteration's rollout.
        path: the file (``<run>/reward_terms/iter_<k>.pt``).
        algo: the run's algorithm config, encoded (``{"type": "ppo", ...}``).
        weights: the run's reward weights.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "version": TRACE_VERSION, "algo": algo, "weights": [list(w) for w in weights],
        "rewards": rollout.rewards, "reward_terms": rollout.reward_terms,
        "step_reward_terms": rollout.step_reward_terms, "values": rollout.values,
        "next_values": rollout.next_values, "terminated": rollout.terminated, "truncated": rollout.truncated,
        "valid": rollout.valid, "group_ids": rollout.group_ids, "env_steps": rollout.env_steps,
        "episodes": [dataclasses.asdict(e) for e in rollout.episodes],
    }
    write_file_atomic(path, lambda f: torch.save(data, f))
    return path


class RewardTraces(Hook):
    """Writes the rollout's reward trace every ``every`` iterations (``--reward.save_terms_every``) to
    ``<folder>/iter_<k>.pt`` (:func:`save_reward_trace`; rank 0 alone, after the iteration's row is logged)."""

    def __init__(self, folder: Path, every: int, algo: dict[str, Any]) -> None:
        self.folder = folder
        self.every = every
        self.algo = algo
        self.run: RunContext | None = None

    def start(self, run: RunContext) -> None:
        self.run = run

    def after_round(self, round_index: int, result: IterationResult) -> None:
        assert self.run is not None
        if result.rollout is not None and self.run.dist.is_main:
            save_reward_trace(result.rollout, self.folder / f"iter_{result.iteration + 1:06d}.pt", self.algo,
                              self.run.engine.reward.weights)


def load_reward_trace(path: str | Path) -> tuple[Rollout, dict[str, Any], list[tuple[str, float]]]:
    """``(rollout without observations, algo config dict, weights)`` from a trace file.

    Raises:
        ReweighError: naming the file when it is missing or not a reward trace.
    """
    path = Path(path)
    try:
        data = torch.load(path, weights_only=True)
    except FileNotFoundError:
        raise ReweighError(f"{path}: no such reward trace") from None
    except Exception as exc:  # a truncated or foreign file
        raise ReweighError(f"{path}: not a reward trace written by vla-rl train ({type(exc).__name__})") from None
    if not isinstance(data, dict) or data.get("version") != TRACE_VERSION:
        raise ReweighError(f"{path}: not a reward trace (version {TRACE_VERSION}) written by vla-rl train")
    t, b = data["rewards"].shape
    empty = torch.zeros(t, b, 0)
    rollout = Rollout(
        obs={}, actions=empty, logp=empty, values=data["values"], extras={}, rewards=data["rewards"],
        reward_terms=data["reward_terms"], terminated=data["terminated"], truncated=data["truncated"],
        next_values=data["next_values"], valid=data["valid"], group_ids=data["group_ids"],
        step_reward_terms=data["step_reward_terms"],
        # every field of the record; traces of earlier versions stored [env, task, return, length, success]
        episodes=[EpisodeRecord(**e) if isinstance(e, dict) else EpisodeRecord(*e) for e in data["episodes"]],
        env_steps=data["env_steps"],
    )
    return rollout, data["algo"], [(str(n), float(w)) for n, w in data["weights"]]


def learner_advantages(algo: dict[str, Any]) -> tuple[Any, bool]:
    """``(fn(rollout) -> (advantages, returns, mask), normalize)`` of the run's algorithm, from its encoded config.

    The learners' ``advantages`` read only their config and the rollout, so a learner is built without a policy.

    Raises:
        ReweighError: for an algorithm that is not registered or a config that does not decode.
    """
    import draccus

    from vla_rl.algorithms.base import ALGORITHMS, LearnerConfig
    from vla_rl.train_config import TrainConfig  # noqa: F401  (registers the built-in learners)

    name = algo.get("type", "")
    if name not in ALGORITHMS:
        raise ReweighError(f"algorithm {name!r} of the trace is not registered ({', '.join(ALGORITHMS.names())})")
    try:
        cfg = draccus.decode(LearnerConfig, algo)
    except Exception as exc:
        raise ReweighError(f"the trace's algorithm config does not decode: {exc}") from None
    cls = ALGORITHMS.get(name).obj
    learner = cls.__new__(cls)  # advantages() reads cfg only; no policy or optimizer is needed
    learner.cfg = cfg
    learner.iteration = 0
    return learner.advantages, bool(getattr(cfg, "normalize_advantages", False))


def reweigh(rollout: Rollout, algo: dict[str, Any], old: list[tuple[str, float]],
            new: list[tuple[str, float]]) -> dict[str, float]:
    """How one rollout's rewards, returns and advantages move from weights ``old`` to ``new`` (module doc).

    Returns :func:`advantage_shift`'s numbers plus ``reward_old`` / ``reward_new`` (mean decision reward) and
    ``reproduced`` (1.0 when ``old`` gives back the stored rewards bit for bit).
    """
    advantages, normalize = learner_advantages(algo)
    base = reweighted_rewards(rollout.step_reward_terms, old)
    moved = reweighted_rewards(rollout.step_reward_terms, new)
    a0 = advantages(with_rewards(rollout, base))
    a1 = advantages(with_rewards(rollout, moved))
    valid = rollout.valid
    return {"reward_old": float(base[valid].mean()), "reward_new": float(moved[valid].mean()),
            "reproduced": float(torch.equal(base, rollout.rewards)), **advantage_shift(a0, a1, normalize)}
