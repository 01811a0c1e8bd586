"""Forward kinematics through a MuJoCo model, for the Cartesian workspace box.

MuJoCo loads MJCF and URDF files, so any arm with a model can use the box:
the command's joint values (times ``scale``, e.g. ``pi / 180`` for degrees)
are written into the model's ``qpos`` for the listed joints, ``mj_kinematics``
runs, and the position of the end-effector site (or body) is compared with
the box.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass
class WorkspaceConfig:
    """A Cartesian box the end effector must stay in; off while ``model_path`` is empty."""

    model_path: str = ""
    """MJCF or URDF file of the arm (``so101`` / ``panda`` name the packaged sim models)."""
    site: str = ""
    """End-effector site name in the model (a body name also works)."""
    joints: list[str] = field(default_factory=list)
    """Model joint driven by each command dimension, in command order; ``""`` for a dimension
    that does not move the end effector (a gripper). Empty: the model's first A joints."""
    scale: float = 1.0
    """Multiplier from command units to model units (``0.017453292519943295`` for degrees)."""
    low: list[float] = field(default_factory=list)
    """Box corner ``[x, y, z]`` (metres, model world frame)."""
    high: list[float] = field(default_factory=list)
    """Opposite box corner ``[x, y, z]``."""


def resolve_model_path(name_or_path: str) -> Path:
    """A packaged model name (``so101``, ``panda``) or a file path -> the model file.

    Raises:
        FileNotFoundError: naming the path and the packaged names.
    """
    from hardware.sim_arm import PACKAGED_MODELS

    if name_or_path in PACKAGED_MODELS:
        return PACKAGED_MODELS[name_or_path].scene_path()
    path = Path(name_or_path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(
            f"model file {name_or_path!r} does not exist (packaged models: {', '.join(sorted(PACKAGED_MODELS))})"
        )
    return path


class ForwardKinematics:
    """End-effector position of joint vectors.

    Args:
        model_path: packaged model name or MJCF/URDF path.
        site: end-effector site (or body) name.
        joints: model joint per command dimension (``""`` to skip one).
        scale: command-unit to model-unit multiplier.

    Raises:
        ValueError: naming an unknown site or joint and listing the valid ones.
    """

    def __init__(self, model_path: str, site: str, joints: list[str], scale: float = 1.0) -> None:
        import mujoco

        self._mj = mujoco
        self.model = mujoco.MjModel.from_xml_path(str(resolve_model_path(model_path)))
        self.data = mujoco.MjData(self.model)
        m = self.model
        sites = [m.site(i).name for i in range(m.nsite)]
        bodies = [m.body(i).name for i in range(m.nbody)]
        if site in sites:
            self._kind, self._id = "site", sites.index(site)
        elif site in bodies:
            self._kind, self._id = "body", bodies.index(site)
        else:
            raise ValueError(
                f"safety.workspace.site: {site!r} is neither a site nor a body of {model_path}; "
                f"sites: {', '.join(s for s in sites if s)}"
            )
        names = [m.joint(i).name for i in range(m.njnt)]
        self._qpos_index: list[int] = []  # per command dimension, -1 = skipped
        for j in joints:
            if not j:
                self._qpos_index.append(-1)
                continue
            if j not in names:
                raise ValueError(f"safety.workspace.joints: {j!r} is not a joint of {model_path}; joints: {names}")
            self._qpos_index.append(int(m.jnt_qposadr[names.index(j)]))
        self.scale = float(scale)
        mujoco.mj_resetData(m, self.data)
        if m.nkey:
            self.data.qpos[:] = m.key_qpos[0]

    @property
    def num_dims(self) -> int:
        """Command dimensions this map reads."""
        return len(self._qpos_index)

    def position(self, q: np.ndarray) -> np.ndarray:
        """End-effector position ``float64 [3]`` (metres) for joint command ``q [A]``."""
        for dim, adr in enumerate(self._qpos_index):
            if adr >= 0:
                self.data.qpos[adr] = float(q[dim]) * self.scale
        self._mj.mj_kinematics(self.model, self.data)
        if self._kind == "site":
            return self.data.site_xpos[self._id].copy()
        return self.data.xpos[self._id].copy()


class Workspace:
    """An axis-aligned box ``[low, high]`` the end effector must stay in."""

    def __init__(self, fk: ForwardKinematics, low: np.ndarray, high: np.ndarray) -> None:
        self.fk = fk
        self.low = np.asarray(low, dtype=np.float64)
        self.high = np.asarray(high, dtype=np.float64)
        if self.low.shape != (3,) or self.high.shape != (3,) or (self.low > self.high).any():
            raise ValueError(f"safety.workspace.low/high must be [x, y, z] with low <= high, got {low} / {high}")

    @classmethod
    def from_config(cls, cfg: WorkspaceConfig, num_joints: int) -> Workspace:
        """Build from config for a robot with ``num_joints`` command dimensions.

        Raises:
            ValueError: naming the ``safety.workspace.*`` field that is wrong.
        """
        if not cfg.site:
            raise ValueError("safety.workspace.site is required when safety.workspace.model_path is set")
        if len(cfg.low) != 3 or len(cfg.high) != 3:
            raise ValueError("safety.workspace.low and safety.workspace.high must have 3 values [x, y, z]")
        joints = list(cfg.joints)
        if not joints:
            import mujoco

            model = mujoco.MjModel.from_xml_path(str(resolve_model_path(cfg.model_path)))
            joints = [model.joint(i).name for i in range(min(model.njnt, num_joints))]
        if len(joints) != num_joints:
            raise ValueError(
                f"safety.workspace.joints: expected {num_joints} entries (one per command dimension, '' to skip), "
                f"got {len(joints)}"
            )
        fk = ForwardKinematics(cfg.model_path, cfg.site, joints, cfg.scale)
        return cls(fk, np.asarray(cfg.low), np.asarray(cfg.high))

    def end_effector(self, q: np.ndarray) -> np.ndarray:
        """End-effector position ``[3]`` of command ``q``."""
        return self.fk.position(q)

    def contains(self, q: np.ndarray) -> bool:
        """True if the end effector of command ``q`` is inside the box."""
        p = self.fk.position(q)
        return bool(((p >= self.low) & (p <= self.high)).all())

    def clamp_segment(self, start: np.ndarray, target: np.ndarray, iterations: int = 24) -> np.ndarray:
        """The point furthest along ``start -> target`` (in joint space) whose end effector is in the box.

        ``start`` must be inside the box (the envelope guarantees it); the
        result is ``start + t (target - start)`` with the largest feasible ``t``
        found by bisection, so it keeps every per-joint bound both ends satisfy.
        """
        lo, hi = 0.0, 1.0
        for _ in range(iterations):
            mid = 0.5 * (lo + hi)
            if self.contains(start + mid * (target - start)):
                lo = mid
            else:
                hi = mid
        return start + lo * (target - start)
