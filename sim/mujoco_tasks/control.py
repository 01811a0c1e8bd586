"""End-effector delta control: normalized ``[dx, dy, dz, grip]`` -> arm joint targets.

Each control step the position target of the pinch point (between the
fingertips) moves by ``action[:3] * max_step`` metres, is clipped to the
workspace box and kept within ``max_lead`` of the measured pinch position (so
pushing against the table or a cube does not wind the target up). Damped
least-squares inverse kinematics on a scratch ``MjData`` turns the target
position plus a fixed top-down gripper orientation into seven joint angles,
which the joint position servos then track during the physics substeps.
The gripper action is an absolute command: -1 fully open, +1 fully closed.
"""

from __future__ import annotations

import mujoco
import numpy as np

from sim.mujoco_tasks.scene import GRIPPER_CTRL_MAX, SceneIds

# Workspace of the pinch point (m): x forward from the robot base, z up from the table top.
WORKSPACE_LOW = np.array([0.25, -0.32, 0.006])
WORKSPACE_HIGH = np.array([0.72, 0.32, 0.35])
# Joint-space posture the redundancy (elbow) is pulled toward; gym-hil's Panda home.
REST_POSTURE = np.array([0.0, 0.195, 0.0, -2.43, 0.0, 2.62, 0.785])
# Home pinch position at reset and fixed gripper orientation (fingers down, jaws along world y).
HOME_POS = np.array([0.45, 0.0, 0.16])
TARGET_ROT = np.array([[1.0, 0.0, 0.0], [0.0, -1.0, 0.0], [0.0, 0.0, -1.0]])
_DAMPING = 1e-3
_NULLSPACE_GAIN = 0.2


class EEController:
    """Differential IK for the Panda's pinch site with a fixed top-down orientation.

    Args:
        model: the compiled tabletop model.
        ids: its :class:`SceneIds`.
        max_step: metres per unit action per control step.
        max_lead: largest distance (m) the position target may run ahead of
            the measured pinch point.
        iterations: IK iterations per control step.
    """

    def __init__(
        self, model: mujoco.MjModel, ids: SceneIds, max_step: float, max_lead: float, iterations: int = 2
    ) -> None:
        self.model = model
        self.ids = ids
        self.max_step = max_step
        self.max_lead = max_lead
        self.iterations = iterations
        self._scratch = mujoco.MjData(model)
        self._jacp = np.zeros((3, model.nv))
        self._jacr = np.zeros((3, model.nv))
        self._target_quat = np.zeros(4)
        mujoco.mju_mat2Quat(self._target_quat, TARGET_ROT.flatten())
        self.target = HOME_POS.copy()
        self.q_target = REST_POSTURE.copy()

    def solve(self, q_seed: np.ndarray, target: np.ndarray, iterations: int) -> np.ndarray:
        """Joint angles ``[7]`` putting the pinch point at ``target [3]`` pointing down.

        Starts from ``q_seed`` and runs ``iterations`` damped least-squares
        steps with a null-space pull toward :data:`REST_POSTURE`; the result
        is clipped to the joint limits.
        """
        ids, d = self.ids, self._scratch
        q = q_seed.copy()
        cur_quat = np.zeros(4)
        rot_err = np.zeros(3)
        eye = np.eye(6)
        for _ in range(iterations):
            d.qpos[ids.arm_qpos] = q
            mujoco.mj_kinematics(self.model, d)
            mujoco.mj_comPos(self.model, d)
            mujoco.mj_jacSite(self.model, d, self._jacp, self._jacr, ids.pinch_site)
            jac = np.vstack([self._jacp[:, ids.arm_dof], self._jacr[:, ids.arm_dof]])  # [6, 7]
            mujoco.mju_mat2Quat(cur_quat, d.site_xmat[ids.pinch_site])
            mujoco.mju_subQuat(rot_err, self._target_quat, cur_quat)  # in the site frame
            rot_err_world = d.site_xmat[ids.pinch_site].reshape(3, 3) @ rot_err
            err = np.concatenate([target - d.site_xpos[ids.pinch_site], rot_err_world])
            jjt_inv = np.linalg.inv(jac @ jac.T + _DAMPING * eye)
            pinv = jac.T @ jjt_inv  # [7, 6]
            dq = pinv @ err + _NULLSPACE_GAIN * (np.eye(7) - pinv @ jac) @ (REST_POSTURE - q)
            q = np.clip(q + dq, ids.arm_range[:, 0], ids.arm_range[:, 1])
        return q

    def reset(self, data: mujoco.MjData, home: np.ndarray = HOME_POS) -> None:
        """Put the arm at rest above ``home`` with the gripper open (no physics step)."""
        q = self.solve(REST_POSTURE, home, iterations=30)
        data.qpos[self.ids.arm_qpos] = q
        data.qvel[self.ids.arm_dof] = 0.0
        data.ctrl[self.ids.arm_ctrl] = q
        data.ctrl[self.ids.gripper_ctrl] = 0.0
        self.q_target = q
        self.target = home.copy()

    def apply(self, data: mujoco.MjData, pinch_pos: np.ndarray, action: np.ndarray) -> None:
        """Set the servo and gripper controls for one control step from ``action [4]`` in [-1, 1]."""
        a = np.clip(action, -1.0, 1.0)
        target = np.clip(self.target + a[:3] * self.max_step, WORKSPACE_LOW, WORKSPACE_HIGH)
        self.target = np.clip(target, pinch_pos - self.max_lead, pinch_pos + self.max_lead)
        self.q_target = self.solve(self.q_target, self.target, self.iterations)
        data.ctrl[self.ids.arm_ctrl] = self.q_target
        data.ctrl[self.ids.gripper_ctrl] = 0.5 * (a[3] + 1.0) * GRIPPER_CTRL_MAX
