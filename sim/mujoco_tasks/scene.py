"""Build the tabletop scene: our table/cubes/pad XML plus gym-hil's packaged Panda.

The robot's kinematics, inertias, collision meshes and Robotiq 2F-85 gripper
linkage come from the ``gym-hil`` package's ``assets/panda.xml`` (LeRobot's
copy of the MuJoCo Menagerie Panda), loaded by path at run time with
:class:`mujoco.MjSpec` and edited before compiling:

- the high-poly visual meshes (group 2) are deleted and the collision meshes
  are drawn instead, in flat colours, as convex hulls of at most
  :data:`MAX_HULL_VERTICES` vertices (~1.8k triangles for the whole robot,
  see :data:`RENDER_FLAGS`); the same hulls are the collision shapes;
- the arm does not collide with itself, and its base and shoulder links
  collide with nothing (speeds up the physics 2.5x);
- the seven torque motors become joint position servos (same force limits)
  and the arm is gravity-compensated, so an inverse-kinematics target set
  once per control step is tracked by MuJoCo's C loop with no Python in the
  physics substeps;
- ``assets/tabletop.xml`` turns shadows and off-screen anti-aliasing off.

Nothing is copied into this repository: only ``assets/tabletop.xml`` (table,
cubes, pad, camera) is ours.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import mujoco
import numpy as np

from sim.core import EnvError
from sim.mujoco_tasks.tasks import CUBE_COLORS

ASSETS = Path(__file__).parent / "assets"
TABLETOP_XML = ASSETS / "tabletop.xml"
ROBOT_PREFIX = "panda/"
ARM_JOINTS = tuple(f"joint{i}" for i in range(1, 8))
# Joint servo gains (N m / rad and N m s / rad): stiff shoulder/elbow, softer wrist.
_KP = (2000.0, 2000.0, 2000.0, 2000.0, 800.0, 800.0, 800.0)
_KV = (200.0, 200.0, 200.0, 200.0, 60.0, 60.0, 60.0)
# Flat colours of the robot's collision meshes.
_ARM_RGBA = (0.92, 0.92, 0.95, 1.0)
_GRIPPER_RGBA = (0.22, 0.22, 0.25, 1.0)
_PAD_RGBA = (0.08, 0.08, 0.08, 1.0)
_GRIPPER_BODIES = {"base_mount", "base"}
# Convex hulls (used for collision and drawn by the renderer) keep at most this many vertices:
# the 2F-85 base meshes alone have 56k triangles and 2.8k-triangle hulls otherwise.
MAX_HULL_VERTICES = 32
_NO_CONTACT_BODIES = {"link0", "link1", "link2"}
_ROBOT_CONTYPE = 2  # collides with contype-1 geoms (table, cubes) but not with itself
FINGER_PAD_GEOMS = ("left_pad1", "left_pad2", "right_pad1", "right_pad2")
GRIPPER_CTRL_MAX = 255.0  # the 2F-85 actuator's ctrl range is [0, 255]
GRIPPER_DRIVER_MAX = 0.8  # rad, driver joint at fully closed

# Scene flags for mujoco.Renderer.update_scene: draw mesh geoms as their convex hulls
# (~1.8k triangles for the whole robot instead of 72k for its collision meshes).
RENDER_FLAGS = ((mujoco.mjtVisFlag.mjVIS_CONVEXHULL, True),)


def gym_hil_assets() -> Path:
    """The folder of gym-hil's packaged MuJoCo assets (``panda.xml`` and meshes).

    Raises:
        EnvError: if gym-hil is not installed, saying how to install it.
    """
    try:
        import gym_hil
    except ImportError as exc:
        raise EnvError(
            "mujoco/*: the tabletop scene loads the Franka Panda model shipped by gym-hil, which is not "
            f"installed ({exc}). Install it with: pip install 'gym-hil==0.1.14'"
        ) from None
    path = Path(gym_hil.__file__).parent / "assets"
    if not (path / "panda.xml").is_file():
        raise EnvError(f"mujoco/*: {path / 'panda.xml'} is missing; reinstall gym-hil (pip install 'gym-hil==0.1.14')")
    return path


def _robot_spec() -> mujoco.MjSpec:
    """gym-hil's Panda + 2F-85 with visual meshes dropped, servos and gravity compensation."""
    folder = gym_hil_assets()
    robot = mujoco.MjSpec.from_file(str(folder / "panda.xml"))
    for geom in [g for g in robot.geoms if g.classname.name.endswith("/visual")]:
        robot.delete(geom)
    used = {g.meshname for g in robot.geoms}
    for mesh in list(robot.meshes):
        if (mesh.name or Path(mesh.file).stem) not in used:
            robot.delete(mesh)
        else:  # absolute path: the mesh moves into a spec whose model file lives elsewhere
            mesh.file = str(folder / mesh.file)
            mesh.maxhullvert = MAX_HULL_VERTICES
    for geom in robot.geoms:
        geom.group = 1  # visible by default (groups 0-2 are drawn)
        body = geom.parent.name
        # No self-collision (the joint limits and the 2F-85 linkage constraints keep the
        # links apart) and no base/shoulder contacts: robot geoms only touch the table and cubes.
        geom.contype, geom.conaffinity = (0, 0) if body in _NO_CONTACT_BODIES else (_ROBOT_CONTYPE, 1)
        if geom.name in FINGER_PAD_GEOMS:
            geom.rgba = _PAD_RGBA
        elif body.startswith(("left_", "right_")) or body in _GRIPPER_BODIES:
            geom.rgba = _GRIPPER_RGBA
        else:
            geom.rgba = _ARM_RGBA
    for body in robot.bodies:
        if body.name:
            body.gravcomp = 1.0
    for i, name in enumerate(ARM_JOINTS):
        act = robot.actuator(f"actuator{i + 1}")
        torque = np.array(act.ctrlrange, dtype=float)
        joint_range = np.array(robot.joint(name).range, dtype=float)
        act.set_to_position(kp=_KP[i], kv=_KV[i])
        act.ctrlrange = joint_range
        act.ctrllimited = mujoco.mjtLimited.mjLIMITED_TRUE
        act.forcerange = torque
        act.forcelimited = mujoco.mjtLimited.mjLIMITED_TRUE
    return robot


@functools.lru_cache(maxsize=4)
def build_model(image_size: int) -> mujoco.MjModel:
    """Compile the tabletop scene with off-screen buffers of ``image_size`` pixels.

    The model is cached per process and shared by every env in it (envs own
    their ``MjData``; nothing writes to the model after this).

    Raises:
        EnvError: if gym-hil's Panda model is missing or fails to compile.
    """
    scene = mujoco.MjSpec.from_file(str(TABLETOP_XML))
    frame = scene.worldbody.add_frame(pos=[0.0, 0.0, 0.0])
    frame.attach_body(_robot_spec().body("link0"), ROBOT_PREFIX, "")
    size = max(64, int(image_size))
    scene.visual.global_.offwidth = size
    scene.visual.global_.offheight = size
    try:
        return scene.compile()
    except ValueError as exc:
        raise EnvError(f"mujoco/*: compiling the tabletop scene with gym-hil's Panda failed: {exc}") from None


@dataclass(frozen=True)
class SceneIds:
    """Indices into ``MjModel``/``MjData`` arrays, looked up once per model."""

    arm_qpos: np.ndarray  # [7] qpos addresses of the arm joints
    arm_dof: np.ndarray  # [7] dof addresses of the arm joints
    arm_ctrl: np.ndarray  # [7] actuator ids of the arm servos
    arm_range: np.ndarray  # [7, 2] joint limits (rad)
    gripper_ctrl: int
    gripper_qpos: int  # qpos address of the right driver joint (0 open .. 0.8 closed)
    pinch_site: int
    cube_qpos: np.ndarray  # [3] qpos address of each cube's free joint (x, y, z, qw, qx, qy, qz)
    cube_dof: np.ndarray  # [3] dof address of each cube's free joint
    cube_geom: np.ndarray  # [3] geom id of each cube
    pad_mocap: int
    left_finger_geoms: np.ndarray  # [2] the pad boxes of the left finger
    right_finger_geoms: np.ndarray  # [2] the pad boxes of the right finger
    robot_geoms: np.ndarray  # every robot geom id
    front_camera: int
    wrist_camera: int

    @staticmethod
    def of(model: mujoco.MjModel) -> SceneIds:
        """Look every index up in ``model`` (built by :func:`build_model`)."""
        p = ROBOT_PREFIX
        joints = [model.joint(p + j) for j in ARM_JOINTS]
        cubes = [model.joint(f"{c}_cube") for c in CUBE_COLORS]
        robot_body_ids = {i for i in range(model.nbody) if model.body(i).name.startswith(p)}
        pad_body = model.body("pad")
        return SceneIds(
            arm_qpos=np.array([j.qposadr[0] for j in joints]),
            arm_dof=np.array([j.dofadr[0] for j in joints]),
            arm_ctrl=np.array([model.actuator(f"{p}actuator{i}").id for i in range(1, 8)]),
            arm_range=np.array([j.range for j in joints]),
            gripper_ctrl=model.actuator(p + "fingers_actuator").id,
            gripper_qpos=int(model.joint(p + "right_driver_joint").qposadr[0]),
            pinch_site=model.site(p + "pinch").id,
            cube_qpos=np.array([j.qposadr[0] for j in cubes]),
            cube_dof=np.array([j.dofadr[0] for j in cubes]),
            cube_geom=np.array([model.geom(f"{c}_cube").id for c in CUBE_COLORS]),
            pad_mocap=int(model.body_mocapid[pad_body.id]),
            left_finger_geoms=np.array([model.geom(p + g).id for g in FINGER_PAD_GEOMS[:2]]),
            right_finger_geoms=np.array([model.geom(p + g).id for g in FINGER_PAD_GEOMS[2:]]),
            robot_geoms=np.array([g for g in range(model.ngeom) if model.geom_bodyid[g] in robot_body_ids]),
            front_camera=model.camera("front").id,
            wrist_camera=model.camera(p + "handcam_rgb").id,
        )
