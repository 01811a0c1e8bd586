"""LIBERO suites as one multi-task env: ``libero/<suite>``, ``libero/libero_standard``, ``libero/libero_130``.

Each env slot is a :class:`LiberoSuiteEnv`: at every reset it takes the next task (and init state) from
its :class:`sim.tasks.TaskSchedule` (queued assignments first, else a draw from the trainer's weights,
uniform by default), then restores that task's init state in a per-task :class:`LiberoEnv`. Task envs
are built on first use and kept in a small LRU cache (``task_cache`` per slot): switching to a cached
task costs a soft reset, a new one a scene build (~1-3 s).

Task names are ``<suite>/<index>`` (the single-task ids without the prefix). Observations are those of
the single-task envs (cameras, 8-dim state), with ``observation.env_state`` zero-padded to the largest
task's state size and ``task_index`` (into ``EnvSpec.tasks``). An episode truncates at its own suite's
limit (:data:`SUITE_MAX_STEPS`); the spec reports the largest.

Init states: a queued :class:`sim.tasks.Assignment` names one (the evaluation protocol does); otherwise
the slot draws one uniformly from the task's first ``train_init_states`` (0 = all 50) with the slot's RNG,
which a seeded reset reseeds (so a seed fixes task and init state under fixed weights).
"""

from __future__ import annotations

import contextlib
import io
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from sim.backends.libero import (
    ACTION_DIM,
    CAMERAS,
    CONTROL_FREQ,
    DEFAULT_IMAGE_SIZE,
    STATE_DIM,
    SUITE_MAX_STEPS,
    SUITE_UNIONS,
    LiberoEnv,
    SUITE_ENV,
    LiberoOptions,
    _import_libero,
    read_config,
)
from sim.core import OBS_ENV_STATE, OBS_STATE, EnvError, EnvSpec, TensorSpec, image_key
from sim.single import SingleEnv, StepOut
from sim.tasks import TASK_INDEX, Assignment, TaskSchedule

def suite_members(name: str) -> tuple[str, ...]:
    """The suites a suite id covers: itself, or those of a union (:data:`SUITE_UNIONS`)."""
    return SUITE_UNIONS.get(name, (name,))


@dataclass(frozen=True)
class TaskFacts:
    """What a suite env needs to know about one task before building it."""

    suite: str
    index: int
    instruction: str
    init_states: int
    state_size: int

    @property
    def name(self) -> str:
        return f"{self.suite}/{self.index}"


@lru_cache(maxsize=8)
def task_facts(name: str, config_dir: str) -> tuple[TaskFacts, ...]:
    """Instruction, init-state count and MuJoCo state size of every task of suite id ``name``.

    Reads LIBERO's benchmark tables and init-state files (no scene is built).
    """
    config = read_config(f"libero/{name}", Path(config_dir))
    _import_libero(f"libero/{name}", Path(config_dir), config["assets"])
    from libero.libero import benchmark

    out = []
    for suite in suite_members(name):
        with contextlib.redirect_stdout(io.StringIO()):
            bench = benchmark.get_benchmark(suite)()
        for i in range(bench.n_tasks):
            states = np.asarray(bench.get_task_init_states(i))
            out.append(TaskFacts(suite, i, bench.get_task(i).language, len(states), int(states.shape[1])))
    return tuple(out)


@SUITE_ENV.register("suite")
class LiberoSuiteEnv(SingleEnv):
    """One env slot of a suite id (see the module doc).

    Args:
        env_id: ``libero/<suite id>``.
        name: the suite id (a suite or a union).
        options: backend options (``task_cache``, ``train_init_states``, ...).
        config_dir: folder of LIBERO's ``config.yaml`` (already checked).

    Raises:
        EnvError: for a ``train_init_states`` larger than some task's init-state count.
    """

    def __init__(self, env_id: str, name: str, options: LiberoOptions, config_dir: str) -> None:
        self._facts = task_facts(name, config_dir)
        self._options = options
        self._config_dir = config_dir
        self._cache: OrderedDict[int, LiberoEnv] = OrderedDict()
        fewest = min(f.init_states for f in self._facts)
        if options.train_init_states > fewest:
            raise EnvError(f"{env_id}: train_init_states={options.train_init_states} exceeds the {fewest} init "
                           "states some task has")
        self._pad = max(f.state_size for f in self._facts)
        rgb = options.obs_mode == "rgb"
        size = options.image_size or DEFAULT_IMAGE_SIZE
        obs = {OBS_STATE: TensorSpec((STATE_DIM,), torch.float32),
               OBS_ENV_STATE: TensorSpec((self._pad,), torch.float32),
               TASK_INDEX: TensorSpec((), torch.int64)}
        if rgb:
            for cam in CAMERAS:
                obs[image_key(cam)] = TensorSpec((size, size, 3), torch.uint8, 0, 255)
        steps = options.max_episode_steps or max(SUITE_MAX_STEPS[f.suite] for f in self._facts)
        self.spec = EnvSpec(
            env_id=env_id, observation=obs, action=TensorSpec((ACTION_DIM,), torch.float32, -1.0, 1.0),
            max_episode_steps=steps, control_freq=CONTROL_FREQ, cameras=tuple(CAMERAS) if rgb else (),
            tasks=tuple(f.name for f in self._facts),
        )
        self.schedule = TaskSchedule(len(self._facts), env_id)
        self._rng = np.random.default_rng()
        self._task = -1
        self.init_state_index = -1

    def _env(self, task: int) -> LiberoEnv:
        """The task's env, built on first use; the least recently used one is closed past ``task_cache``."""
        env = self._cache.pop(task, None)
        if env is None:
            f = self._facts[task]
            env = LiberoEnv(f"libero/{f.name}", f.suite, f.index, self._options, self._config_dir)
            while len(self._cache) >= max(1, self._options.task_cache):
                self._cache.popitem(last=False)[1].close()
        self._cache[task] = env
        return env

    def reset(self, seed: int | None) -> tuple[dict[str, np.ndarray], str]:
        """Take the next assignment (see :mod:`sim.tasks`), restore its init state; returns (obs, instruction)."""
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        plan = self.schedule.next(self._rng)
        if plan.seed is not None:
            self._rng = np.random.default_rng(plan.seed)
        facts = self._facts[plan.task]
        if plan.init >= 0:
            index = plan.init
        elif self._options.init_state >= 0:
            index = self._options.init_state
        else:
            index = int(self._rng.integers(self._options.train_init_states or facts.init_states))
        self._task = plan.task
        env = self._env(plan.task)
        obs = env.restore(index)
        self.init_state_index = index
        return self._pad_obs(obs), facts.instruction

    def _pad_obs(self, obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        state = obs[OBS_ENV_STATE]
        if state.shape[0] < self._pad:
            obs[OBS_ENV_STATE] = np.concatenate([state, np.zeros(self._pad - state.shape[0], np.float32)])
        obs[TASK_INDEX] = np.int64(self._task)
        return obs

    def step(self, action: np.ndarray) -> StepOut:
        """Step the current task's env (truncation at its suite's limit)."""
        if self._task < 0:
            raise EnvError(f"{self.spec.env_id}: step() before reset()")
        out = self._cache[self._task].step(action)
        out.obs = self._pad_obs(out.obs)
        return out

    def schedule_tasks(self, weights: np.ndarray | None, plan: list[Assignment] | None) -> None:
        """Task weights / queued (task, init state, seed) assignments; see :mod:`sim.tasks`."""
        for a in plan or ():
            if 0 <= a.task < len(self._facts) and a.init >= self._facts[a.task].init_states:
                raise EnvError(f"{self.spec.env_id}: init state {a.init} out of range for task "
                               f"{self._facts[a.task].name} ({self._facts[a.task].init_states} init states)")
        self.schedule.set(weights, plan)

    def close(self) -> None:
        """Close every cached task env. Idempotent."""
        while self._cache:
            self._cache.popitem()[1].close()
