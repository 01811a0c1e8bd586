"""The training loop: collect, update, evaluate, log, checkpoint, resume.

The trainer wires registered pieces together and never names a policy type or
an algorithm: the policy comes from :mod:`vla_rl.policy_factory` (the policy
registry), the learner from :data:`vla_rl.algorithms.base.ALGORITHMS`, and each
iteration reads ``batch = learner.collect(inputs)``, ``stats = learner.update(batch)``,
then evaluates, logs and checkpoints. What a learner needs from the loop
(:class:`vla_rl.algorithms.base.Needs`) decides what the loop builds for it.
Everything else attaches as a hook (:mod:`vla_rl.hooks`): the ``time/*`` scalars,
the weight EMA, the task curriculum, reward annealing and reward traces, and a
command's own (``Trainer(cfg, hooks=[...])``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
from collections.abc import Callable, Iterator, Sequence
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
from vla_rl.curriculum import CurriculumHook, TaskCurriculum, spread
from vla_rl.data import ChunkDataset, dataset_spec, load_policy_chunks
from vla_rl.distributed import SINGLE, Distributed
from vla_rl.ema import WeightEMA, check_ema_resume
from vla_rl.evaluation import EvalResult, EvalShard, evaluate_policy
from vla_rl.hooks import Hook, IterationResult, RewardAnnealing, RunContext
from vla_rl.policy_factory import build_policy
from vla_rl.reweigh import TRACE_DIR, RewardTraces
from vla_rl.rollout import EpisodeRecord, Rollout, RolloutEngine, reward_scalars
from vla_rl.run_logging import RunLogger
from vla_rl.threads import torch_threads
from vla_rl.timing import StageTimer, time_summary
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
    """Run :class:`TrainConfig` (see module doc); ``run()`` returns the evaluations before and after training.

    Without an env (``env.id`` empty) a learner that trains on a dataset runs without evaluations, its policy sized
    from the dataset (``vla-rl sft`` without ``--env.id``); the training envs are built only for a learner that steps
    them.

    Args:
        cfg: the run.
        hooks: attached after the trainer's own (:mod:`vla_rl.hooks`).
        config: what the checkpoints and the logger record as the run's config instead of ``cfg`` (a command that
            builds ``cfg`` from its own config records its own).
        policy_factory: builds a fresh policy from the env's (or the dataset's) spec, right after the run is seeded,
            in place of ``build_policy(cfg.policy, spec)`` (e.g. a policy sized from a dataset, not the env).
        evaluate_start: evaluate the policy before training (a fresh run; the ``before`` result).
    """

    def __init__(self, cfg: TrainConfig, hooks: Sequence[Hook] = (), config: dict[str, Any] | None = None,
                 policy_factory: Callable[[EnvSpec], Policy] | None = None, evaluate_start: bool = True) -> None:
        """Check what can be checked before any env is built.

        Raises:
            ConfigError: for a ``policy.path`` that is not a folder.
            RegistryError: for an unknown ``algo.type``.
        """
        if cfg.policy.path and not Path(cfg.policy.path).is_dir():
            raise ConfigError(f"policy.path: {cfg.policy.path} is not a folder; expected a policy folder with "
                              "config.json and model.safetensors (e.g. <run>/checkpoints/best/policy)")
        if cfg.policy.path and cfg.env.id:  # e.g. the quickstart's policy, which reads a wrist camera
            env = cfg.env.with_policy_cameras(checkpoint_cameras(cfg.policy.path), cfg.policy.path)
            cfg = dataclasses.replace(cfg, env=env)
        self.cfg = cfg
        self.hooks = list(hooks)
        self.config = config
        self.policy_factory = policy_factory
        self.evaluate_start = evaluate_start
        self.run_dir = Path(cfg.run_dir) if cfg.run_dir else default_runs_dir() / cfg.run_name
        self.ckpt_dir = self.run_dir / "checkpoints"
        self.learner_cls: type[Learner] = ALGORITHMS.get(cfg.algo.type).obj  # fails before any env is built
        self.dist: Distributed = SINGLE  # the ranks of this run (vla_rl.distributed), found by run()
        self.curriculum: TaskCurriculum | None = None  # set once the env is built (multi-task envs)
        self._saved: Path | None = None  # the last checkpoint this process wrote

    def _config_dict(self) -> dict[str, Any]:
        return self.config if self.config is not None else json.loads(json.dumps(draccus.encode(self.cfg), default=str))

    def _evaluate(self, policy: Policy, env: Any, iteration: int, logger: RunLogger, tag: str) -> EvalResult:
        cfg, dist = self.cfg, self.dist
        policy.eval()
        video = self.run_dir / "videos" / f"eval_{tag}.mp4" if cfg.eval.video and dist.is_main else None

        # Seeded like the env (evaluate_policy): the same policy always scores the same, the before and after
        # evaluations share their flow noise, and the training RNG stream is left untouched.
        tasks = per_task_eval_tasks(cfg, self.curriculum)
        seed, shard = cfg.eval.seed, None
        if tasks is None:  # this rank plays its slice of the evaluation envs; episodes gathered
            shard = EvalShard(cfg.eval_envs, dist.rank * env.num_envs, dist.gather_objects)
            seed += shard.offset
        res = evaluate_policy(env, policy, cfg.eval.episodes, seed, cfg.exec_steps, video,
                              cfg.eval.video_envs, desc=f"eval {tag}", progress=dist.is_main, tasks=tasks,
                              episodes_per_task=cfg.eval.episodes_per_task, shard=shard,
                              first_init=cfg.env.tasks.train_init_states, video_episodes=cfg.eval.video_episodes)
        if res.video:
            logger.log_video(iteration, "eval/video", res.video, env.spec.control_freq)
        return res

    def _own_hooks(self, policy: Policy, env: Any | None) -> list[Hook]:
        """The hooks the config asks for: timing (always; first, so it times what the others add to a stage), the
        weight EMA (``eval.ema``; built before the learner, from the weights as they start), the task curriculum
        (multi-task envs), reward annealing (``reward.anneal``) and reward traces (``reward.save_terms_every``)."""
        cfg = self.cfg
        hooks: list[Hook] = [StageTimer()]
        if cfg.eval.ema:
            hooks.append(WeightEMA(policy, cfg.eval.ema))
        if self.curriculum is not None and env is not None:
            hooks.append(CurriculumHook(self.curriculum, env))
        if cfg.reward.anneal:
            hooks.append(RewardAnnealing(cfg.reward.anneal, cfg.iterations))
        if cfg.reward.save_terms_every:
            algo = json.loads(json.dumps(draccus.encode(cfg), default=str))["algo"]
            hooks.append(RewardTraces(self.run_dir / TRACE_DIR, cfg.reward.save_terms_every, algo))
        return hooks

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
        steps_envs = self.learner_cls.needs.env_rollouts
        if steps_envs and not cfg.env.id:
            raise ConfigError(f"algo.type={cfg.algo.type} trains in an env: pass --env.id")
        env = eval_env = None
        if steps_envs:  # rank r holds envs [r*n, (r+1)*n) of the run, seeded as those envs
            cfg.algo.check_run(dist.shard(cfg.env.num_envs, "env.num_envs"))
            env = cfg.env.make(*dist.env_shard(cfg.env.num_envs, cfg.env.seed))
        try:
            if cfg.env.id:
                eval_env = cfg.env.make(*dist.env_shard(cfg.eval_envs, cfg.eval.seed, "eval.num_envs"))
            spec = env.spec if env is not None else eval_env.spec if eval_env is not None else self._dataset_spec()
            self.curriculum = task_curriculum(cfg, spec) if cfg.env.id else None
            if self.curriculum is not None and cfg.env.tasks.holdout:  # evaluate on the held-out tasks only
                eval_env.schedule_tasks(weights=(~self.curriculum.train_mask).astype(float))
            state: dict[str, Any] = {}
            if resume_from is not None:
                policy = load_policy(resume_from / ckpt.POLICY_DIR, verify=False)  # resume_checkpoint verified it
                state = ckpt.load_trainer_state(resume_from)
                check_ema_resume(cfg.eval.ema, state.get(WeightEMA.name), resume_from)
            elif self.policy_factory is not None:
                policy = self.policy_factory(spec)
            else:
                policy = build_policy(cfg.policy, spec, smoke=cfg.smoke)
            hooks = self._own_hooks(policy, env) + self.hooks
            for hook in hooks:  # before the learner is built: with --eval.ema the weights as trained go back in
                if hook.name and hook.name in state:
                    try:
                        hook.load_state_dict(state[hook.name])
                    except ValueError as exc:
                        raise ConfigError(f"{resume_from}/trainer.pt, {hook.name!r}: {exc}") from None
            learner: Learner = self.learner_cls(cfg.algo.for_run(cfg.iterations), policy)
            learner.to(dist.device)  # a GPU when there is one, also in a one-process run
            store = self.run_dir / LEARNER_STORE
            learner.use_store(dist.rank_folder(store), cfg.keep_last)
            learner.distribute(dist)  # same initial weights on every rank; from here on each rank draws its own noise
            dist.reseed(cfg.seed, seed_everything)
            start_iter, best = 0, None
            env_steps = 0
            if resume_from is not None:
                learner.load_state_dict(state["learner"])
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
                engine = None
                if env is not None:
                    engine = RolloutEngine(env, policy, cfg.exec_steps, use_critic=learner.uses_critic,
                                           reward=cfg.reward)
                    learner.check_env(env.spec, engine.exec_steps, cfg.reset_every_iteration)
                    engine.total_env_steps = env_steps // dist.world_size  # this rank's share of the run's env steps
                data = self._offline_data(learner, policy)
                run = RunContext(cfg, self.run_dir, policy, learner, env, eval_env, engine, dist, logger, start_iter,
                                 data)
                return self._loop(run, hooks, best)
            finally:
                logger.close()
        finally:
            for e in (env, eval_env):
                if e is not None:
                    e.close()

    def _dataset_spec(self) -> EnvSpec:
        """The spec a policy is sized from in a run without an env: the ``data.path`` dataset's.

        Raises:
            ConfigError: without ``data.path``.
        """
        if not self.cfg.data.path:
            raise ConfigError("env.id is empty: pass --env.id, or --data.path for a learner that trains on a dataset")
        return dataset_spec(self.cfg.data.path).env_spec()

    def _loop(self, run: RunContext, hooks: list[Hook], best: float | None) -> dict[str, Any]:
        """Evaluate the start (a fresh run), then iterate: collect, update, evaluate, log, checkpoint."""
        cfg, dist = self.cfg, run.dist
        for hook in hooks:
            hook.start(run)
        first = last = None
        if run.start_iteration == 0 and self.evaluate_start and _evaluates(run):
            with _stage(hooks, "evaluate"):
                first = self._evaluate(run.policy, run.eval_env, 0, run.logger, "iter_000000")
            run.logger.log(0, first.scalars())
            self._write_eval(first, "before")
        bar = tqdm(range(run.start_iteration, cfg.iterations), desc="train", unit="it", initial=run.start_iteration,
                   total=cfg.iterations, disable=not dist.is_main)
        for it in bar:
            result = self._iteration(run, hooks, it, it + 1 == cfg.iterations)
            ends = result.last | any([hook.ends_run(it) for hook in hooks])  # every hook asked
            if ends and result.evaluation is None and _evaluates(run):  # a hook ended the run: evaluate it all the same
                with _stage(hooks, "evaluate"):
                    result.evaluation = self._evaluate(run.policy, run.eval_env, result.env_steps, run.logger,
                                                       f"iter_{it + 1:06d}")
                run.logger.log(result.env_steps, result.evaluation.scalars())
            last = result.evaluation or last
            shown = {"success": "rollout/success", "ret": "rollout/return", "loss": "update/loss"}
            bar.set_postfix(**{k: f"{result.scalars[m]:.3g}" for k, m in shown.items() if m in result.scalars},
                            eval=f"{last.success_rate:.2f}" if last else "-", time=time_summary(result.scalars))
            if ends or (it + 1) % cfg.checkpoint_every == 0:
                best = self._checkpoint(run, hooks, result, best)
            if ends:
                break
        bar.close()
        if last is None and run.start_iteration == cfg.iterations == 0:  # nothing trained: the start is the result
            last = first
        if last is not None:
            self._write_eval(last, "after")
        out = {"before": first, "after": last, "run_dir": str(self.run_dir), "env_steps": _env_steps(run.engine),
               "main": dist.is_main, "device": str(dist.device), "checkpoint": self._saved}
        for hook in hooks:
            hook.end(out)
        return out

    def _iteration(self, run: RunContext, hooks: list[Hook], it: int, last: bool) -> IterationResult:
        """One iteration ``it`` up to its logged row: collect, update, evaluate (every ``eval.every`` and the
        ``last``), log, and the hooks in between."""
        cfg, learner = self.cfg, run.learner
        for hook in hooks:
            hook.before_iteration(it)
        done = it + 1
        evaluates = _evaluates(run) and (last or bool(cfg.eval.every and done % cfg.eval.every == 0))
        base, _ = training_seed_range(cfg, it)
        run.policy.train()
        envs = run.env.num_envs if run.env is not None else 0
        inputs = IterationInputs(iteration=it, seed_base=run.dist.seed_base(base, envs),
                                 reset=cfg.reset_every_iteration, data=run.data, sync=evaluates,
                                 engine=run.engine if learner.needs.env_rollouts else None)
        with _stage(hooks, "collect"), torch_threads(cfg.threads.rollout):
            batch = learner.collect(inputs)
        with _stage(hooks, "update"), torch_threads(cfg.threads.update):
            stats = learner.update(batch)
        result = self._result(run, it, batch, stats, last)
        for hook in hooks:
            hook.after_update(result)
        if evaluates:
            with _stage(hooks, "evaluate"):
                result.evaluation = self._evaluate(run.policy, run.eval_env, result.env_steps, run.logger,
                                                   f"iter_{done:06d}")
            result.scalars.update(result.evaluation.scalars())
        for hook in hooks:
            hook.before_log(result)
        with _stage(hooks, "log"):
            run.logger.log(result.env_steps, result.scalars)
        for hook in hooks:
            if done % hook.every == 0:
                hook.after_round(done // hook.every - 1, result)
        return result

    def _result(self, run: RunContext, it: int, batch: Any, stats: dict[str, float], last: bool) -> IterationResult:
        """The iteration's row so far: the learner's statistics averaged over the ranks, and for a rollout every
        rank's ended episodes with their ``rollout/*`` statistics and this rank's ``reward/*`` terms."""
        dist = run.dist
        scalars = dist.merge_scalars(stats)
        rollout = batch if isinstance(batch, Rollout) else None
        episodes: list[EpisodeRecord] = []
        if rollout is not None:
            episodes = dist.gather_objects(list(rollout.episodes))  # every rank's, so the curriculum agrees
            scalars = {**rollout_scalars(rollout, episodes), **scalars}
        step = dist.total(_env_steps(run.engine))
        return IterationResult(iteration=it, batch=batch, scalars=scalars, rollout=rollout, episodes=episodes,
                               env_steps=step, last=last)

    def _checkpoint(self, run: RunContext, hooks: list[Hook], result: IterationResult,
                    best: float | None) -> float | None:
        """Write the checkpoint after ``result``'s iteration (rank 0; every rank's RNG and learner state in it) and
        mark it best when its evaluation beats ``best``; returns the best success so far."""
        dist, learner, done = run.dist, run.learner, result.iteration + 1
        state = {"learner": learner.state_dict(), "rng": ckpt.rng_state(), "iteration": done,
                 "env_steps": result.env_steps}
        if dist.enabled:  # every rank's RNG and own learner state; rank 0 writes them all
            state["ranks"] = dist.all_objects({"rng": state["rng"], "learner": learner.rank_state()})
        if not dist.is_main:
            return best
        with _stage(hooks, "checkpoint"):  # the policy folder holds what was evaluated (the EMA's average)
            state.update({hook.name: hook.state_dict() for hook in hooks if hook.name})
            saved = ckpt.save_checkpoint(self.ckpt_dir, done, run.policy, state, self._config_dict(),
                                         self.cfg.keep_last)
        self._saved = saved
        res = result.evaluation
        if res is not None and (best is None or res.success_rate > best):
            best = res.success_rate
            ckpt.mark_best(self.ckpt_dir, saved, best)
        return best

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


def _evaluates(run: RunContext) -> bool:
    """Whether the run evaluates at all: it has an env and ``eval.episodes`` (0: a hook evaluates, or nothing)."""
    return run.eval_env is not None and run.cfg.eval.episodes > 0


def _env_steps(engine: RolloutEngine | None) -> int:
    """This rank's env steps so far (0 in a run that steps no env)."""
    return engine.total_env_steps if engine is not None else 0


@contextlib.contextmanager
def _stage(hooks: Sequence[Hook], name: str) -> Iterator[None]:
    """Pipeline stage ``name`` inside every hook's :meth:`Hook.stage` context, nested in list order."""
    with contextlib.ExitStack() as stack:
        for hook in hooks:
            stack.enter_context(hook.stage(name))
        yield


class _NullLogger:
    """The logger of ranks other than 0 (rank 0 alone writes ``metrics.jsonl``, TensorBoard and wandb)."""

    def log(self, step: int, scalars: dict[str, float]) -> None:
        pass

    def log_video(self, step: int, key: str, path: Any, fps: float) -> None:
        pass

    def close(self) -> None:
        pass
