"""Named reward terms: what each means, the term interface, and the registry of computed terms.

A *term* is a per-step signal, ``float32 [B]`` for a batch of ``B`` envs. The step reward the
learner sees is a weighted sum of terms (:class:`rewards.config.RewardConfig`, applied by
:func:`rewards.compose.weighted_step_reward`); every term is stored and logged on its own.

Terms every env provides (the same meaning on every backend; :func:`env_terms`):

============  ======================================================================================
term          meaning
============  ======================================================================================
``env``       the reward the simulator itself returns for the step, in the backend's configured
              reward mode (``VecEnv.step``'s ``reward``). MuJoCo tabletop: the sum of its terms below
              (``reward_mode`` potential by default); ManiSkill: its ``reward_mode`` reward
              (``normalized_dense`` by default, which is not decomposed); LIBERO: 1 on the success
              step (equal to ``success``); gym-hil / so101 / packaged gym envs: the package's reward
              (``task``) plus its penalty term where configured.
``success``   1.0 on each step the env reports success (``info["success"]``), else 0. An env that
              terminates on success (the default everywhere) reports it once per episode.
============  ======================================================================================

Backend breakdown terms (reported by the backend in ``reward_terms``; where a backend has them they
sum to ``env``): MuJoCo tabletop ``reach``, ``grasp``, ``lift``, ``place`` (scaled potential-based
shaping, :mod:`sim.mujoco_tasks.tasks`) and ``success``; gym-hil and gymnasium packages ``task``
(the package's reward) and their penalty (e.g. ``discrete_penalty``). ManiSkill and LIBERO report
none beyond ``env`` and ``success``.

Computed terms (:data:`REWARDS`) are functions of the step (:class:`StepInput`: the decision
observation, the chunk's outcome observation, the executed action, the env's terms and flags); learned
reward models and constraint costs plug in the same way. Registered here: ``env`` and ``success`` (read
from the env) and ``action_magnitude`` (an example of a computed term); the constraint costs of
:mod:`rewards.costs` (collision, table force, path length, steps, joint limits, jerk, keypoint clearance)
read the env's privileged signals (``StepInput.signals``); :mod:`rewards.learned.terms` registers
``classifier`` and ``prm`` (learned models, configured by their own section of
:class:`rewards.config.RewardConfig`). A name that is neither registered nor reported
by the env is an error naming the term, the env id and the terms it has (:class:`RewardTermError`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from torch import Tensor

from sim.core import ChunkSteps, Obs
from vla_core.registry import Registry

ENV = "env"
SUCCESS = "success"


class RewardTermError(KeyError):
    """A reward term the env does not provide and no registered term computes; the message lists the valid ones."""

    def __str__(self) -> str:  # KeyError quotes its message
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class StepInput:
    """What a reward term reads for one env step of ``B`` envs (step ``h`` of a chunk).

    Attributes:
        env_id: the env's id (for error messages).
        step: ``h``, the step's index inside its chunk.
        obs: the decision observation the chunk was chosen from (batch of ``B``); the observations
            inside a chunk are not rendered (:meth:`sim.core.VecEnv.step_chunk`).
        action: ``float32 [B, A]`` the action executed at this step (zeros for an env held still
            after its episode ended, :mod:`sim.chunk`).
        env_terms: the env's terms at this step, name -> ``float32 [B]`` (:func:`env_terms`).
        success, terminated, truncated: ``bool [B]`` the step's flags.
        signals: the env's privileged signals at this step, name -> ``float32 [B]``
            (:class:`sim.single.StepOut`; empty if the backend reports none). Constraint costs read them.
        executed: ``float32 [B, H, A]`` every action executed in this step's chunk (zeros on held
            steps), for terms over several steps (action jerk); None where the caller has no chunk.
        next_obs: the observation each env's chunk ended in (batch of ``B``): the last observation of its
            episode where the episode ended inside the chunk, else the observation after the chunk. Learned
            terms judge it (:mod:`rewards.learned.terms`). None where the caller has none.
        last: ``bool [B]``: this is the env's last step of its episode inside the chunk (the step it ended,
            or the chunk's last step); where a term that judges ``next_obs`` pays. None with ``next_obs``.
        env_ids: the env indices of the ``B`` rows (a pipelined rollout steps half of the envs at a time),
            for terms that keep state per env; None means ``0 .. B-1``.
    """

    env_id: str
    step: int
    obs: Obs
    action: Tensor
    env_terms: dict[str, Tensor]
    success: Tensor
    terminated: Tensor
    truncated: Tensor
    signals: dict[str, Tensor] = field(default_factory=dict)
    executed: Tensor | None = None
    next_obs: Obs | None = None
    last: Tensor | None = None
    env_ids: list[int] | None = None


class RewardTerm(Protocol):
    """A reward term: ``term(step) -> float32 [B]``, one value per env for one step.

    A term may also end episodes (a success classifier standing in for the simulator's success): it then has
    ``ends_episodes = True`` and ``episode_end() -> bool [B]``, asked once after the term ran on every step of a
    chunk, True for the envs whose episode the chunk's outcome ends (:attr:`rewards.compose.ChunkReward.ends`;
    the rollout engine makes those decisions terminal and resets the envs).

    A term that keeps state per episode (the ``prm`` term's ``milestone`` form) also has
    ``episodes_ended(env_ids: list[int], ended: bool [B])``, told after each chunk which of its envs' episodes it
    ended (by the env or by a term), and ``reset()``, told when every env was reset (:meth:`rewards.compose.RewardFunction.reset`).
    """

    def __call__(self, step: StepInput) -> Tensor: ...


REWARDS: Registry[type] = Registry("reward term")


def missing_term_message(name: str, env_id: str, env_names: list[str]) -> str:
    """The error text for a term neither registered nor reported by ``env_id`` (lists what is valid)."""
    return (
        f"reward term {name!r}: env {env_id} does not report it and no computed term has that name. "
        f"Terms of {env_id}: {', '.join(sorted(env_names)) or '(none)'}; computed terms: {', '.join(REWARDS.names())}"
    )


@dataclass(frozen=True)
class EnvTerm:
    """A term the env reports (``env``, ``success`` or a backend breakdown term), by name."""

    name: str

    def __call__(self, step: StepInput) -> Tensor:
        """``float32 [B]``: the env's value of this term at ``step``.

        Raises:
            RewardTermError: if the env does not report the term (names the env id and its terms).
        """
        try:
            return step.env_terms[self.name]
        except KeyError:
            raise RewardTermError(missing_term_message(self.name, step.env_id, list(step.env_terms))) from None


@REWARDS.register(ENV, help="the simulator's own step reward in the backend's reward mode")
def env_reward() -> RewardTerm:
    """The simulator's own step reward in the backend's configured reward mode (see the module doc)."""
    return EnvTerm(ENV)


@REWARDS.register(SUCCESS, help="1 on each step the env reports success")
def success() -> RewardTerm:
    """1.0 on each step the env reports success, else 0 (see the module doc)."""
    return EnvTerm(SUCCESS)


@dataclass(frozen=True)
class ActionMagnitude:
    """``sum_a action_a^2`` of the executed action, ``>= 0``: a cost; weight it negatively to penalize."""

    def __call__(self, step: StepInput) -> Tensor:
        """``float32 [B]`` squared Euclidean norm of ``step.action [B, A]``."""
        return step.action.float().square().sum(-1)


@REWARDS.register("action_magnitude", help="squared norm of the executed action (a cost: use a negative weight)")
def action_magnitude() -> RewardTerm:
    """Squared norm of the executed action, a computed term (weight it negatively to penalize large actions)."""
    return ActionMagnitude()


def make_term(name: str, options: Any = None) -> RewardTerm:
    """The term called ``name``: a registered (computed) term, else the env's own term of that name.

    A term registered with a config dataclass is built from ``options`` (the section of
    :class:`rewards.config.RewardConfig` named like the term, e.g. ``reward.classifier``), or from that
    dataclass's defaults when ``options`` is None. An unregistered name is resolved against the env's terms
    when first evaluated, and raises :class:`RewardTermError` there if the env does not report it.
    """
    if name not in REWARDS:
        return EnvTerm(name)
    entry = REWARDS.get(name)
    if entry.config is None:
        return entry.obj()
    return entry.obj(options if options is not None else entry.config())


def env_step_terms(reward: Tensor, info: dict[str, Any]) -> dict[str, Tensor]:
    """The terms an env reports for one :meth:`sim.core.VecEnv.step`: as :func:`env_terms`, ``[B]`` each.

    Args:
        reward: ``[B]`` the step's reward.
        info: the step's info (``success``, and ``reward_terms`` where the backend has breakdown terms).
    """
    terms = {k: v.float().cpu() for k, v in info.get("reward_terms", {}).items()}
    terms[ENV] = reward.float().cpu()
    terms[SUCCESS] = info["success"].float().cpu()
    return terms


def env_terms(steps: ChunkSteps) -> dict[str, Tensor]:
    """The terms an env reports for one chunk: ``env``, ``success`` and the backend's breakdown terms.

    Args:
        steps: the chunk's outcome (:meth:`sim.core.VecEnv.step_chunk`).

    Returns:
        name -> ``float32 [H, n]`` on the CPU; ``env`` is ``steps.reward`` itself (not a copy, so a
        weight of 1 reproduces it bit for bit) and ``success`` the success flag as 0/1.
    """
    terms = {k: v.float().cpu() for k, v in steps.reward_terms.items()}
    terms[ENV] = steps.reward.float().cpu()
    terms[SUCCESS] = steps.success.float().cpu()
    return terms
