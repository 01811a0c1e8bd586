"""The env-backend registry and ``make_env``.

A backend registers under the prefix of its env ids (``maniskill``,
``libero``, ``mujoco``, ...) with its options dataclass::

    @ENVS.register("mujoco", config=MujocoOptions)
    class MujocoBackend(Backend):
        def tasks(self) -> list[str]: ...
        def make(self, task, num_envs, seed, options) -> VecEnv: ...

Backend modules import their simulator lazily, inside ``make``, so listing
env ids never imports SAPIEN, robosuite or MuJoCo.

Callers ask a backend what it can do (:func:`wrist_camera_support`) instead of
testing env-id prefixes.
"""

from __future__ import annotations

import abc
import difflib
import enum
from dataclasses import fields
from typing import ClassVar

from sim.core import EnvConfigError, VecEnv
from sim.options import SimOptions
from vla_core.registry import Registry


class WristCamera(enum.Enum):
    """Whether a backend's envs have a wrist camera, and what switches it on."""

    NONE = "none"
    """No wrist camera; a ``wrist_camera`` option is rejected."""
    OPTIONAL = "optional"
    """The options' ``wrist_camera`` field switches it on."""
    ALWAYS = "always"
    """Rendered in every ``rgb`` observation; there is no switch (and no ``wrist_camera`` option)."""


class Backend(abc.ABC):
    """One family of envs, addressed as ``<prefix>/<task>``.

    Attributes:
        always_renders_wrist_camera: class-level capability: every ``rgb``
            observation holds a wrist camera, with no option to turn it off
            (see :func:`wrist_camera_support`).
    """

    always_renders_wrist_camera: ClassVar[bool] = False

    @abc.abstractmethod
    def tasks(self) -> list[str]:
        """Every valid task name of this backend (without the prefix)."""

    @abc.abstractmethod
    def make(self, task: str, num_envs: int, seed: int, options: SimOptions) -> VecEnv:
        """Build ``num_envs`` envs of ``task``. ``task`` is already validated."""


ENVS: Registry[type[Backend]] = Registry("env backend")


def wrist_camera_support(env_id: str) -> WristCamera:
    """How the backend of ``env_id`` (``<backend>/<task>``) provides a wrist camera.

    :attr:`WristCamera.ALWAYS` when the backend class sets
    ``always_renders_wrist_camera``, :attr:`WristCamera.OPTIONAL` when its options
    dataclass has a ``wrist_camera`` field, else :attr:`WristCamera.NONE` (also for
    an unknown backend; :func:`make_env` reports those).
    """
    prefix = env_id.partition("/")[0]
    if prefix not in ENVS:
        return WristCamera.NONE
    entry = ENVS.get(prefix)
    if entry.obj.always_renders_wrist_camera:
        return WristCamera.ALWAYS
    if entry.config is not None and "wrist_camera" in {f.name for f in fields(entry.config)}:
        return WristCamera.OPTIONAL
    return WristCamera.NONE


def backends_with_wrist_camera(support: WristCamera) -> list[str]:
    """The registered backend names whose wrist camera is ``support``, sorted (for messages)."""
    return [e.name for e in ENVS if wrist_camera_support(f"{e.name}/") is support]


def list_envs() -> list[str]:
    """Every valid env id, ``<prefix>/<task>``, sorted."""
    return [f"{e.name}/{t}" for e in ENVS for t in e.obj().tasks()]


def make_env(env_id: str, num_envs: int = 1, seed: int = 0, **options: object) -> VecEnv:
    """Build a :class:`sim.core.VecEnv` for ``env_id`` (e.g. ``maniskill/PickCube-v1``).

    Args:
        env_id: ``<backend>/<task>``; :func:`list_envs` lists them.
        num_envs: envs stepped together.
        seed: base seed; env ``i`` is seeded with ``seed + i`` on the first reset.
        **options: fields of the backend's options dataclass (``obs_mode``,
            ``image_size``, ``num_workers``, ...).

    Raises:
        EnvConfigError: for an unknown env id (listing the valid ones), an unknown
            option (listing the valid ones) or ``num_envs < 1`` (bad input).
        EnvError: from the backend, for what fails at run time (a missing package or driver).
    """
    if num_envs < 1:
        raise EnvConfigError(f"{env_id}: num_envs must be >= 1, got {num_envs}")
    prefix, _, task = env_id.partition("/")
    if prefix not in ENVS or not task:
        raise EnvConfigError(_unknown(env_id, list_envs()))
    entry = ENVS.get(prefix)
    backend = entry.obj()
    valid = backend.tasks()
    if task not in valid:
        raise EnvConfigError(_unknown(env_id, [f"{prefix}/{t}" for t in valid]))
    try:
        opts = ENVS.make_config(prefix, **options)
    except (ValueError, TypeError) as exc:
        raise EnvConfigError(f"{env_id}: {exc}") from None
    env = backend.make(task, num_envs, seed, opts)
    env._seed = seed  # first reset(seed=None) uses it
    return env


def _unknown(env_id: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(env_id, valid, n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    return f"unknown env id {env_id!r}.{hint} Valid env ids: {', '.join(summarize_ids(valid))}"


def summarize_ids(ids: list[str]) -> list[str]:
    """Collapse numbered ids into ranges: ``libero/libero_90/0 ... /89`` -> ``libero/libero_90/{0..89}``."""
    groups: dict[str, list[int]] = {}
    out: list[str] = []
    for i in ids:
        head, _, tail = i.rpartition("/")
        if tail.isdigit():
            if head not in groups:
                groups[head] = []
                out.append(head)
            groups[head].append(int(tail))
        else:
            out.append(i)
    return [f"{o}/{{{min(groups[o])}..{max(groups[o])}}}" if o in groups else o for o in out]
