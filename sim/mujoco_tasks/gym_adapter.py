"""Adapt a packaged gymnasium MuJoCo env (gym-hil, lerobot-env-so101) to :class:`sim.single.SingleEnv`.

Used by ``sim/backends/gym_hil.py`` and ``sim/backends/so101.py``. The
adapter

- makes the env with ``gym.make`` inside the process that steps it, then
  switches its renderer to fast settings: no shadows, no off-screen
  anti-aliasing (a renderer the package built eagerly is rebuilt, because the
  multi-sample buffer is fixed when its GL context is made);
- maps our normalized action ``[dx, dy, dz, gripper]`` in ``[-1, 1]``
  (gripper -1 open, +1 closed) onto the package's own gripper convention;
- renames observations to the contract's keys (``pixels/<cam>`` ->
  ``observation.images.<cam>``, ``agent_pos`` -> ``observation.state``) and
  adds ``observation.env_state`` read from the simulator;
- makes seeding reproducible for packages that draw from numpy's global RNG
  (gym-hil does): each env keeps its own global-RNG state and swaps it in
  only around ``reset``, leaving the caller's global RNG untouched.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from sim.core import OBS_ENV_STATE, OBS_STATE, EnvError, EnvSpec, TensorSpec, image_key
from sim.mujoco_tasks.gl import close_at_exit
from sim.single import SingleEnv, StepOut

GripperMap = Callable[[float], float]  # our gripper command in [-1, 1] -> the package's value
EnvStateFn = Callable[[Any], np.ndarray]  # unwrapped env -> float32 [P]
ExpertFactory = Callable[[], Any]  # -> object with reset() and act(unwrapped env) -> our action [4]


@dataclass(frozen=True)
class GymEnvConfig:
    """How to build and adapt one packaged env. Picklable (travels to worker processes).

    Attributes:
        env_id: our id, e.g. ``gym_hil/PandaPickCube-v0``.
        gym_id: the gymnasium id registered by the package.
        package: module to import so that ``gym_id`` is registered.
        install: the pip requirement to print when ``package`` is missing.
        make_kwargs: keyword arguments for ``gym.make`` (image_obs, reward type, ...).
        render_spec_class: ``module:Class`` of the package's rendering spec; when
            set, ``render_spec=Class(height=size, width=size)`` joins the kwargs.
        instruction: the language instruction of every episode.
        cameras: image keys under ``obs["pixels"]`` to emit (empty for state-only).
        control_freq: control steps per simulated second.
        gripper_map: our gripper command -> the package's gripper action.
        env_state_fn: privileged state ``float32 [P]`` from the unwrapped env.
        penalty_key: ``info`` key of a per-step penalty reported as its own reward term.
        expert_factory: builds a scripted expert, or None.
    """

    env_id: str
    gym_id: str
    package: str
    install: str
    make_kwargs: dict[str, Any] = field(default_factory=dict)
    render_spec_class: str = ""
    instruction: str = ""
    cameras: tuple[str, ...] = ()
    control_freq: float = 10.0
    gripper_map: GripperMap | None = None
    env_state_fn: EnvStateFn | None = None
    penalty_key: str | None = None
    expert_factory: ExpertFactory | None = None


def disable_slow_rendering(unwrapped: Any, size: int) -> None:
    """Turn off shadows and anti-aliasing of a packaged MuJoCo env; rebuild its renderer if it has one.

    ``unwrapped`` must expose ``model`` (an ``MjModel``); a renderer already
    built by the package is expected in its ``_viewer`` attribute (gym-hil
    and lerobot-env-so101 both keep it there).
    """
    import mujoco

    model = unwrapped.model
    model.light_castshadow[:] = 0
    model.vis.quality.offsamples = 0
    viewer = getattr(unwrapped, "_viewer", None)
    if isinstance(viewer, mujoco.Renderer):
        viewer.close()
        unwrapped._viewer = mujoco.Renderer(model, height=size, width=size)


class GymMujocoEnv(SingleEnv):
    """A packaged gymnasium MuJoCo env behind the :class:`SingleEnv` protocol.

    Raises:
        EnvError: if the package is not installed (saying what to install) or
            ``gym.make`` fails (naming the env id).
    """

    def __init__(self, cfg: GymEnvConfig, image_size: int, max_episode_steps: int) -> None:
        self.cfg = cfg
        try:
            import gymnasium as gym

            importlib.import_module(cfg.package)
        except ImportError as exc:
            raise EnvError(
                f"{cfg.env_id}: needs the {cfg.package!r} package ({exc}); pip install '{cfg.install}'"
            ) from None
        kwargs = dict(cfg.make_kwargs)
        if cfg.render_spec_class:
            module, _, name = cfg.render_spec_class.partition(":")
            kwargs["render_spec"] = getattr(importlib.import_module(module), name)(height=image_size, width=image_size)
        if max_episode_steps:
            kwargs["max_episode_steps"] = max_episode_steps
        try:
            with warnings.catch_warnings():  # the packages build float64 Box bounds; gymnasium warns
                warnings.simplefilter("ignore", UserWarning)
                self.env = gym.make(cfg.gym_id, **kwargs)
        except Exception as exc:  # a constructor error deep in the package: name the id and the options
            raise EnvError(
                f"{cfg.env_id}: gym.make({cfg.gym_id!r}, {kwargs}) failed: {type(exc).__name__}: {exc}"
            ) from exc
        self.unwrapped = self.env.unwrapped
        disable_slow_rendering(self.unwrapped, image_size)
        close_at_exit(self)
        self._np_state = np.random.RandomState().get_state()
        self._expert = cfg.expert_factory() if cfg.expert_factory is not None else None
        state_dim = int(self.env.observation_space["agent_pos"].shape[0])
        env_state_dim = len(self._env_state())
        obs_spec = {image_key(c): TensorSpec((image_size, image_size, 3), torch.uint8, 0, 255) for c in cfg.cameras}
        obs_spec[OBS_STATE] = TensorSpec((state_dim,), torch.float32)
        obs_spec[OBS_ENV_STATE] = TensorSpec((env_state_dim,), torch.float32)
        self.spec = EnvSpec(
            env_id=cfg.env_id,
            observation=obs_spec,
            action=TensorSpec((4,), torch.float32, -1.0, 1.0),
            max_episode_steps=int(self.env.spec.max_episode_steps),
            control_freq=cfg.control_freq,
            cameras=cfg.cameras,
        )

    def _env_state(self) -> np.ndarray:
        if self.cfg.env_state_fn is None:
            return np.zeros(0, dtype=np.float32)
        return np.asarray(self.cfg.env_state_fn(self.unwrapped), dtype=np.float32)

    def _convert(self, raw: dict[str, Any]) -> dict[str, np.ndarray]:
        obs = {OBS_STATE: np.asarray(raw["agent_pos"], dtype=np.float32), OBS_ENV_STATE: self._env_state()}
        for cam in self.cfg.cameras:
            obs[image_key(cam)] = np.asarray(raw["pixels"][cam], dtype=np.uint8)
        return obs

    def reset(self, seed: int | None) -> tuple[dict[str, np.ndarray], str]:
        """Reset; ``seed`` seeds both the env's gymnasium RNG and its private global-RNG stream."""
        if seed is not None:
            self._np_state = np.random.RandomState(seed).get_state()
        outer = np.random.get_state()
        np.random.set_state(self._np_state)
        try:
            raw, _ = self.env.reset(seed=seed)
        finally:
            self._np_state = np.random.get_state()
            np.random.set_state(outer)
        if self._expert is not None:
            self._expert.reset()
        return self._convert(raw), self.cfg.instruction

    def step(self, action: np.ndarray) -> StepOut:
        """Map ``action [4]`` to the package's convention and step once.

        Raises:
            EnvError: for a non-finite action.
        """
        a = np.clip(np.asarray(action, dtype=np.float32), -1.0, 1.0)
        if not np.all(np.isfinite(a)):
            raise EnvError(f"{self.cfg.env_id}: action contains NaN/inf: {action}")
        if self.cfg.gripper_map is not None:
            a[3] = self.cfg.gripper_map(float(a[3]))
        raw, reward, terminated, truncated, info = self.env.step(a)
        terms = {"task": float(reward)}
        if self.cfg.penalty_key is not None:
            terms[self.cfg.penalty_key] = float(info.get(self.cfg.penalty_key, 0.0))
        return StepOut(
            obs=self._convert(raw),
            reward=float(sum(terms.values())),
            terminated=bool(terminated),
            truncated=bool(truncated) and not terminated,
            success=bool(info.get("succeed", False)),
            reward_terms=terms,
        )

    def expert_action(self) -> np.ndarray:
        """The package's scripted controller, when this env has one (see the backend module).

        Raises:
            NotImplementedError: if the env has no scripted expert.
        """
        if self._expert is None:
            raise NotImplementedError(f"{self.cfg.env_id} has no scripted expert")
        return np.asarray(self._expert.act(self.unwrapped), dtype=np.float32)

    def close(self) -> None:
        """Close the gymnasium env (and its renderer). Idempotent."""
        env = getattr(self, "env", None)
        if env is not None:
            self.env = None
            env.close()
