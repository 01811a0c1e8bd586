"""Scripted experts for ManiSkill3 tasks, acting from privileged state.

Each expert is a pure function ``(state [P], layout) -> action float32 [7]``
of one env's ``observation.env_state`` (field layout from
:mod:`sim.backends.maniskill_tasks`), for the Panda under the
``pd_ee_delta_pose`` controller:

- ``action[0:3]``: TCP translation, x0.1 m per step, robot-base frame (its
  axes are the world's for these tasks);
- ``action[3:6]``: rotation; ManiSkill scales the (norm-clipped) vector by
  ``rot_lower = -0.1``, so an action ``a`` turns the TCP by ``-0.1 * a`` rad
  about world-aligned axes through the TCP (XYZ Euler ~ axis-angle for such
  small angles);
- ``action[6]``: gripper, +1 open, -1 closed.

The experts are stateless: the phase (reach, descend, grasp, carry, place,
release) is read off the state itself, so they recover from slips and can
take over mid-episode.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Expert = Callable[[np.ndarray, dict[str, slice]], np.ndarray]

POS_SCALE = 0.1  # m per unit translation action
ROT_SCALE = -0.1  # rad per unit rotation action (note the sign, see module doc)
OPEN, CLOSED = 1.0, -1.0
MAX_ROT_ACTION = 1.0  # cap on the rotation action's norm
# How far past the target a translation command may reach (m). The PD controller lags
# behind each step's target, so a little overshoot speeds up the last centimetres; more
# is harmful: near the edge of the workspace an unreachable target makes ManiSkill's CPU
# IK fail, and a failed IK freezes the whole arm for that step.
MAX_OVERSHOOT = 0.01
# Cap on the translation action's norm. ManiSkill's CPU IK (100 iterations) fails on
# some long full-scale steps (0.1 m per axis) even well inside the workspace; a failed
# IK freezes the arm for the step, and a stateless expert would repeat the same step.
MAX_TRANSLATION = 0.6
CUBE_HALF = 0.02  # m, the cubes of PickCube, PushCube and StackCube
GRIPPER_OPEN_WIDTH = 0.07  # m; the Panda opens to 0.08


# ------------------------------------------------------------------ geometry


def quat_to_mat(q: np.ndarray) -> np.ndarray:
    """Rotation matrix ``[3, 3]`` of a unit quaternion ``[w, x, y, z]``."""
    w, x, y, z = q / np.linalg.norm(q)
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
            [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
            [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
        ]
    )


def mat_to_rotvec(m: np.ndarray) -> np.ndarray:
    """Axis-angle vector ``[3]`` (rad) of a rotation matrix ``[3, 3]``."""
    cos = np.clip((np.trace(m) - 1.0) / 2.0, -1.0, 1.0)
    angle = float(np.arccos(cos))
    axis = np.array([m[2, 1] - m[1, 2], m[0, 2] - m[2, 0], m[1, 0] - m[0, 1]])
    if angle < 1e-6:
        return 0.5 * axis
    if np.pi - angle < 1e-3:  # near 180 deg: take the axis from the diagonal
        d = np.sqrt(np.clip((np.diag(m) + 1.0) / 2.0, 0.0, None))
        i = int(np.argmax(d))
        axis = m[:, i] + m[i, :]
        axis[i] = 2 * d[i] ** 2
        return angle * axis / np.linalg.norm(axis)
    return angle * axis / (2.0 * np.sin(angle))


def yaw_of(q: np.ndarray) -> float:
    """Rotation about world z (rad) of the frame ``q``'s x axis."""
    m = quat_to_mat(q)
    return float(np.arctan2(m[1, 0], m[0, 0]))


def wrap(angle: float, period: float) -> float:
    """``angle`` wrapped into ``[-period / 2, period / 2)``."""
    return float((angle + period / 2) % period - period / 2)


def top_down(yaw: float) -> np.ndarray:
    """TCP orientation ``[3, 3]`` pointing straight down (z = -world z) with its x axis at ``yaw``."""
    c, s = np.cos(yaw), np.sin(yaw)
    rz = np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])
    rx_pi = np.diag([1.0, -1.0, -1.0])
    return rz @ rx_pi


def grasp_yaw(tcp_q: np.ndarray, obj_q: np.ndarray) -> float:
    """The TCP yaw, nearest the current one, that puts the fingers across a cube's faces (90 deg symmetry)."""
    current = yaw_of(tcp_q)
    return current + wrap(yaw_of(obj_q) - current, np.pi / 2)


def pose_action(
    tcp_pose: np.ndarray,
    target_pos: np.ndarray,
    target_rot: np.ndarray,
    gripper: float,
    gain: float = 1.5,
    max_rot: float = MAX_ROT_ACTION,
) -> np.ndarray:
    """The ``pd_ee_delta_pose`` action ``[7]`` that moves the TCP toward a target pose.

    Args:
        tcp_pose: current TCP pose ``[7]`` (xyz, wxyz).
        target_pos: target TCP position ``[3]`` (m).
        target_rot: target TCP orientation ``[3, 3]``.
        gripper: gripper command (+1 open, -1 closed).
        gain: proportional gain; > 1 makes up for the PD controller lagging
            behind each step's target.
        max_rot: cap on the rotation action's norm.
    """
    err_pos = target_pos - tcp_pose[:3]
    step = gain * err_pos
    cap = float(np.linalg.norm(err_pos)) + MAX_OVERSHOOT
    if np.linalg.norm(step) > cap:
        step = step * (cap / np.linalg.norm(step))
    pos = step / POS_SCALE
    norm = float(np.linalg.norm(pos))
    if norm > MAX_TRANSLATION:  # scale uniformly so the direction is kept
        pos = pos * (MAX_TRANSLATION / norm)
    err = mat_to_rotvec(target_rot @ quat_to_mat(tcp_pose[3:7]).T)  # world frame
    rot = gain * err / ROT_SCALE
    norm = np.linalg.norm(rot)
    if norm > max_rot:
        rot = rot * (max_rot / norm)
    return np.concatenate([pos, rot, [gripper]]).astype(np.float32)


def _grasp_action(tcp: np.ndarray, width: float, obj: np.ndarray, hover: float = 0.06) -> np.ndarray:
    """Reach above a cube, descend with the gripper open and close it (one step of that sequence).

    Args:
        tcp: TCP pose ``[7]``; width: gripper opening (m); obj: cube pose ``[7]``;
        hover: height above the cube centre to approach from (m).
    """
    yaw = grasp_yaw(tcp[3:7], obj[3:7])
    rot = top_down(yaw)
    c = obj[:3]
    xy_err = float(np.linalg.norm(tcp[:2] - c[:2]))
    yaw_err = abs(wrap(yaw - yaw_of(tcp[3:7]), 2 * np.pi))
    height = tcp[2] - c[2]
    if height < 0.012 and xy_err < 0.012:
        # At the cube: close; reopen if the fingers shut on nothing.
        grip = OPEN if width < 0.004 else CLOSED
        return pose_action(tcp, c, rot, grip)
    if xy_err > 0.01 or yaw_err > 0.1:
        # Line up above the cube; stay high while far away so the fingers clear it.
        z = c[2] + (hover if xy_err > 0.02 else max(min(height, hover), 0.02))
        return pose_action(tcp, np.array([c[0], c[1], z]), rot, OPEN)
    grip = OPEN
    if width < GRIPPER_OPEN_WIDTH:  # wait for the fingers to open before descending
        return pose_action(tcp, np.array([c[0], c[1], tcp[2]]), rot, grip)
    return pose_action(tcp, c, rot, grip)


# ------------------------------------------------------------------ experts


def pick_cube_expert(state: np.ndarray, layout: dict[str, slice]) -> np.ndarray:
    """PickCube-v1: grasp the cube from above, carry it to the goal and hold still there."""
    tcp, width = state[layout["tcp_pose"]], float(state[layout["gripper_width"]][0])
    cube, goal = state[layout["cube_pose"]], state[layout["goal_pos"]]
    grasped = state[layout["is_grasped"]][0] > 0.5
    if not grasped:
        return _grasp_action(tcp, width, cube)
    # Carry: move the TCP so that the cube (held at its offset) lands on the goal.
    target = goal + (tcp[:3] - cube[:3])
    rot = top_down(yaw_of(tcp[3:7]))
    return pose_action(tcp, target, rot, CLOSED)


def push_cube_expert(state: np.ndarray, layout: dict[str, slice]) -> np.ndarray:
    """PushCube-v1: put the closed gripper behind the cube and push it onto the target."""
    tcp, cube, goal = state[layout["tcp_pose"]], state[layout["cube_pose"]], state[layout["goal_pos"]]
    to_goal = goal[:2] - cube[:2]
    direction = to_goal / max(float(np.linalg.norm(to_goal)), 1e-6)
    behind = cube[:2] - direction * (CUBE_HALF + 0.02)
    rel = tcp[:2] - cube[:2]
    along = float(rel @ direction)  # negative when the TCP is behind the cube
    lateral = float(abs(rel[0] * direction[1] - rel[1] * direction[0]))
    rot = top_down(yaw_of(tcp[3:7]))
    push_z = CUBE_HALF * 0.8
    if along < -CUBE_HALF and lateral < 0.01 and tcp[2] < 0.04:
        # In position: push through the cube toward the goal centre.
        target_xy = cube[:2] + direction * 0.05
        return pose_action(tcp, np.array([*target_xy, push_z]), rot, CLOSED)
    if np.linalg.norm(tcp[:2] - behind) > 0.015:
        # Travel above the cube's height to the point behind it.
        return pose_action(tcp, np.array([*behind, 0.07]), rot, CLOSED)
    return pose_action(tcp, np.array([*behind, push_z]), rot, CLOSED)


def stack_cube_expert(state: np.ndarray, layout: dict[str, slice]) -> np.ndarray:
    """StackCube-v1: grasp the red cube, carry it above the green one, lower it and let go."""
    tcp, width = state[layout["tcp_pose"]], float(state[layout["gripper_width"]][0])
    a, b = state[layout["cubeA_pose"]], state[layout["cubeB_pose"]]
    grasped = state[layout["is_grasped"]][0] > 0.5
    stack_pos = b[:3] + np.array([0.0, 0.0, 2 * CUBE_HALF])
    xy_err = float(np.linalg.norm(a[:2] - b[:2]))
    placed = xy_err < 0.015 and abs(a[2] - stack_pos[2]) < 0.01
    rot = top_down(yaw_of(tcp[3:7]))
    if placed and (not grasped or abs(a[2] - stack_pos[2]) < 0.004):
        # On the stack: open and back off upward.
        up = tcp[:3] + np.array([0.0, 0.0, 0.02 if width > GRIPPER_OPEN_WIDTH else 0.0])
        return pose_action(tcp, up, rot, OPEN)
    if not grasped:
        return _grasp_action(tcp, width, a)
    offset = tcp[:3] - a[:3]
    carry_z = stack_pos[2] + 0.03
    if xy_err > 0.008:
        # Lift first if the cube is low, then fly over cube B.
        z = carry_z if a[2] > stack_pos[2] - 0.005 else a[2] + 0.05
        target_a = np.array([b[0], b[1], z]) if a[2] > stack_pos[2] - 0.005 else np.array([a[0], a[1], z])
        return pose_action(tcp, target_a + offset, rot, CLOSED)
    return pose_action(tcp, stack_pos + offset + np.array([0.0, 0.0, 0.002]), rot, CLOSED)


EXPERTS: dict[str, Expert] = {
    "PickCube-v1": pick_cube_expert,
    "PushCube-v1": push_cube_expert,
    "StackCube-v1": stack_cube_expert,
}
