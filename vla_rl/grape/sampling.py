"""GRAPE's round: sample trajectories per initial state, score them, pair them.

- :func:`sample_trajectories`: for each seeded initial state, one-episode rollouts of the current
  policy with exploration on the vectorized envs until the state has both successes and failures
  (at least ``min_samples``, at most ``max_samples``), keeping what the trajectory log-likelihood
  needs (observations and sampler extras) and what the costs need (per-step cost terms and stage
  progress, from the env's privileged signals through :mod:`rewards.costs`);
- :func:`vla_rl.grape.scoring.score_trajectory`: GRAPE's ``R(tau)``;
- :func:`vla_rl.grape.pairs.select_pairs`: top-m against bottom-m per state.

:func:`preference_round` runs the three; :func:`run_episodes` also plays the held-out evaluations.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from policies.base import ActMode
from rewards.costs import STAGE_SIGNAL
from sim.core import TASK, EnvSpec
from vla_rl.grape.pairs import distinct_instructions, instruction_pairs, select_pairs
from vla_rl.grape.scoring import ScoreConfig, score_trajectory
from vla_rl.grape.trajectory import PreferencePair, Trajectory
from vla_rl.rollout import Rollout, RolloutEngine


@dataclass
class GrapeSettings:
    """Sampling and pairing of one round."""

    min_samples: int = 6
    """Rollouts per initial state at least (GRAPE: 6)."""
    max_samples: int = 11
    """Rollouts per initial state at most, when successes and failures have not both appeared (GRAPE: 11)."""
    pairs_per_state: int = 1
    """``m``: the top-m trajectories of a state are paired with its bottom-m."""
    require_both_outcomes: bool = True
    """Pair only states with successes and failures (GRAPE); false: also rank and pair states whose samples all
    succeeded or all failed by score alone (costs then decide, e.g. efficiency among successes), and stop
    sampling a state at ``min_samples``."""
    pair_single_outcome: bool = False
    """Keep GRAPE's sampling (until both outcomes appear, at most ``max_samples``) but also pair, by score alone,
    the states that still have one outcome. A constraint objective needs it: on ``mujoco/pick-any`` most colliding
    episodes come from states the policy always fails (seed 0: 31 of 47 in one round, seed 3: 125 of 168), which
    GRAPE's pairing skips, so without it no pair ever contrasts a clean failure with a colliding one
    (docs/results.md, "GRAPE alignment")."""
    pair_within_outcome: bool = False
    """Keep GRAPE's sampling and pairs, and also pair within each outcome of every state: its best successes
    against its worst successes and its best failures against its worst failures (top-m against bottom-m by
    score, so the costs decide). GRAPE's top-against-bottom pairing ranks every success above every failure, so
    in a state with both outcomes a colliding success is chosen and never rejected; this contrasts it with a clean
    one (pair the failures without imitating them: ``--tpo.nll_successes_only true``)."""
    success_pairs: int = 0
    """Per state with both outcomes, also pair each of its best ``success_pairs`` successes with one of its failures
    (the worst first, reused in turn), so that every success of a state the policy mostly solves is chosen (and
    imitated by RPO's NLL), where GRAPE's top-m against bottom-m uses at most ``m`` of them; 0: off (GRAPE)."""
    instruction_pairs: int = 0
    """Per state, this many of its best successes are also each paired against themselves under every other
    instruction of the env (:func:`vla_rl.grape.pairs.instruction_pairs`): chosen under their own
    instruction, rejected under one that names another object, where the same motion fails. On
    ``mujoco/pick-any`` most failures and collisions are the arm going for a cube the instruction does not name,
    in states GRAPE's pairs cannot reach (docs/results.md, "GRAPE alignment"); 0: off (GRAPE). Needs
    an env with at least two task instructions (``mujoco/pick-any``, ``mujoco/multi``, LIBERO suites)."""
    score: ScoreConfig = field(default_factory=ScoreConfig)
    """The trajectory score."""

    @property
    def pairs_need_both_outcomes(self) -> bool:
        """Whether only states with successes and failures give pairs."""
        return self.require_both_outcomes and not self.pair_single_outcome

    def __post_init__(self) -> None:
        if not 1 <= self.min_samples <= self.max_samples:
            raise ValueError(f"need 1 <= min_samples <= max_samples, got {self.min_samples}, {self.max_samples}")
        if self.pairs_per_state < 1:
            raise ValueError(f"pairs_per_state must be >= 1, got {self.pairs_per_state}")
        if self.success_pairs < 0:
            raise ValueError(f"success_pairs must be >= 0, got {self.success_pairs}")
        if self.instruction_pairs < 0:
            raise ValueError(f"instruction_pairs must be >= 0, got {self.instruction_pairs}")


def check_instructions(spec: EnvSpec, settings: GrapeSettings) -> list[str]:
    """The env's distinct task instructions; raises ``ValueError`` naming the env when ``instruction_pairs`` is on
    and it has fewer than two to swap between."""
    instructions = distinct_instructions(spec.instructions)
    if settings.instruction_pairs and len(instructions) < 2:
        raise ValueError(f"grape.instruction_pairs: {spec.env_id} declares {len(instructions)} task instruction(s); "
                         "swapping needs at least two (a multi-task env such as mujoco/pick-any), or pass "
                         "--grape.instruction_pairs 0")
    return instructions


def _trajectory(ro: Rollout, i: int, tid: int, state: int, seed: int, costs: list[str], stagewise: bool,
                env_id: str) -> Trajectory:
    """Env ``i``'s one episode of a group-mode rollout as a :class:`Trajectory`."""
    t_idx = ro.valid[:, i].nonzero().flatten()
    obs = {k: ([v[t][i] for t in t_idx.tolist()] if k == TASK else v[t_idx, i]) for k, v in ro.obs.items()}
    ep = next((e for e in ro.episodes if e.env == i), None)
    if stagewise:
        if STAGE_SIGNAL not in ro.step_signals:
            raise ValueError(f"score.stagewise: task {env_id} declares no stage predicates; pass "
                             "--score.stagewise false")
        stage = ro.step_signals[STAGE_SIGNAL][t_idx, i].long().flatten()  # [T * H]
    else:
        stage = torch.zeros(len(t_idx) * ro.step_reward_terms["env"].shape[-1], dtype=torch.long)
    n_stages = int(stage.max()) + 1 if stage.numel() else 1
    stage_costs, totals = {}, {}
    for c in costs:
        per_step = ro.step_reward_terms[c][t_idx, i].flatten().double()
        stage_costs[c] = torch.zeros(n_stages, dtype=torch.float64).index_add_(0, stage, per_step).tolist()
        totals[c] = float(per_step.sum())
    lp = ro.logp[t_idx, i]
    return Trajectory(
        id=tid, state=state, seed=seed, obs=obs, actions=ro.actions[t_idx, i],
        extras={k: v[t_idx, i] for k, v in ro.extras.items()},
        logp=lp.reshape(lp.shape[0], -1).mean(-1) if lp.ndim > 1 else lp,
        success=bool(ep.success) if ep is not None else False,
        steps=int(ep.length) if ep is not None else int(len(t_idx) * ro.actions.shape[2]),
        costs=totals, stage_costs=stage_costs,
    )


def run_episodes(engine: RolloutEngine, seeds: list[int], mode: ActMode, costs: list[str], stagewise: bool,
                 max_decisions: int, first_id: int = 0, states: list[int] | None = None) -> list[Trajectory]:
    """One episode per seed (``engine.env.num_envs`` at a time) as :class:`Trajectory` records."""
    b = engine.env.num_envs
    out: list[Trajectory] = []
    for a in range(0, len(seeds), b):
        batch = seeds[a : a + b]
        padded = batch + [batch[-1]] * (b - len(batch))  # a short last batch: the spare envs repeat a seed
        ro = engine.collect_groups(padded, 1, max_decisions, mode)
        for j, seed in enumerate(batch):
            st = states[a + j] if states is not None else a + j
            out.append(_trajectory(ro, j, first_id + len(out), st, seed, costs, stagewise, engine.env.spec.env_id))
    return out


def sample_trajectories(engine: RolloutEngine, seeds: list[int], settings: GrapeSettings, costs: list[str],
                        max_decisions: int, progress: Any = None) -> list[Trajectory]:
    """Rollouts of each initial state (``seeds[s]``) until it has successes and failures (see module doc).

    The envs are filled with the pending states in turn; a state stops at ``min_samples`` once both outcomes
    exist, or at ``max_samples``.
    """
    by_state: dict[int, list[Trajectory]] = {s: [] for s in range(len(seeds))}
    pending = list(by_state)
    next_id = 0
    while pending:
        b = engine.env.num_envs
        slots = [pending[k % len(pending)] for k in range(b)]
        trajs = run_episodes(engine, [seeds[s] for s in slots], ActMode.EXPLORE, costs, settings.score.stagewise,
                             max_decisions, next_id, slots)
        for t in trajs:
            if len(by_state[t.state]) < settings.max_samples:
                t.id = next_id
                next_id += 1
                by_state[t.state].append(t)
                if progress is not None:
                    progress.update(1)
        pending = [s for s in pending if not _done(by_state[s], settings)]
    return [t for s in sorted(by_state) for t in by_state[s]]


def _done(trajs: list[Trajectory], settings: GrapeSettings) -> bool:
    n = len(trajs)
    both = len({t.success for t in trajs}) == 2
    return n >= settings.max_samples or (n >= settings.min_samples and (both or not settings.require_both_outcomes))


@dataclass
class RoundData:
    """One round's scored trajectories, its pairs, the states that gave none, and the successes of earlier rounds
    the update also imitates (``tpo.replay_rounds``)."""

    trajectories: list[Trajectory]
    pairs: list[PreferencePair]
    unpaired_states: list[int]
    replay: list[Trajectory] = field(default_factory=list)


@dataclass
class RoundSampling:
    """How the TPO learner samples each round (:meth:`vla_rl.grape.tpo.TPOLearner.collect`)."""

    settings: GrapeSettings = field(default_factory=GrapeSettings)
    """Sampling, pairing and the score."""
    costs: list[str] | None = None
    """The cost terms the rollout engine's reward records (None: the score's)."""
    states: int = 4
    """Seeded initial states per round."""
    replay: Callable[[int], list[Trajectory]] | None = None
    """Round index -> the successes of the rounds before it to replay (``vla-rl align`` reads its round files);
    None: nothing to replay from."""


def preference_round(engine: RolloutEngine, seeds: list[int], settings: GrapeSettings,
                     costs: list[str] | None = None, max_decisions: int = 0, progress: Any = None) -> RoundData:
    """Sample, score and pair one round from the initial states ``seeds`` (see module doc).

    ``costs``: the cost terms the engine's reward config computes (default: the scoring costs);
    ``max_decisions``: decisions per episode at most (0: enough for the env's episode length).
    """
    costs = list(settings.score.active()) if costs is None else costs
    instructions = check_instructions(engine.env.spec, settings)
    if not max_decisions:
        max_decisions = -(-engine.env.spec.max_episode_steps // engine.exec_steps) + 1
    trajs = sample_trajectories(engine, seeds, settings, costs, max_decisions, progress)
    for t in trajs:
        score_trajectory(t, settings.score)
    pairs = select_pairs(trajs, settings.pairs_per_state, settings.pairs_need_both_outcomes,
                         settings.pair_within_outcome, settings.success_pairs)
    if settings.instruction_pairs:
        swaps = instruction_pairs(trajs, instructions, settings.instruction_pairs, TASK)
        for p in swaps:
            score_trajectory(p.rejected, settings.score)
        pairs += swaps
    paired = {p.state for p in pairs}
    return RoundData(trajs, pairs, [s for s in range(len(seeds)) if s not in paired])


