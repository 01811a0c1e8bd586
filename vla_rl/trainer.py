"""The training loop: collect, update, evaluate, log, checkpoint, resume.

The trainer wires registered pieces together and never names a policy type or
an algorithm: the policy comes from :mod:`vla_rl.policy_factory` (the policy
registry), the learner from :data:`vla_rl.algorithms.base.ALGORITHMS`, and each
iteration reads ``batch = learner.collect(inputs)``, ``stats = learner.update(batch)``,
then evaluates, logs and checkpoints. What a learner needs from the loop
(:class:`vla_rl.algorithms.base.Needs`) decides what the loop builds for it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
import time
from pathlib import Path
from typing import Any

import draccus
import numpy as np
import torch
from tqdm import tqdm

from policies.base import Policy
from policies.io import checkpoint_cameras
from policies.loading import load_policy
from sim.core import EnvSpec
from vla_core.manifest import write_text_atomic
from vla_rl import checkpoint as ckpt
from vla_rl.algorithms.base import ALGORITHMS, IterationInputs, Learner, Needs
from vla_rl.config import ConfigError, default_runs_dir
from vla_rl.curriculum import TaskCurriculum, spread
from vla_rl.data import ChunkDataset, load_policy_chunks
from vla_rl.distributed import SINGLE, Distributed, rank_seed
from vla_rl.ema import WeightEMA
from vla_rl.evaluation import EvalResult, EvalShard, evaluate_policy
from vla_rl.policy_factory import build_policy
from vla_rl.reweigh import TRACE_DIR, save_reward_trace
from vla_rl.rollout import EpisodeRecord, Rollout, RolloutEngine, reward_scalars
from vla_rl.run_logging import RunLogger
from vla_rl.threads import torch_threads
from vla_rl.timing import StageTimes, split_remainder, time_summary
from vla_rl.train_config import TrainConfig, training_seed_range


LEARNER_STORE = "learner_store"
"""Run sub-folder for learner state too large for a checkpoint (:meth:`Learner.use_store`); ``rank<r>/`` per rank."""


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rollout_scalars(rollout: Rollout, episodes: list[EpisodeRecord] | None = None) -> dict[str, float]:
    """Episode statistics and per-term rewards of a rollout, for logging (``rollout/*``, ``reward/*``); the episode
    statistics are over ``episodes`` when given (every rank's, in a distributed run), else the rollout's own."""
    eps = rollout.episodes if episodes is None else episodes
    nan = float("nan")
    out = {
        "rollout/episodes": float(len(eps)),
        "rollout/success": sum(e.success for e in eps) / len(eps) if eps else nan,
        "rollout/return": sum(e.ret for e in eps) / len(eps) if eps else nan,
        "rollout/length": sum(e.length for e in eps) / len(eps) if eps else nan,
        **reward_scalars(rollout),
    }
    if any(e.ended_by_reward for e in eps):  # a success classifier ends episodes: how often it ended one
        out["rollout/ended_by_reward"] = sum(e.ended_by_reward for e in eps) / len(eps)
    return out


def per_task_eval_tasks(cfg: TrainConfig, curriculum: TaskCurriculum | None) -> list[int] | None:
    """The task indices the ``per_task`` evaluation plays: the held-out tasks if any, else every task, spread to
    ``eval.max_tasks``; None under the ``seeds`` protocol or on a single-task env (``curriculum`` None)."""
    if cfg.eval.protocol != "per_task" or curriculum is None:
        return None
    return spread(curriculum.eval_tasks, cfg.eval.max_tasks)


def task_curriculum(cfg: TrainConfig, spec: EnvSpec) -> TaskCurriculum | None:
    """The run's :class:`TaskCurriculum` for a multi-task env; None for a single-task one.

    Raises:
        ConfigError: for task settings a single-task env cannot honour, or an unknown held-out task.
    """
    if not spec.tasks:
        if cfg.env.tasks.holdout or cfg.env.tasks.sampler != "uniform" or cfg.eval.protocol == "per_task":
            raise ConfigError(f"env.tasks / eval.protocol: {cfg.env.id} is a single-task env; task sampling, "
                              "hold-out and the per_task protocol need a multi-task id (mujoco/multi, "
                              "libero/<suite>, maniskill/TabletopSet-v1)")
        return None
    check_init_state_split(cfg, spec)
    try:
        return TaskCurriculum(spec.tasks, cfg.env.tasks)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def check_init_state_split(cfg: TrainConfig, spec: EnvSpec) -> None:
    """Check that the ``per_task`` evaluation's init states exist and stay apart from the training ones.

    With ``env.tasks.train_init_states N`` training draws each task's init states ``[0, N)`` and the ``per_task``
    protocol plays ``[N, N + eval.episodes_per_task)``; both must fit every task's count
    (``EnvSpec.init_states``). With N = 0 the evaluation plays ``[0, eval.episodes_per_task)``.

    Raises:
        ConfigError: naming the fields, for a split on an env without fixed init states or under the ``seeds``
            protocol (whose episodes draw their init states like training's), or a range that does not fit.
    """
    n, episodes = cfg.env.tasks.train_init_states, cfg.eval.episodes_per_task
    if n and not spec.init_states:
        raise ConfigError(f"env.tasks.train_init_states: {cfg.env.id} has no fixed init states (LIBERO suite ids "
                          "have); its evaluation is kept apart by eval.seed")
    if n and cfg.eval.protocol != "per_task":
        raise ConfigError("env.tasks.train_init_states needs eval.protocol per_task: the seeds protocol draws its "
                          "episodes' init states from the training ones")
    if not spec.init_states or cfg.eval.protocol != "per_task":
        return
    fewest = min(range(len(spec.tasks)), key=lambda t: spec.init_states[t])
    count, where = spec.init_states[fewest], f"{cfg.env.id} task {spec.tasks[fewest]}"
    if n and n + episodes > count:
        raise ConfigError(f"env.tasks.train_init_states={n} + eval.episodes_per_task={episodes} exceed the {count} "
                          f"init states of {where}: training and evaluation init states would overlap; lower one")
    if episodes > count:
        raise ConfigError(f"eval.episodes_per_task={episodes} exceeds the {count} init states of {where} "
                          "(the per_task protocol plays each once)")


class Trainer:
    """Run :class:`TrainConfig` (see module doc). ``run()`` returns the final evaluation."""

    def __init__(self, cfg: TrainConfig) -> None:
        """Check what can be checked before any env is built.

        Raises:
            ConfigError: for a ``policy.path`` that is not a folder.
            RegistryError: for an unknown ``algo.type``.
        """
        if cfg.policy.path and not Path(cfg.policy.path).is_dir():
            raise ConfigError(f"policy.path: {cfg.policy.path} is not a folder; expected a policy folder with "
                              "config.json and model.safetensors (e.g. <run>/checkpoints/best/policy)")
        if cfg.policy.path:  # e.g. the quickstart's policy, which reads a wrist camera
            env = cfg.env.with_policy_cameras(checkpoint_cameras(cfg.policy.path), cfg.policy.path)
            cfg = dataclasses.replace(cfg, env=env)
        self.cfg = cfg
        self.run_dir = Path(cfg.run_dir) if cfg.run_dir else default_runs_dir() / cfg.run_name
        self.ckpt_dir = self.run_dir / "checkpoints"
        self.learner_cls: type[Learner] = ALGORITHMS.get(cfg.algo.type).obj  # fails before any env is built
        self.dist: Distributed = SINGLE  # the ranks of this run (vla_rl.distributed), found by run()
        self.curriculum: TaskCurriculum | None = None  # set once the env is built (multi-task envs)
        self.ema: WeightEMA | None = None  # the evaluated average of the weights, with --eval.ema (vla_rl.ema)

    def _config_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(draccus.encode(self.cfg), default=str))

    def _evaluate(self, policy: Policy, env: Any, iteration: int, logger: RunLogger, tag: str) -> EvalResult:
        cfg, dist = self.cfg, self.dist
        policy.eval()
        video = self.run_dir / "videos" / f"eval_{tag}.mp4" if cfg.eval.video and dist.is_main else None

        # Seeded like the env (evaluate_policy): the same policy always scores the same, the before and after
        # evaluations share their flow noise, and the training RNG stream is left untouched.
        tasks = per_task_eval_tasks(cfg, self.curriculum)
        seed, shard = cfg.eval.seed, None
        if dist.enabled and tasks is None:  # this rank plays its slice of the evaluation envs; episodes gathered
            shard = EvalShard(cfg.eval_envs, dist.rank * env.num_envs, dist.gather_objects)
            seed += shard.offset
        res = evaluate_policy(env, policy, cfg.eval.episodes, seed, cfg.exec_steps, video,
                              cfg.eval.video_envs, desc=f"eval {tag}", progress=dist.is_main, tasks=tasks,
                              episodes_per_task=cfg.eval.episodes_per_task, shard=shard,
                              first_init=cfg.env.tasks.train_init_states, video_episodes=cfg.eval.video_episodes)
        if res.video:
            logger.log_video(iteration, "eval/video", res.video, env.spec.control_freq)
        return res

    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        resume_from = ckpt.resume_checkpoint(self.ckpt_dir) if cfg.resume else None
        if cfg.resume and resume_from is None and (self.run_dir / "metrics.jsonl").exists():
            print(f"no complete checkpoint in {self.ckpt_dir}; starting from scratch")
        if not cfg.resume and self.ckpt_dir.exists() and any(self.ckpt_dir.iterdir()):
            raise FileExistsError(f"{self.run_dir} already holds a run; pass --resume true or another --name/--run_dir")
        self.dist = dist = Distributed.from_environment()
        if cfg.eval.ema and dist.fsdp:
            raise ConfigError(f"eval.ema={cfg.eval.ema} averages whole parameters and FSDP shards them: run without "
                              "--eval.ema or with DDP")
        seed_everything(cfg.seed)
        if dist.enabled:  # rank r holds envs [r*n, (r+1)*n) of the run, seeded as those envs
            cfg.algo.check_run(dist.shard(cfg.env.num_envs, "env.num_envs"))
            env = cfg.env.make(*dist.env_shard(cfg.env.num_envs, cfg.env.seed))
        else:
            env = cfg.env.make()
        eval_env = None
        try:
            if dist.enabled:
                eval_env = cfg.env.make(*dist.env_shard(cfg.eval_envs, cfg.eval.seed, "eval.num_envs"))
            else:
                eval_env = cfg.env.make(num_envs=cfg.eval.num_envs or cfg.env.num_envs, seed=cfg.eval.seed)
            self.curriculum = task_curriculum(cfg, env.spec)
            if self.curriculum is not None and cfg.env.tasks.holdout:  # evaluate on the held-out tasks only
                eval_env.schedule_tasks(weights=(~self.curriculum.train_mask).astype(float))
            state: dict[str, Any] = {}
            if resume_from is not None:
                policy = load_policy(resume_from / ckpt.POLICY_DIR, verify=False)  # resume_checkpoint verified it
                state = ckpt.load_trainer_state(resume_from)
                # with --eval.ema the folder held the average: the weights as trained go back in before any use
                self.ema = WeightEMA.resume(policy, cfg.eval.ema, state.get("ema"), resume_from)
            else:
                policy = build_policy(cfg.policy, env.spec, smoke=cfg.smoke)
                self.ema = WeightEMA(policy, cfg.eval.ema) if cfg.eval.ema else None
            learner: Learner = self.learner_cls(cfg.algo.for_run(cfg.iterations), policy)
            learner.to(dist.device)  # a GPU when there is one, also in a one-process run
            if self.ema is not None:
                self.ema.to(dist.device)
            store = self.run_dir / LEARNER_STORE
            learner.use_store(store / f"rank{dist.rank}" if dist.enabled else store, cfg.keep_last)
            if dist.enabled:  # same initial weights on every rank; from here on each rank draws its own noise
                learner.distribute(dist)
                seed_everything(rank_seed(cfg.seed, dist.rank))
            start_iter, best = 0, None
            env_steps = 0
            if resume_from is not None:
                learner.load_state_dict(state["learner"])
                if self.curriculum is not None and "curriculum" in state:
                    self.curriculum.load_state_dict(state["curriculum"])
                ckpt.set_rng_state(state["rng"])
                if dist.enabled:
                    ranks = state.get("ranks") or []
                    if len(ranks) != dist.world_size:
                        raise ConfigError(f"{resume_from} was written by {len(ranks) or 1} process(es); resume it "
                                          f"with as many (this launch has {dist.world_size})")
                    ckpt.set_rng_state(ranks[dist.rank]["rng"])
                    learner.load_rank_state(ranks[dist.rank]["learner"])
                start_iter, env_steps = state["iteration"], state["env_steps"]
                best = ckpt.best_metric(self.ckpt_dir, report=print if dist.is_main else lambda line: None)
                if dist.is_main:
                    print(f"resuming {self.run_dir} at iteration {start_iter} from {resume_from}")
            logger = RunLogger(self.run_dir, cfg.logging, self._config_dict(), resume=resume_from is not None) \
                if dist.is_main else _NullLogger()
            try:
                return self._loop(policy, learner, env, eval_env, logger, start_iter, env_steps, best)
            finally:
                logger.close()
        finally:
            env.close()
            if eval_env is not None:
                eval_env.close()

    def _loop(self, policy: Policy, learner: Learner, env: Any, eval_env: Any, logger: RunLogger,
              start_iter: int, env_steps: int, best: float | None) -> dict[str, Any]:
        cfg = self.cfg
        engine = RolloutEngine(env, policy, cfg.exec_steps, use_critic=learner.uses_critic, reward=cfg.reward)
        learner.check_env(env.spec, engine.exec_steps, cfg.reset_every_iteration)
        dist = self.dist
        engine.total_env_steps = env_steps // dist.world_size  # this rank's share of the run's env steps
        data = self._offline_data(learner, policy)
        first = last = None
        if start_iter == 0:
            first = self._evaluate(policy, eval_env, 0, logger, "iter_000000")
            logger.log(0, first.scalars())
            self._write_eval(first, "before")
        bar = tqdm(range(start_iter, cfg.iterations), desc="train", unit="it", initial=start_iter, total=cfg.iterations,
                   disable=not dist.is_main)
        after_row = StageTimes()  # logging and checkpointing, done after an iteration's row is written
        for it in bar:
            t0 = time.perf_counter()
            carried = after_row.take("time/")  # the previous iteration's log / checkpoint seconds
            base, _ = training_seed_range(cfg, it)
            base = dist.seed_base(base, env.num_envs)
            policy.train()
            if self.curriculum is not None:  # this iteration's resets draw their tasks from these weights
                env.schedule_tasks(weights=self.curriculum.weights())
            if cfg.reward.anneal:  # a function of the iteration alone, so a resumed run anneals the same
                engine.reward.set_progress(it / cfg.iterations)
            done_iter = it + 1
            is_last = done_iter == cfg.iterations
            evaluates = is_last or bool(cfg.eval.every and done_iter % cfg.eval.every == 0)
            checkpoints = is_last or done_iter % cfg.checkpoint_every == 0
            inputs = IterationInputs(iteration=it, seed_base=base, reset=cfg.reset_every_iteration,
                                     engine=engine if learner.needs.env_rollouts else None, data=data,
                                     sync=evaluates)
            with torch_threads(cfg.threads.rollout):
                batch = learner.collect(inputs)
            t1 = time.perf_counter()
            with torch_threads(cfg.threads.update):
                stats = learner.update(batch)
            if self.ema is not None:
                self.ema.update()
            t2 = time.perf_counter()
            scalars = {"time/rollout_s": t1 - t0, "time/update_s": t2 - t1, **stats}
            scalars.update(split_remainder(t2 - t1, {k: v for k, v in stats.items() if k.startswith("time/update_")},
                                           "time/update_other_s"))
            if isinstance(batch, Rollout):
                scalars.update(split_remainder(t1 - t0, batch.times, "time/rollout_other_s"))
                scalars["time/env_steps_per_s"] = batch.env_steps / max(t1 - t0, 1e-9)
            else:  # a dataset learner: drawing its batch
                scalars["time/rollout_other_s"] = t1 - t0
            scalars = dist.merge_scalars(scalars, summed=("time/env_steps_per_s",))
            if cfg.reward.anneal:
                scalars.update({f"reward/weight/{k}": w for k, w in engine.reward.weights if k in cfg.reward.anneal})
            if isinstance(batch, Rollout):
                episodes = dist.gather_objects(list(batch.episodes))  # every rank's, so the curriculum agrees
                scalars = {**rollout_scalars(batch, episodes), **scalars}
                if self.curriculum is not None:
                    self.curriculum.observe((e.task_index, e.success) for e in episodes)
                    scalars.update(self.curriculum.scalars())
            step = int(dist.sum(torch.tensor(engine.total_env_steps)).item()) if dist.enabled else engine.total_env_steps
            t_eval = time.perf_counter()
            if evaluates:
                with self._averaged():
                    res = self._evaluate(policy, eval_env, step, logger, f"iter_{done_iter:06d}")
                scalars.update(res.scalars())
                last = res
            scalars["time/eval_s"] = time.perf_counter() - t_eval
            scalars.update({"time/log_s": 0.0, "time/checkpoint_s": 0.0, **carried})
            scalars["time/iteration_s"] = time.perf_counter() - t0 + scalars["time/log_s"] + scalars["time/checkpoint_s"]
            with after_row("log"):
                logger.log(step, scalars)
            every = cfg.reward.save_terms_every
            if isinstance(batch, Rollout) and every and done_iter % every == 0 and dist.is_main:  # reward reweigh
                save_reward_trace(batch, self.run_dir / TRACE_DIR / f"iter_{done_iter:06d}.pt",
                                  self._config_dict()["algo"], engine.reward.weights)
            shown = {"success": "rollout/success", "ret": "rollout/return", "loss": "update/loss"}
            bar.set_postfix(**{k: f"{scalars[m]:.3g}" for k, m in shown.items() if m in scalars},
                            eval=f"{last.success_rate:.2f}" if last else "-", time=time_summary(scalars))
            if checkpoints:
                after_row.start("checkpoint")
                state = {"learner": learner.state_dict(), "rng": ckpt.rng_state(), "iteration": done_iter,
                         "env_steps": step,
                         **({"curriculum": self.curriculum.state_dict()} if self.curriculum is not None else {})}
                if dist.enabled:  # every rank's RNG and own learner state; rank 0 writes them all
                    state["ranks"] = dist.all_objects({"rng": state["rng"], "learner": learner.rank_state()})
                if dist.is_main:
                    with self._averaged():  # the policy folder holds what was evaluated, trainer.pt the rest
                        if self.ema is not None:
                            state["ema"] = self.ema.state_dict()
                        saved = ckpt.save_checkpoint(self.ckpt_dir, done_iter, policy, state, self._config_dict(),
                                                     cfg.keep_last)
                    if last is not None and (best is None or last.success_rate > best) and "eval/success" in scalars:
                        best = last.success_rate
                        ckpt.mark_best(self.ckpt_dir, saved, best)
                after_row.stop("checkpoint")
        bar.close()
        if last is None and start_iter == cfg.iterations == 0:  # nothing trained: the start is the result
            last = first
        if last is not None:
            self._write_eval(last, "after")
        return {"before": first, "after": last, "run_dir": str(self.run_dir), "env_steps": engine.total_env_steps,
                "main": dist.is_main, "device": str(dist.device)}

    def _averaged(self) -> contextlib.AbstractContextManager[None]:
        """The policy holds the average of its weights inside (with ``--eval.ema``; the weights as trained without)."""
        return self.ema.applied() if self.ema is not None else contextlib.nullcontext()

    def _offline_data(self, learner: Learner, policy: Policy) -> ChunkDataset | None:
        """The ``data.path`` dataset as chunks of the policy's horizon, for a learner that needs
        :attr:`Needs.DATASET`; None otherwise.

        Raises:
            ConfigError: when the learner needs data and ``data.path`` is empty; :class:`vla_rl.data.DatasetError`
                naming the folder and feature when the dataset does not fit the policy.
        """
        cfg = self.cfg
        if not learner.needs & Needs.DATASET:
            return None
        if not cfg.data.path:
            raise ConfigError(f"algo.type={cfg.algo.type} trains on offline data: pass --data.path <LeRobotDataset folder>")
        return load_policy_chunks(cfg.data.path, policy, cfg.data.episodes, cfg.data.intervention_split,
                                  cfg.data.recovery_steps)

    def _write_eval(self, res: EvalResult, tag: str) -> None:
        if not self.dist.is_main:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.run_dir / f"eval_{tag}.json", json.dumps(dataclasses.asdict(res), indent=2))


class _NullLogger:
    """The logger of ranks other than 0 (rank 0 alone writes ``metrics.jsonl``, TensorBoard and wandb)."""

    def log(self, step: int, scalars: dict[str, float]) -> None:
        pass

    def log_video(self, step: int, key: str, path: Any, fps: float) -> None:
        pass

    def close(self) -> None:
        pass
