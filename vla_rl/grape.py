"""GRAPE's round: sample trajectories per initial state, score them, pair them (ALGORITHMS.md, GRAPE).

- :func:`sample_trajectories`: for each seeded initial state, one-episode rollouts of the current
  policy with exploration on the vectorized envs until the state has both successes and failures
  (at least ``min_samples``, at most ``max_samples``), keeping what the trajectory log-likelihood
  needs (observations and sampler extras) and what the costs need (per-step cost terms and stage
  progress, from the env's privileged signals through :mod:`rewards.costs`);
- :func:`score_trajectory`: ``R(tau) = lam_self * log R_self + lam_ext * R_ext + lam_success * 1[success]``
  with ``R_ext = prod_stages exp(-sum_j beta_j * max(0, C_j,stage - tau_j))``;
- :func:`vla_rl.data.preferences.select_pairs`: top-m against bottom-m per state.

``R_self = prod_t max(p_t, min_prob)`` with ``p_t`` the probability of decision ``t``'s sample. GRAPE's
``p_t`` is a token probability; for a continuous (flow) policy the recorded log-density is per
element, so here ``log p_t`` is the mean log-prob per element of the decision (the geometric-mean
token probability for an autoregressive policy), clipped to ``[log min_prob, 0]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from policies.base import ActMode
from rewards.costs import COSTS, STAGE_SIGNAL, check_costs
from rewards.terms import RewardTermError, StepInput, make_term
from sim.core import TASK, EnvSpec, VecEnv
from vla_rl.data.preferences import (PreferencePair, Trajectory, distinct_instructions, instruction_pairs,
                                     select_pairs)
from vla_rl.evaluation import wilson_interval
from vla_rl.rollout import Rollout, RolloutEngine


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
    (docs/benchmarks.md, "GRAPE alignment: reading")."""
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
    instruction of the env (:func:`vla_rl.data.preferences.instruction_pairs`): chosen under their own
    instruction, rejected under one that names another object, where the same motion fails. On
    ``mujoco/pick-any`` most failures and collisions are the arm going for a cube the instruction does not name,
    in states GRAPE's pairs cannot reach (docs/benchmarks.md, "GRAPE alignment: reading"); 0: off (GRAPE). Needs
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


@dataclass
class RoundData:
    """One round's scored trajectories, its pairs and the states that gave none."""

    trajectories: list[Trajectory]
    pairs: list[PreferencePair]
    unpaired_states: list[int]


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


def summarize(trajs: list[Trajectory], costs: list[str]) -> dict[str, Any]:
    """Success rate with its 95% Wilson interval, each cost's mean per episode, the collision rate (episodes
    with any collision step), the mean steps of successful episodes, and each episode's seed, success and
    steps, and whether it collided when ``collision`` is among ``costs`` (``per_episode``: what
    :func:`shared_success_steps` and :func:`collisions_by_outcome` read)."""
    n = len(trajs)
    wins = sum(t.success for t in trajs)
    lo, hi = wilson_interval(wins, n)
    out: dict[str, Any] = {"episodes": n, "success": wins / n if n else 0.0, "success_ci": [lo, hi]}
    out["costs"] = {c: sum(t.costs[c] for t in trajs) / n if n else 0.0 for c in costs}
    if "collision" in costs:
        out["collision_rate"] = sum(t.costs["collision"] > 0 for t in trajs) / n if n else 0.0
    steps = [t.steps for t in trajs if t.success]
    out["mean_steps_success"] = sum(steps) / len(steps) if steps else None
    out["mean_steps"] = sum(t.steps for t in trajs) / n if n else 0.0
    out["per_episode"] = {"seed": [int(t.seed) for t in trajs], "success": [bool(t.success) for t in trajs],
                          "steps": [int(t.steps) for t in trajs]}
    if "collision" in costs:
        out["per_episode"]["collided"] = [bool(t.costs["collision"] > 0) for t in trajs]
    return out


def collisions_by_outcome(ev: dict[str, Any]) -> dict[str, tuple[int, int]] | None:
    """``{"successes": (colliding, episodes), "failures": (colliding, episodes)}`` of an evaluation (:func:`summarize`),
    or None without per-episode collision records. A collision rate that stays flat while success rises can be
    fewer colliding failures and more colliding successes; this tells them apart."""
    rec = ev.get("per_episode") or {}
    if "collided" not in rec:
        return None
    out = {}
    for name, outcome in (("successes", True), ("failures", False)):
        hits = [c for ok, c in zip(rec["success"], rec["collided"]) if ok == outcome]
        out[name] = (sum(hits), len(hits))
    return out


def shared_success_steps(before: dict[str, Any], after: dict[str, Any]) -> tuple[int, float | None, float | None]:
    """``(states, mean steps before, mean steps after)`` over the initial states (seeds) that both evaluations
    (:func:`summarize` outputs) solved.

    The mean steps of successful episodes mixes two effects when success changes: a policy that also solves
    harder states, which take longer, raises it even if it got faster on every state it solved before. On
    the states solved both times it measures speed alone. ``(0, None, None)`` when no state was solved
    twice or an evaluation has no ``per_episode`` record (reports written before it existed).
    """
    solved = []
    for ev in (before, after):
        rec = ev.get("per_episode")
        if not rec:
            return 0, None, None
        solved.append({seed: steps for seed, ok, steps in zip(rec["seed"], rec["success"], rec["steps"]) if ok})
    shared = sorted(set(solved[0]) & set(solved[1]))
    if not shared:
        return 0, None, None
    return (len(shared), sum(solved[0][k] for k in shared) / len(shared),
            sum(solved[1][k] for k in shared) / len(shared))
