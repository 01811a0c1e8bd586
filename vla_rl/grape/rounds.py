"""``vla-rl align``: GRAPE preference alignment in rounds of sample -> score -> pair -> train (TPO) -> evaluate.

    vla-rl align --preset align_task --policy.path runs/quickstart-mujoco-pick-any-s0/sft_policy
    vla-rl align --preset align_safety --policy.path ... --grape.score.costs '{collision: 2.0}'

Each round samples the current policy with exploration from ``states_per_round`` seeded initial
states until each state has successes and failures (``grape.min_samples`` .. ``grape.max_samples``),
scores every trajectory (``R = lam_self log R_self + lam_ext R_ext + lam_success success``, costs
per task stage from the env's privileged signals), pairs the top-m with the bottom-m per state and
trains TPO against the policy of the round's start (:mod:`vla_rl.grape.sampling`, :mod:`vla_rl.grape.tpo`).

The rounds run through :class:`vla_rl.trainer.Trainer`, one round per iteration of the TPO learner (its
``collect`` samples, scores and pairs, its ``update`` trains), with :class:`GrapeRounds`, a trainer hook, for
what is align's own: the held-out evaluations with costs, the round folders and the report. The run folder
gets, per round, ``rounds/round_<k>/`` with the trajectories as a LeRobotDataset (``trajectories/``),
everything needed to re-train from them (``trajectories.pt``), the pairs table (``pairs.parquet``) and
``round.json``; a checkpoint after every round (``--resume true`` continues after the last finished round);
and the report (``report.md`` / ``report.json``, plots, videos of a chosen and a rejected trajectory).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import draccus
import torch
from tqdm import tqdm

from policies.base import ActMode, Policy
from policies.io import checkpoint_cameras
from rewards import RewardConfig
from sim.core import VecEnv
from vla_rl.algorithms.base import LearnerConfig
from vla_rl.config import ConfigError, EnvConfig, default_runs_dir
from vla_rl.grape.pairs import load_pairs, write_pairs_table
from vla_rl.grape.report import (
    eval_scalars,
    pair_videos,
    print_round,
    round_plots,
    sample_scalars,
    summarize,
    write_align_report,
    write_json,
    write_round_dataset,
)
from vla_rl.grape.sampling import GrapeSettings, RoundData, RoundSampling, check_instructions, run_episodes
from vla_rl.grape.scoring import check_scoring
from vla_rl.grape.tpo import TPOConfig, TPOLearner
from vla_rl.grape.trajectory import Trajectory, load_trajectories, save_trajectories
from vla_rl.hooks import Hook, IterationResult, RunContext
from vla_rl.policy_factory import build_policy
from vla_rl.rollout import RolloutEngine
from vla_rl.run_logging import LoggingConfig
from vla_rl.algorithms.sft import SFT_RECORD, pretraining_dataset
from vla_rl.timing import split_remainder
from vla_rl.train_config import (
    EVAL_SEED_BASE,
    POLICY_CHOICES,
    SEED_BLOCK,
    EvalConfig,
    PolicyConfig,
    TrainConfig,
    policy_type,
)
from vla_rl.trainer import Trainer, seed_everything

OBJECTIVES = ("task", "safety", "efficiency", "custom")


def _align_env() -> EnvConfig:
    return EnvConfig(id="mujoco/pick-any", num_envs=8, obs_mode="rgb", num_workers=0, wrist_camera=True)


def _align_policy() -> PolicyConfig:
    return POLICY_CHOICES["compact-flow"]()


@dataclass
class AlignConfig:
    """``vla-rl align``: GRAPE preference alignment (see the module doc)."""

    env: EnvConfig = field(default_factory=_align_env)
    """The env the policy is sampled and evaluated in."""
    policy: PolicyConfig = field(default_factory=_align_policy)
    """The policy to align: ``--policy.path`` a checkpoint (the quickstart's ``sft_policy``), or a fresh one."""
    grape: GrapeSettings = field(default_factory=GrapeSettings)
    """Sampling per state, pairing and the score (weights ``grape.score.lam_*``, costs ``grape.score.costs``)."""
    tpo: LearnerConfig = field(default_factory=TPOConfig)
    """The TPO update (``beta``, ``lr``, ``epochs``, ``pairs_per_step``); ``type`` must stay ``tpo``."""
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    objective: str = "custom"
    """A label for the run (``task``, ``safety``, ``efficiency``: the presets ``configs/align_<objective>.yaml``
    set it with their weights; ``custom`` otherwise)."""
    rounds: int = 3
    """Rounds of sample -> score -> pair -> train -> evaluate."""
    states_per_round: int = 8
    """Seeded initial states sampled per round."""
    eval_episodes: int = 100
    """Held-out episodes of the evaluations before the first and after the last round."""
    round_eval_episodes: int = 0
    """Held-out episodes of the evaluation after each other round; 0 = none between the first and the last."""
    exec_steps: int = 0
    """Actions of each chunk executed per decision; 0 = the whole chunk."""
    save_dataset: bool = True
    """Write each round's trajectories as a LeRobotDataset (images as PNG: takes a while on large rounds)."""
    seed: int = 0
    """Seed of everything; round ``k`` samples initial states ``seed * 1e6 + k * 1000 + i``, evaluation uses
    ``1e9 + seed * 1e6 + i``."""
    smoke: bool = False
    """A CPU smoke run: a fresh policy is its tiny variant (hub checkpoints are not downloaded), the sizes
    shrink to at most 4 envs, 2 states per round, 2-3 samples per state and 4 evaluation episodes, and a policy
    without pre-training demos (a fresh one) leaves the demo mix ``tpo.demo_bc`` out, saying so."""
    name: str = ""
    """Run name; empty = ``align-<objective>-<env>-s<seed>``."""
    run_dir: str = ""
    """Run folder; empty = ``runs/<name>``."""
    resume: bool = False
    """Continue a run in ``run_dir`` after its last finished round (``--rounds`` may be raised)."""

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}")
        for name in ("rounds", "states_per_round", "eval_episodes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not isinstance(self.tpo, TPOConfig):
            raise ValueError(f"tpo.type must be 'tpo' (vla-rl align trains TPO), got {self.tpo.type!r}")
        if self.round_eval_episodes < 0:
            raise ValueError(f"round_eval_episodes must be >= 0, got {self.round_eval_episodes}")


def _smoke(cfg: AlignConfig) -> AlignConfig:
    """``cfg`` shrunk for ``--smoke true`` (see the field's doc; the demo mix: :func:`_with_pretraining_demos`)."""
    grape = dataclasses.replace(cfg.grape, min_samples=min(cfg.grape.min_samples, 2),
                                max_samples=min(cfg.grape.max_samples, 3))
    return dataclasses.replace(
        cfg, env=dataclasses.replace(cfg.env, num_envs=min(cfg.env.num_envs, 4)), grape=grape,
        states_per_round=min(cfg.states_per_round, 2), eval_episodes=min(cfg.eval_episodes, 4),
        round_eval_episodes=min(cfg.round_eval_episodes, 4))


def _with_pretraining_demos(cfg: AlignConfig) -> AlignConfig:
    """``cfg`` with ``tpo.demos`` set to the demos ``policy.path`` was pre-trained on (the ``dataset`` of its
    ``sft.json``) when ``tpo.demo_bc`` asks for demos and none are named. A smoke run of a policy that records
    none (a fresh one) leaves the demo mix out (``tpo.demo_bc`` 0) and says so.

    Raises:
        ConfigError: when the policy records no pre-training dataset (not a smoke run).
    """
    tpo = cfg.tpo
    assert isinstance(tpo, TPOConfig)
    if tpo.demo_bc == 0 or tpo.demos:
        return cfg
    dataset = pretraining_dataset(cfg.policy.path) if cfg.policy.path else None
    if not dataset:
        where = (f"{Path(cfg.policy.path) / SFT_RECORD} names no 'dataset'" if cfg.policy.path
                 else "a fresh policy has no pre-training data")
        if cfg.smoke:
            print(f"smoke: the demo mix tpo.demo_bc {tpo.demo_bc:g} is left out ({where}); name demos with "
                  "--tpo.demos to keep it")
            bc_lr = tpo.bc_lr if tpo.chosen_bc else 0.0  # the imitation rate has nothing left to step without it
            return dataclasses.replace(cfg, tpo=dataclasses.replace(tpo, demo_bc=0.0, bc_lr=bc_lr))
        raise ConfigError(f"tpo.demo_bc imitates demos: name their LeRobotDataset with --tpo.demos, or leave the "
                          f"demo mix out with --tpo.demo_bc 0 ({where})")
    print(f"tpo.demos: the demos {cfg.policy.path} was pre-trained on, {dataset}")
    return dataclasses.replace(cfg, tpo=dataclasses.replace(tpo, demos=dataset))


def _eval_seeds(cfg: AlignConfig, n: int) -> list[int]:
    return [EVAL_SEED_BASE + cfg.seed * SEED_BLOCK + i for i in range(n)]


def _env_config(cfg: AlignConfig) -> EnvConfig:
    """The env a run of ``cfg`` plays: ``cfg.env`` with the cameras of the checkpoint ``policy.path`` reads."""
    return cfg.env.with_policy_cameras(checkpoint_cameras(cfg.policy.path), cfg.policy.path) \
        if cfg.policy.path else cfg.env


def _scoring_costs(env: VecEnv, cfg: AlignConfig) -> list[str]:
    """The costs ``env`` reports (:func:`vla_rl.grape.scoring.check_scoring`); ConfigError for one the score needs
    and the env lacks, or for instruction pairs on an env with fewer than two instructions."""
    try:
        check_instructions(env.spec, cfg.grape)
        return check_scoring(env, cfg.grape.score, cfg.seed)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _reward(costs: list[str]) -> RewardConfig:
    """The env's reward, with every cost recorded as a reward term of weight 0 (the reward unchanged)."""
    return RewardConfig(terms={"env": 1.0, **dict.fromkeys(costs, 0.0)})


def evaluate(engine: RolloutEngine, seeds: list[int], costs: list[str]) -> dict[str, Any]:
    """Deterministic episodes from ``seeds`` on their own RNG stream (the same noise for every policy), summarized
    with their costs (:func:`vla_rl.grape.report.summarize`)."""
    max_dec = -(-engine.env.spec.max_episode_steps // engine.exec_steps) + 1
    b = engine.env.num_envs
    trajs: list[Trajectory] = []
    with torch.random.fork_rng(), tqdm(total=len(seeds), desc="eval", unit="ep", leave=False) as bar:
        torch.manual_seed(seeds[0])
        for i in range(0, len(seeds), b):  # a batch of envs at a time, for the progress bar
            trajs += run_episodes(engine, seeds[i : i + b], ActMode.EVAL, costs, False, max_dec, first_id=i)
            bar.update(len(seeds[i : i + b]))
    engine.policy.reset()
    return summarize(trajs, costs)


def evaluate_policy_folder(cfg: AlignConfig, episodes: int = 0) -> dict[str, Any]:
    """Align's held-out evaluation of the checkpoint ``cfg.policy.path`` alone, without rounds: the env, the seeds
    (``cfg.seed``) and the costs a run of ``cfg`` evaluates with, so the result compares with that run's
    ``before`` / ``after`` (:func:`vla_rl.grape.report.summarize`; ``episodes`` 0 = ``cfg.eval_episodes``).
    The starting policy reproduces its report's numbers, since evaluation is deterministic.

    Raises:
        ConfigError: without ``policy.path``, or for a cost the env cannot report.
    """
    if not cfg.policy.path:
        raise ConfigError("policy.path: the checkpoint folder to evaluate")
    env_cfg = _env_config(cfg)
    seed_everything(cfg.seed)
    with env_cfg.make() as env:
        costs = _scoring_costs(env, cfg)
    with env_cfg.make(seed=EVAL_SEED_BASE + cfg.seed * SEED_BLOCK) as eval_env:
        policy: Policy = build_policy(cfg.policy, eval_env.spec)
        engine = RolloutEngine(eval_env, policy, cfg.exec_steps, use_critic=False, reward=_reward(costs))
        return evaluate(engine, _eval_seeds(cfg, episodes or cfg.eval_episodes), costs)


class GrapeRounds(Hook):
    """Align's side of the trainer's loop (module doc): before the first round, the held-out evaluation of the
    starting policy; after each round's update, its folder (trajectories, pairs, dataset, ``round.json``), its
    evaluation and its row of the report with the logged ``sample/*``, ``eval/*`` and ``time/*`` scalars; at the
    end, the videos and the report. The report's rows so far are checkpointed under ``"grape"``, so a resumed run
    reports every round."""

    name = "grape"

    def __init__(self, cfg: AlignConfig, run_dir: Path, costs: list[str], name: str = "") -> None:
        self.cfg, self.run_dir, self.costs, self.name = cfg, run_dir, costs, name or run_dir.name
        self.rounds_dir = run_dir / "rounds"
        self.rows: list[dict[str, Any]] = []  # the report's rows: round 0 (the start), then one per round
        self.summary: dict[str, Any] = {}  # report.json, once the run ended
        self._successes: dict[int, list[Trajectory]] = {}  # round index -> its successes, for tpo.replay_rounds
        self._times: dict[str, float] = {}  # the round's stage seconds (``time/*``)
        self._sample_times: dict[str, float] = {}  # the engine's own seconds before the round sampled
        self._steps_before = 0
        self._started = time.perf_counter()

    # --- replay of earlier rounds' successes (tpo.replay_rounds)

    def written(self, k: int, trajectories: list[Trajectory]) -> None:
        """Round ``k``'s trajectories were just saved: keep its successes for the next rounds' replay, so that
        :meth:`replay` reads a round's file only when this process did not sample it (a resumed run)."""
        if self.cfg.tpo.replay_rounds:
            self._successes[k] = [t for t in trajectories if t.success]

    def replay(self, k: int) -> list[Trajectory]:
        """The successes sampled in the ``tpo.replay_rounds`` rounds before round ``k`` (0-based): those this process
        kept (:meth:`written`), else read from their ``trajectories.pt`` (so a resumed run replays what it would
        have); rounds not written are skipped."""
        window = range(max(0, k - self.cfg.tpo.replay_rounds), k)
        self._successes = {j: v for j, v in self._successes.items() if j in window}
        for j in window:
            path = self.rounds_dir / f"round_{j:03d}" / "trajectories.pt"
            if j not in self._successes and path.exists():
                self._successes[j] = [t for t in load_trajectories(path) if t.success]
        return [t for j in window for t in self._successes.get(j, [])]

    # --- the trainer's calls

    def start(self, run: RunContext) -> None:
        cfg = self.cfg
        self.engine = run.engine
        self.eval_engine = RolloutEngine(run.eval_env, run.policy, cfg.exec_steps, use_critic=False,
                                         reward=_reward(self.costs))
        self.logger = run.logger
        assert isinstance(run.learner, TPOLearner)
        run.learner.sampling = RoundSampling(cfg.grape, self.costs, cfg.states_per_round,
                                             self.replay if cfg.tpo.replay_rounds else None)
        if not self.rows:
            print(f"evaluating the starting policy on {cfg.eval_episodes} held-out episodes", flush=True)
            before = evaluate(self.eval_engine, _eval_seeds(cfg, cfg.eval_episodes), self.costs)
            self.rows.append({"round": 0, "eval": before})
            self.logger.log(0, eval_scalars(before))

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        if name == "collect":
            self._sample_times, self._steps_before = dict(self.engine.times_total), self.engine.total_env_steps
        t0 = time.perf_counter()
        yield
        seconds = time.perf_counter() - t0
        if name == "collect":  # sample_env / sample_act: the envs stepping and the policy choosing chunks;
            # sample_other: building, scoring and pairing the trajectories
            rollout = {k.replace("time/rollout_", "time/sample_"): v - self._sample_times.get(k, 0.0)
                       for k, v in self.engine.times_total.items()}
            self._times = split_remainder(seconds, rollout, "time/sample_other_s")
        elif name == "update":
            self._times["time/update_s"] = seconds
        elif name == "checkpoint":  # in the report's rows; a resumed run's earlier rows lack it
            self.rows[-1]["time"]["time/checkpoint_s"] = seconds

    def after_update(self, result: IterationResult) -> None:
        """Write the round's folder, then evaluate it (every ``round_eval_episodes``, the last ``eval_episodes``)."""
        cfg, k, data = self.cfg, result.iteration, result.batch
        assert isinstance(data, RoundData)
        t_write = time.perf_counter()
        out = self.rounds_dir / f"round_{k:03d}"
        out.mkdir(parents=True, exist_ok=True)
        save_trajectories(out / "trajectories.pt", data.trajectories)
        self.written(k, data.trajectories)
        write_pairs_table(out / "pairs.parquet", data.pairs, self.costs)
        if cfg.save_dataset:
            spec = self.engine.env.spec
            fps = spec.control_freq / self.engine.exec_steps
            write_round_dataset(out / "trajectories", data.trajectories, spec, fps, k)
        row: dict[str, Any] = {
            "round": k + 1, "trajectories": len(data.trajectories),
            "successes": sum(t.success for t in data.trajectories), "pairs": len(data.pairs),
            "unpaired_states": len(data.unpaired_states),
            "instruction_pairs": sum(p.chosen.id == p.rejected.id for p in data.pairs),
            "env_steps": self.engine.total_env_steps - self._steps_before,
        }
        if "collision" in self.costs:  # the sampled (exploring) episodes that touched a non-target object
            row["colliding"] = sum(t.costs["collision"] > 0 for t in data.trajectories)
        if not data.pairs:
            print(f"round {k + 1}: no pair (every state's {cfg.grape.max_samples} samples all succeeded or all "
                  "failed); training skipped")
            row.update(skipped=True, update={})
        else:
            update = {key.removeprefix("update/"): v for key, v in result.scalars.items() if key.startswith("update/")}
            row.update(skipped=False, update=update)
        row["time"] = {**self._times, "time/write_s": time.perf_counter() - t_write}
        write_json(out / "round.json", row)
        episodes = cfg.eval_episodes if result.last else cfg.round_eval_episodes
        t_eval = time.perf_counter()
        row["eval"] = evaluate(self.eval_engine, _eval_seeds(cfg, episodes), self.costs) if episodes else None
        row["time"]["time/eval_s"] = time.perf_counter() - t_eval
        del row["env_steps"]
        row["env_steps_total"] = result.env_steps
        self.rows.append(row)

    def before_log(self, result: IterationResult) -> None:
        row = self.rows[-1]
        result.scalars.update({**({} if row["eval"] is None else eval_scalars(row["eval"])), **sample_scalars(row),
                               **row["time"]})

    def after_round(self, round_index: int, result: IterationResult) -> None:
        print_round(self.rows[-1])

    def end(self, result: dict[str, Any]) -> None:
        """Videos of the last round that paired, ``report.json`` / ``report.md`` with the plots; prints the result."""
        cfg, rows = self.cfg, self.rows
        videos: dict[str, str] = {}
        spec = self.engine.env.spec
        for k in range(cfg.rounds - 1, -1, -1):
            pairs = load_pairs(self.rounds_dir / f"round_{k:03d}")
            if pairs:
                videos = pair_videos(self.run_dir / "videos", pairs, spec.image_keys,
                                     spec.control_freq / self.engine.exec_steps)
                break
        before, after = rows[0]["eval"], rows[-1]["eval"]
        self.summary = {
            "name": self.name, "env_id": cfg.env.id,
            "policy": policy_type(cfg.policy) if not cfg.policy.path else cfg.policy.path,
            "objective": cfg.objective, "seed": cfg.seed, "rounds": cfg.rounds, "env_steps": result["env_steps"],
            "wall_seconds": time.perf_counter() - self._started, "before": before, "after": after,
            "success_before": before["success"], "success_after": after["success"],
            "success_before_ci": before["success_ci"], "success_after_ci": after["success_ci"],
            "episodes_per_eval": after["episodes"], "per_round": rows,
            "score": dataclasses.asdict(cfg.grape.score),
        }
        md = write_align_report(self.run_dir, self.summary, rows, round_plots(rows, self.run_dir / "plots"), videos)
        print(f"report: {md}")
        print(f"success {before['success']:.2f} -> {after['success']:.2f} over {after['episodes']} held-out episodes "
              f"(after: 95% CI {after['success_ci'][0]:.2f}-{after['success_ci'][1]:.2f}); "
              f"{self.summary['wall_seconds']:.0f} s")

    def state_dict(self) -> dict[str, Any]:
        return {"rows": json.dumps(self.rows)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rows = json.loads(state["rows"])


def train_config(cfg: AlignConfig, run_dir: Path, costs: list[str]) -> TrainConfig:
    """The trainer's config of an alignment run: the TPO learner for ``rounds`` iterations, the costs recorded as
    reward terms of weight 0, a checkpoint per round (the last two kept), and no evaluation of the trainer's
    own (:class:`GrapeRounds` evaluates)."""
    return TrainConfig(env=cfg.env, policy=cfg.policy, algo=cfg.tpo, eval=EvalConfig(episodes=0, video=False),
                       logging=cfg.logging, reward=_reward(costs), iterations=cfg.rounds, seed=cfg.seed,
                       run_dir=str(run_dir), resume=cfg.resume, exec_steps=cfg.exec_steps, keep_last=2,
                       smoke=cfg.smoke)


def run_align(cfg: AlignConfig) -> dict[str, Any]:
    """Run the rounds (module doc); returns the ``report.json`` content.

    Raises:
        FileExistsError: when ``run_dir`` holds a run and ``--resume`` is not given.
        ConfigError: for a cost the env cannot report, or stage-wise scoring on a task without stages.
    """
    if cfg.smoke:
        cfg = _smoke(cfg)
    cfg = _with_pretraining_demos(cfg)
    name = cfg.name or f"align-{cfg.objective}-{cfg.env.id.replace('/', '-')}-s{cfg.seed}"
    run_dir = Path(cfg.run_dir) if cfg.run_dir else default_runs_dir() / name
    if not cfg.resume and run_dir.exists() and any(run_dir.iterdir()):
        raise FileExistsError(f"{run_dir} already holds a run; pass --resume true or another --name/--run_dir")
    if cfg.env.wrist_camera and not cfg.env.has_optional_wrist_camera():
        print(f"note: {cfg.env.id} has no optional wrist camera; using its default cameras")
        cfg = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, wrist_camera=False))
    with _env_config(cfg).make() as env:
        costs = _scoring_costs(env, cfg)
    rounds = GrapeRounds(cfg, run_dir, costs, name)
    config = json.loads(json.dumps(draccus.encode(cfg), default=str))
    Trainer(train_config(cfg, run_dir, costs), hooks=[rounds], config=config).run()
    return rounds.summary
