"""Batched simulators behind one contract (see :mod:`sim.core`).

``make_env("mujoco/pick-red", num_envs=8, seed=0)`` builds any backend; ids are
``<backend>/<task>`` and :func:`list_envs` lists them all.
"""

from sim.core import (
    OBS_ENV_STATE,
    OBS_IMAGE_PREFIX,
    OBS_STATE,
    TASK,
    EnvError,
    EnvSpec,
    Obs,
    TensorSpec,
    VecEnv,
    image_key,
)
from sim.options import SimOptions
from sim.registry import (
    ENVS,
    Backend,
    WristCamera,
    backends_with_wrist_camera,
    list_envs,
    make_env,
    wrist_camera_support,
)

# Importing a backend module registers it; simulators themselves load lazily.
from sim.backends import gym_hil, libero, libero_suite, maniskill, mujoco, so101  # noqa: E402,F401  isort: skip

__all__ = [
    "ENVS",
    "OBS_ENV_STATE",
    "OBS_IMAGE_PREFIX",
    "OBS_STATE",
    "TASK",
    "Backend",
    "EnvError",
    "EnvSpec",
    "Obs",
    "SimOptions",
    "TensorSpec",
    "VecEnv",
    "WristCamera",
    "backends_with_wrist_camera",
    "image_key",
    "list_envs",
    "make_env",
    "wrist_camera_support",
]
