"""The training loop: collect, update, evaluate, log, checkpoint, resume.

The trainer wires registered pieces together and never branches on the model
type: the policy comes from :data:`policies.registry.POLICIES`, the learner
from :data:`vla_rl.algorithms.learners.ALGORITHMS`.
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
from policies.io import checkpoint_cameras, checkpoint_config, load_policy
from policies.registry import POLICIES
from sim.core import OBS_ENV_STATE, OBS_STATE, EnvSpec
from vla_rl import checkpoint as ckpt
from vla_rl.algorithms.learners import ALGORITHMS, Learner
from vla_rl.config import ConfigError, default_runs_dir
from vla_rl.evaluation import EvalResult, evaluate_policy
from vla_rl.rollout import RolloutEngine, reward_scalars
from vla_rl.run_logging import RunLogger
from vla_rl.smoke import apply_smoke, build_smoke_policy
from vla_rl.train_config import TrainConfig, policy_options, policy_type, training_seed_range


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def spec_fields(spec: EnvSpec) -> dict[str, Any]:
    """Policy config values derived from an env spec (by the conventional field names)."""
    out: dict[str, Any] = {"action_dim": spec.action_dim, "cameras": tuple(spec.cameras)}
    if OBS_STATE in spec.observation:
        out["state_dim"] = spec.observation[OBS_STATE].shape[0]
    if OBS_ENV_STATE in spec.observation:
        out["env_state_dim"] = spec.observation[OBS_ENV_STATE].shape[0]
    if spec.image_keys:
        out["image_size"] = tuple(spec.observation[spec.image_keys[0]].shape[:2])
    return out


def build_policy(cfg: TrainConfig, spec: EnvSpec) -> Policy:
    """A fresh policy sized for ``spec``, or the checkpoint at ``policy.path`` (with this run's ``policy.sampler``,
    which ``vla-rl train`` starts from the checkpoint's).

    With ``cfg.smoke``, policies that :mod:`vla_rl.smoke` replaces by a tiny offline model come from there.
    """
    options = policy_options(cfg.policy)
    if cfg.policy.path:
        overrides = {"sampler": options["sampler"]} if "sampler" in options else {}
        _note_sampler_change(cfg.policy.path, overrides.get("sampler"))
        return load_policy(cfg.policy.path, **overrides)
    name = policy_type(cfg.policy)
    tiny = build_smoke_policy(name, options, spec) if cfg.smoke else None
    if tiny is not None:
        return tiny
    entry = POLICIES.get(name)
    names = {f.name for f in dataclasses.fields(entry.config)}
    derived = spec_fields(spec)
    chosen = options.get("cameras")
    default = next((f.default for f in dataclasses.fields(entry.config) if f.name == "cameras"), None)
    # an explicit selection of the env's cameras is kept; the config's default means "all of the env's"
    if chosen and tuple(chosen) != default and set(chosen) <= set(derived["cameras"]):
        derived["cameras"] = tuple(chosen)
    options.update({k: v for k, v in derived.items() if k in names})
    return entry.obj(entry.config(**options))


def _note_sampler_change(path: str, sampler: Any) -> None:
    """Say so when this run samples ``policy.path`` with another sampler than the one saved with it.

    ``vla-rl train`` starts ``policy.sampler`` from the checkpoint's (see ``vla_rl.cli``), so this happens when
    the command line or preset changes it, or when a config built in code does not start from it.
    """
    if sampler is None:
        return
    saved = checkpoint_config(path).get("sampler")
    mine = json.loads(json.dumps(draccus.encode(sampler)))  # encoded as checkpoints save their config
    if isinstance(saved, dict) and saved != mine:
        changed = ", ".join(f"{k}={saved.get(k)!r} -> {v!r}" for k, v in mine.items() if saved.get(k) != v)
        print(f"note: policy.path {path}: sampling with another policy.sampler than the checkpoint was saved "
              f"with ({changed})", flush=True)


def check_episode_fits(cfg: TrainConfig, spec: EnvSpec, exec_steps: int) -> None:
    """With ``reset_every_iteration``, one iteration must cover a whole episode of ``spec``.

    Raises:
        ConfigError: naming ``algo.decisions_per_iter`` and the episode length.
    """
    horizon = cfg.algo.decisions_per_iter * exec_steps
    if cfg.reset_every_iteration and horizon < spec.max_episode_steps:
        raise ConfigError(
            f"algo.decisions_per_iter ({cfg.algo.decisions_per_iter}) x exec steps ({exec_steps}) = {horizon} "
            f"env steps per iteration is shorter than an episode of {spec.env_id} ({spec.max_episode_steps} "
            "steps): with reset_every_iteration no episode could finish. Raise algo.decisions_per_iter or "
            "lower env.max_episode_steps."
        )


class Trainer:
    """Run :class:`TrainConfig` (see module doc). ``run()`` returns the final evaluation."""

    def __init__(self, cfg: TrainConfig) -> None:
        cfg = apply_smoke(cfg)
        if cfg.policy.path:  # e.g. the quickstart's policy, which reads a wrist camera
            env = cfg.env.with_policy_cameras(checkpoint_cameras(cfg.policy.path), cfg.policy.path)
            cfg = dataclasses.replace(cfg, env=env)
        self.cfg = cfg
        self.run_dir = Path(cfg.run_dir) if cfg.run_dir else default_runs_dir() / cfg.run_name
        self.ckpt_dir = self.run_dir / "checkpoints"
        self.learner_cls = ALGORITHMS.get(cfg.algo.name).obj  # fails before any env is built

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
        resume_from = ckpt.latest_checkpoint(self.ckpt_dir) if cfg.resume else None
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
                policy = load_policy(resume_from / "policy")
            else:
                policy = build_policy(cfg, env.spec)
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
        check_episode_fits(cfg, env.spec, engine.exec_steps)
        engine.total_env_steps = env_steps
        first = last = None
        if start_iter == 0:
            first = self._evaluate(policy, eval_env, 0, logger, "iter_000000")
            logger.log(0, first.scalars())
            self._write_eval(first, "before")
        bar = tqdm(range(start_iter, cfg.iterations), desc="train", unit="it", initial=start_iter, total=cfg.iterations)
        for it in bar:
            t0 = time.perf_counter()
            base, _ = training_seed_range(cfg, it)
            n_groups = max(1, env.num_envs // cfg.algo.group_size)
            seeds = [base + g for g in range(n_groups)]
            if cfg.reset_every_iteration and cfg.algo.name != "grpo":
                engine.reset(seed=base)
            policy.train()
            rollout = learner.collect(engine, seeds)
            t1 = time.perf_counter()
            stats = learner.update(rollout)
            t2 = time.perf_counter()
            eps = rollout.episodes
            scalars = {
                "rollout/episodes": float(len(eps)),
                "rollout/success": sum(e.success for e in eps) / len(eps) if eps else float("nan"),
                "rollout/return": sum(e.ret for e in eps) / len(eps) if eps else float("nan"),
                "rollout/length": sum(e.length for e in eps) / len(eps) if eps else float("nan"),
                "time/rollout_s": t1 - t0, "time/update_s": t2 - t1,
                "time/env_steps_per_s": rollout.env_steps / max(t1 - t0, 1e-9),
                **reward_scalars(rollout),
                **stats,
            }
            step = engine.total_env_steps
            done_iter = it + 1
            is_last = done_iter == cfg.iterations
            if is_last or (cfg.eval.every and done_iter % cfg.eval.every == 0):
                res = self._evaluate(policy, eval_env, step, logger, f"iter_{done_iter:06d}")
                scalars.update(res.scalars())
                last = res
            logger.log(step, scalars)
            bar.set_postfix(success=f"{scalars['rollout/success']:.2f}", ret=f"{scalars['rollout/return']:.2f}",
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

    def _write_eval(self, res: EvalResult, tag: str) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / f"eval_{tag}.json").write_text(json.dumps(dataclasses.asdict(res), indent=2))
