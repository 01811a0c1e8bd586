"""ManiSkill3 tabletop tasks (``maniskill/<Task>-v1``) behind the sim contract.

Two paths, picked by :attr:`ManiSkillOptions.sim_backend`:

- CPU (default without CUDA): one ``gym.make(task, sim_backend="physx_cpu")``
  env per :class:`ManiSkillSingleEnv`, built inside worker processes by
  :func:`sim.vector.build_vec_env` (ManiSkill's CPU sim holds one env per
  process).
- GPU (default with CUDA): :class:`sim.backends.maniskill_gpu.ManiSkillGPUVecEnv`,
  one ManiSkill env holding every sub-env in PhysX's CUDA simulation.

Observations (per env): ``observation.state`` ``float32 [25]`` (Panda qpos 9,
qvel 9, TCP pose 7), ``observation.env_state`` ``float32 [P]`` (the task's
privileged state, see :mod:`sim.backends.maniskill_tasks`), and with
``obs_mode="rgb"`` ``observation.images.<camera>`` ``uint8 [S, S, 3]`` for each
sensor camera of the task (``base_camera``; also ``hand_camera`` for robots
with a wrist camera, e.g. the default robot of StackCube and
PegInsertionSide). Actions default to ``pd_ee_delta_pose``: ``[-1, 1]^7`` =
TCP translation (x0.1 m, robot base frame), rotation (x0.1 rad, axis-angle in
the TCP-aligned frame) and gripper (-1 closed, +1 open).

SAPIEN needs a Vulkan driver even for state observations. :func:`make`
probes for one in a short subprocess and turns a missing driver into one
:class:`sim.core.EnvError` naming ``scripts/install_lavapipe.sh``.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from sim.core import OBS_ENV_STATE, OBS_STATE, EnvError, EnvSpec, TensorSpec, VecEnv, image_key
from sim.options import SimOptions
from sim.registry import ENVS, Backend
from sim.single import SingleEnv, StepOut

PREFIX = "maniskill"
DEFAULT_CONTROL_MODE = "pd_ee_delta_pose"
DEFAULT_IMAGE_SIZE = 128
REWARD_MODES = ("normalized_dense", "dense", "sparse", "none")
SIM_BACKENDS = ("auto", "cpu", "gpu")
INSTALL_SCRIPT = "scripts/install_lavapipe.sh"


@dataclass
class ManiSkillOptions(SimOptions):
    """ManiSkill3 options (on top of :class:`sim.options.SimOptions`).

    Attributes:
        sim_backend: ``auto`` (PhysX on CUDA when ``torch.cuda.is_available()``,
            else one CPU env per worker process), ``cpu`` or ``gpu``.
        reward_mode: ManiSkill reward returned as ``reward``:
            ``normalized_dense`` (dense shaping scaled to [0, 1]), ``dense``,
            ``sparse`` (1 on success) or ``none``. It is not decomposed into
            breakdown terms: the reward layer reports it as the ``env`` term,
            next to ``success`` (:mod:`rewards.terms`).
        robot_uids: ManiSkill robot id (``panda``, ``panda_wristcam``, ...);
            empty keeps the task's default. ``panda_wristcam`` adds a
            ``hand_camera`` image.
        vulkan_icd: path of a Vulkan ICD json (the one
            ``scripts/install_lavapipe.sh`` prints); empty uses
            ``VK_ICD_FILENAMES`` from the environment, or the system's drivers.
    """

    sim_backend: str = "auto"
    reward_mode: str = "normalized_dense"
    robot_uids: str = ""
    vulkan_icd: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.sim_backend not in SIM_BACKENDS:
            raise ValueError(f"sim_backend must be one of {', '.join(SIM_BACKENDS)}; got {self.sim_backend!r}")
        if self.reward_mode not in REWARD_MODES:
            raise ValueError(f"reward_mode must be one of {', '.join(REWARD_MODES)}; got {self.reward_mode!r}")

    @property
    def resolved_control_mode(self) -> str:
        """The controller name passed to ManiSkill."""
        return self.control_mode or DEFAULT_CONTROL_MODE

    @property
    def resolved_image_size(self) -> int:
        """Camera height and width in pixels."""
        return self.image_size or DEFAULT_IMAGE_SIZE


def gym_make_kwargs(options: ManiSkillOptions) -> dict[str, Any]:
    """Keyword arguments for ``gym.make`` shared by the CPU and GPU paths."""
    size = options.resolved_image_size
    kwargs: dict[str, Any] = {
        "obs_mode": "rgb" if options.obs_mode == "rgb" else "none",
        "control_mode": options.resolved_control_mode,
        "reward_mode": options.reward_mode,
        "render_backend": "gpu" if torch.cuda.is_available() else "cpu",
        # an unseeded (auto-)reset draws its episode seed from the seeded main RNG; without this it
        # randomizes with the process's global torch RNG, so episodes after the first were not reproducible
        "enhanced_determinism": True,
    }
    if options.obs_mode == "rgb":
        kwargs["sensor_configs"] = {"width": size, "height": size}
    if options.robot_uids:
        kwargs["robot_uids"] = options.robot_uids
    return kwargs


def observation_spec(state_dim: int, env_state_dim: int, cameras: tuple[str, ...], size: int) -> dict[str, TensorSpec]:
    """Specs of proprioception, privileged state and one ``size x size`` RGB image per camera."""
    spec = {
        OBS_STATE: TensorSpec((state_dim,), torch.float32),
        OBS_ENV_STATE: TensorSpec((env_state_dim,), torch.float32),
    }
    for cam in cameras:
        spec[image_key(cam)] = TensorSpec((size, size, 3), torch.uint8, 0.0, 255.0)
    return spec


def action_spec(space: Any) -> TensorSpec:
    """A :class:`TensorSpec` from a gymnasium ``Box`` ``[A]``.

    Per-dimension bounds that differ are reported as their loosest scalar
    range (the spec holds one ``low`` and one ``high``).
    """
    low, high = np.asarray(space.low, dtype=np.float64), np.asarray(space.high, dtype=np.float64)
    return TensorSpec(
        shape=tuple(int(d) for d in space.shape),
        dtype=torch.float32,
        low=float(low.min()) if np.isfinite(low).all() else None,
        high=float(high.max()) if np.isfinite(high).all() else None,
    )


# ------------------------------------------------------------------ Vulkan


def default_lavapipe_icd() -> str:
    """Where ``scripts/install_lavapipe.sh`` writes its ICD json by default."""
    home = os.environ.get("VLA_RL_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "vla-rl")
    return os.path.join(home, "lavapipe", "lvp_icd.json")


_PROBE = """
import sys
try:
    import sapien
except ImportError as exc:
    print("IMPORT:" + str(exc)); sys.exit(3)
try:
    sapien.render.get_device_summary()
except RuntimeError as exc:
    print("VULKAN:" + str(exc)); sys.exit(4)
"""

_probe_cache: dict[str, str | None] = {}


def vulkan_error(icd: str) -> str | None:
    """Why SAPIEN cannot find a Vulkan device with ``VK_ICD_FILENAMES=icd`` (None if it can).

    Runs a short Python subprocess (SAPIEN caches its device per process, so
    probing in this process could not be retried after installing a driver);
    the answer is cached per ``icd`` for the life of this process.
    """
    if icd not in _probe_cache:
        env = dict(os.environ)
        if icd:
            env["VK_ICD_FILENAMES"] = icd
        try:
            res = subprocess.run(
                [sys.executable, "-c", _PROBE], check=False, env=env, capture_output=True, text=True, timeout=300
            )
        except subprocess.TimeoutExpired:
            return "the Vulkan probe did not finish within 300 s"
        lines = [ln for ln in res.stdout.splitlines() if ln.startswith(("IMPORT:", "VULKAN:"))]
        if res.returncode == 0:
            _probe_cache[icd] = None
        elif lines:
            _probe_cache[icd] = lines[-1]
        else:
            tail = (res.stderr.strip().splitlines() or ["no output"])[-1]
            _probe_cache[icd] = f"VULKAN:probe exited with code {res.returncode}: {tail}"
    return _probe_cache[icd]


def vulkan_message(env_id: str, reason: str, icd: str) -> str:
    """The one-paragraph user-facing text for a missing simulator or Vulkan driver."""
    kind, _, detail = reason.partition(":")
    if kind == "IMPORT":
        return (
            f"{env_id}: ManiSkill's simulator SAPIEN is not installed ({detail}); run: pip install 'mani-skill==3.0.1'"
        )
    default = default_lavapipe_icd()
    if icd:
        hint = f"the Vulkan ICD {icd!r} (vulkan_icd / VK_ICD_FILENAMES) does not work"
        if not os.path.isfile(icd):
            hint += " (no such file)"
        hint += f"; run {INSTALL_SCRIPT} and point VK_ICD_FILENAMES at the json path it prints"
    elif os.path.isfile(default):
        hint = f"lavapipe is already installed: export VK_ICD_FILENAMES={default}"
    else:
        hint = f"without an NVIDIA driver, run {INSTALL_SCRIPT} and export VK_ICD_FILENAMES=<the json path it prints>"
    return (
        f"{env_id}: SAPIEN (ManiSkill's simulator) found no usable Vulkan device ({detail.strip()}); "
        f"it needs one even for obs_mode='state'. Fix: {hint}."
    )


def is_vulkan_failure(exc: BaseException) -> bool:
    """Whether a SAPIEN exception means "no Vulkan device"."""
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(
        s in text for s in ("rendering device", "physical device", "vk::", "vulkan", "incompatibledriver")
    )


# ------------------------------------------------------------------ CPU path


class ManiSkillSingleEnv(SingleEnv):
    """One ManiSkill env on PhysX's CPU backend (see the module doc for obs and actions).

    Args:
        task: a key of :data:`sim.backends.maniskill_tasks.TASKS`.
        options: backend options.
        vulkan_icd: value for ``VK_ICD_FILENAMES`` in this process (empty: leave it).

    Raises:
        EnvError: if SAPIEN finds no Vulkan device or ManiSkill rejects an option.
    """

    def __init__(self, task: str, options: ManiSkillOptions, vulkan_icd: str = "") -> None:
        if vulkan_icd:
            os.environ["VK_ICD_FILENAMES"] = vulkan_icd
        import gymnasium as gym
        import mani_skill.envs  # noqa: F401  registers the tasks

        from sim.backends.maniskill_tasks import TASKS

        env_id = f"{PREFIX}/{task}"
        self._task = TASKS[task]
        self._options = options
        try:
            self._env = gym.make(task, sim_backend="physx_cpu", num_envs=1, **gym_make_kwargs(options))
        except Exception as exc:
            if is_vulkan_failure(exc):
                raise EnvError(vulkan_message(env_id, f"VULKAN:{exc}", vulkan_icd)) from None
            raise EnvError(
                f"{env_id}: ManiSkill could not build the env with {gym_make_kwargs(options)}: {exc}"
            ) from exc
        self._base = self._env.unwrapped
        registered = gym.spec(task).max_episode_steps or 0
        self._max_steps = options.max_episode_steps or registered
        if self._max_steps <= 0:
            raise EnvError(f"{env_id}: the task sets no step limit; pass max_episode_steps > 0")
        self._cameras: tuple[str, ...] = tuple(self._base.scene.sensors) if options.obs_mode == "rgb" else ()
        self._t = 0
        size = options.resolved_image_size
        obs_spec = observation_spec(int(self._state()[0].shape[0]), self._task.state_dim, self._cameras, size)
        self.spec = EnvSpec(
            env_id=env_id,
            observation=obs_spec,
            action=action_spec(self._base.single_action_space),
            max_episode_steps=self._max_steps,
            control_freq=float(self._base.control_freq),
            cameras=self._cameras,
        )

    def _state(self) -> torch.Tensor:
        from sim.backends.maniskill_tasks import proprio_state

        return proprio_state(self._base)

    def _obs(self, raw: Any, info: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
        """Our observation of the current state; ``info``: ManiSkill's info of the same state (reused)."""
        obs = {
            OBS_STATE: self._state()[0].cpu().numpy(),
            OBS_ENV_STATE: self._task.read(self._base, info)[0].cpu().numpy(),
        }
        for cam in self._cameras:
            obs[image_key(cam)] = raw["sensor_data"][cam]["rgb"][0].cpu().numpy()
        return obs

    def reset(self, seed: int | None) -> tuple[dict[str, np.ndarray], str]:
        """Start an episode (``seed=None`` continues ManiSkill's RNG); returns (obs, instruction)."""
        raw, info = self._base.reset(seed=seed)
        self._t = 0
        return self._obs(raw, info), self._task.instruction

    def step(self, action: np.ndarray) -> StepOut:
        """Apply ``action [A]``; terminated on success, truncated after ``max_episode_steps``."""
        raw, reward, terminated, _, info = self._base.step(np.asarray(action, dtype=np.float32)[None])
        self._t += 1
        success = bool(info["success"][0]) if "success" in info else False
        r = float(reward[0]) if torch.is_tensor(reward) and reward.ndim else float(reward)
        return StepOut(
            obs=self._obs(raw, info),
            reward=r,
            terminated=bool(terminated[0]),
            truncated=self._t >= self._max_steps,
            success=success,
        )

    def expert_action(self) -> np.ndarray:
        """The scripted expert's action ``float32 [7]`` for the current state.

        Raises:
            NotImplementedError: if the task has no expert, or the control mode
                is not ``pd_ee_delta_pose`` (the experts' action space).
        """
        from sim.experts.maniskill import EXPERTS

        if self._task.task not in EXPERTS:
            raise NotImplementedError(
                f"{self.spec.env_id}: no scripted expert; experts exist for {', '.join(sorted(EXPERTS))}"
            )
        if self._options.resolved_control_mode != DEFAULT_CONTROL_MODE:
            raise NotImplementedError(
                f"{self.spec.env_id}: scripted experts act in control_mode={DEFAULT_CONTROL_MODE!r}, "
                f"not {self._options.resolved_control_mode!r}"
            )
        state = self._task.read(self._base)[0].cpu().numpy()
        return EXPERTS[self._task.task](state, self._task.layout())

    def close(self) -> None:
        """Close the ManiSkill env."""
        env = getattr(self, "_env", None)
        if env is not None:
            self._env = None
            env.close()


def _make_single(task: str, options: ManiSkillOptions, vulkan_icd: str) -> ManiSkillSingleEnv:
    """Module-level factory (picklable through ``functools.partial``) run inside a worker."""
    return ManiSkillSingleEnv(task, options, vulkan_icd)


# ------------------------------------------------------------------ backend


@ENVS.register(PREFIX, config=ManiSkillOptions)
class ManiSkillBackend(Backend):
    """ManiSkill3 tabletop tasks with the Panda arm (SAPIEN; needs Vulkan)."""

    def tasks(self) -> list[str]:
        """The supported ManiSkill task ids."""
        from sim.backends.maniskill_tasks import TASKS

        return sorted(TASKS)

    def make(self, task: str, num_envs: int, seed: int, options: SimOptions) -> VecEnv:
        """Build ``num_envs`` envs of ``task`` on the CPU (worker processes) or GPU path.

        Raises:
            EnvError: no Vulkan device, ``sim_backend='gpu'`` without CUDA, or
                a missing ``vulkan_icd`` file.
        """
        assert isinstance(options, ManiSkillOptions)
        env_id = f"{PREFIX}/{task}"
        if options.vulkan_icd and not os.path.isfile(options.vulkan_icd):
            raise EnvError(
                f"{env_id}: vulkan_icd={options.vulkan_icd!r} does not exist; run {INSTALL_SCRIPT} "
                "and pass the json path it prints"
            )
        icd = options.vulkan_icd or os.environ.get("VK_ICD_FILENAMES", "")
        cuda = torch.cuda.is_available()
        if options.sim_backend == "gpu" and not cuda:
            raise EnvError(f"{env_id}: sim_backend='gpu' needs CUDA (torch.cuda.is_available() is False); use 'cpu'")
        reason = vulkan_error(icd)
        if reason is not None:
            raise EnvError(vulkan_message(env_id, reason, icd))
        if options.sim_backend == "gpu" or (options.sim_backend == "auto" and cuda):
            from sim.backends.maniskill_gpu import ManiSkillGPUVecEnv

            if icd:
                os.environ["VK_ICD_FILENAMES"] = icd
            return ManiSkillGPUVecEnv(task, num_envs, options, env_id)
        from sim.vector import build_vec_env

        workers = options.num_workers if options.num_workers >= 0 else min(num_envs, os.cpu_count() or 1)
        factory = functools.partial(_make_single, task, options, icd)
        return build_vec_env([factory] * num_envs, env_id, workers, spin=options.spin)
