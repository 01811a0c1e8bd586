"""``vla-rl quickstart``: demos -> few-shot imitation -> RL on its own successes -> report, in one command.

1. collect scripted-expert demos (cached: a second run reuses them);
2. pre-train the compact flow VLA on a few of them (deliberately few-shot);
3. RL on vectorized envs: the policy explores with its Flow-SDE sampler (chains started at zero noise, where the
   deployed policy starts) and imitates the episodes it solved, mixed with the demos (``--algo.type
   filtered_bc``; ``--algo.type ppo`` runs Flow-SDE PPO instead, see docs/results.md "Training the deployed
   policy" for both on the same starts);
4. evaluate before and after on the same held-out seeds (95% Wilson CI);
5. write ``report.md`` / ``report.json``, plots and videos into the run folder.

Ctrl-C during RL leaves the last checkpoint; ``--resume true`` finishes the run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import draccus
import torch

from policies.flow.sampler import InitialNoise, SamplerConfig, SamplerKind, SdeMode
from policies.io import CheckpointError, verify_policy_folder
from sim.dataset import verify_dataset
from vla_core.manifest import IntegrityError, exclusive, move_aside
from vla_rl.algorithms.base import LearnerConfig
from vla_rl.algorithms.filtered_bc import FilteredBCConfig
from vla_rl.algorithms.sft import SFTConfig, save_sft_policy
from vla_rl.commands import COMMANDS
from vla_rl.commands.sft import pretrain
from vla_rl.config import ConfigError, EnvConfig, default_runs_dir
from vla_rl.data import collect_demos
from vla_rl.evaluation import evaluate_policy
from vla_rl.report import make_plots, write_report
from vla_rl.run_logging import LoggingConfig
from vla_rl.threads import ThreadsConfig
from vla_rl.policy_factory import build_policy
from vla_rl.train_config import (
    EVAL_SEED_BASE,
    POLICY_CHOICES,
    SEED_BLOCK,
    EvalConfig,
    PolicyConfig,
    TrainConfig,
    policy_type,
)
from vla_rl.trainer import Trainer


def _maniskill_gpu_ready() -> bool:
    """Whether ManiSkill's GPU backend can run: SAPIEN installed, PhysX's CUDA library in place or fetchable."""
    from sim.backends.maniskill_common import physx_gpu_error

    why = physx_gpu_error()
    if why is not None:
        print(f"note: the quickstart's default env here is the MuJoCo tabletop: ManiSkill's GPU backend is not "
              f"available ({why})")
    return why is None


def _quickstart_env() -> EnvConfig:
    if torch.cuda.is_available() and _maniskill_gpu_ready():  # ManiSkill's GPU backend, more envs
        return EnvConfig(id="maniskill/PickCube-v1", num_envs=64, obs_mode="rgb", image_size=64)
    # Two worker processes step the envs about a third faster than this process alone, with the same episodes.
    workers = 2 if (os.cpu_count() or 1) >= 2 else 0
    return EnvConfig(id="mujoco/pick-any", num_envs=32, obs_mode="rgb", num_workers=workers, wrist_camera=True)


def _quickstart_policy() -> PolicyConfig:
    # exploration chains start where the deployed (zero-noise ODE) policy starts, so the successes it imitates lie
    # around the chunks evaluation plays (docs/results.md, "Training the deployed policy")
    return POLICY_CHOICES["compact-flow"](chunk_size=4, sampler=SamplerConfig(
        kind=SamplerKind.FLOW_SDE, sde_mode=SdeMode.FULL_CHAIN, explore_noise=InitialNoise.ZERO))


def _quickstart_algo() -> LearnerConfig:
    # success-filtered self-imitation: above PPO on every measured seed at the same env steps and wall time
    # (docs/results.md, "Training the deployed policy"); with a second core, each iteration's update trains
    # while the next one collects (docs/results.md, "Training throughput")
    return FilteredBCConfig(overlap=(os.cpu_count() or 1) >= 2)


# Demo action noise per env backend: the MuJoCo tabletop's expert recovers from 0.3 (its action scale); ManiSkill's
# PickCube expert (end-effector deltas in [-1, 1]) fails every episode at 0.3 and succeeds at 0.1.
DEMO_NOISE = {"mujoco": 0.3, "default": 0.1}
# Demos are collected on this many envs (fewer for fewer demos) whatever env.num_envs is: which episodes succeed
# first, and so the demo set, depends on the env count, and the demo cache is keyed on the number of demos only.
DEMO_ENVS = 16


@dataclass
class QuickstartConfig:
    """``vla-rl quickstart``: the whole pipeline on a CPU laptop (see module doc)."""

    env: EnvConfig = field(default_factory=_quickstart_env)
    policy: PolicyConfig = field(default_factory=_quickstart_policy)
    algo: LearnerConfig = field(default_factory=_quickstart_algo)
    sft: LearnerConfig = field(default_factory=lambda: SFTConfig(steps=700, episodes=50))
    """Pre-training (``--sft.*``: the ``sft`` learner's settings; ``type`` must stay ``sft``): 700 steps on the first
    50 demos unless given."""
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    threads: ThreadsConfig = field(default_factory=ThreadsConfig)
    """Torch threads of the RL stage per part (``--threads.update``, ``--threads.rollout``; see docs/training.md)."""
    demos: int = 50
    """Expert demos collected (cached); ``sft.episodes`` of them are used for pre-training."""
    demo_noise: float = -1.0
    """Std of the noise injected into executed demo actions (labels stay clean; see ``collect_demos``);
    -1 = the env backend's (:data:`DEMO_NOISE`)."""
    iterations: int = 200
    """RL iterations (collect + update). 100 keep a run near 8.5 minutes on 2 cores but learn less (seed 0: 0.32 ->
    0.64 against 0.76 with 200; docs/results.md, "Quickstart")."""
    eval_episodes: int = 400
    """Episodes per evaluation (before and after RL, same held-out seeds). 400 keep the gain's 95% interval
    near ±0.06; with 100 a gain moves by about ±0.1 between sets of held-out episodes."""
    eval_every: int = 0
    """Extra evaluations every this many iterations (0 = only before and after)."""
    seed: int = 0
    """Seed of everything (demos, pre-training, RL, evaluation seeds are offset from it)."""
    name: str = ""
    """Run name; empty = ``quickstart-<env>-s<seed>``."""
    run_dir: str = ""
    """Run folder; empty = ``runs/<name>``."""
    demo_cache: str = ""
    """Folder of cached demo datasets; empty = ``$VLA_RL_HOME/demos`` (or ``data/demos``)."""
    resume: bool = False
    """Finish an interrupted run in ``run_dir``."""

    @property
    def resolved_demo_noise(self) -> float:
        if self.demo_noise >= 0:
            return self.demo_noise
        return DEMO_NOISE.get(self.env.id.partition("/")[0], DEMO_NOISE["default"])

    def __post_init__(self) -> None:
        if not isinstance(self.sft, SFTConfig):
            raise ValueError(f"sft.type must be 'sft' (the quickstart pre-trains with it), got {self.sft.type!r}")
        if self.sft.episodes > self.demos:
            raise ValueError(f"sft.episodes={self.sft.episodes} exceeds demos={self.demos}")
        if self.eval_episodes < 1 or self.demos < 1:
            raise ValueError("eval_episodes and demos must be >= 1")


def _demo_root(cfg: QuickstartConfig) -> Path:
    base = Path(cfg.demo_cache) if cfg.demo_cache else Path(os.environ.get("VLA_RL_HOME", "data")) / "demos"
    e = cfg.env
    cams = "-wrist" if e.wrist_camera else ""
    name = f"{e.id.replace('/', '-')}-{e.obs_mode}{e.image_size}{cams}-n{cfg.demos}-noise{cfg.resolved_demo_noise:g}"
    return base / f"{name}-s{cfg.seed}"


def _demo_envs(cfg: QuickstartConfig) -> int:
    """Envs that collect the demos: :data:`DEMO_ENVS`, or ``demos`` when fewer."""
    return min(DEMO_ENVS, cfg.demos)


def _demo_seed(cfg: QuickstartConfig) -> int:
    """Base seed of the demo episodes (collection env ``i`` starts from it + ``i``), apart from the run's
    training and evaluation seeds (tested)."""
    return cfg.seed + 500_000


def _check_seed(cfg: QuickstartConfig) -> int:
    """Base seed of pre-training's success-check episodes: the second half of the evaluation seed block,
    apart from the evaluation's own seeds, the training seeds and the demos (tested)."""
    return EVAL_SEED_BASE + cfg.seed * SEED_BLOCK + SEED_BLOCK // 2


def _success_check(cfg: QuickstartConfig, exec_steps: int,
                   stack: contextlib.ExitStack) -> Callable[[Any], float] | None:
    """``pretrain``'s success check: the policy's ODE success on ``sft.check_episodes`` episodes of its own
    seeds (env built on the first check, closed by ``stack``); None when ``sft.stop_at_success`` is 0."""
    if not cfg.sft.stop_at_success:
        return None
    envs: list[Any] = []

    def check(policy: Any) -> float:
        if not envs:
            envs.append(stack.enter_context(cfg.env.make(seed=_check_seed(cfg))))
        res = evaluate_policy(envs[0], policy, cfg.sft.check_episodes, _check_seed(cfg), exec_steps,
                              desc="success check", progress=False)  # the same noise at every check
        return res.success_rate

    return check


def run_quickstart(cfg: QuickstartConfig) -> dict[str, Any]:
    """Run the pipeline (module doc); returns the ``report.json`` content."""
    t_start = time.perf_counter()
    name = cfg.name or f"quickstart-{cfg.env.id.replace('/', '-')}-s{cfg.seed}"
    run_dir = Path(cfg.run_dir) if cfg.run_dir else default_runs_dir() / name
    if run_dir.exists() and not cfg.resume:
        raise FileExistsError(f"{run_dir} exists; pass --resume true to finish it, or --name/--run_dir for a new run")
    if cfg.env.wrist_camera and not cfg.env.has_optional_wrist_camera():
        print(f"note: {cfg.env.id} has no optional wrist camera; using its default cameras")
        cfg = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, wrist_camera=False))
    try:
        train_cfg = _train_config(cfg, run_dir, policy_path="")
    except ValueError as exc:  # a field combination the RL stage rejects: report it like a parse error
        raise ConfigError(str(exc)) from None
    with cfg.env.make(num_envs=1) as env:  # also fails early for a bad env id or option
        spec = env.spec
    run_dir.mkdir(parents=True, exist_ok=True)
    stages: dict[str, float] = {}

    # 1. demos (cached across runs)
    t = time.perf_counter()
    demo_root = _demo_root(cfg)
    with exclusive(demo_root, "the demo cache"):  # two runs of one seed at once: the second reuses the first's
        if not _reusable(demo_root, "demo cache", _verify_demos):
            print(f"[1/4] collecting {cfg.demos} expert demos -> {demo_root}")
            with cfg.env.make(num_envs=_demo_envs(cfg), seed=_demo_seed(cfg)) as env:
                collect_demos(env, demo_root, cfg.demos, "local/vla-rl-quickstart-demos",
                              action_noise=cfg.resolved_demo_noise, seed=cfg.seed)
        else:
            print(f"[1/4] reusing cached demos {demo_root}")
    stages["demos"] = time.perf_counter() - t

    # 2. few-shot imitation pre-training (skipped when the run already has it)
    t = time.perf_counter()
    sft_dir = run_dir / "sft_policy"
    if not _reusable(sft_dir, "pre-trained policy", verify_policy_folder):
        print(f"[2/4] pre-training on {cfg.sft.episodes or cfg.demos} demos")
        with contextlib.ExitStack() as stack:
            policy, sft_stats = pretrain(cfg.sft, demo_root, lambda _: build_policy(train_cfg.policy, spec),
                                         seed=cfg.seed, policy=train_cfg.policy,
                                         success_check=_success_check(cfg, train_cfg.exec_steps, stack))
        sft_stats.pop("evaluation")
        save_sft_policy(policy, sft_dir, sft_stats)
    else:
        print(f"[2/4] reusing pre-trained policy {sft_dir}")
    stages["pretrain"] = time.perf_counter() - t

    # 3 + 4. RL with evaluation before and after
    t = time.perf_counter()
    print(f"[3/4] {cfg.algo.type} ({_sampler_name(cfg.policy)}) for {cfg.iterations} iterations")
    result = Trainer(_train_config(cfg, run_dir, policy_path=str(sft_dir))).run()
    stages["rl"] = time.perf_counter() - t

    print("[4/4] writing the report")
    before = result["before"] or _load_eval(run_dir / "eval_before.json")
    after = result["after"] or _load_eval(run_dir / "eval_after.json")
    plots = make_plots(run_dir / "metrics.jsonl", run_dir / "plots")
    videos = {}
    vid_dir = run_dir / "videos"
    for tag, res in (("before", before), ("after", after)):
        if res is not None and res.video and Path(res.video).exists():
            dst = vid_dir / f"{tag}.mp4"
            shutil.copyfile(res.video, dst)
            videos[tag] = str(dst.relative_to(run_dir))
    summary = {
        "name": name, "env_id": cfg.env.id, "policy": policy_type(cfg.policy), "algorithm": f"{cfg.algo.type} + {_sampler_name(cfg.policy)}",
        "seed": cfg.seed, "success_before": before.success_rate, "success_after": after.success_rate,
        "success_before_ci": [before.ci_low, before.ci_high], "success_after_ci": [after.ci_low, after.ci_high],
        "episodes_per_eval": after.episodes, "per_task_before": before.per_task, "per_task_after": after.per_task,
        "demos": cfg.demos, "sft_episodes": cfg.sft.episodes or cfg.demos, **_sft_summary(sft_dir),
        "iterations": cfg.iterations,
        "env_steps": result["env_steps"], "wall_seconds": time.perf_counter() - t_start, "stages": stages,
        "device": result.get("device"),
        "config": json.loads(json.dumps(draccus.encode(cfg), default=str)),
    }
    md = write_report(run_dir, summary, plots, videos)
    print(f"report: {md}")
    print(f"success {before.success_rate:.2f} -> {after.success_rate:.2f} over {after.episodes} held-out episodes "
          f"(after: 95% CI {after.ci_low:.2f}-{after.ci_high:.2f}); {summary['wall_seconds']:.0f} s")
    return summary


def _verify_demos(root: Path) -> None:
    if not (root / "meta" / "info.json").is_file():
        raise IntegrityError(f"{root / 'meta' / 'info.json'} is missing")
    verify_dataset(root)


def _reusable(folder: Path, what: str, verify: Callable[[Path], Any]) -> bool:
    """Whether a stage's output ``folder`` exists and verifies (``verify`` raises otherwise). A damaged one is
    moved aside (``<name>.damaged-<n>``, never deleted) and reported in one line, so the stage runs again."""
    if not folder.exists():
        return False
    try:
        verify(folder)
    except (IntegrityError, CheckpointError) as exc:
        print(f"note: {what} {folder} does not verify ({exc}); moved aside to {move_aside(folder).name}, redoing")
        return False
    return True


def _train_config(cfg: QuickstartConfig, run_dir: Path, policy_path: str) -> TrainConfig:
    """The RL stage's config (``policy_path`` empty: a fresh policy, for pre-training)."""
    return TrainConfig(
        env=cfg.env, policy=dataclasses.replace(cfg.policy, path=policy_path),
        algo=cfg.algo.with_default_demos(str(_demo_root(cfg))), logging=cfg.logging,
        iterations=cfg.iterations, seed=cfg.seed, run_dir=str(run_dir), reset_every_iteration=False, threads=cfg.threads,
        resume=cfg.resume or (run_dir / "checkpoints").exists(),
        eval=EvalConfig(episodes=cfg.eval_episodes, every=cfg.eval_every,
                        video=True),
    )


def _sampler_name(policy: PolicyConfig) -> str:
    """The policy's RL sampler as a name (``flow-sde``, ``flow-noise``), or ``-`` for a policy without one."""
    sampler = getattr(policy, "sampler", None)
    return getattr(sampler.kind, "value", str(sampler.kind)) if sampler is not None else "-"


def _sft_summary(sft_dir: Path) -> dict[str, Any]:
    """``sft_steps`` run (and ``sft_check_success``, the last success check's rate) from ``sft.json``."""
    f = sft_dir / "sft.json"
    stats = json.loads(f.read_text()) if f.exists() else {}
    out = {"sft_steps": stats.get("sft/steps")}
    if "sft/check_success" in stats:
        out["sft_check_success"] = stats["sft/check_success"]
    return out


def _load_eval(path: Path) -> Any:
    from vla_rl.evaluation import EvalResult

    return EvalResult(**json.loads(path.read_text())) if path.exists() else None


@COMMANDS.register("quickstart", config=QuickstartConfig, help="demos -> few-shot imitation -> RL -> report")
def quickstart(cfg: QuickstartConfig) -> dict[str, Any]:
    torch.set_num_threads(1)
    return run_quickstart(cfg)
