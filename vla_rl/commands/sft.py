"""``vla-rl sft``: supervised pre-training of any registered policy on any LeRobotDataset folder.

    vla-rl sft --dataset data/mujoco-pick-any-expert-s0 --policy.type compact-flow --steps 1000 --episodes 20 \\
        --output runs/sft-pick-any [--env.id mujoco/pick-any --env.obs_mode rgb]

A fresh policy is sized from the dataset's features (``--policy.path`` starts
from a checkpoint instead); the features it reads are matched by name and their
shapes checked. Training is the ``sft`` learner (:mod:`vla_rl.algorithms.sft`)
in the trainer that runs ``vla-rl train``, one gradient step per iteration
(:func:`pretrain`). The policy folder (``save_pretrained`` plus ``sft.json``) is
written atomically. With ``--env.id`` the trained policy is evaluated there
(deterministic actions, held-out seeds), and ``--stop_at_success`` can end
training at a success check as in the quickstart.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from policies.base import Policy
from sim.core import EnvSpec
from vla_rl.algorithms.sft import SFTConfig, save_sft_policy
from vla_rl.commands import COMMANDS
from vla_rl.config import ConfigError, EnvConfig, default_runs_dir
from vla_rl.data import dataset_spec
from vla_rl.evaluation import evaluate_policy
from vla_rl.hooks import Hook, IterationResult, RunContext
from vla_rl.policy_factory import build_policy
from vla_rl.run_logging import LoggingConfig
from vla_rl.train_config import EVAL_SEED_BASE, POLICY_CHOICES, SEED_BLOCK, DataConfig, EvalConfig, PolicyConfig, \
    TrainConfig, policy_type
from vla_rl.trainer import Trainer


def _no_env() -> EnvConfig:
    return EnvConfig(id="")


def _default_policy() -> PolicyConfig:
    return POLICY_CHOICES["compact-flow"]()


@dataclass
class SFTRunConfig(SFTConfig):
    """``vla-rl sft``: supervised pre-training on a LeRobotDataset folder (the SFT settings are top-level fields)."""

    steps: int = 1500
    """Gradient steps."""
    dataset: str = ""
    """LeRobotDataset folder (written by ``vla-rl collect`` or LeRobot's tools); required."""
    policy: PolicyConfig = field(default_factory=_default_policy)
    """The policy: ``--policy.type`` picks a registered one (sized from the dataset), ``--policy.path`` a checkpoint."""
    env: EnvConfig = field(default_factory=_no_env)
    """Optional env for a success evaluation after training (and the checks of ``stop_at_success``);
    ``--env.id`` empty = none."""
    eval_episodes: int = 20
    """Episodes of the final evaluation (with ``--env.id``)."""
    exec_steps: int = 0
    """Actions of each chunk executed per decision in the env; 0 = the whole chunk."""
    output: str = ""
    """Policy folder to write (must not exist); empty = ``runs/sft-<dataset folder>-<policy type>-s<seed>``."""
    seed: int = 0
    """Seed of the initial weights, the minibatches, the augmentation and the evaluation seeds."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.stop_at_success and not self.env.id:
            raise ValueError("stop_at_success needs an env for its success checks: pass --env.id")
        if self.eval_episodes < 1:
            raise ValueError(f"eval_episodes must be >= 1, got {self.eval_episodes}")
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")

    @property
    def eval_seed(self) -> int:
        """Base seed of the final evaluation: ``vla-rl train``'s default (far from any training seed)."""
        return EVAL_SEED_BASE + self.seed * SEED_BLOCK

    @property
    def check_seed(self) -> int:
        """Base seed of the success checks: the second half of the evaluation seed block (as the quickstart's)."""
        return self.eval_seed + SEED_BLOCK // 2


class _SuccessCheck(Hook):
    """Pre-training's early stop: every ``check_every`` steps from ``check_from`` on (before the last), the rate
    ``check(policy)`` returns, with the policy in eval mode and the RNG states restored afterwards (training goes on
    as without the check); the run ends at the first check that reaches ``stop_at_success``."""

    def __init__(self, cfg: SFTConfig, check: Callable[[Policy], float]) -> None:
        self.cfg = cfg
        self.check = check
        self.policy: Policy | None = None
        self.last: float | None = None

    def start(self, run: RunContext) -> None:
        self.policy = run.policy

    def ends_run(self, iteration: int) -> bool:
        cfg, done = self.cfg, iteration + 1
        if not (cfg.check_from <= done < cfg.steps and (done - cfg.check_from) % cfg.check_every == 0):
            return False
        assert self.policy is not None
        self.policy.eval()
        try:
            with torch.random.fork_rng(), torch.no_grad():
                self.last = float(self.check(self.policy))
        finally:
            self.policy.train()
        print(f"pre-train step {done}: success check {self.last:.2f} (stop at {cfg.stop_at_success:g})", flush=True)
        return self.last >= cfg.stop_at_success


class _Losses(Hook):
    """Keeps each step's loss (one step per iteration), the trained policy and the dataset's size for ``sft.json``."""

    def __init__(self) -> None:
        self.losses: list[float] = []
        self.run: RunContext | None = None

    def start(self, run: RunContext) -> None:
        self.run = run

    def after_update(self, result: IterationResult) -> None:
        self.losses.append(result.scalars["update/loss"])

    def stats(self) -> dict[str, float]:
        """``sft/loss_first`` / ``sft/loss_last``: the loss means over the first / last 10% of steps; ``sft/steps``."""
        k = max(1, len(self.losses) // 10)
        return {"sft/loss_first": sum(self.losses[:k]) / k, "sft/loss_last": sum(self.losses[-k:]) / k,
                "sft/steps": len(self.losses)}


def pretrain(sft: SFTConfig, dataset: str | Path, policy_factory: Callable[[EnvSpec], Policy], seed: int = 0,
             policy: PolicyConfig | None = None, env: EnvConfig | None = None, eval_episodes: int = 0,
             eval_seed: int | None = None, exec_steps: int = 0,
             success_check: Callable[[Policy], float] | None = None) -> tuple[Policy, dict[str, Any]]:
    """Pre-train a fresh policy on the LeRobotDataset at ``dataset``: the ``sft`` learner in :class:`Trainer`, one
    gradient step per iteration for ``sft.steps`` steps on its first ``sft.episodes`` episodes (0 = all), seeded
    with ``seed``; the trainer's run folder is temporary.

    Args:
        sft: the settings (``steps``, ``batch_size``, ``lr``, ``ema``, ``stop_at_success`` with its checks, ...).
        policy_factory: builds the policy from the dataset's spec (or the env's, with ``env``), once the run is
            seeded.
        policy: what the run records as its policy config (the factory's).
        env: an env to evaluate the trained policy in (``eval_episodes`` on seeds from ``eval_seed``); None: none.
        success_check: with ``sft.stop_at_success``, ``check(policy) -> success rate`` every ``sft.check_every``
            steps from ``sft.check_from`` on; training stops at the first that reaches ``sft.stop_at_success``.

    Returns:
        The trained policy (the average of its weights with ``sft.ema``) and its statistics: ``sft/loss_first``,
        ``sft/loss_last``, ``sft/steps``, ``sft/check_success`` (of the last check, when one ran), ``frames``,
        ``episodes``, ``dataset`` (the absolute path) and the evaluation's result under ``evaluation``.

    Raises:
        DatasetError: naming ``dataset`` and the feature, for a folder that is no LeRobotDataset, a feature the
            policy reads but the dataset lacks, a shape mismatch (both shapes), or too few episodes.
    """
    if sft.steps < 1:
        raise ConfigError(f"SFT steps must be >= 1 for pre-training, got {sft.steps}")
    algo = dataclasses.replace(sft, steps_per_iter=1)
    losses = _Losses()
    hooks: list[Hook] = [losses]
    checks = _SuccessCheck(sft, success_check) if success_check is not None and sft.stop_at_success else None
    if checks is not None:
        hooks.append(checks)
    with tempfile.TemporaryDirectory(prefix="sft-run-") as run_dir:
        cfg = TrainConfig(
            env=env if env is not None else _no_env(), policy=policy if policy is not None else _default_policy(),
            algo=SFTConfig(**{f.name: getattr(algo, f.name) for f in dataclasses.fields(SFTConfig)}),
            data=DataConfig(path=str(dataset), episodes=sft.episodes), iterations=sft.steps, seed=seed,
            run_dir=run_dir, exec_steps=exec_steps, checkpoint_every=sft.steps, keep_last=1,
            eval=EvalConfig(episodes=eval_episodes if env is not None else 0, every=0, video=False, seed=eval_seed),
            logging=LoggingConfig(wandb=False, tensorboard=False))
        result = Trainer(cfg, hooks, policy_factory=policy_factory, evaluate_start=False).run()
    assert losses.run is not None and losses.run.data is not None
    data = losses.run.data
    stats: dict[str, Any] = losses.stats()
    if checks is not None and checks.last is not None:
        stats["sft/check_success"] = checks.last
    stats.update(frames=len(data), episodes=data.episodes, dataset=str(Path(dataset).resolve()),
                 evaluation=result["after"])
    return losses.run.policy, stats


def _success_check(cfg: SFTRunConfig, env: EnvConfig, stack: contextlib.ExitStack) -> Callable[[Policy], float]:
    """The success check of ``stop_at_success``: ``check_episodes`` episodes in ``env`` from ``check_seed`` (the env
    built on the first check, closed by ``stack``)."""
    envs: list[Any] = []

    def check(policy: Policy) -> float:
        if not envs:
            envs.append(stack.enter_context(env.make(seed=cfg.check_seed)))
        return evaluate_policy(envs[0], policy, cfg.check_episodes, cfg.check_seed, cfg.exec_steps,
                               desc="success check", progress=False).success_rate

    return check


def _output_dir(cfg: SFTRunConfig) -> Path:
    if cfg.output:
        return Path(cfg.output)
    name = Path(cfg.dataset).resolve().name
    return default_runs_dir() / f"sft-{name}-{policy_type(cfg.policy)}-s{cfg.seed}"


@COMMANDS.register("sft", config=SFTRunConfig, help="supervised pre-training of any policy on a LeRobotDataset")
def sft(cfg: SFTRunConfig) -> dict[str, Any]:
    """Train, optionally evaluate, save; returns the statistics written to ``sft.json``.

    Raises:
        ConfigError: without ``--dataset``; DatasetError (a ConfigError) for a folder that is no dataset, a
            missing feature or a shape mismatch.
        FileExistsError: when the output folder exists.
    """
    if not cfg.dataset:
        raise ConfigError("--dataset is required: a LeRobotDataset folder (from `vla-rl collect` or LeRobot's tools)")
    spec = dataset_spec(cfg.dataset)
    out = _output_dir(cfg)
    if out.exists():
        raise FileExistsError(f"{out} exists; remove it or pass another --output")
    env = cfg.env.with_policy_cameras(spec.cameras, "the dataset") if cfg.env.id else None
    with contextlib.ExitStack() as stack:
        check = _success_check(cfg, env, stack) if env is not None and cfg.stop_at_success else None
        policy, stats = pretrain(cfg, cfg.dataset, lambda _: build_policy(cfg.policy, spec.env_spec()), seed=cfg.seed,
                                 policy=cfg.policy, env=env, eval_episodes=cfg.eval_episodes, eval_seed=cfg.eval_seed,
                                 exec_steps=cfg.exec_steps, success_check=check)
    res = stats.pop("evaluation")
    stats.update(policy=policy_type(cfg.policy))
    if res is not None:
        stats.update({"eval/success": res.success_rate, "eval/episodes": res.episodes, "eval/env": cfg.env.id,
                      "eval/ci": [res.ci_low, res.ci_high]})
    save_sft_policy(policy, out, stats)
    line = (f"sft: {stats['sft/steps']} steps on {stats['frames']} frames of {stats['episodes']} episodes, "
            f"loss {stats['sft/loss_first']:.4f} -> {stats['sft/loss_last']:.4f}")
    if "eval/success" in stats:
        line += f"; success {stats['eval/success']:.2f} over {stats['eval/episodes']} episodes of {cfg.env.id}"
    print(f"{line}; policy -> {out}", flush=True)
    return {**stats, "output": str(out)}
