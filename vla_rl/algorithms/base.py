"""The learner interface: what a learner needs from the loop, how it updates, how it is configured.

A learner is an algorithm (PPO, GRPO, filtered BC, SFT, RaC, TPO) wired to a
policy. It declares what it needs each iteration
(:class:`Needs`: on-policy rollouts, grouped rollouts, a dataset, ...), turns
the loop's :class:`IterationInputs` into a batch (:meth:`Learner.collect`) and
updates on it (:meth:`Learner.update`). The trainer only runs::

    batch = learner.collect(inputs)
    stats = learner.update(batch)

Adding an algorithm is adding a file: a config dataclass deriving from
:class:`LearnerConfig` and a :class:`Learner`, joined by :func:`register_learner`::

    @dataclass
    class MyConfig(LearnerConfig):
        lr: float = 1e-4
        \"\"\"Learning rate.\"\"\"

    @register_learner("mine", MyConfig)
    class MyLearner(Learner):
        needs = Needs.ON_POLICY
        def collect(self, inputs): ...
        def update(self, batch): ...

after which ``vla-rl train --algo.type mine --algo.lr 3e-4`` runs it. The
registry is :data:`ALGORITHMS` (the one registry mechanism of
:mod:`vla_core.registry`); the config is a draccus choice like ``--policy.type``.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import draccus
import torch

from policies.base import Policy
from vla_core.registry import Registry, RegistryChoice
from vla_rl.distributed import SINGLE, Distributed

if TYPE_CHECKING:
    from sim.core import EnvSpec
    from vla_rl.rollout import RolloutEngine

ALGORITHMS: Registry = Registry("algorithm")
"""Learner classes by name, each with its config dataclass (a :class:`LearnerConfig`)."""

DEFAULT_ALGORITHM = "ppo"

L = TypeVar("L", bound="type[Learner]")


class Needs(enum.Flag):
    """What a learner takes from the loop each iteration.

    ``ON_POLICY``: rollouts of the current policy from wherever the envs are (PPO);
    ``GROUPS``: one episode per env, groups of envs sharing an initial state (GRPO, GRAPE sampling);
    ``DATASET``: offline frames (demos, LeRobotDatasets, intervention segments: SFT, RaC);
    ``PREFERENCES``: scored and paired trajectories (TPO).
    """

    NONE = 0
    ON_POLICY = enum.auto()
    GROUPS = enum.auto()
    DATASET = enum.auto()
    PREFERENCES = enum.auto()

    @property
    def env_rollouts(self) -> bool:
        """Whether the learner steps the training envs itself."""
        return bool(self & (Needs.ON_POLICY | Needs.GROUPS | Needs.PREFERENCES))


@dataclass(frozen=True)
class SmokeLimits:
    """The caps of a ``--smoke true`` run (:mod:`vla_rl.smoke`) a learner config shrinks itself to.

    Attributes:
        max_envs: training envs at most.
        max_decisions: decisions per iteration at most (raised to ``episode_decisions`` if that is more).
        episode_decisions: decisions one whole smoke episode takes (every iteration must hold one).
        max_group: rollouts per initial state at most.
        max_minibatch: samples per gradient step at most.
    """

    max_envs: int
    max_decisions: int
    episode_decisions: int
    max_group: int
    max_minibatch: int


class LearnerConfig(RegistryChoice, draccus.ChoiceRegistry):
    """Base of the per-algorithm configs; ``--algo.type NAME`` chooses one of :data:`ALGORITHMS` (see the module doc).

    Subclasses are dataclasses with a docstring per field; their ``__post_init__`` validates what the config
    alone decides, :meth:`check_run` what depends on the rest of the run.
    """

    choices = ALGORITHMS
    default_choice = DEFAULT_ALGORITHM

    @property
    def type(self) -> str:
        """The registered name of this config's algorithm."""
        return LearnerConfig.get_choice_name(type(self))

    def check_run(self, num_envs: int) -> None:
        """Raise ``ValueError`` naming the field when this config cannot run with ``num_envs`` training envs."""

    def for_run(self, iterations: int) -> LearnerConfig:
        """This config with the settings that follow from the run's length resolved (an SFT-style learner's
        learning-rate schedule spans ``iterations x steps_per_iter`` unless it was given). Default: unchanged."""
        return self

    def with_default_demos(self, path: str) -> LearnerConfig:
        """This config with ``path`` as its demo dataset, where it mixes demos into its batches and none was
        given (the quickstart passes the demos it collected). Default: unchanged."""
        return self

    def smoke(self, limits: SmokeLimits, num_envs: int) -> tuple[LearnerConfig, int]:
        """This config shrunk for a smoke run, and the number of training envs (now ``num_envs``) it wants there.

        Default: unchanged, at most ``limits.max_envs`` envs.
        """
        return self, min(num_envs, limits.max_envs)


def register_learner(name: str, config: type, help: str = "") -> Callable[[L], L]:
    """Register a learner class under ``name`` with its config dataclass (a :class:`LearnerConfig` subclass).

    Raises:
        TypeError: if ``config`` is not a dataclass deriving from :class:`LearnerConfig`.
        vla_core.registry.RegistryError: if ``name`` is taken.
    """
    if not (isinstance(config, type) and issubclass(config, LearnerConfig) and dataclasses.is_dataclass(config)):
        raise TypeError(f"learner {name!r}: config {config!r} must be a dataclass deriving from LearnerConfig")

    def decorator(cls: L) -> L:
        ALGORITHMS.register(name, config=config, help=help)(cls)
        cls.name = name
        return cls

    return decorator


@dataclass
class IterationInputs:
    """What the loop hands :meth:`Learner.collect` for one iteration.

    Attributes:
        iteration: the iteration index (0-based).
        seed_base: the first training seed of this iteration; env (or group) ``i`` may use ``seed_base + i``
            (:func:`vla_rl.train_config.training_seed_range`), disjoint from every evaluation seed.
        reset: reset the envs from ``seed_base`` before collecting (``reset_every_iteration``); otherwise
            on-policy collection continues from where the envs are.
        engine: the rollout engine of the training envs (None for a learner that needs no env rollouts).
        data: the offline data source (None unless the learner needs :attr:`Needs.DATASET`).
        sync: the loop evaluates (or stops) after this iteration, so :meth:`Learner.update` must leave the policy
            fully updated; when False, a learner that overlaps its update with the next collection (``filtered_bc``
            with ``algo.overlap``) may defer the update to it. A checkpoint written meanwhile holds the weights
            without the deferred steps (a resumed run goes on without them, as if that update had been lost).
    """

    iteration: int
    seed_base: int
    reset: bool
    engine: RolloutEngine | None = None
    data: Any = None
    sync: bool = True


def freeze_encoder(policy: Policy) -> None:
    """Stop gradients into the policy's observation encoder (:meth:`policies.Policy.encoder_parameters`: vision
    and language), so a learner trains the rest (``--algo.freeze_encoder``).

    Raises:
        ValueError: for a policy that does not say which parameters are its encoder.
    """
    encoder = policy.encoder_parameters()
    if not encoder:
        raise ValueError(f"algo.freeze_encoder: {type(policy).__name__} does not say which parameters are its "
                         "observation encoder (encoder_parameters() is empty)")
    for p in encoder:
        p.requires_grad_(False)


class Learner(abc.ABC):
    """An algorithm wired to a policy (see the module doc).

    Class attributes:
        needs: what :meth:`collect` reads from :class:`IterationInputs` (a learner whose config decides it sets
            it per instance, as PPO does).
        uses_critic: whether rollouts compute values with the policy's critic (likewise).
        name: the registered name (set by :func:`register_learner`; the last one for a class registered twice).

    Args:
        cfg: the learner's config.
        policy: any :class:`policies.Policy`.
    """

    needs: Needs = Needs.ON_POLICY
    uses_critic: bool = False
    name: ClassVar[str] = ""

    def __init__(self, cfg: Any, policy: Policy) -> None:
        self.cfg = cfg
        self.policy = policy
        self.iteration = 0
        self.dist: Distributed = SINGLE
        self._caller: Callable[..., Any] | None = None

    def distribute(self, dist: Distributed) -> None:
        """Train as one of ``dist``'s ranks: gradients of :meth:`call` are all-reduced (DDP / FSDP through
        accelerate, :meth:`vla_rl.distributed.Distributed.wrap`). Call it once, after building the learner."""
        self.dist = dist
        self._caller = dist.wrap(self.policy, self.optimizers())

    def call(self, method: str, *args: Any) -> Any:
        """``self.policy.<method>(*args)`` for a forward whose gradients the update uses (``evaluate``,
        ``sft_loss``): through the DDP / FSDP wrapper when :meth:`distribute` made one."""
        if self._caller is None:
            return getattr(self.policy, method)(*args)
        return self._caller(method, *args)

    def use_store(self, folder: Path, keep: int) -> None:
        """A folder of the run (this rank's own under several processes) for state too large to rewrite into every
        checkpoint, such as filtered_bc's success buffer: the learner writes it there append-only, its
        :meth:`state_dict` names what a checkpoint needs, and what the latest ``keep`` checkpoints need stays.
        Called once, before :meth:`load_state_dict`. Default: unused."""

    def rank_state(self) -> dict[str, Any]:
        """What differs between ranks besides the RNG states (a data sampler's generator); saved per rank in a
        distributed run's checkpoint. Default: nothing."""
        return {}

    def load_rank_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`rank_state`'s output (after :meth:`load_state_dict`)."""

    @abc.abstractmethod
    def collect(self, inputs: IterationInputs) -> Any:
        """This iteration's batch (a :class:`vla_rl.rollout.Rollout`, a data batch, ...)."""

    @abc.abstractmethod
    def update(self, batch: Any) -> dict[str, float]:
        """Learn from ``batch``; returns scalars to log (``update/<name>``)."""

    def check_env(self, spec: EnvSpec, exec_steps: int, reset_every_iteration: bool) -> None:
        """Raise :class:`vla_rl.config.ConfigError` when this learner cannot train in an env of ``spec``.

        Default: no requirement.
        """

    def optimizers(self) -> list[torch.optim.Optimizer]:
        """The learner's optimizers (moved by :meth:`to`, saved by :meth:`state_dict`). Default: ``self.optimizer``."""
        opt = getattr(self, "optimizer", None)
        return [opt] if opt is not None else []

    def to(self, device: torch.device | str) -> Learner:
        """Move the policy, every other module the learner holds (a frozen reference, an actor copy) and the
        optimizers' state (Adam moments, steps) to ``device``."""
        device = torch.device(device)
        self.policy.to(device)
        for value in vars(self).values():
            if isinstance(value, torch.nn.Module) and value is not self.policy:
                value.to(device)
        for opt in self.optimizers():
            for state in opt.state.values():
                for key, value in state.items():
                    if isinstance(value, torch.Tensor) and not (key == "step" and value.dim() == 0):
                        state[key] = value.to(device)
        return self

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs besides the policy's weights."""
        opts = self.optimizers()
        out: dict[str, Any] = {"iteration": self.iteration}
        if len(opts) == 1:
            out["optimizer"] = opts[0].state_dict()
        else:
            out["optimizers"] = [o.state_dict() for o in opts]
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output."""
        opts = self.optimizers()
        saved = [state["optimizer"]] if "optimizer" in state else state.get("optimizers", [])
        for opt, s in zip(opts, saved, strict=True):
            opt.load_state_dict(s)
        self.iteration = state["iteration"]
