"""RaC as a learner: supervised fine-tuning on demos plus intervention segments, in rounds of collection.

``vla-rl train --algo.type rac --data.path INTERVENTIONS [--algo.demos DEMOS]``
runs :class:`vla_rl.algorithms.sft.SFTUpdater` steps (flow matching / token
cross-entropy, whatever the policy's ``sft_loss`` is) on batches mixed from

- the demos (``algo.demos``, any LeRobotDataset; rows drawn uniformly), a
  fraction ``algo.demo_ratio`` of every batch, and
- the intervention data (``--data.path``, ``algo.extra_data`` and the rounds
  collected so far): rows drawn with probability proportional to their
  label's weight (``recovery_weight``, ``correction_weight``;
  ``policy_weight`` unless ``mask_policy``), which in expectation weights
  the loss per label. With ``mask_policy`` the chunk steps of a row that the
  policy itself took are masked out of the loss as well, so the policy never
  imitates its own failing actions. A dataset without intervention field
  counts as demos (:func:`vla_rl.data.load_chunks`).

**Rounds** (``algo.episodes_per_round > 0``, ``algo.rounds_dir``): every
``algo.iters_per_round`` iterations, starting at the first, the learner runs
the current policy in the training envs with the simulated operator
(:mod:`vla_rl.intervention.operator`, ``algo.operator.*``), records the
labelled episodes to ``<rounds_dir>/round_<k>`` (written atomically) and adds
them to the intervention data: collect -> fine-tune -> collect again. A
resumed run reloads the finished rounds from disk and collects only the rest.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from policies.base import ActMode, Policy
from vla_core.labels import Label
from vla_rl.algorithms.base import IterationInputs, LearnerConfig, Needs, SmokeLimits, register_learner
from vla_rl.algorithms.sft import SFTConfig, SFTLearner
from vla_rl.data.chunks import ChunkBatch, ChunkDataset
from vla_rl.data.mix import MixedSource
from vla_rl.intervention.operator import OperatorConfig

DEMO = -1
"""Label code of a demo row in a mixed batch (:attr:`vla_rl.data.ChunkBatch.label`)."""


@dataclass
class RaCLearnerConfig(SFTConfig):
    """RaC fine-tuning (``--algo.type rac``): the SFT settings plus the data mix, label weights and rounds."""

    demos: str = ""
    """Demo LeRobotDataset mixed into every batch (empty: none, every row comes from intervention data)."""
    demo_ratio: float = 0.5
    """Fraction of each batch drawn from ``demos`` (the rest from intervention data)."""
    extra_data: tuple[str, ...] = ()
    """More intervention datasets (earlier collections), pooled with ``--data.path``."""
    recovery_weight: float = 1.0
    """Sampling weight of ``recovery`` rows."""
    correction_weight: float = 1.0
    """Sampling weight of ``correction`` rows."""
    policy_weight: float = 0.0
    """Sampling weight of ``policy`` rows when ``mask_policy`` is False."""
    mask_policy: bool = True
    """Leave the policy's own steps out of the loss (rows never drawn, chunk steps masked)."""
    episodes_per_round: int = 0
    """Rounds: intervention episodes collected with the current policy per round (0: no rounds)."""
    iters_per_round: int = 5
    """Rounds: training iterations between collections."""
    round_operator_steps: int = 0
    """Rounds: stop a round's collection once the operator controlled this many steps (0: no limit)."""
    rounds_dir: str = ""
    """Rounds: folder of the round datasets ``round_<k>`` (kept across resumes; required with rounds)."""
    operator: OperatorConfig = field(default_factory=OperatorConfig)
    """The simulated operator of the rounds (MuJoCo tabletop envs)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.demo_ratio <= 1.0:
            raise ValueError(f"algo.demo_ratio must lie in [0, 1], got {self.demo_ratio}")
        for name in ("recovery_weight", "correction_weight", "policy_weight"):
            if getattr(self, name) < 0:
                raise ValueError(f"algo.{name} must be >= 0, got {getattr(self, name)}")
        if self.episodes_per_round < 0 or self.iters_per_round < 1:
            raise ValueError("algo.episodes_per_round must be >= 0 and algo.iters_per_round >= 1")
        if self.episodes_per_round and not self.rounds_dir:
            raise ValueError("algo.episodes_per_round > 0 needs algo.rounds_dir (where round datasets are kept)")

    def smoke(self, limits: SmokeLimits, num_envs: int) -> tuple[LearnerConfig, int]:
        small, envs = super().smoke(limits, num_envs)
        return dataclasses.replace(small, episodes_per_round=min(self.episodes_per_round, 2)), envs

    def label_weights(self) -> dict[int, float]:
        """Sampling weight per label code."""
        return {int(Label.POLICY): 0.0 if self.mask_policy else self.policy_weight,
                int(Label.RECOVERY): self.recovery_weight, int(Label.CORRECTION): self.correction_weight}


class WeightedRows:
    """A :class:`~vla_rl.data.ChunkDataset` drawn with per-row probabilities (weights need not sum to 1).

    With ``keep`` (bool ``[N, H]``) each drawn row's chunk mask is ANDed with it. Sample only from a source
    with a positive :attr:`total`.
    """

    def __init__(self, data: ChunkDataset, weights: Tensor, keep: Tensor | None = None) -> None:
        self.data, self.weights, self.keep = data, weights.double(), keep

    def __len__(self) -> int:
        return int((self.weights > 0).sum())

    @property
    def total(self) -> float:
        """Sum of the weights (how much this source counts when pooled with others)."""
        return float(self.weights.sum())

    def sample(self, batch_size: int, generator: torch.Generator) -> ChunkBatch:
        idx = torch.multinomial(self.weights, batch_size, replacement=True, generator=generator)
        batch = self.data.batch(idx)
        if self.keep is not None:
            batch.mask = batch.mask & self.keep[idx]
        return batch


def step_labels(data: ChunkDataset) -> Tensor:
    """int64 ``[N, H]``: the label of every chunk step's frame (steps past the episode's end: the row's own)."""
    assert data.label is not None and data.episode_index is not None
    n, h = len(data), data.horizon
    idx = (torch.arange(n)[:, None] + torch.arange(h)[None, :]).clamp(max=n - 1)
    same = data.episode_index[idx] == data.episode_index[:, None]
    idx = torch.where(same, idx, torch.arange(n)[:, None].expand(-1, h))
    return data.label[idx]


def intervention_source(data: ChunkDataset, cfg: RaCLearnerConfig) -> WeightedRows:
    """The intervention rows of ``data`` weighted by label; policy chunk steps masked with ``mask_policy``.

    A dataset without labels (plain demos) gets weight 1 on every row.
    """
    if data.label is None:
        return WeightedRows(data, torch.ones(len(data)))
    weights = cfg.label_weights()
    w = torch.tensor([weights[int(x)] for x in data.label.tolist()], dtype=torch.float64)
    keep = step_labels(data) != int(Label.POLICY) if cfg.mask_policy else None
    return WeightedRows(data, w, keep)


@register_learner("rac", RaCLearnerConfig, help="RaC: fine-tune on demos + recovery/correction segments, in rounds")
class RaCLearner(SFTLearner):
    """:class:`~vla_rl.algorithms.sft.SFTLearner` steps on the RaC mix (module doc), with collection rounds."""

    needs = Needs.DATASET | Needs.ON_POLICY
    cfg: RaCLearnerConfig

    def __init__(self, cfg: RaCLearnerConfig, policy: Policy) -> None:
        super().__init__(cfg, policy)
        self.sources: list[ChunkDataset] = []
        self.demos: ChunkDataset | None = None
        self.rounds: list[str] = []
        self.mix: MixedSource | None = None
        self.round_stats: list[dict[str, Any]] = []

    # ------------------------------------------------------------ data

    def _build_mix(self) -> MixedSource:
        """Demos and the label-weighted intervention rows (sources with no row of positive weight, e.g. a round
        without a takeover, are left out).

        Raises:
            ValueError: when neither demos nor any intervention row with a positive weight remain.
        """
        interv = [s for s in (intervention_source(d, self.cfg) for d in self.sources) if s.total > 0]
        if not interv:
            if self.demos is None:
                raise ValueError("algo.type=rac: no intervention row has a positive weight (no takeover recorded, "
                                 "or every label weighted 0) and no algo.demos to train on")
            return MixedSource([(self.demos, 1.0)])
        pooled = MixedSource([(s, s.total) for s in interv]) if len(interv) > 1 else interv[0]
        if self.demos is None or self.cfg.demo_ratio == 0.0:
            return MixedSource([(pooled, 1.0)])
        if self.cfg.demo_ratio == 1.0:
            return MixedSource([(self.demos, 1.0)])
        return MixedSource([(self.demos, self.cfg.demo_ratio), (pooled, 1.0 - self.cfg.demo_ratio)])

    def _round_due(self, iteration: int) -> bool:
        return self.cfg.episodes_per_round > 0 and iteration % self.cfg.iters_per_round == 0

    def _collect_round(self, inputs: IterationInputs) -> dict[str, float]:
        """Collect (or, on resume, reload) round ``iteration / iters_per_round``; returns its scalars."""
        from sim.dataset import EpisodeRecorder
        from vla_core.labels import label_features
        from vla_rl.intervention.session import make_operators, run_session

        k = inputs.iteration // self.cfg.iters_per_round
        root = Path(self.cfg.rounds_dir) / f"round_{k:03d}"
        out: dict[str, float] = {}
        if not (root / "meta" / "info.json").exists():
            if inputs.engine is None:
                raise ValueError("algo.type=rac rounds collect in the training envs, but the loop gave no env")
            env = inputs.engine.env
            rec = EpisodeRecorder(root, f"local/rac-round-{k}", env.spec, fps=round(env.spec.control_freq),
                                  extra_features=label_features())

            def act(obs: dict[str, Any]) -> Tensor:
                return self.policy.act(obs, ActMode.EVAL).actions

            self.policy.eval()
            try:
                stats = run_session(env, act, make_operators(self.cfg.operator, env.num_envs, self.cfg.operator.max_step,
                                                              inputs.seed_base),
                                    self.cfg.episodes_per_round, inputs.seed_base, recorder=rec,
                                    exec_steps=inputs.engine.exec_steps, progress=False,
                                    operator_budget=self.cfg.round_operator_steps)
            finally:
                self.policy.train()
                self.policy.reset()
            rec.finalize()
            inputs.engine.total_env_steps += sum(stats.steps.values())
            out = {"rac/round_success": stats.successes / max(1, stats.episodes),
                   "rac/round_operator_steps": float(stats.operator_steps),
                   "rac/round_recovery_steps": float(stats.steps["recovery"]),
                   "rac/round_correction_steps": float(stats.steps["correction"])}
            self.round_stats.append({"round": k, **stats.as_dict()})
        if str(root) not in self.rounds:
            self.rounds.append(str(root))
            self.sources.append(self._load(str(root)))
            self.mix = None
        return out

    # ------------------------------------------------------------ learner

    def collect(self, inputs: IterationInputs) -> list[ChunkBatch]:
        if not self.sources:
            if inputs.data is not None:
                self.sources.append(inputs.data)
            for path in self.cfg.extra_data:
                self.sources.append(self._load(path))
            for path in list(self.rounds):  # resumed: the rounds collected before
                self.sources.append(self._load(path))
            if self.cfg.demos:
                self.demos = self._load(self.cfg.demos)
        self._round_scalars = self._collect_round(inputs) if self._round_due(inputs.iteration) else {}
        if not self.sources:
            raise ValueError("algo.type=rac has no intervention data: pass --data.path or enable rounds")
        if self.mix is None:
            self.mix = self._build_mix()
        if self.updater is None:
            fit = self.demos if self.demos is not None else self.sources[0]
            self.updater = self._start(fit)
        gen = self.updater.generator
        return [self.mix.sample(self.cfg.batch_size, gen) for _ in range(self.cfg.steps_per_iter)]

    def update(self, batches: list[ChunkBatch]) -> dict[str, float]:
        stats = super().update(batches)
        rows = torch.cat([b.label if b.label is not None else torch.full((len(b),), DEMO) for b in batches])
        for code, name in ((DEMO, "demo"), (int(Label.RECOVERY), "recovery"), (int(Label.CORRECTION), "correction"),
                           (int(Label.POLICY), "policy")):
            stats[f"update/rows_{name}"] = float((rows == code).float().mean())
        return {**stats, **getattr(self, "_round_scalars", {})}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "rounds": list(self.rounds), "round_stats": list(self.round_stats)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.rounds = list(state.get("rounds", []))
        self.round_stats = list(state.get("round_stats", []))
