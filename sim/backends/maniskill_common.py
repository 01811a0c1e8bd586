"""What both ManiSkill3 paths share: the options, the specs, ``gym.make`` arguments, the Vulkan probe.

The CPU path (:class:`sim.backends.maniskill.ManiSkillSingleEnv`, and the
registered backend in :mod:`sim.backends.maniskill`) and the GPU path
(:class:`sim.backends.maniskill_gpu.ManiSkillGPUVecEnv`) both build on this
module, so neither imports the other's module for it.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from sim.core import OBS_ENV_STATE, OBS_STATE, TensorSpec, image_key
from sim.options import SimOptions

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
        task_cache: ``maniskill/TabletopSet-v1``: task envs each slot keeps built (least recently
            used closed first; see :mod:`sim.backends.maniskill_set`).
    """

    sim_backend: str = "auto"
    reward_mode: str = "normalized_dense"
    robot_uids: str = ""
    vulkan_icd: str = ""
    task_cache: int = 4

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.sim_backend not in SIM_BACKENDS:
            raise ValueError(f"sim_backend must be one of {', '.join(SIM_BACKENDS)}; got {self.sim_backend!r}")
        if self.reward_mode not in REWARD_MODES:
            raise ValueError(f"reward_mode must be one of {', '.join(REWARD_MODES)}; got {self.reward_mode!r}")
        if self.task_cache < 1:
            raise ValueError(f"task_cache must be >= 1, got {self.task_cache}")

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


def select_vulkan_icd(icd: str, environ: MutableMapping[str, str] | None = None) -> None:
    """Point the Vulkan loader at the ICD json ``icd`` in ``environ`` (default ``os.environ``).

    Sets ``VK_DRIVER_FILES`` as well as ``VK_ICD_FILENAMES``: loaders from 1.3.234 on read the first and ignore
    the second when both are set (on a GPU machine whose environment sets ``VK_DRIVER_FILES``, the ICD
    asked for would otherwise be ignored).
    """
    environ = os.environ if environ is None else environ
    environ["VK_ICD_FILENAMES"] = icd
    environ["VK_DRIVER_FILES"] = icd


def vulkan_error(icd: str) -> str | None:
    """Why SAPIEN cannot find a Vulkan device with ``VK_ICD_FILENAMES=icd`` (None if it can).

    Runs a short Python subprocess (SAPIEN caches its device per process, so
    probing in this process could not be retried after installing a driver);
    the answer is cached per ``icd`` for the life of this process.
    """
    if icd not in _probe_cache:
        env = dict(os.environ)
        if icd:
            select_vulkan_icd(icd, env)
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


# ------------------------------------------------------------------ PhysX on CUDA

def physx_gpu_library() -> tuple[str, str]:
    """Where SAPIEN keeps PhysX's CUDA library (``libPhysXGpu_64.so``) and the URL it downloads it from.

    The library is not in SAPIEN's wheel: SAPIEN fetches it from GitHub the first time a GPU simulation is
    built, into ``~/.sapien/physx/<PhysX version>/``.
    """
    import sapien.physx

    version = sapien.physx.version()
    folder = os.path.join(os.path.expanduser("~"), ".sapien", "physx", version)
    url = f"https://github.com/sapien-sim/physx-precompiled/releases/download/{version}/linux-so.zip"
    return os.path.join(folder, "libPhysXGpu_64.so"), url


@functools.cache
def physx_gpu_error() -> str | None:
    """Why ManiSkill's GPU backend cannot run here although CUDA is present (None if it can).

    Enables SAPIEN's GPU PhysX once per process, which downloads its CUDA library on first use (see
    :func:`physx_gpu_library`); a machine that cannot reach GitHub and has no copy gets the reason and the fix.
    """
    try:
        import sapien.physx

        sapien.physx.enable_gpu()
        return None
    except Exception as exc:  # no network (requests), a bad download (zip), a library that does not load
        try:
            path, url = physx_gpu_library()
            fix = f"download {url} and unzip it into {os.path.dirname(path)}"
        except Exception:  # sapien itself missing or broken: the import error says it
            fix = "reinstall sapien"
        return (f"SAPIEN could not load PhysX's CUDA library ({type(exc).__name__}: {str(exc)[:200]}); "
                f"SAPIEN fetches it from GitHub on first use: {fix}")
