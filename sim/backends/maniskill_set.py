"""``maniskill/TabletopSet-v1``: the ManiSkill tasks that install and render offline, as one multi-task env.

The set (:data:`SET_TASKS`) is the pick / push / pull / poke / stack / peg tasks of
:mod:`sim.backends.maniskill_tasks`; pi_RL's larger ManiSkill set needs YCB assets that do not
install offline here. Each env slot is a :class:`ManiSkillSetEnv`: at every reset it takes the next
task from its :class:`sim.tasks.TaskSchedule` (queued assignments first, else the trainer's weights,
uniform by default) and resets that task's :class:`ManiSkillSingleEnv`, built on first use and kept in
an LRU cache of ``task_cache`` envs per slot. CPU path only (worker processes); a GPU ``physx_cuda``
env holds one task.

Observations: ``observation.state`` (the Panda's 25 values, the same on every task),
``observation.env_state`` zero-padded to the largest task's privileged state, the ``base_camera``
image every task has (a task's extra ``hand_camera`` is left out) and ``task_index``. An episode
truncates at its own task's limit; the spec reports the largest.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import torch

from sim.backends.maniskill_common import PREFIX, ManiSkillOptions, select_vulkan_icd
from sim.core import OBS_ENV_STATE, EnvError, EnvSpec, TensorSpec, image_key
from sim.single import SingleEnv, StepOut
from sim.tasks import TASK_INDEX, Assignment, TaskSchedule

SET_ID = "TabletopSet-v1"
SET_TASKS = ("PickCube-v1", "PushCube-v1", "PullCube-v1", "PokeCube-v1", "StackCube-v1", "LiftPegUpright-v1",
             "PegInsertionSide-v1")
SET_CAMERA = "base_camera"


class ManiSkillSetEnv(SingleEnv):
    """One slot of ``maniskill/TabletopSet-v1`` (see the module doc).

    Args:
        single_env: the one-task env class, called as ``single_env(task, options, vulkan_icd)``
            (:class:`sim.backends.maniskill.ManiSkillSingleEnv`; passed in by the backend, which imports this module).
        options: backend options (``task_cache`` and the usual ones).
        vulkan_icd: ``VK_ICD_FILENAMES`` for this process (empty: leave it).
    """

    def __init__(self, single_env: Callable[[str, ManiSkillOptions, str], SingleEnv], options: ManiSkillOptions,
                 vulkan_icd: str = "") -> None:
        from sim.backends.maniskill_tasks import TASKS

        self._single = single_env
        self._options, self._icd = options, vulkan_icd
        self._cache: OrderedDict[int, SingleEnv] = OrderedDict()
        env_id = f"{PREFIX}/{SET_ID}"
        first = self._env(0)
        self._pad = max(TASKS[t].state_dim for t in SET_TASKS)
        self._limits = [0] * len(SET_TASKS)
        obs = {k: v for k, v in first.spec.observation.items() if not k.startswith("observation.images.")}
        obs[OBS_ENV_STATE] = TensorSpec((self._pad,), torch.float32)
        obs[TASK_INDEX] = TensorSpec((), torch.int64)
        cameras: tuple[str, ...] = ()
        if options.obs_mode == "rgb":
            cameras = (SET_CAMERA,)
            obs[image_key(SET_CAMERA)] = first.spec.observation[image_key(SET_CAMERA)]
        self.spec = EnvSpec(
            env_id=env_id, observation=obs, action=first.spec.action,
            max_episode_steps=options.max_episode_steps or max(_limit(t) for t in SET_TASKS),
            control_freq=first.spec.control_freq, cameras=cameras, tasks=SET_TASKS,
        )
        self.schedule = TaskSchedule(len(SET_TASKS), env_id)
        self._rng = np.random.default_rng()
        self._task = -1

    def _env(self, task: int) -> SingleEnv:
        env = self._cache.pop(task, None)
        if env is None:
            env = self._single(SET_TASKS[task], self._options, self._icd)
            while len(self._cache) >= max(1, self._options.task_cache):
                self._cache.popitem(last=False)[1].close()
        self._cache[task] = env
        return env

    def _pad_obs(self, obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = {k: v for k, v in obs.items() if k in self.spec.observation}
        state = obs[OBS_ENV_STATE]
        out[OBS_ENV_STATE] = np.concatenate([state, np.zeros(self._pad - state.shape[0], np.float32)])
        out[TASK_INDEX] = np.int64(self._task)
        return out

    def reset(self, seed: int | None) -> tuple[dict[str, np.ndarray], str]:
        """Take the next assignment, reset that task with a seed drawn from the slot's RNG."""
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        plan = self.schedule.next(self._rng)
        episode_seed = plan.seed if plan.seed is not None else int(self._rng.integers(2**31 - 1))
        self._task = plan.task
        obs, text = self._env(plan.task).reset(episode_seed)
        return self._pad_obs(obs), text

    def step(self, action: np.ndarray) -> StepOut:
        """Step the current task (terminated on success, truncated at its own limit)."""
        if self._task < 0:
            raise EnvError(f"{self.spec.env_id}: step() before reset()")
        out = self._cache[self._task].step(action)
        return replace(out, obs=self._pad_obs(out.obs))

    def schedule_tasks(self, weights: np.ndarray | None, plan: list[Assignment] | None) -> None:
        """Task weights / queued (task, seed) assignments; see :mod:`sim.tasks`."""
        self.schedule.set(weights, plan)

    def close(self) -> None:
        """Close every cached task env. Idempotent."""
        while self._cache:
            self._cache.popitem()[1].close()


def _limit(task: str) -> int:
    import gymnasium as gym

    return int(gym.spec(task).max_episode_steps or 0)


def make_set_single(single_env: Callable[[str, ManiSkillOptions, str], SingleEnv], options: ManiSkillOptions,
                    vulkan_icd: str) -> ManiSkillSetEnv:
    """Module-level factory (picklable through ``functools.partial``) run inside a worker."""
    if vulkan_icd:
        select_vulkan_icd(vulkan_icd)
    return ManiSkillSetEnv(single_env, options, vulkan_icd)
