"""The reward configuration: which named terms make the learner's reward, with which weights."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from rewards.learned.terms import ClassifierTermConfig, ProgressTermConfig
from rewards.terms import ENV


def _default_terms() -> dict[str, float]:
    return {ENV: 1.0}


def _check_weight(what: str, weight: object) -> None:
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
        raise ValueError(f"{what} must be a finite number, got {weight!r}")


@dataclass
class RewardConfig:
    """The reward the learner sees: a weighted sum of named terms (:mod:`rewards.terms`).

    The step reward is ``sum_k weight_k * term_k`` over ``terms`` in order; a decision's reward is the
    sum of its chunk's step rewards (up to the step its episode ended, :mod:`sim.chunk`). Every term
    the env reports and every configured term is stored per step and per decision and logged as
    ``reward/<term>``, whatever its weight.
    """

    terms: dict[str, float] = field(default_factory=_default_terms)
    """Term name -> weight. Names: ``env`` (the simulator's own reward in the backend's reward mode),
    ``success`` (1 on each step the env reports success), a backend breakdown term (MuJoCo tabletop:
    ``reach``, ``grasp``, ``lift``, ``place``) or a computed term (``action_magnitude``; a cost, so
    weight it negatively; ``classifier`` and ``prm``, learned models configured below). The default
    ``{env: 1.0}`` is each backend's own reward, what training always used: the chunk rewards are then
    bit-identical to the env's summed step rewards."""
    classifier: ClassifierTermConfig = field(default_factory=ClassifierTermConfig)
    """The ``classifier`` term (a learned success classifier; :mod:`rewards.learned.terms`)."""
    prm: ProgressTermConfig = field(default_factory=ProgressTermConfig)
    """The ``prm`` term (a learned process reward model; :mod:`rewards.learned.terms`)."""
    anneal: dict[str, float] = field(default_factory=dict)
    """Term name -> the weight it ends at: from its ``terms`` weight at the first iteration the weight moves
    linearly to this one at ``anneal_end`` of the run's iterations, and stays there. ``{prm: 0.0}`` fades a learned
    shaping term out, so the end of training optimises the sparse reward alone (any bias the model has stops
    counting once the policy has used its early guidance). The weights an iteration used are logged as
    ``reward/weight/<term>`` and stored with its reward terms. Empty (default): constant weights."""
    anneal_end: float = 1.0
    """The fraction of the run's iterations (0, 1] at which ``anneal``'s weights are reached."""
    save_terms_every: int = 1
    """Write every this many iterations' reward terms (per decision and step, with values and episode ends;
    no observations, a few kB) to ``<run>/reward_terms/``, so ``vla-rl reward reweigh`` can recompute the
    advantages with other weights without new rollouts; 0 = never."""

    def __post_init__(self) -> None:
        if not self.terms:
            raise ValueError("reward.terms is empty: give at least one term, e.g. {env: 1.0}")
        for name, weight in self.terms.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"reward.terms: term names must be non-empty strings, got {name!r}")
            _check_weight(f"reward.terms.{name}: the weight", weight)
        for name, weight in self.anneal.items():
            if name not in self.terms:
                raise ValueError(f"reward.anneal.{name}: not a reward term; anneal one of reward.terms "
                                 f"({', '.join(self.terms)})")
            _check_weight(f"reward.anneal.{name}: the final weight", weight)
        if not 0.0 < self.anneal_end <= 1.0:
            raise ValueError(f"reward.anneal_end must be in (0, 1], got {self.anneal_end}")
        if self.save_terms_every < 0:
            raise ValueError(f"reward.save_terms_every must be >= 0, got {self.save_terms_every}")

    def weights(self, progress: float = 0.0) -> list[tuple[str, float]]:
        """``[(term, weight)]`` in the configured order, weights as floats.

        Args:
            progress: how far training is, ``iteration / iterations`` in [0, 1]; moves the ``anneal`` terms'
                weights (the ``terms`` weights at 0, the ``anneal`` ones from ``anneal_end`` on).
        """
        t = min(max(progress / self.anneal_end, 0.0), 1.0)
        return [(name, float(w) + t * (float(self.anneal[name]) - float(w)) if name in self.anneal else float(w))
                for name, w in self.terms.items()]
