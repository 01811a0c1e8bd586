"""``vla-rl align``: GRAPE preference alignment in rounds of sample -> score -> pair -> train (TPO) -> evaluate.

    vla-rl align --preset align_task --policy.path runs/quickstart-mujoco-pick-any-s0/sft_policy
    vla-rl align --preset align_safety --policy.path ... --grape.score.costs '{collision: 2.0}'

Each round samples the current policy with exploration from ``states_per_round`` seeded initial
states until each state has successes and failures (``grape.min_samples`` .. ``grape.max_samples``),
scores every trajectory (``R = lam_self log R_self + lam_ext R_ext + lam_success success``, costs
per task stage from the env's privileged signals), pairs the top-m with the bottom-m per state and
trains TPO against the policy of the round's start (:mod:`vla_rl.grape.sampling`,
:mod:`vla_rl.grape.tpo`). The run folder gets, per round, ``rounds/round_<k>/`` with the
trajectories as a LeRobotDataset (``trajectories/``), everything needed to re-train from them
(``trajectories.pt``), the pairs table (``pairs.parquet``) and ``round.json``; a checkpoint after
every round (``--resume true`` continues after the last finished round); and the report
(``report.md`` / ``report.json``, plots, videos of a chosen and a rejected trajectory).
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import draccus
import torch
from tqdm import tqdm

from policies.base import ActMode, Policy
from policies.io import checkpoint_cameras
from policies.loading import load_policy
from rewards import RewardConfig
from sim.core import VecEnv
from vla_rl import checkpoint as ckpt
from vla_rl.algorithms.base import LearnerConfig
from vla_rl.config import ConfigError, EnvConfig, default_runs_dir
from vla_rl.distributed import default_device
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
from vla_rl.grape.sampling import GrapeSettings, check_instructions, preference_round, run_episodes
from vla_rl.grape.scoring import check_scoring
from vla_rl.grape.tpo import TPOConfig, TPOLearner
from vla_rl.grape.trajectory import load_trajectories, save_trajectories
from vla_rl.policy_factory import build_policy
from vla_rl.rollout import RolloutEngine
from vla_rl.run_logging import LoggingConfig, RunLogger
from vla_rl.sft import SFT_RECORD, pretraining_dataset
from vla_rl.timing import split_remainder
from vla_rl.train_config import EVAL_SEED_BASE, POLICY_CHOICES, SEED_BLOCK, TRAIN_SEED_STRIDE, PolicyConfig, policy_type
from vla_rl.trainer import seed_everything

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
    """A CPU smoke run: a fresh policy is its tiny variant (hub checkpoints are not downloaded) and the sizes
    shrink to at most 4 envs, 2 states per round, 2-3 samples per state and 4 evaluation episodes."""
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
    """``cfg`` shrunk for ``--smoke true`` (see the field's doc)."""
    grape = dataclasses.replace(cfg.grape, min_samples=min(cfg.grape.min_samples, 2),
                                max_samples=min(cfg.grape.max_samples, 3))
    return dataclasses.replace(
        cfg, env=dataclasses.replace(cfg.env, num_envs=min(cfg.env.num_envs, 4)), grape=grape,
        states_per_round=min(cfg.states_per_round, 2), eval_episodes=min(cfg.eval_episodes, 4),
        round_eval_episodes=min(cfg.round_eval_episodes, 4))


def _round_seeds(cfg: AlignConfig, k: int) -> list[int]:
    base = cfg.seed * SEED_BLOCK + k * TRAIN_SEED_STRIDE
    return [base + i for i in range(cfg.states_per_round)]


def _eval_seeds(cfg: AlignConfig, n: int) -> list[int]:
    return [EVAL_SEED_BASE + cfg.seed * SEED_BLOCK + i for i in range(n)]


class _Run:
    """One alignment run: env, engines, policy, learner, folders (see :func:`run_align`)."""

    def __init__(self, cfg: AlignConfig, run_dir: Path) -> None:
        self.cfg, self.run_dir = cfg, run_dir
        self.ckpt_dir = run_dir / "checkpoints"
        self.rounds_dir = run_dir / "rounds"
        self._successes: dict[int, list[Any]] = {}  # round index -> its successful trajectories, for tpo.replay_rounds

    def written(self, k: int, trajectories: list[Any]) -> None:
        """Round ``k``'s trajectories were just saved: keep its successes for the next rounds' replay, so that
        :meth:`replay` reads a round's file only when this process did not sample it (a resumed run)."""
        if self.cfg.tpo.replay_rounds:
            self._successes[k] = [t for t in trajectories if t.success]

    def replay(self, k: int) -> list[Any]:
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

    def evaluate(self, engine: RolloutEngine, episodes: int, costs: list[str]) -> dict[str, Any]:
        """Deterministic episodes on held-out seeds, on their own RNG stream (the same noise for every policy)."""
        seeds = _eval_seeds(self.cfg, episodes)
        max_dec = -(-engine.env.spec.max_episode_steps // engine.exec_steps) + 1
        b = engine.env.num_envs
        trajs = []
        with torch.random.fork_rng(), tqdm(total=episodes, desc="eval", unit="ep", leave=False) as bar:
            torch.manual_seed(seeds[0])
            for i in range(0, episodes, b):  # a batch of envs at a time, for the progress bar
                trajs += run_episodes(engine, seeds[i : i + b], ActMode.EVAL, costs, False, max_dec, first_id=i)
                bar.update(len(seeds[i : i + b]))
        engine.policy.reset()
        return summarize(trajs, costs)


def evaluate_policy_folder(cfg: AlignConfig, episodes: int = 0) -> dict[str, Any]:
    """Align's held-out evaluation of the checkpoint ``cfg.policy.path`` alone, without rounds: the env, the seeds
    (``cfg.seed``) and the costs a run of ``cfg`` evaluates with, so the result compares with that run's
    ``before`` / ``after`` (:func:`vla_rl.grape.report.summarize`; ``episodes`` 0 = ``cfg.eval_episodes``).
    ``benchmarks/grape.py --rescore`` uses it to add ``per_episode`` records to reports written before they
    existed: the starting policy reproduces its report's numbers, since evaluation is deterministic.

    Raises:
        ConfigError: without ``policy.path``, or for a cost the env cannot report.
    """
    if not cfg.policy.path:
        raise ConfigError("policy.path: the checkpoint folder to evaluate")
    env_cfg = _env_config(cfg)
    seed_everything(cfg.seed)
    with env_cfg.make() as env:
        costs = _scoring_costs(env, cfg)
    with _eval_env(env_cfg, cfg) as eval_env:
        engine = _engine(eval_env, build_policy(cfg.policy, eval_env.spec), cfg, costs)
        return _Run(cfg, Path(".")).evaluate(engine, episodes or cfg.eval_episodes, costs)


def _env_config(cfg: AlignConfig) -> EnvConfig:
    """The env a run of ``cfg`` plays: ``cfg.env`` with the cameras of the checkpoint ``policy.path`` reads."""
    return cfg.env.with_policy_cameras(checkpoint_cameras(cfg.policy.path), cfg.policy.path) \
        if cfg.policy.path else cfg.env


def _eval_env(env_cfg: EnvConfig, cfg: AlignConfig) -> VecEnv:
    """The held-out evaluation env, seeded apart from training (``cfg.seed``'s block of evaluation seeds)."""
    return env_cfg.make(seed=EVAL_SEED_BASE + cfg.seed * SEED_BLOCK)


def _scoring_costs(env: VecEnv, cfg: AlignConfig) -> list[str]:
    """The costs ``env`` reports (:func:`vla_rl.grape.scoring.check_scoring`); ConfigError for one the score needs
    and the env lacks, or for instruction pairs on an env with fewer than two instructions."""
    try:
        check_instructions(env.spec, cfg.grape)
        return check_scoring(env, cfg.grape.score, cfg.seed)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _engine(env: VecEnv, policy: Policy, cfg: AlignConfig, costs: list[str]) -> RolloutEngine:
    """A rollout engine on ``env`` that records every cost as a reward term of weight 0 (the reward unchanged)."""
    reward = RewardConfig(terms={"env": 1.0, **dict.fromkeys(costs, 0.0)})
    return RolloutEngine(env, policy, cfg.exec_steps, use_critic=False, reward=reward)


def _with_pretraining_demos(cfg: AlignConfig) -> AlignConfig:
    """``cfg`` with ``tpo.demos`` set to the demos ``policy.path`` was pre-trained on (the ``dataset`` of its
    ``sft.json``) when ``tpo.demo_bc`` asks for demos and none are named.

    Raises:
        ConfigError: when the policy records no pre-training dataset.
    """
    tpo = cfg.tpo
    assert isinstance(tpo, TPOConfig)
    if tpo.demo_bc == 0 or tpo.demos:
        return cfg
    dataset = pretraining_dataset(cfg.policy.path) if cfg.policy.path else None
    if not dataset:
        where = (f"{Path(cfg.policy.path) / SFT_RECORD} names no 'dataset'" if cfg.policy.path
                 else "a fresh policy has no pre-training data")
        raise ConfigError(f"tpo.demo_bc imitates demos: name their LeRobotDataset with --tpo.demos, or leave the "
                          f"demo mix out with --tpo.demo_bc 0 ({where})")
    print(f"tpo.demos: the demos {cfg.policy.path} was pre-trained on, {dataset}")
    return dataclasses.replace(cfg, tpo=dataclasses.replace(tpo, demos=dataset))


def run_align(cfg: AlignConfig) -> dict[str, Any]:
    """Run the rounds (module doc); returns the ``report.json`` content.

    Raises:
        FileExistsError: when ``run_dir`` holds a run and ``--resume`` is not given.
        ConfigError: for a cost the env cannot report, or stage-wise scoring on a task without stages.
    """
    t_start = time.perf_counter()
    if cfg.smoke:
        cfg = _smoke(cfg)
    cfg = _with_pretraining_demos(cfg)
    name = cfg.name or f"align-{cfg.objective}-{cfg.env.id.replace('/', '-')}-s{cfg.seed}"
    run_dir = Path(cfg.run_dir) if cfg.run_dir else default_runs_dir() / name
    run = _Run(cfg, run_dir)
    resume_from = ckpt.resume_checkpoint(run.ckpt_dir) if cfg.resume else None
    if not cfg.resume and run_dir.exists() and any(run_dir.iterdir()):
        raise FileExistsError(f"{run_dir} already holds a run; pass --resume true or another --name/--run_dir")
    if cfg.env.wrist_camera and not cfg.env.has_optional_wrist_camera():
        print(f"note: {cfg.env.id} has no optional wrist camera; using its default cameras")
        cfg = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, wrist_camera=False))
        run.cfg = cfg
    env_cfg = _env_config(cfg)
    seed_everything(cfg.seed)
    env = env_cfg.make()
    eval_env = None
    try:
        costs = _scoring_costs(env, cfg)
        eval_env = _eval_env(env_cfg, cfg)
        if resume_from is not None:
            policy = load_policy(resume_from / ckpt.POLICY_DIR, verify=False).to(default_device())
        else:  # a checkpoint at policy.path loads with --policy.sampler (which starts from the saved one)
            policy = build_policy(cfg.policy, env.spec, smoke=cfg.smoke)
        learner = TPOLearner(cfg.tpo, policy)
        engine = _engine(env, policy, cfg, costs)
        eval_engine = _engine(eval_env, policy, cfg, costs)
        start, env_steps, rows = 0, 0, []
        if resume_from is not None:
            state = ckpt.load_trainer_state(resume_from)
            learner.load_state_dict(state["learner"])
            ckpt.set_rng_state(state["rng"])
            start, env_steps, rows = state["round"], state["env_steps"], json.loads(state["rows"])
            print(f"resuming {run_dir} after round {start} from {resume_from}")
        run_dir.mkdir(parents=True, exist_ok=True)
        logger = RunLogger(run_dir, cfg.logging, json.loads(json.dumps(draccus.encode(cfg), default=str)),
                           resume=resume_from is not None)
        videos: dict[str, str] = {}
        try:
            if not rows:
                print(f"evaluating the starting policy on {cfg.eval_episodes} held-out episodes", flush=True)
                before = run.evaluate(eval_engine, cfg.eval_episodes, costs)
                rows.append({"round": 0, "eval": before})
                logger.log(0, eval_scalars(before))
            carried: dict[str, float] = {}  # the previous round's checkpoint seconds, logged with this round's
            for k in range(start, cfg.rounds):
                row = _one_round(run, k, engine, learner, costs)
                env_steps += row.pop("env_steps")
                last = k == cfg.rounds - 1
                episodes = cfg.eval_episodes if last else cfg.round_eval_episodes
                t_eval = time.perf_counter()
                row["eval"] = run.evaluate(eval_engine, episodes, costs) if episodes else None
                row["time"]["time/eval_s"] = time.perf_counter() - t_eval
                row["env_steps_total"] = env_steps
                rows.append(row)
                logger.log(env_steps, {**({} if row["eval"] is None else eval_scalars(row["eval"])),
                                       **sample_scalars(row),
                                       **{f"update/{a}": b for a, b in row["update"].items()},
                                       **row["time"], **carried})
                print_round(row)
                t_ckpt = time.perf_counter()
                ckpt.save_checkpoint(run.ckpt_dir, k + 1, policy, {
                    "learner": learner.state_dict(), "rng": ckpt.rng_state(), "iteration": k + 1, "round": k + 1,
                    "env_steps": env_steps,
                    "rows": json.dumps(rows)}, json.loads(json.dumps(draccus.encode(cfg), default=str)), keep_last=2)
                carried = {"time/checkpoint_s": time.perf_counter() - t_ckpt}
                row["time"].update(carried)  # in the report's rows; a resumed run's earlier rows lack it
        finally:
            logger.close()
        fps = env.spec.control_freq / engine.exec_steps
        for k in range(cfg.rounds - 1, -1, -1):  # videos of the last round that paired
            pairs = load_pairs(run.rounds_dir / f"round_{k:03d}")
            if pairs:
                videos = pair_videos(run_dir / "videos", pairs, env.spec.image_keys, fps)
                break
    finally:
        env.close()
        if eval_env is not None:
            eval_env.close()
    before, after = rows[0]["eval"], rows[-1]["eval"]
    summary = {
        "name": name, "env_id": cfg.env.id, "policy": policy_type(cfg.policy) if not cfg.policy.path else cfg.policy.path,
        "objective": cfg.objective, "seed": cfg.seed, "rounds": cfg.rounds, "env_steps": env_steps,
        "wall_seconds": time.perf_counter() - t_start, "before": before, "after": after,
        "success_before": before["success"], "success_after": after["success"],
        "success_before_ci": before["success_ci"], "success_after_ci": after["success_ci"],
        "episodes_per_eval": after["episodes"], "per_round": rows,
        "score": dataclasses.asdict(cfg.grape.score),
    }
    md = write_align_report(run_dir, summary, rows, round_plots(rows, run_dir / "plots"), videos)
    print(f"report: {md}")
    print(f"success {before['success']:.2f} -> {after['success']:.2f} over {after['episodes']} held-out episodes "
          f"(after: 95% CI {after['success_ci'][0]:.2f}-{after['success_ci'][1]:.2f}); {summary['wall_seconds']:.0f} s")
    return summary


def _one_round(run: _Run, k: int, engine: RolloutEngine, learner: TPOLearner, costs: list[str]) -> dict[str, Any]:
    """Sample, score, pair, write, train one round; its row of the report (without the evaluation)."""
    cfg = run.cfg
    steps_before = engine.total_env_steps
    t0, rollout_before = time.perf_counter(), dict(engine.times_total)
    with tqdm(desc=f"round {k + 1}/{cfg.rounds} sampling", unit="traj", leave=False) as bar:
        data = preference_round(engine, _round_seeds(cfg, k), cfg.grape, costs, progress=bar)
    t1 = time.perf_counter()
    rollout = {k_.replace("time/rollout_", "time/sample_"): v - rollout_before.get(k_, 0.0)
               for k_, v in engine.times_total.items()}
    out = run.rounds_dir / f"round_{k:03d}"
    out.mkdir(parents=True, exist_ok=True)
    save_trajectories(out / "trajectories.pt", data.trajectories)
    run.written(k, data.trajectories)
    write_pairs_table(out / "pairs.parquet", data.pairs, costs)
    if cfg.save_dataset:
        fps = engine.env.spec.control_freq / engine.exec_steps
        write_round_dataset(out / "trajectories", data.trajectories, engine.env.spec, fps, k)
    t2 = time.perf_counter()
    row: dict[str, Any] = {
        "round": k + 1, "trajectories": len(data.trajectories), "successes": sum(t.success for t in data.trajectories),
        "pairs": len(data.pairs), "unpaired_states": len(data.unpaired_states),
        "instruction_pairs": sum(p.chosen.id == p.rejected.id for p in data.pairs),
        "env_steps": engine.total_env_steps - steps_before,
    }
    if "collision" in costs:  # the sampled (exploring) episodes that touched a non-target object
        row["colliding"] = sum(t.costs["collision"] > 0 for t in data.trajectories)
    if not data.pairs:
        print(f"round {k + 1}: no pair (every state's {cfg.grape.max_samples} samples all succeeded or all failed); "
              "training skipped")
        row.update(skipped=True, update={})
    else:
        row.update(skipped=False, update=learner.update(data.pairs, run.replay(k)))
    # sample_env / sample_act: the envs stepping and the policy choosing chunks; sample_other: building, scoring and
    # pairing the trajectories; write: the round's files; then the TPO update (eval and checkpoint: run_align)
    row["time"] = {**split_remainder(t1 - t0, rollout, "time/sample_other_s"), "time/write_s": t2 - t1,
                   "time/update_s": time.perf_counter() - t2}
    write_json(out / "round.json", row)
    return row
