"""Per-task facts for the ManiSkill3 backend: instruction, privileged state layout.

Each supported ManiSkill task has a :class:`TaskDef` naming its language
instruction and the fields of its privileged state vector
(``observation.env_state``). The state is read straight from the simulator
objects (cube, goal, peg, ...) rather than from ManiSkill's observation, so it
is identical in ``state`` and ``rgb`` observation modes and on the CPU and GPU
paths. Every getter takes the unwrapped ManiSkill env and returns a
``float32`` torch tensor ``[num_envs, size]`` on the sim device.

Every layout starts with the fields the scripted experts share:
``tcp_pose`` (7: position xyz, quaternion wxyz, robot-base/world frame, m) and
``gripper_width`` (1, m: the sum of the two finger joint positions).

This module imports no simulator; getters only touch attributes of the env
object they are given.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

Getter = Callable[[Any], torch.Tensor]


@dataclass(frozen=True)
class StateField:
    """One named slice of the privileged state vector.

    ``info_key``: the key of ManiSkill's step/reset ``info`` (its ``evaluate()``) holding the same value
    computed on the same state, reused by :meth:`TaskDef.read` when given that info (saves e.g. a second
    contact query for ``is_grasped``).
    """

    name: str
    size: int
    get: Getter
    info_key: str = ""


@dataclass(frozen=True)
class TaskDef:
    """What the backend needs to know about one ManiSkill task.

    Attributes:
        task: the ManiSkill env id, e.g. ``PickCube-v1``.
        instruction: the language instruction given to the policy.
        fields: the privileged state layout, in order.
    """

    task: str
    instruction: str
    fields: tuple[StateField, ...]

    @property
    def state_dim(self) -> int:
        """Length of ``observation.env_state``."""
        return sum(f.size for f in self.fields)

    def layout(self) -> dict[str, slice]:
        """Field name -> slice into the flat state vector."""
        out: dict[str, slice] = {}
        start = 0
        for f in self.fields:
            out[f.name] = slice(start, start + f.size)
            start += f.size
        return out

    def read(self, base_env: Any, info: dict[str, Any] | None = None) -> torch.Tensor:
        """The privileged state ``float32 [num_envs, state_dim]`` of ``base_env``.

        ``info``: ManiSkill's info dict returned by the ``step``/``reset`` that produced the current
        state; fields with an ``info_key`` found there are taken from it instead of being recomputed.
        """
        parts = [
            _col(info[f.info_key] if info and f.info_key and f.info_key in info else f.get(base_env)).to(torch.float32)
            for f in self.fields
        ]
        return torch.cat(parts, dim=-1)


def unpack(layout: dict[str, slice], state: np.ndarray) -> dict[str, np.ndarray]:
    """Split one env's flat state ``[P]`` into named arrays (views)."""
    return {name: state[sl] for name, sl in layout.items()}


def _col(x: torch.Tensor) -> torch.Tensor:
    """Make ``[n]`` tensors ``[n, 1]`` so every field concatenates on the last dim."""
    return x.unsqueeze(-1) if x.ndim == 1 else x


# ------------------------------------------------------------------ getters


def _tcp_pose(env: Any) -> torch.Tensor:
    return env.agent.tcp.pose.raw_pose


def _gripper_width(env: Any) -> torch.Tensor:
    return env.agent.robot.get_qpos()[..., -2:].sum(dim=-1)


def _pose(attr: str) -> Getter:
    return lambda env: getattr(env, attr).pose.raw_pose


def _pos(attr: str) -> Getter:
    return lambda env: getattr(env, attr).pose.p


def _grasping(attr: str) -> Getter:
    return lambda env: env.agent.is_grasping(getattr(env, attr))


def _tensor(attr: str) -> Getter:
    """A per-env tensor attribute (``[n]`` or ``[n, k]``) of the task."""

    def get(env: Any) -> torch.Tensor:
        value = torch.as_tensor(getattr(env, attr), device=env.device)
        return value.expand(env.num_envs, *value.shape[1:]) if value.ndim > 1 else value

    return get


_COMMON = (StateField("tcp_pose", 7, _tcp_pose), StateField("gripper_width", 1, _gripper_width))

TASKS: dict[str, TaskDef] = {
    t.task: t
    for t in (
        TaskDef(
            "PickCube-v1",
            "pick up the red cube and move it to the green goal",
            _COMMON
            + (
                StateField("cube_pose", 7, _pose("cube")),
                StateField("goal_pos", 3, _pos("goal_site")),
                StateField("is_grasped", 1, _grasping("cube"), "is_grasped"),
            ),
        ),
        TaskDef(
            "PushCube-v1",
            "push the blue cube onto the red and white target",
            _COMMON + (StateField("cube_pose", 7, _pose("obj")), StateField("goal_pos", 3, _pos("goal_region"))),
        ),
        TaskDef(
            "PullCube-v1",
            "pull the blue cube back onto the red and white target",
            _COMMON + (StateField("cube_pose", 7, _pose("obj")), StateField("goal_pos", 3, _pos("goal_region"))),
        ),
        TaskDef(
            "StackCube-v1",
            "stack the red cube on top of the green cube",
            _COMMON
            + (
                StateField("cubeA_pose", 7, _pose("cubeA")),
                StateField("cubeB_pose", 7, _pose("cubeB")),
                StateField("is_grasped", 1, _grasping("cubeA"), "is_cubeA_grasped"),
            ),
        ),
        TaskDef(
            "LiftPegUpright-v1",
            "lift the peg and stand it upright on the table",
            _COMMON + (StateField("peg_pose", 7, _pose("peg")), StateField("is_grasped", 1, _grasping("peg"))),
        ),
        TaskDef(
            "PokeCube-v1",
            "use the peg to poke the red cube onto the red and white target",
            _COMMON
            + (
                StateField("cube_pose", 7, _pose("cube")),
                StateField("peg_pose", 7, _pose("peg")),
                StateField("goal_pos", 3, _pos("goal_region")),
                StateField("is_grasped", 1, _grasping("peg"), "is_peg_grasped"),
            ),
        ),
        TaskDef(
            "PegInsertionSide-v1",
            "insert the peg into the hole in the side of the box",
            _COMMON
            + (
                StateField("peg_pose", 7, _pose("peg")),
                StateField("peg_half_size", 3, _tensor("peg_half_sizes")),
                StateField("box_hole_pose", 7, lambda env: env.box_hole_pose.raw_pose),
                StateField("box_hole_radius", 1, _tensor("box_hole_radii")),
                StateField("is_grasped", 1, _grasping("peg")),
            ),
        ),
    )
}


def proprio_state(base_env: Any) -> torch.Tensor:
    """Robot proprioception ``float32 [num_envs, 2 * dof + 7]``: qpos, qvel, tcp pose.

    For the Panda (7 arm joints + 2 fingers) this is 9 + 9 + 7 = 25 values.
    """
    robot = base_env.agent.robot
    return torch.cat([robot.get_qpos(), robot.get_qvel(), _tcp_pose(base_env)], dim=-1).to(torch.float32)
