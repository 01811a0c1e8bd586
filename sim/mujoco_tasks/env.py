"""One tabletop env: :class:`sim.single.SingleEnv` over the scene, task family and controller.

Observations (no batch dim):

- ``observation.images.front`` (and ``.wrist`` when enabled): ``uint8 [H, W, 3]``;
- ``observation.state``: ``float32 [11]`` = pinch point xyz (m, robot base
  frame = world frame, table top at z = 0), gripper opening (1 open, 0
  closed), the seven arm joint angles (rad);
- ``observation.env_state``: ``float32 [13]`` (privileged) = red, green, blue
  cube centres (3 x xyz), pad centre xyz, task index into
  :data:`sim.mujoco_tasks.tasks.ALL_TASKS`.

Actions ``float32 [4]`` in ``[-1, 1]``: pinch-point displacement ``dx, dy, dz``
(times ``max_step`` metres per step) and the gripper command (-1 open, +1
closed). See :mod:`sim.mujoco_tasks.control`.

Privileged signals (``StepOut.signals``, never observed by a policy; :data:`SIGNALS`):

=========================  ==================================================================
signal                     meaning
=========================  ==================================================================
``stage_progress``         leading task stages that hold (:func:`~sim.mujoco_tasks.tasks.stage_progress`)
``stage_count``            number of stages of the episode's task
``stage_<name>``           1 while stage ``<name>`` holds (0 for stages the task does not have)
``collision``              contacts of the arm or the target cube with a non-target cube
``collision_force``        summed normal force of those contacts (N)
``table_force``            summed normal force of arm-table contacts (N)
``ee_x/y/z``               pinch point (m, world frame)
``ee_step``                distance the pinch point moved during this step (m; path length)
``target_x/y/z``           centre of the cube the task moves (m)
``obstacle_count``         non-target cubes (2 for pick / push, 1 for stack)
``obstacle<k>_x/y/z``      their centres (m; 0 for k >= ``obstacle_count``)
``joint_limit_margin``     min over the arm joints of the distance to the nearer limit over the
                           joint's range (0 at a limit, 0.5 centred)
``grasped``                1 while both fingers touch the target cube
``achieved_task``          multi-task envs: 1 + the index into ``EnvSpec.tasks`` of another task of the
                           env's set whose success predicate holds now (the first such), else 0 (so
                           held steps, reported as 0, read as none): what the episode did instead of
                           its instruction, for hindsight relabeling
=========================  ==================================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mujoco
import numpy as np
import torch

from sim.core import OBS_ENV_STATE, OBS_STATE, EnvConfigError, EnvError, EnvSpec, TensorSpec, image_key
from sim.mujoco_tasks.control import HOME_POS, EEController
from sim.mujoco_tasks.expert import ScriptedExpert
from sim.mujoco_tasks.gl import close_at_exit
from sim.mujoco_tasks.scene import GRIPPER_DRIVER_MAX, RENDER_FLAGS, SceneIds, build_model
from sim.mujoco_tasks.tasks import (
    CUBE_HALF,
    STAGE_NAMES,
    MULTI,
    MULTI_MAX_EPISODE_STEPS,
    REWARD_MODES,
    ALL_TASKS,
    TASK_INDEX,
    TASKS,
    Task,
    TaskState,
    is_success,
    potentials,
    reward_terms,
    stage_flags,
    stage_progress,
)
from sim.single import SingleEnv, StepOut
from sim.tasks import TASK_INDEX as TASK_INDEX_KEY
from sim.tasks import Assignment, TaskSchedule

STATE_DIM = 11
ENV_STATE_DIM = 13
# Cube and pad centres are drawn in this xy box (m), at least these distances apart.
SPAWN_LOW = np.array([0.36, -0.17])
SPAWN_HIGH = np.array([0.58, 0.17])
MIN_CUBE_GAP = 0.075
MIN_PAD_GAP = 0.11
PUSH_CLEARANCE = 0.085  # push tasks: other cubes stay this far from the push path
MAX_CUBE_YAW = 0.4  # rad, cubes are rotated about z by up to this much
HOME_JITTER = 0.02  # m, the arm starts within this box around HOME_POS
MAX_OBSTACLES = 2  # non-target cubes reported in the signals
SIGNALS: tuple[str, ...] = (
    "stage_progress", "stage_count", *(f"stage_{n}" for n in STAGE_NAMES), "collision", "collision_force",
    "table_force", "ee_x", "ee_y", "ee_z", "ee_step", "target_x", "target_y", "target_z", "obstacle_count",
    *(f"obstacle{k}_{a}" for k in range(MAX_OBSTACLES) for a in "xyz"), "joint_limit_margin", "grasped",
    "achieved_task",
)


@dataclass(frozen=True)
class TabletopConfig:
    """Everything one :class:`TabletopEnv` needs, picklable (it travels to worker processes).

    Attributes:
        env_id: the full id, e.g. ``mujoco/pick-red``.
        task: task name or ``multi``.
        multi_tasks: ``multi``: the task names to draw from (empty: all).
        obs_mode: ``rgb`` or ``state``.
        image_size: camera height and width in pixels.
        wrist_camera: also render the wrist camera.
        max_episode_steps: steps before truncation (0: the task's default).
        control_freq: control steps per simulated second.
        max_step: metres the pinch target moves per step at action 1.
        reward_mode: ``potential``, ``absolute`` or ``sparse`` (see tasks.py).
        terminate_on_success: end the episode on the first success step.
    """

    env_id: str
    task: str
    multi_tasks: tuple[str, ...] = ()
    obs_mode: str = "rgb"
    image_size: int = 64
    wrist_camera: bool = False
    max_episode_steps: int = 0
    control_freq: float = 10.0
    max_step: float = 0.04
    reward_mode: str = "potential"
    terminate_on_success: bool = True


class TabletopEnv(SingleEnv):
    """A MuJoCo tabletop env implementing the :class:`sim.single.SingleEnv` protocol.

    The renderer is created lazily on the first rendered observation, so an
    env built in a parent process and never stepped there holds no GL context.

    Raises:
        EnvError: for an unknown task, reward mode or a control frequency the
            physics timestep does not divide.
    """

    def __init__(self, cfg: TabletopConfig) -> None:
        self.cfg = cfg
        if cfg.reward_mode not in REWARD_MODES:
            raise EnvConfigError(f"{cfg.env_id}: reward_mode must be one of {REWARD_MODES}, got {cfg.reward_mode!r}")
        if cfg.task == MULTI:
            names = cfg.multi_tasks or tuple(t.name for t in TASKS)
            bad = [n for n in names if n not in TASK_INDEX]
            if bad:
                raise EnvConfigError(f"{cfg.env_id}: unknown multi_tasks {bad}; valid: {sorted(TASK_INDEX)}")
            self._choices = [ALL_TASKS[TASK_INDEX[n]] for n in names]
            default_steps = (
                max(t.max_episode_steps for t in self._choices) if cfg.multi_tasks else MULTI_MAX_EPISODE_STEPS
            )
        elif cfg.task in TASK_INDEX:
            self._choices = [ALL_TASKS[TASK_INDEX[cfg.task]]]
            default_steps = self._choices[0].max_episode_steps
        else:
            raise EnvConfigError(f"{cfg.env_id}: unknown task {cfg.task!r}; valid: {sorted(TASK_INDEX)} and {MULTI!r}")
        self.model = build_model(cfg.image_size)
        self.data = mujoco.MjData(self.model)
        self.ids = SceneIds.of(self.model)
        n_sub = round(1.0 / (cfg.control_freq * self.model.opt.timestep))
        if n_sub < 1 or abs(n_sub * cfg.control_freq * self.model.opt.timestep - 1.0) > 1e-6:
            raise EnvConfigError(
                f"{cfg.env_id}: control_freq={cfg.control_freq} Hz must divide the physics rate "
                f"{1.0 / self.model.opt.timestep:.0f} Hz (e.g. 10 or 20)"
            )
        self.n_substeps = n_sub
        self.controller = EEController(self.model, self.ids, max_step=cfg.max_step, max_lead=1.5 * cfg.max_step)
        self.expert = ScriptedExpert(cfg.max_step)
        self.max_episode_steps = cfg.max_episode_steps or default_steps
        self.cameras: tuple[str, ...] = ()
        if cfg.obs_mode == "rgb":
            self.cameras = ("front", "wrist") if cfg.wrist_camera else ("front",)
        self._camera_ids = {"front": self.ids.front_camera, "wrist": self.ids.wrist_camera}
        size = cfg.image_size
        obs_spec = {image_key(c): TensorSpec((size, size, 3), torch.uint8, 0, 255) for c in self.cameras}
        obs_spec[OBS_STATE] = TensorSpec((STATE_DIM,), torch.float32)
        obs_spec[OBS_ENV_STATE] = TensorSpec((ENV_STATE_DIM,), torch.float32)
        multi = cfg.task == MULTI
        if multi:
            obs_spec[TASK_INDEX_KEY] = TensorSpec((), torch.int64)
        self.schedule = TaskSchedule(len(self._choices), cfg.env_id)
        self._task_slot = 0
        self.spec = EnvSpec(
            env_id=cfg.env_id,
            observation=obs_spec,
            action=TensorSpec((4,), torch.float32, -1.0, 1.0),
            max_episode_steps=self.max_episode_steps,
            control_freq=cfg.control_freq,
            cameras=self.cameras,
            tasks=tuple(t.name for t in self._choices) if multi else (),
            instructions=tuple(t.instruction for t in self._choices) if multi else (),
        )
        self._renderer: mujoco.Renderer | None = None
        self._scene_option = mujoco.MjvOption()
        for flag, value in RENDER_FLAGS:
            self._scene_option.flags[flag] = value
        self._rng = np.random.default_rng()
        self.task: Task = self._choices[0]
        self._elapsed = 0
        self._phi: dict[str, float] = {}
        self._state: TaskState | None = None
        self._table_geom = self.model.geom("table").id
        self._force = np.zeros(6)
        self._prev_pinch = np.zeros(3)  # the pinch point before the last step (ee_step)
        self._geom_sets: dict[str, Any] = {  # geom ids as Python sets for the per-step contact scans
            "robot": {int(g) for g in self.ids.robot_geoms},
            "left": {int(g) for g in self.ids.left_finger_geoms},
            "right": {int(g) for g in self.ids.right_finger_geoms},
            "cube_index": {int(g): i for i, g in enumerate(self.ids.cube_geom)},
        }

    # ------------------------------------------------------------------ episode

    def reset(self, seed: int | None) -> tuple[dict[str, np.ndarray], str]:
        """Start an episode: draw the task (``multi``), the cube/pad layout and the arm start."""
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        plan = self.schedule.next(self._rng)  # uniform: one rng.integers draw, as before task schedules existed
        if plan.seed is not None:
            self._rng = np.random.default_rng(plan.seed)
        rng = self._rng
        self._task_slot = plan.task
        self.task = self._choices[plan.task]
        m, d, ids = self.model, self.data, self.ids
        mujoco.mj_resetData(m, d)
        cubes_xy, pad_xy = sample_layout(rng, self.task)
        for i in range(3):
            yaw = rng.uniform(-MAX_CUBE_YAW, MAX_CUBE_YAW)
            adr = ids.cube_qpos[i]
            d.qpos[adr : adr + 3] = (*cubes_xy[i], CUBE_HALF)
            d.qpos[adr + 3 : adr + 7] = (np.cos(yaw / 2), 0.0, 0.0, np.sin(yaw / 2))
        d.mocap_pos[ids.pad_mocap] = (*pad_xy, 0.0)
        home = HOME_POS + rng.uniform(-HOME_JITTER, HOME_JITTER, size=3)
        self.controller.reset(d, home)
        mujoco.mj_forward(m, d)
        self.expert.reset()
        self._elapsed = 0
        self._state = self.read_state()
        self._phi = potentials(self.task, self._state)
        return self._observe(), self.task.instruction

    def schedule_tasks(self, weights: np.ndarray | None, plan: list[Assignment] | None) -> None:
        """Task weights / queued assignments of ``mujoco/multi`` and ``*-any`` (:mod:`sim.tasks`)."""
        if not self.spec.tasks:
            super().schedule_tasks(weights, plan)
        self.schedule.set(weights, plan)

    def step(self, action: np.ndarray) -> StepOut:
        """Apply ``action [4]`` for one control step (``n_substeps`` physics steps).

        Raises:
            EnvError: before the first reset, or for a non-finite action.
        """
        return self._step(action, render=True)

    def step_unrendered(self, action: np.ndarray) -> StepOut:
        """:meth:`step` without the camera images unless the episode ends (rendering is most of a step's cost)."""
        return self._step(action, render=False)

    def _step(self, action: np.ndarray, render: bool) -> StepOut:
        if self._state is None:
            raise EnvError(f"{self.cfg.env_id}: step() called before reset()")
        action = np.asarray(action, dtype=np.float64)
        if not np.all(np.isfinite(action)):
            raise EnvError(f"{self.cfg.env_id}: action contains NaN/inf at step {self._elapsed}: {action}")
        self._prev_pinch = self._state.pinch.copy()
        self.controller.apply(self.data, self._state.pinch, action)
        mujoco.mj_step(self.model, self.data, self.n_substeps)
        mujoco.mj_forward(self.model, self.data)  # positions, contacts and camera poses of the new state
        self._elapsed += 1
        terms, success = self.evaluate()
        terminated = success and self.cfg.terminate_on_success
        truncated = not terminated and self._elapsed >= self.max_episode_steps
        return StepOut(
            obs=self._observe(render or terminated or truncated),
            reward=float(sum(terms.values())),
            terminated=terminated,
            truncated=truncated,
            success=success,
            reward_terms=terms,
            signals=self.signals(),
        )

    def evaluate(self) -> tuple[dict[str, float], bool]:
        """Reward terms and success of the current simulator state; advances the potentials.

        Call after changing ``data`` by hand (tests teleport cubes, then call
        ``mujoco.mj_forward`` and this).
        """
        self._state = self.read_state()
        success = is_success(self.task, self._state)
        phi = potentials(self.task, self._state)
        terms = reward_terms(self.cfg.reward_mode, self._phi, phi, success)
        self._phi = phi
        return terms, success

    def obstacles(self) -> list[int]:
        """Indices of the non-target cubes of the current task (neither moved nor stacked on)."""
        return [i for i in range(3) if i not in (self.task.cube, self.task.base)]

    def signals(self) -> dict[str, float]:
        """The privileged signals of the current state (:data:`SIGNALS`, see the module doc)."""
        s, d, ids, task = self._state, self.data, self.ids, self.task
        assert s is not None
        flags = stage_flags(task, s)
        obstacles = self.obstacles()
        robot = self._geom_sets["robot"]
        obstacle_geoms = {int(g) for g in ids.cube_geom[obstacles]}
        movers = robot | {int(ids.cube_geom[task.cube])}
        table = self._table_geom
        collision, collision_force, table_force = 0, 0.0, 0.0
        for i, (g1, g2) in enumerate(d.contact.geom[: d.ncon].tolist()):  # Python ints: set lookups, not array scans
            hit = (g1 in obstacle_geoms and g2 in movers) or (g2 in obstacle_geoms and g1 in movers)
            on_table = (g1 == table and g2 in robot) or (g2 == table and g1 in robot)
            if hit or on_table:
                mujoco.mj_contactForce(self.model, d, i, self._force)
                normal = abs(float(self._force[0]))
                if hit:
                    collision, collision_force = collision + 1, collision_force + normal
                else:
                    table_force += normal
        q, rng = d.qpos[ids.arm_qpos], ids.arm_range
        margin = np.minimum(q - rng[:, 0], rng[:, 1] - q) / (rng[:, 1] - rng[:, 0])
        out = {"stage_progress": float(stage_progress(task, s)), "stage_count": float(len(task.stages))}
        out.update({f"stage_{n}": float(flags.get(n, False)) for n in STAGE_NAMES})
        out.update(collision=float(collision), collision_force=collision_force, table_force=table_force)
        out.update(zip(("ee_x", "ee_y", "ee_z"), map(float, s.pinch)))
        out["ee_step"] = float(np.linalg.norm(s.pinch - self._prev_pinch))
        out.update(zip(("target_x", "target_y", "target_z"), map(float, s.cubes[task.cube])))
        out["obstacle_count"] = float(len(obstacles))
        for k in range(MAX_OBSTACLES):
            xyz = s.cubes[obstacles[k]] if k < len(obstacles) else np.zeros(3)
            out.update(zip((f"obstacle{k}_x", f"obstacle{k}_y", f"obstacle{k}_z"), map(float, xyz)))
        out["joint_limit_margin"] = float(np.clip(margin.min(), 0.0, 0.5))
        out["grasped"] = float(s.grasped[task.cube])
        out["achieved_task"] = float(self.achieved_task() + 1)
        return out

    def achieved_task(self) -> int:
        """Index into ``spec.tasks`` of the first other task of a multi-task env's set whose success predicate
        holds in the current state; -1 for none or a single-task env."""
        assert self._state is not None
        if not self.spec.tasks:  # a single-task env
            return -1
        for i, other in enumerate(self._choices):
            if other is not self.task and is_success(other, self._state):
                return i
        return -1

    def expert_action(self) -> np.ndarray:
        """The scripted expert's next action ``float32 [4]`` (see :mod:`sim.mujoco_tasks.expert`)."""
        if self._state is None:
            raise EnvError(f"{self.cfg.env_id}: expert_action() called before reset()")
        # steer from the measured pinch point, not the controller's hidden target: then every input of the
        # expert is in the observation (cube poses aside), so a policy imitating it can be Markov
        return self.expert.act(self.task, self._state, self.gripper_closure(), self._state.pinch.copy())

    def close(self) -> None:
        """Free the renderer's GL context. Idempotent."""
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None

    # ------------------------------------------------------------------ state

    def gripper_closure(self) -> float:
        """0 fully open .. 1 fully closed (driver joint angle over its range)."""
        return float(np.clip(self.data.qpos[self.ids.gripper_qpos] / GRIPPER_DRIVER_MAX, 0.0, 1.0))

    def read_state(self) -> TaskState:
        """Snapshot of the privileged state the task predicates read."""
        d, ids = self.data, self.ids
        cubes = np.stack([d.qpos[a : a + 3] for a in ids.cube_qpos])
        speed = np.array([np.linalg.norm(d.qvel[a : a + 3]) for a in ids.cube_dof])
        grasped = np.zeros(3, dtype=bool)
        touched = np.zeros(3, dtype=bool)
        if d.ncon:
            sets = self._geom_sets
            cube_index = sets["cube_index"]
            left = [False, False, False]
            right = [False, False, False]
            for g1, g2 in d.contact.geom[: d.ncon].tolist():  # each contact, both ways round
                for cube, other in ((g1, g2), (g2, g1)):
                    i = cube_index.get(cube)
                    if i is None:
                        continue
                    touched[i] |= other in sets["robot"]
                    left[i] |= other in sets["left"]
                    right[i] |= other in sets["right"]
            grasped[:] = np.logical_and(left, right)
        return TaskState(
            pinch=d.site_xpos[ids.pinch_site].copy(),
            cubes=cubes,
            cube_speed=speed,
            pad=d.mocap_pos[ids.pad_mocap].copy(),
            grasped=grasped,
            touched=touched,
        )

    def _observe(self, render: bool = True) -> dict[str, np.ndarray]:
        d, ids, s = self.data, self.ids, self._state
        assert s is not None
        obs: dict[str, np.ndarray] = {
            OBS_STATE: np.concatenate([s.pinch, [1.0 - self.gripper_closure()], d.qpos[ids.arm_qpos]]).astype(
                np.float32
            ),
            OBS_ENV_STATE: np.concatenate([s.cubes.ravel(), s.pad, [TASK_INDEX[self.task.name]]]).astype(np.float32),
        }
        if self.spec.tasks:
            obs[TASK_INDEX_KEY] = np.int64(self._task_slot)
        if self.cameras and render:
            if self._renderer is None:
                size = self.cfg.image_size
                self._renderer = mujoco.Renderer(self.model, height=size, width=size)
                close_at_exit(self)
            for cam in self.cameras:
                self._renderer.update_scene(d, camera=self._camera_ids[cam], scene_option=self._scene_option)
                obs[image_key(cam)] = self._renderer.render()
        return obs


def sample_layout(rng: np.random.Generator, task: Task, tries: int = 1000) -> tuple[np.ndarray, np.ndarray]:
    """Cube centres ``[3, 2]`` and pad centre ``[2]`` (xy, m) by rejection sampling.

    Cubes are at least :data:`MIN_CUBE_GAP` apart and :data:`MIN_PAD_GAP`
    from the pad. For push tasks the other cubes also keep
    :data:`PUSH_CLEARANCE` from the straight path the pushed cube travels to
    the pad, extended backwards by the room the fingers need behind it.

    Raises:
        EnvError: if no layout is found in ``tries`` draws (cannot happen with
            the shipped constants; guards against edits).
    """
    for _ in range(tries):
        pts = rng.uniform(SPAWN_LOW, SPAWN_HIGH, size=(4, 2))
        cubes, pad = pts[:3], pts[3]
        gaps = np.linalg.norm(cubes[:, None] - cubes[None], axis=-1) + np.eye(3)
        if gaps.min() < MIN_CUBE_GAP or np.linalg.norm(cubes - pad, axis=-1).min() < MIN_PAD_GAP:
            continue
        if task.kind == "push":
            start = cubes[task.cube]
            direction = (pad - start) / np.linalg.norm(pad - start)
            behind = start - 0.07 * direction
            others = [cubes[j] for j in range(3) if j != task.cube]
            if min(_segment_distance(p, behind, pad) for p in others) < PUSH_CLEARANCE:
                continue
        return cubes, pad
    raise EnvError(f"mujoco/{task.name}: no valid cube/pad layout found in {tries} draws")


def _segment_distance(p: np.ndarray, a: np.ndarray, b: np.ndarray) -> float:
    ab = b - a
    t = float(np.clip(np.dot(p - a, ab) / np.dot(ab, ab), 0.0, 1.0))
    return float(np.linalg.norm(p - (a + t * ab)))
