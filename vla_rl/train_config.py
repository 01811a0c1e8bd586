"""Configs of ``vla-rl train``: env, policy and algorithm (draccus choices over their registries), eval, logging.

``--policy.type compact-flow --policy.width 64`` picks a registered policy and
sets its config fields; ``--policy.path DIR`` starts from a checkpoint instead
of fresh weights (its saved architecture wins; sampler settings given on the
command line still apply). ``--algo.type grpo --algo.group_size 4`` picks a
registered learner (:data:`vla_rl.algorithms.base.ALGORITHMS`) the same way.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import draccus

import policies as _policies  # noqa: F401  (registers the policy modules)
from policies.registry import POLICIES
from rewards.config import RewardConfig
from vla_core.registry import Entry, RegistryChoice
from vla_rl.algorithms import filtered_bc as _filtered_bc  # noqa: F401  (registers the built-in learners)
from vla_rl.algorithms import ppo as _ppo  # noqa: F401
from vla_rl.algorithms import rac as _rac  # noqa: F401
from vla_rl.algorithms import sft as _sft  # noqa: F401
from vla_rl.algorithms.base import LearnerConfig
from vla_rl.algorithms.ppo import PPOConfig
from vla_rl.config import EnvConfig
from vla_rl.grape import tpo as _tpo  # noqa: F401
from vla_rl.run_logging import LoggingConfig
from vla_rl.threads import ThreadsConfig

DEFAULT_POLICY = "compact-flow"


class PolicyConfig(RegistryChoice, draccus.ChoiceRegistry):
    """Base of the per-policy configs; ``--policy.type NAME`` chooses one of :data:`policies.registry.POLICIES`.

    The choice of a policy is its registered config dataclass plus ``path`` (a checkpoint to start from), derived
    when draccus first asks for it: ``@POLICIES.register(name, config=...)`` is the only registration a policy needs.
    """

    choices = POLICIES
    default_choice = DEFAULT_POLICY

    @classmethod
    def choice_class(cls, entry: Entry) -> type | None:
        return None if entry.config is None else _with_path(entry.config)


@functools.cache
def _with_path(config: type) -> type:
    """``config`` plus a ``path`` field, deriving :class:`PolicyConfig` (one class per config, made once)."""
    ns = {"__annotations__": {"path": str}, "path": "", "__doc__": config.__doc__, "__module__": __name__}
    frozen = config.__dataclass_params__.frozen  # type: ignore[attr-defined]
    return dataclass(frozen=frozen)(type(f"{config.__name__}Choice", (config, PolicyConfig), ns))


class _PolicyChoices(Mapping[str, type]):
    """Policy name -> its :class:`PolicyConfig` class, read from the registry whenever asked."""

    def __getitem__(self, name: str) -> type:
        return PolicyConfig.get_choice_class(name)

    def __iter__(self) -> Iterator[str]:
        return iter(PolicyConfig.get_known_choices())

    def __len__(self) -> int:
        return len(PolicyConfig.get_known_choices())


POLICY_CHOICES: Mapping[str, type] = _PolicyChoices()
"""``POLICY_CHOICES["compact-flow"](chunk_size=4)``: a policy section of a command's config."""


def policy_type(cfg: PolicyConfig) -> str:
    """The registry name of a policy choice config."""
    return PolicyConfig.get_choice_name(type(cfg))


def policy_options(cfg: PolicyConfig) -> dict:
    """The policy's own config fields (without ``path``) as keyword values."""
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name != "path"}


@dataclass
class EvalConfig:
    """Periodic deterministic evaluation on held-out seeds."""

    episodes: int = 20
    """Episodes per evaluation; 0: the trainer does not evaluate (a command's hook may, as ``vla-rl align``'s does)."""
    num_envs: int = 0
    """Eval envs; 0 = the same as env.num_envs."""
    seed: int | None = None
    """Base seed of the evaluation episodes (eval env ``i`` plays from seed ``seed + i``); None = the run's
    ``1_000_000_000 + seed * 1_000_000``, far above the training seeds of any run shorter than a million
    iterations. It must not be a training seed (checked)."""
    every: int = 5
    """Evaluate every this many iterations (and before the first and after the last); 0 = only before and after."""
    video: bool = True
    """Write an MP4 of each evaluation."""
    video_envs: int = 4
    """Envs tiled into the eval video."""
    video_episodes: int = 2
    """Episodes of each video env the video shows; 0 = every episode it plays in the evaluation. While they play,
    every env renders every step (the video's frames); after them the chunks run batched, rendering only the
    decision frames the policy reads (the quickstart's 400-episode evaluation: 41-49 -> 30-34 s, the same
    episodes; docs/results.md, "Training throughput")."""
    protocol: str = "seeds"
    """``seeds``: ``episodes`` episodes from held-out seeds (any env). ``per_task`` (multi-task envs): the
    benchmarks' protocol, every evaluated task for ``episodes_per_task`` episodes, episode ``k`` of a task on
    LIBERO's fixed init state ``k`` (ManiSkill / MuJoCo: seed ``eval.seed + k``), success averaged over tasks
    with per-task 95% intervals (:func:`vla_rl.evaluation.evaluate_per_task`)."""
    episodes_per_task: int = 50
    """``per_task`` protocol: episodes per task (LIBERO's protocol: 50, one per init state)."""
    max_tasks: int = 0
    """``per_task`` protocol: evaluate at most this many of the evaluated tasks, evenly spread over them
    (0 = all, the benchmarks' protocol; ``--smoke`` evaluates a few)."""
    ema: float = 0.0
    """Evaluate an exponential moving average of the policy's trainable weights, moved ``1 - ema`` of the way to
    the weights after every iteration's update, in place of the weights as trained (0 = the weights as trained).
    It reads the trend of the last ``~1 / (1 - ema)`` iterations instead of one step's; rollouts still use the
    weights as trained. Checkpoints' ``policy/`` folders (``best`` too) then hold the average (:mod:`vla_rl.ema`)."""


@dataclass
class DataConfig:
    """Offline data for the learners that read it (``--algo.type sft``, ``rac``)."""

    path: str = ""
    """LeRobotDataset folder (ours or recorded with LeRobot's tools); its features are matched to the policy's
    inputs by name (:func:`vla_rl.data.load_chunks`)."""
    episodes: int = 0
    """Use only the first this many episodes; 0 = all."""
    intervention_split: str = "correction"
    """How intervention steps without RaC labels (LeRobot's ``intervention`` flag only) are labelled:
    ``correction`` (all), ``first-k`` (the first ``recovery_steps`` of each takeover are recovery) or
    ``retreat`` (the leading rising steps are recovery); see :func:`vla_rl.intervention.labels.labels_from_flags`."""
    recovery_steps: int = 5
    """``first-k``: recovery steps at the start of each takeover."""


SEED_BLOCK = 1_000_000
"""Run seed ``s`` trains from seeds in ``[s * SEED_BLOCK, (s + 1) * SEED_BLOCK)``."""
TRAIN_SEED_STRIDE = 1000
"""Iteration ``k`` trains from seeds ``s * SEED_BLOCK + k * TRAIN_SEED_STRIDE + i`` (env or group ``i``)."""
EVAL_SEED_BASE = 1_000_000_000
"""The default evaluation seed is ``EVAL_SEED_BASE + s * SEED_BLOCK``: whatever the run's length, its
training seeds ``s * SEED_BLOCK + k * TRAIN_SEED_STRIDE + i`` stay far below it."""


def training_seed_range(cfg: TrainConfig, iteration: int) -> tuple[int, int]:
    """``[lo, hi)``: the reset seeds iteration ``iteration`` of ``cfg`` may use (one per env or group)."""
    lo = cfg.seed * SEED_BLOCK + iteration * TRAIN_SEED_STRIDE
    return lo, lo + cfg.env.num_envs


def training_seed_overlap(cfg: TrainConfig) -> int | None:
    """The first iteration whose training seeds include an evaluation seed, or None."""
    e0, e1 = cfg.eval.seed, cfg.eval.seed + cfg.eval_envs
    base = cfg.seed * SEED_BLOCK
    first = max(0, (e0 - base - cfg.env.num_envs) // TRAIN_SEED_STRIDE)
    last = min(cfg.iterations - 1, (e1 - 1 - base) // TRAIN_SEED_STRIDE)
    for k in range(first, last + 1):
        lo, hi = training_seed_range(cfg, k)
        if lo < e1 and e0 < hi:
            return k
    return None


def _default_policy() -> PolicyConfig:
    return POLICY_CHOICES[DEFAULT_POLICY]()


@dataclass
class TrainConfig:
    """``vla-rl train``: RL fine-tuning of a policy in a vectorized env."""

    env: EnvConfig = field(default_factory=EnvConfig)
    policy: PolicyConfig = field(default_factory=_default_policy)
    algo: LearnerConfig = field(default_factory=PPOConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    data: DataConfig = field(default_factory=DataConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Reward terms and weights (:mod:`rewards`); the default is the env's own reward."""
    iterations: int = 20
    """Training iterations (collect + update)."""
    seed: int = 0
    """Seed of torch/numpy/python RNGs and of the training episodes."""
    name: str = ""
    """Run name; empty = ``<algo>-<env>-s<seed>``."""
    run_dir: str = ""
    """Run folder; empty = ``runs/<name>``."""
    resume: bool = False
    """Continue the run in ``run_dir`` from its last checkpoint."""
    exec_steps: int = 0
    """Actions of each chunk executed per decision; 0 = the whole chunk."""
    reset_every_iteration: bool = True
    """Reset all envs (with per-iteration seeds) at the start of each iteration: iterations are then
    a pure function of (weights, optimizer, RNG, iteration), which makes --resume exact."""
    threads: ThreadsConfig = field(default_factory=ThreadsConfig)
    """Torch threads per stage (``--threads.rollout``, ``--threads.update``; :class:`vla_rl.threads.ThreadsConfig`)."""
    checkpoint_every: int = 1
    """Save a checkpoint every this many iterations."""
    keep_last: int = 3
    """Checkpoints kept (plus ``best``)."""
    smoke: bool = False
    """Shrink the run to a CPU smoke test (few tiny envs, a tiny offline policy, 1-2 iterations); the
    preset's env, policy type, sampler and algorithm are kept. See :mod:`vla_rl.smoke`."""

    def __post_init__(self) -> None:
        if self.iterations < 0:
            raise ValueError(f"iterations must be >= 0, got {self.iterations}")
        self.algo.check_run(self.env.num_envs)
        chunk = getattr(self.policy, "chunk_size", 0)
        steps = self.exec_steps or chunk
        if self.exec_steps and chunk and self.exec_steps > chunk:
            raise ValueError(f"exec_steps={self.exec_steps} exceeds policy.chunk_size={chunk}")
        if self.env.max_episode_steps and steps and steps > self.env.max_episode_steps:
            raise ValueError(
                f"policy.chunk_size / exec_steps ({steps}) is longer than env.max_episode_steps "
                f"({self.env.max_episode_steps}): one decision would span several episodes"
            )

        if self.eval.max_tasks < 0:
            raise ValueError(f"eval.max_tasks must be >= 0 (0 = all), got {self.eval.max_tasks}")
        if self.eval.video_episodes < 0:
            raise ValueError(f"eval.video_episodes must be >= 0 (0 = every episode), got {self.eval.video_episodes}")
        if self.eval.protocol not in ("seeds", "per_task"):
            raise ValueError(f"eval.protocol must be 'seeds' or 'per_task', got {self.eval.protocol!r}")
        if not 0.0 <= self.eval.ema < 1.0:
            raise ValueError(f"eval.ema must lie in [0, 1) (0: no moving average), got {self.eval.ema}")
        if self.eval.episodes_per_task < 1:
            raise ValueError(f"eval.episodes_per_task must be >= 1, got {self.eval.episodes_per_task}")
        if self.eval.seed is None:
            self.eval.seed = EVAL_SEED_BASE + self.seed * SEED_BLOCK
        clash = training_seed_overlap(self)
        if clash is not None:
            lo, hi = training_seed_range(self, clash)
            raise ValueError(
                f"eval.seed={self.eval.seed}: the evaluation seeds [{self.eval.seed}, {self.eval.seed + self.eval_envs}) "
                f"overlap the training seeds [{lo}, {hi}) of iteration {clash} (iteration k trains from "
                f"seed * {SEED_BLOCK} + k * {TRAIN_SEED_STRIDE} + env): held-out episodes would be trained on. "
                "Leave eval.seed unset or pick one outside the run's training seeds."
            )

    @property
    def eval_envs(self) -> int:
        """Envs of the evaluation env."""
        return self.eval.num_envs or self.env.num_envs

    @property
    def run_name(self) -> str:
        return self.name or f"{self.algo.type}-{self.env.id.replace('/', '-')}-s{self.seed}"
