"""``vla-rl sft``: supervised pre-training of any registered policy on any LeRobotDataset folder.

    vla-rl sft --dataset data/mujoco-pick-any-expert-s0 --policy.type compact-flow --steps 1000 --episodes 20 \\
        --output runs/sft-pick-any [--env.id mujoco/pick-any --env.obs_mode rgb]

A fresh policy is sized from the dataset's features (``--policy.path`` starts
from a checkpoint instead); the features it reads are matched by name and their
shapes checked. The policy folder (``save_pretrained`` plus ``sft.json``) is
written atomically. With ``--env.id`` the trained policy is evaluated there
(deterministic actions, held-out seeds), and ``--stop_at_success`` can end
training at a success check as in the quickstart.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from vla_rl.commands import COMMANDS
from vla_rl.config import ConfigError, EnvConfig, default_runs_dir
from vla_rl.data import dataset_spec, policy_inputs
from vla_rl.evaluation import evaluate_policy
from vla_rl.sft import SFTConfig, pretrain_on_dataset, save_sft_policy
from vla_rl.train_config import EVAL_SEED_BASE, POLICY_CHOICES, SEED_BLOCK, PolicyConfig, policy_type
from vla_rl.policy_factory import build_policy
from vla_rl.trainer import seed_everything


def _no_env() -> EnvConfig:
    return EnvConfig(id="")


def _default_policy() -> PolicyConfig:
    return POLICY_CHOICES["compact-flow"]()


@dataclass
class SFTRunConfig(SFTConfig):
    """``vla-rl sft``: supervised pre-training on a LeRobotDataset folder (the SFT settings are top-level fields)."""

    flags: ClassVar[str] = ""

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

    @property
    def eval_seed(self) -> int:
        """Base seed of the final evaluation: ``vla-rl train``'s default (far from any training seed)."""
        return EVAL_SEED_BASE + self.seed * SEED_BLOCK

    @property
    def check_seed(self) -> int:
        """Base seed of the success checks: the second half of the evaluation seed block (as the quickstart's)."""
        return self.eval_seed + SEED_BLOCK // 2


def _output_dir(cfg: SFTRunConfig) -> Path:
    if cfg.output:
        return Path(cfg.output)
    name = Path(cfg.dataset).resolve().name
    return default_runs_dir() / f"sft-{name}-{policy_type(cfg.policy)}-s{cfg.seed}"


def _env_runner(cfg: SFTRunConfig, policy: Any, stack: contextlib.ExitStack) -> Callable[[int, int, str], Any]:
    """``run(episodes, seed, desc) -> EvalResult`` in ``cfg.env`` (built on first use, closed by ``stack``)."""
    envs: list[Any] = []

    def run(episodes: int, seed: int, desc: str) -> Any:
        if not envs:
            env_cfg = cfg.env.with_policy_cameras(policy_inputs(policy).cameras, "the policy")
            envs.append(stack.enter_context(env_cfg.make(seed=seed)))
        return evaluate_policy(envs[0], policy, episodes, seed, cfg.exec_steps, desc=desc, progress=desc == "eval")

    return run


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
    seed_everything(cfg.seed)
    policy = build_policy(cfg.policy, spec.env_spec())
    with contextlib.ExitStack() as stack:
        run = _env_runner(cfg, policy, stack) if cfg.env.id else None
        check = (lambda: run(cfg.check_episodes, cfg.check_seed, "success check").success_rate) if run else None
        stats: dict[str, Any] = pretrain_on_dataset(policy, cfg.dataset, cfg, seed=cfg.seed, success_check=check)
        stats.update(policy=policy_type(cfg.policy))
        if run is not None:
            res = run(cfg.eval_episodes, cfg.eval_seed, "eval")
            stats.update({"eval/success": res.success_rate, "eval/episodes": res.episodes, "eval/env": cfg.env.id,
                          "eval/ci": [res.ci_low, res.ci_high]})
    save_sft_policy(policy, out, stats)
    line = (f"sft: {stats['sft/steps']} steps on {stats['frames']} frames of {stats['episodes']} episodes, "
            f"loss {stats['sft/loss_first']:.4f} -> {stats['sft/loss_last']:.4f}")
    if "eval/success" in stats:
        line += f"; success {stats['eval/success']:.2f} over {stats['eval/episodes']} episodes of {cfg.env.id}"
    print(f"{line}; policy -> {out}", flush=True)
    return {**stats, "output": str(out)}

