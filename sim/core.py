"""The contract every simulator backend implements.

Observation dict (batched, ``B = num_envs``), keys follow LeRobot's names:

- ``observation.images.<camera>``: ``uint8 [B, H, W, 3]`` per camera;
- ``observation.state``: ``float32 [B, S]`` proprioception;
- ``observation.env_state`` (optional): ``float32 [B, P]`` privileged
  simulator state (object poses) for scripted experts and critics;
- ``task``: ``list[str]`` of B language instructions.

``step(actions [B, A]) -> (obs, reward [B] f32, terminated [B] bool,
truncated [B] bool, info)`` with ``info["success"] [B] bool`` and, for envs
whose episode ended on this step (``terminated | truncated``),
``info["final_obs"]`` (a full batch dict whose rows for ended envs hold the
last observation of the old episode) and ``info["episode"]`` (return, length,
success per env, valid where ended). Backends that measure privileged per-step scalars put them in
``info["signals"]`` (name -> ``float32 [B]``, see :class:`sim.single.StepOut`); like
``info["reward_terms"]`` they never reach the policy. Envs auto-reset: the returned obs of an
ended env is the first observation of its next episode.

``step_chunk(actions [B, H, A]) -> ChunkSteps`` executes a whole action chunk
(what a chunked policy does between two decisions) and returns the per-step
rewards and flags, the final observation of envs whose episode ended inside
the chunk and the observation after it. An env whose episode ends inside the
chunk is auto-reset and held still (:meth:`VecEnv.still_actions`, zero actions
for the simulators) for the rest of it (the one rule, :mod:`sim.chunk`). The
observations in between are never returned, so backends that can skip
rendering them do (the MuJoCo tabletop renders once per chunk instead of once
per step); worker-process envs run the chunk with one message per worker.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from sim.chunk import ChunkHold
from vla_core.keys import OBS_ENV_STATE, OBS_IMAGE_PREFIX, OBS_STATE, TASK, image_key  # noqa: F401  (re-exported)

Obs = dict[str, Any]  # str -> Tensor, and TASK -> list[str]


@dataclass(frozen=True)
class TensorSpec:
    """Shape (per env, without the batch dim) and dtype of one tensor."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    low: float | None = None
    high: float | None = None

    def zeros(self, batch: int) -> torch.Tensor:
        return torch.zeros((batch, *self.shape), dtype=self.dtype)


@dataclass(frozen=True)
class EnvSpec:
    """What an env emits and accepts.

    Attributes:
        env_id: the full id, e.g. ``mujoco/pick-red``.
        observation: tensor specs keyed by observation key (TASK excluded).
        action: spec of one env's action ``[A]``, normalized to ``[-1, 1]``
            unless ``low``/``high`` say otherwise.
        max_episode_steps: steps before truncation.
        control_freq: env steps per second of simulated time.
        cameras: camera names, in the order of their image keys.
        tasks: a multi-task env's task names, indexed by the ``task_index`` observation
            (:mod:`sim.tasks`); empty for a single-task env.
        instructions: per task of ``tasks``, its language instruction (empty where the env does not say; hindsight
            relabeling, ``filtered_bc``'s ``hindsight``, needs them).
        init_states: per task of ``tasks``, how many fixed init states it has (LIBERO: 50), the range
            an :class:`sim.tasks.Assignment`'s ``init`` may name; empty where episodes start from seeds.
    """

    env_id: str
    observation: dict[str, TensorSpec]
    action: TensorSpec
    max_episode_steps: int
    control_freq: float
    cameras: tuple[str, ...] = field(default=())
    tasks: tuple[str, ...] = field(default=())
    instructions: tuple[str, ...] = field(default=())
    init_states: tuple[int, ...] = field(default=())

    @property
    def action_dim(self) -> int:
        return self.action.shape[0]

    @property
    def image_keys(self) -> list[str]:
        return [image_key(c) for c in self.cameras]


class EnvError(RuntimeError):
    """A user-facing error from the sim layer at run time (a missing driver or package, a worker that died, a bad
    action); the CLI exits 1 for it. Bad input is the subclass :class:`EnvConfigError`."""


class EnvConfigError(EnvError):
    """An env id, task or option that cannot work (unknown id, unknown or invalid option, an index out of
    range): bad input, which the CLI reports with exit code 2. A subclass of :class:`EnvError`, so code that
    catches every sim error still does."""


@dataclass
class ChunkSteps:
    """The outcome of one action chunk on ``n`` envs (:meth:`VecEnv.step_chunk`).

    Per-step tensors are ``[H, n]``; rows follow ``env_ids``. After an env's episode ends (and it is
    auto-reset) it is held still: its later steps belong to its next episode.

    Attributes:
        env_ids: the envs, ascending.
        reward, terminated, truncated, success: ``[H, n]`` per step, as :meth:`VecEnv.step` returns them.
        reward_terms: named ``[H, n]`` reward terms (empty if the env reports none).
        episode_return, episode_length: ``[H, n]`` statistics of the episode that ended at that step
            (valid where ``terminated | truncated``).
        final_obs: rows ``[n, ...]`` of the last observation of each env's first episode that ended in
            the chunk (valid for those envs), with ``task`` its instruction.
        obs: rows ``[n, ...]`` of the observation after the chunk, with the current instructions.
        step_obs: with ``step_chunk(..., record_obs=True)``, the ``H`` observations after each step (an
            env that ended shows its next episode's first observation, then holds still); else None.
        signals: named ``[H, n]`` privileged per-step signals (:class:`sim.single.StepOut`; empty if the
            env reports none).
    """

    env_ids: list[int]
    reward: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    success: torch.Tensor
    reward_terms: dict[str, torch.Tensor]
    episode_return: torch.Tensor
    episode_length: torch.Tensor
    final_obs: Obs
    obs: Obs
    step_obs: list[Obs] | None = None
    signals: dict[str, torch.Tensor] = field(default_factory=dict)


class VecEnv(abc.ABC):
    """A batch of ``num_envs`` environments stepped together (see module doc)."""

    spec: EnvSpec
    num_envs: int

    @property
    def instructions(self) -> list[str]:
        """The current language instruction of each env."""
        return list(self._instructions)

    _instructions: list[str]

    @abc.abstractmethod
    def reset(self, seed: int | Sequence[int] | None = None, env_ids: Sequence[int] | torch.Tensor | None = None) -> Obs:
        """Reset all envs, or only ``env_ids`` (the others keep their state).

        An int ``seed`` seeds env ``i`` with ``seed + i`` (a partial reset uses
        ``seed + env_id``); a sequence gives one seed per reset env (used to
        start a GRPO group from one initial state); ``None`` continues each
        env's own RNG stream.
        Returns the full batch observation.
        """

    @abc.abstractmethod
    def step(self, actions: torch.Tensor) -> tuple[Obs, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        """Step every env with ``actions [num_envs, A]``; see the module doc."""

    def step_chunk(self, actions: torch.Tensor, record_obs: bool = False) -> ChunkSteps:
        """Execute ``actions [num_envs, H, A]`` open-loop on every env (see the module doc).

        This default calls :meth:`step` ``H`` times, holding ended envs still with
        :class:`sim.chunk.ChunkHold`; batching drivers override it to skip the renders nobody reads and
        to save round trips to worker processes, and fall back to it for ``record_obs``.

        Args:
            actions: ``[num_envs, H, A]``.
            record_obs: also return the observation after every step (``ChunkSteps.step_obs``), e.g.
                for a video; every step is then rendered.

        Raises:
            EnvError: if ``actions`` is not ``[num_envs, H, A]``.
        """
        acts = self._check_chunk(actions).numpy()
        horizon, n = acts.shape[1], self.num_envs
        shape = (horizon, n)
        reward, ret = torch.zeros(shape), torch.zeros(shape)
        term, trunc, success = (torch.zeros(shape, dtype=torch.bool) for _ in range(3))
        length = torch.zeros(shape, dtype=torch.long)
        terms: dict[str, torch.Tensor] = {}
        signals: dict[str, torch.Tensor] = {}
        hold = ChunkHold(n, self.still_actions)
        final: Obs | None = None
        obs: Obs = {}
        step_obs: list[Obs] | None = [] if record_obs else None
        for h in range(horizon):
            obs, reward[h], term[h], trunc[h], info = self.step(torch.from_numpy(hold.actions(acts[:, h])))
            if step_obs is not None:
                step_obs.append(obs)
            success[h] = info["success"]
            for name, value in info.get("reward_terms", {}).items():
                terms.setdefault(name, torch.zeros(shape))[h] = value
            for name, value in info.get("signals", {}).items():
                signals.setdefault(name, torch.zeros(shape))[h] = value
            done = term[h] | trunc[h]
            if done.any():
                ret[h], length[h] = info["episode"]["return"], info["episode"]["length"]
                first = hold.end(done.cpu().numpy())
                if first.any():
                    fin = info["final_obs"]
                    if final is None:
                        final = {k: (list(v) if k == TASK else v.clone()) for k, v in fin.items()}
                    for i in np.flatnonzero(first).tolist():
                        for k, v in fin.items():
                            final[k][i] = v[i]
        if final is None:
            final = {k: (list(v) if k == TASK else v.clone()) for k, v in obs.items()}
        return ChunkSteps(
            env_ids=list(range(n)), reward=reward, terminated=term, truncated=trunc, success=success,
            reward_terms=terms, episode_return=ret, episode_length=length, final_obs=final, obs=obs,
            step_obs=step_obs, signals=signals,
        )

    def still_actions(self) -> np.ndarray:
        """``float32 [num_envs, A]`` actions that hold every env still where an episode ended inside a chunk.

        Zeros: no end-effector motion under the simulators' delta control. An env whose zero action
        moves it (absolute joint targets: a robot) overrides this.
        """
        return np.zeros((self.num_envs, *self.spec.action.shape), np.float32)

    def _check_chunk(self, actions: torch.Tensor | np.ndarray) -> torch.Tensor:
        """Validate a chunk ``[num_envs, H, A]``; returns float32 on the CPU."""
        if isinstance(actions, np.ndarray):
            actions = torch.from_numpy(actions)
        expected = (self.num_envs, *self.spec.action.shape)
        if not isinstance(actions, torch.Tensor) or actions.ndim != 3 or actions.shape[1] < 1 or (
            (actions.shape[0], *actions.shape[2:]) != expected
        ):
            got = list(actions.shape) if isinstance(actions, torch.Tensor) else type(actions).__name__
            raise EnvError(
                f"{self.spec.env_id}: chunk action shape mismatch: expected [{expected[0]}, H, "
                f"{', '.join(map(str, expected[1:]))}] ([num_envs, chunk, action_dim]), got {got}"
            )
        return actions.detach().to("cpu", torch.float32)

    def lower_worker_priority(self, nice: int) -> int:
        """Raise the nice value of the env's worker processes (every thread, renderer threads included) by
        ``nice``, for a caller whose own work beside the envs is the critical path: a learner that trains in a
        thread while the envs step (``filtered_bc --algo.overlap``). Unprivileged processes cannot lower it back.

        Returns:
            How many worker threads were reniced: 0 for envs without worker processes (this default).
        """
        return 0

    @abc.abstractmethod
    def close(self) -> None:
        """Release workers, renderers and simulator handles. Idempotent."""

    def schedule_tasks(self, weights: Sequence[float] | np.ndarray | None = None,
                       plans: dict[int, list[Any]] | None = None) -> None:
        """Set how a multi-task env's slots choose their task at every later reset (:mod:`sim.tasks`).

        Args:
            weights: ``[T]`` sampling weights over ``spec.tasks`` for every slot (an empty sequence: back to
                uniform); None keeps the current ones.
            plans: slot -> queue of :class:`sim.tasks.Assignment` played before sampling resumes
                (replacing that slot's queue); None keeps the queues.

        Raises:
            EnvError: for a single-task env, bad weights or a task index out of range.
        """
        raise EnvError(f"{self.spec.env_id} is a single-task env: it has no tasks to schedule "
                       "(multi-task ids: mujoco/multi, mujoco/*-any, libero/<suite>, maniskill/TabletopSet-v1)")

    def expert_actions(self) -> torch.Tensor:
        """The scripted expert's actions ``[num_envs, A]`` from privileged state.

        Raises:
            NotImplementedError: if the task has no scripted expert.
        """
        raise NotImplementedError(f"{self.spec.env_id} has no scripted expert")

    def render(self) -> np.ndarray:
        """An RGB frame ``uint8 [H, W, 3]`` tiling the first camera of every env."""
        obs = self._last_obs
        keys = self.spec.image_keys
        if not keys:
            raise EnvError(f"{self.spec.env_id}: no camera observations to render (obs_mode=state?)")
        return tile_images(obs[keys[0]].numpy())

    _last_obs: Obs
    _seed: int | None = None

    def _take_seed(self, seed: int | None) -> int | None:
        """``seed``, or on the first reset the seed given to ``make_env``."""
        if seed is None:
            seed = self._seed
        self._seed = None
        return seed

    def check_actions(self, actions: torch.Tensor | np.ndarray, device: torch.device | str = "cpu") -> torch.Tensor:
        """Validate ``actions`` against the spec and return a float32 tensor on ``device``.

        Raises:
            EnvError: naming the env id, the expected shape and the one given.
        """
        if isinstance(actions, np.ndarray):
            actions = torch.from_numpy(actions)
        if not isinstance(actions, torch.Tensor):
            raise EnvError(f"{self.spec.env_id}: actions must be a tensor, got {type(actions).__name__}")
        expected = (self.num_envs, *self.spec.action.shape)
        if tuple(actions.shape) != expected:
            raise EnvError(
                f"{self.spec.env_id}: action shape mismatch: expected {list(expected)} "
                f"([num_envs, action_dim]), got {list(actions.shape)}"
            )
        return actions.detach().to(device, torch.float32)

    def __enter__(self) -> VecEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # best effort; explicit close() is preferred
        try:
            self.close()
        except Exception:
            pass


def normalize_env_ids(env_ids: Sequence[int] | torch.Tensor | np.ndarray | None, num_envs: int) -> list[int]:
    """Turn ``env_ids`` (indices or a boolean mask, or None for all) into a sorted index list."""
    if env_ids is None:
        return list(range(num_envs))
    ids = torch.as_tensor(env_ids)
    if ids.dtype == torch.bool:
        if ids.shape != (num_envs,):
            raise EnvError(f"env_ids mask must have shape [{num_envs}], got {list(ids.shape)}")
        ids = ids.nonzero().flatten()
    out = sorted(int(i) for i in ids.flatten().tolist())
    bad = [i for i in out if not 0 <= i < num_envs]
    if bad:
        raise EnvError(f"env_ids {bad} out of range for num_envs={num_envs}")
    return out


def seeds_for_ids(seed: int | Sequence[int] | None, ids: list[int]) -> list[int | None]:
    """Per-env seeds for a reset of ``ids`` (see :meth:`VecEnv.reset`)."""
    if seed is None:
        return [None] * len(ids)
    if isinstance(seed, (int, np.integer)):
        return [int(seed) + i for i in ids]
    seeds = [int(s) for s in seed]
    if len(seeds) != len(ids):
        raise EnvError(f"reset: got {len(seeds)} seeds for {len(ids)} envs")
    return seeds


def tile_images(images: np.ndarray) -> np.ndarray:
    """Tile ``[B, H, W, 3]`` images into one near-square ``[H', W', 3]`` grid."""
    b, h, w, c = images.shape
    cols = int(np.ceil(np.sqrt(b)))
    rows = int(np.ceil(b / cols))
    grid = np.zeros((rows * h, cols * w, c), dtype=images.dtype)
    for i in range(b):
        r, k = divmod(i, cols)
        grid[r * h : (r + 1) * h, k * w : (k + 1) * w] = images[i]
    return grid
