"""The training loop: collect, update, evaluate, log, checkpoint, resume.

The trainer wires registered pieces together and never names a policy type or
an algorithm: the policy comes from :mod:`vla_rl.policy_factory` (the policy
registry), the learner from :data:`vla_rl.algorithms.base.ALGORITHMS`, and each
iteration reads ``batch = learner.collect(inputs)``, ``stats = learner.update(batch)``,
then evaluates, logs and checkpoints. What a learner needs from the loop
(:class:`vla_rl.algorithms.base.Needs`) decides what the loop builds for it.
"""

from __future__ import annotations

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
from vla_rl import checkpoint as ckpt
from vla_rl.algorithms.base import ALGORITHMS, IterationInputs, Learner, Needs
from vla_rl.config import ConfigError, default_runs_dir
from vla_rl.data import ChunkDataset, load_chunks, policy_inputs
from vla_rl.evaluation import EvalResult, evaluate_policy
from vla_rl.policy_factory import build_policy
from vla_rl.reweigh import TRACE_DIR, save_reward_trace
from vla_rl.rollout import Rollout, RolloutEngine, reward_scalars
from vla_rl.run_logging import RunLogger
from vla_rl.train_config import TrainConfig, training_seed_range


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rollout_scalars(rollout: Rollout) -> dict[str, float]:
    """Episode statistics and per-term rewards of a rollout, for logging (``rollout/*``, ``reward/*``)."""
    eps = rollout.episodes
    nan = float("nan")
    return {
        "rollout/episodes": float(len(eps)),
        "rollout/success": sum(e.success for e in eps) / len(eps) if eps else nan,
        "rollout/return": sum(e.ret for e in eps) / len(eps) if eps else nan,
        "rollout/length": sum(e.length for e in eps) / len(eps) if eps else nan,
        **reward_scalars(rollout),
    }


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

    def _config_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(draccus.encode(self.cfg), default=str))

    def _evaluate(self, policy: Policy, env: Any, iteration: int, logger: RunLogger, tag: str) -> EvalResult:
        cfg = self.cfg
        policy.eval()
        video = self.run_dir / "videos" / f"eval_{tag}.mp4" if cfg.eval.video else None

        # Seeded like the env (evaluate_policy): the same policy always scores the same, the before and after
        # evaluations share their flow noise, and the training RNG stream is left untouched.
        res = evaluate_policy(env, policy, cfg.eval.episodes, cfg.eval.seed, cfg.exec_steps, video,
                              cfg.eval.video_envs, desc=f"eval {tag}")
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
        seed_everything(cfg.seed)
        env = cfg.env.make()
        eval_env = None
        try:
            eval_env = cfg.env.make(num_envs=cfg.eval.num_envs or cfg.env.num_envs, seed=cfg.eval.seed)
            if resume_from is not None:
                policy = load_policy(resume_from / ckpt.POLICY_DIR, verify=False)  # resume_checkpoint verified it
            else:
                policy = build_policy(cfg.policy, env.spec, smoke=cfg.smoke)
            learner: Learner = self.learner_cls(cfg.algo, policy)
            start_iter, best = 0, None
            env_steps = 0
            if resume_from is not None:
                state = ckpt.load_trainer_state(resume_from)
                learner.load_state_dict(state["learner"])
                ckpt.set_rng_state(state["rng"])
                start_iter, env_steps = state["iteration"], state["env_steps"]
                best = ckpt.best_metric(self.ckpt_dir)
                print(f"resuming {self.run_dir} at iteration {start_iter} from {resume_from}")
            logger = RunLogger(self.run_dir, cfg.logging, self._config_dict(), resume=resume_from is not None)
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
        engine.total_env_steps = env_steps
        data = self._offline_data(learner, policy)
        first = last = None
        if start_iter == 0:
            first = self._evaluate(policy, eval_env, 0, logger, "iter_000000")
            logger.log(0, first.scalars())
            self._write_eval(first, "before")
        bar = tqdm(range(start_iter, cfg.iterations), desc="train", unit="it", initial=start_iter, total=cfg.iterations)
        for it in bar:
            t0 = time.perf_counter()
            base, _ = training_seed_range(cfg, it)
            policy.train()
            inputs = IterationInputs(iteration=it, seed_base=base, reset=cfg.reset_every_iteration,
                                     engine=engine if learner.needs.env_rollouts else None, data=data)
            batch = learner.collect(inputs)
            t1 = time.perf_counter()
            stats = learner.update(batch)
            t2 = time.perf_counter()
            scalars = {**(rollout_scalars(batch) if isinstance(batch, Rollout) else {}),
                       "time/rollout_s": t1 - t0, "time/update_s": t2 - t1, **stats}
            if isinstance(batch, Rollout):
                scalars["time/env_steps_per_s"] = batch.env_steps / max(t1 - t0, 1e-9)
            step = engine.total_env_steps
            done_iter = it + 1
            is_last = done_iter == cfg.iterations
            if is_last or (cfg.eval.every and done_iter % cfg.eval.every == 0):
                res = self._evaluate(policy, eval_env, step, logger, f"iter_{done_iter:06d}")
                scalars.update(res.scalars())
                last = res
            logger.log(step, scalars)
            every = cfg.reward.save_terms_every
            if isinstance(batch, Rollout) and every and done_iter % every == 0:  # for `vla-rl reward reweigh`
                save_reward_trace(batch, self.run_dir / TRACE_DIR / f"iter_{done_iter:06d}.pt",
                                  self._config_dict()["algo"], cfg.reward.weights())
            shown = {"success": "rollout/success", "ret": "rollout/return", "loss": "update/loss"}
            bar.set_postfix(**{k: f"{scalars[m]:.3g}" for k, m in shown.items() if m in scalars},
                            eval=f"{last.success_rate:.2f}" if last else "-")
            if is_last or done_iter % cfg.checkpoint_every == 0:
                saved = ckpt.save_checkpoint(self.ckpt_dir, done_iter, policy, {
                    "learner": learner.state_dict(), "rng": ckpt.rng_state(),
                    "iteration": done_iter, "env_steps": step,
                }, self._config_dict(), cfg.keep_last)
                if last is not None and (best is None or last.success_rate > best) and "eval/success" in scalars:
                    best = last.success_rate
                    ckpt.mark_best(self.ckpt_dir, saved, best)
        bar.close()
        if last is not None:
            self._write_eval(last, "after")
        return {"before": first, "after": last, "run_dir": str(self.run_dir), "env_steps": engine.total_env_steps}

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
        return load_chunks(cfg.data.path, policy_inputs(policy), policy.chunk_size, cfg.data.episodes)

    def _write_eval(self, res: EvalResult, tag: str) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / f"eval_{tag}.json").write_text(json.dumps(dataclasses.asdict(res), indent=2))
