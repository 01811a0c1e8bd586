"""The ``mujoco/*`` tabletop backend: predicates, rewards, language conditioning, determinism, experts.

Most tests drive :class:`sim.mujoco_tasks.env.TabletopEnv` directly in
``state`` mode (no rendering, ~500 steps/s); the rendering and vector-env
paths are covered through ``make_env``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import mujoco
import numpy as np
import pytest
import torch

from rewards.terms import env_step_terms, env_terms
from sim import OBS_ENV_STATE, OBS_STATE, TASK, EnvError, list_envs, make_env
from sim.mujoco_tasks.env import TabletopConfig, TabletopEnv
from sim.mujoco_tasks.tasks import (
    CUBE_HALF,
    LONG_TASKS,
    REWARD_SCALES,
    REWARD_TERMS,
    TASK_INDEX,
    TASKS,
    TaskState,
    is_success,
    potentials,
    stage_flags,
    stage_progress,
)

ROOT = Path(__file__).resolve().parents[2]
RED, GREEN, BLUE = 0, 1, 2
FRONT = "observation.images.front"


def _env(task: str, **kw) -> TabletopEnv:
    kw.setdefault("obs_mode", "state")
    return TabletopEnv(TabletopConfig(env_id=f"mujoco/{task}", task=task, **kw))


def _teleport(env: TabletopEnv, cube: int, pos) -> None:
    """Put ``cube`` at ``pos`` (at rest, upright) and recompute the derived quantities."""
    adr, dof = env.ids.cube_qpos[cube], env.ids.cube_dof[cube]
    env.data.qpos[adr : adr + 7] = (*pos, 1.0, 0.0, 0.0, 0.0)
    env.data.qvel[dof : dof + 6] = 0.0
    mujoco.mj_forward(env.model, env.data)


def _run_expert(env: TabletopEnv, seed: int) -> tuple[bool, int, list[dict[str, float]]]:
    env.reset(seed)
    terms = []
    for t in range(env.max_episode_steps):
        out = env.step(env.expert_action())
        terms.append(out.reward_terms)
        if out.terminated or out.truncated:
            return out.success, t + 1, terms
    raise AssertionError("episode did not end by max_episode_steps")


# ----------------------------------------------------------------- listing


def test_task_family_is_listed_without_importing_mujoco():
    ids = [e for e in list_envs() if e.startswith("mujoco/")]
    for wanted in ("mujoco/pick-red", "mujoco/pick-blue", "mujoco/push-blue-to-pad", "mujoco/stack-red-on-green"):
        assert wanted in ids
    skill_ids = ["mujoco/pick-any", "mujoco/push-any", "mujoco/stack-any"]
    assert "mujoco/multi" in ids and all(i in ids for i in skill_ids)
    assert len(ids) == len(TASKS) + len(LONG_TASKS) + 1 + len(skill_ids)
    code = (
        "import sys; from sim.backends.mujoco import MujocoBackend; "
        "assert MujocoBackend().tasks(); assert 'mujoco' not in sys.modules, 'listing imported mujoco'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


# ------------------------------------------------------ success predicates


def _state(**kw) -> TaskState:
    cubes = np.array([[0.40, -0.10, CUBE_HALF], [0.45, 0.00, CUBE_HALF], [0.50, 0.10, CUBE_HALF]])
    base = {
        "pinch": np.array([0.45, 0.0, 0.16]),
        "cubes": cubes,
        "cube_speed": np.zeros(3),
        "pad": np.array([0.55, -0.10, 0.0]),
        "grasped": np.zeros(3, bool),
        "touched": np.zeros(3, bool),
    }
    base.update(kw)
    return TaskState(**base)


def test_predicates_on_hand_built_states():
    pick_red, push_blue = TASKS[TASK_INDEX["pick-red"]], TASKS[TASK_INDEX["push-blue-to-pad"]]
    stack = TASKS[TASK_INDEX["stack-red-on-green"]]
    s = _state()
    assert not any(is_success(t, s) for t in TASKS)  # initial layout: nothing is done
    held = s.cubes.copy()
    held[RED] = s.pinch + [0.0, 0.0, -0.01]
    assert is_success(pick_red, _state(cubes=held))
    assert not is_success(TASKS[TASK_INDEX["pick-blue"]], _state(cubes=held))
    flicked = held.copy()
    flicked[RED] = s.pinch + [0.08, 0.0, 0.0]  # high up but not in the hand
    assert not is_success(pick_red, _state(cubes=flicked))
    on_pad = s.cubes.copy()
    on_pad[BLUE, :2] = s.pad[:2] + [0.02, -0.02]
    assert is_success(push_blue, _state(cubes=on_pad))
    on_pad[BLUE, 2] = 0.06  # carried over the pad, not resting on it
    assert not is_success(push_blue, _state(cubes=on_pad))
    stacked = s.cubes.copy()
    stacked[RED] = stacked[GREEN] + [0.005, 0.0, 2 * CUBE_HALF]
    assert is_success(stack, _state(cubes=stacked))
    assert not is_success(stack, _state(cubes=stacked, touched=np.array([True, False, False])))
    assert not is_success(stack, _state(cubes=stacked, cube_speed=np.array([0.2, 0.0, 0.0])))
    assert not is_success(TASKS[TASK_INDEX["stack-green-on-red"]], _state(cubes=stacked))
    offset = stacked.copy()
    offset[RED, 0] += 0.03
    assert not is_success(stack, _state(cubes=offset))


@pytest.mark.parametrize(
    "task, cube, where",
    [
        ("pick-red", RED, "pinch"),
        ("push-blue-to-pad", BLUE, "pad"),
        ("stack-red-on-green", RED, "on-green"),
    ],
)
def test_teleporting_into_the_goal_is_success_in_the_simulator(task, cube, where):
    env = _env(task)
    env.reset(seed=3)
    _, success = env.evaluate()
    assert not success
    s = env.read_state()
    goal = {
        "pinch": s.pinch,
        "pad": np.array([s.pad[0], s.pad[1], CUBE_HALF]),
        "on-green": s.cubes[GREEN] + [0.0, 0.0, 2 * CUBE_HALF],
    }[where]
    _teleport(env, cube, goal)
    terms, success = env.evaluate()
    assert success and terms["success"] == REWARD_SCALES["success"]
    _teleport(env, cube, goal + [0.1, 0.0, 0.0])
    assert not env.evaluate()[1]


# ----------------------------------------------------------------- rewards


def test_reward_is_the_sum_of_terms_and_potential_shaping_telescopes():
    env = _env("pick-red")
    env.reset(seed=5)
    start = potentials(env.task, env.read_state())
    success, _, terms = _run_expert(env, seed=5)
    assert success
    end = potentials(env.task, env.read_state())
    for k in ("reach", "grasp", "lift", "place"):
        assert sum(t[k] for t in terms) == pytest.approx(end[k] - start[k], abs=1e-9), k
    assert terms[-1]["success"] == 1.0 and all(t["success"] == 0.0 for t in terms[:-1])
    assert end["grasp"] == REWARD_SCALES["grasp"] and end["lift"] == pytest.approx(REWARD_SCALES["lift"])

    vec = make_env("mujoco/pick-red", num_envs=2, seed=0, obs_mode="state")
    vec.reset()
    _, reward, _, _, info = vec.step(vec.expert_actions())
    assert set(info["reward_terms"]) == set(REWARD_TERMS)
    assert torch.allclose(reward, sum(info["reward_terms"].values()))
    # the documented terms (rewards.terms): env (= the reward), success (= the flag), and the breakdown
    terms = env_step_terms(reward, info)
    assert set(terms) == {"env", "success", *REWARD_TERMS}
    assert torch.equal(terms["env"], reward) and torch.equal(terms["success"], info["success"].float())
    steps = vec.step_chunk(vec.expert_actions()[:, None].repeat(1, 3, 1))
    chunk_terms = env_terms(steps)
    assert set(chunk_terms) == set(terms) and torch.equal(chunk_terms["env"], steps.reward)
    assert torch.allclose(steps.reward, sum(chunk_terms[k] for k in REWARD_TERMS))
    vec.close()


@pytest.mark.parametrize("mode", ["absolute", "sparse"])
def test_reward_modes(mode):
    env = _env("stack-red-on-green", reward_mode=mode)
    env.reset(seed=2)
    out = None
    for _ in range(12):  # the expert has grasped by now
        out = env.step(env.expert_action())
    phi = potentials(env.task, env.read_state())
    for k in ("reach", "grasp", "lift", "place"):
        expected = phi[k] if mode == "absolute" else 0.0
        assert out.reward_terms[k] == pytest.approx(expected), k
    if mode == "absolute":
        assert out.reward_terms["reach"] > 0.05 and out.reward_terms["grasp"] == REWARD_SCALES["grasp"]


# ------------------------------------------------------ language / multi


def test_multi_instruction_names_the_task_and_conditions_success():
    env = _env("multi")
    seen: dict[str, int] = {}
    for seed in range(40):
        obs, text = env.reset(seed)
        task_index = int(obs[OBS_ENV_STATE][-1])
        assert TASKS[task_index].instruction == text == env.task.instruction
        seen.setdefault(TASKS[task_index].name, seed)
    assert len(seen) >= 8, f"multi drew only {sorted(seen)} in 40 episodes"
    # The same physical outcome (red cube in the hand) succeeds only under the instruction that asked for it.
    for name, cube, ok in (("pick-red", RED, True), ("pick-blue", RED, False), ("pick-blue", BLUE, True)):
        env.reset(seen[name])
        assert env.task.instruction == f"pick up the {name.split('-')[1]} cube"
        _teleport(env, cube, env.read_state().pinch)
        assert env.evaluate()[1] is ok, (name, cube)


def test_multi_tasks_subset_and_option_errors():
    vec = make_env("mujoco/multi", num_envs=6, seed=0, obs_mode="state", multi_tasks=("pick-red", "pick-blue"))
    texts = set()
    for seed in range(4):
        texts |= set(vec.reset(seed=seed * 10)[TASK])
    assert texts == {"pick up the red cube", "pick up the blue cube"}
    assert vec.spec.max_episode_steps == TASKS[TASK_INDEX["pick-red"]].max_episode_steps
    vec.close()
    with pytest.raises(EnvError, match="multi_tasks"):
        make_env("mujoco/multi", multi_tasks=("pick-purple",))
    with pytest.raises(EnvError, match="mujoco/pick-red: multi_tasks only applies"):
        make_env("mujoco/pick-red", multi_tasks=("pick-blue",))
    with pytest.raises(EnvError, match="mujoco/pick-red: .*reward_mode"):
        make_env("mujoco/pick-red", reward_mode="dense-ish")
    with pytest.raises(EnvError, match="control_freq"):
        make_env("mujoco/pick-red", control_freq=7.0)
    with pytest.raises(EnvError, match="control_mode"):
        make_env("mujoco/pick-red", control_mode="joint_pos")


# ------------------------------------------------- observations / control


def test_rendered_observations_and_specs():
    vec = make_env("mujoco/pick-red", num_envs=2, seed=0, wrist_camera=True)
    assert vec.spec.image_keys == [FRONT, "observation.images.wrist"]
    obs = vec.reset()
    assert obs[FRONT].shape == (2, 64, 64, 3) and obs[FRONT].dtype == torch.uint8
    assert obs[OBS_STATE].shape == (2, 11) and obs[OBS_ENV_STATE].shape == (2, 13)
    assert not torch.equal(obs[FRONT][0], obs[FRONT][1]), "different seeds, same picture"
    vec.close()
    big = make_env("mujoco/pick-red", image_size=128)
    assert big.reset()[FRONT].shape == (1, 128, 128, 3)
    big.close()


def _colour_pixels(img: np.ndarray) -> list[int]:
    """Pixels that are clearly red, green, blue (the cubes) and yellow (the pad)."""
    r, g, b = (img[..., i].astype(int) for i in range(3))
    return [
        int(((r > 150) & (g < 80) & (b < 80)).sum()),
        int(((g > 150) & (r < 80) & (b < 80)).sum()),
        int(((b > 150) & (r < 80) & (g < 100)).sum()),
        int(((r > 180) & (g > 160) & (b < 80)).sum()),
    ]


def test_every_cube_and_the_pad_are_in_view_at_64_pixels():
    env = _env("multi", obs_mode="rgb")
    for seed in range(12):
        counts = _colour_pixels(env.reset(seed)[0][FRONT])
        assert min(counts) >= 10, f"seed {seed}: red/green/blue/pad pixels {counts}"
    env.close()


def test_moving_a_cube_changes_the_front_image():
    env = _env("pick-red", obs_mode="rgb")
    before = env.reset(seed=1)[0][FRONT]
    _teleport(env, RED, env.read_state().cubes[RED] + [0.0, 0.06, 0.0])
    after = env._observe()[FRONT]
    assert (before != after).any(axis=-1).sum() > 10


def test_actions_move_the_pinch_point_and_the_gripper():
    env = _env("pick-red")
    obs, _ = env.reset(seed=0)
    start = obs[OBS_STATE][:3].copy()
    assert obs[OBS_STATE][3] > 0.95, "gripper starts open"
    for _ in range(3):
        out = env.step(np.array([1.0, 0.0, 0.0, -1.0]))
    moved = out.obs[OBS_STATE][:3] - start
    assert 0.08 < moved[0] < 0.14 and abs(moved[1]) < 0.01 and abs(moved[2]) < 0.01
    for _ in range(3):
        out = env.step(np.array([0.0, 0.0, -1.0, 1.0]))
    assert out.obs[OBS_STATE][2] < start[2] - 0.08
    assert out.obs[OBS_STATE][3] < 0.3, "gripper did not close"
    with pytest.raises(EnvError, match="NaN"):
        env.step(np.array([np.nan, 0, 0, 0]))


# ------------------------------------------------------------ determinism


def test_same_seed_same_episode_different_seed_different_layout():
    a, b = _env("multi", obs_mode="rgb"), _env("multi", obs_mode="rgb")
    oa, ta = a.reset(7)
    ob, tb = b.reset(7)
    assert ta == tb and all(np.array_equal(oa[k], ob[k]) for k in oa)
    rng = np.random.default_rng(0)
    for _ in range(15):
        act = rng.uniform(-1, 1, 4).astype(np.float32)
        sa, sb = a.step(act), b.step(act)
        assert all(np.array_equal(sa.obs[k], sb.obs[k]) for k in sa.obs)
        assert sa.reward == sb.reward
    oc, _ = b.reset(8)
    assert not np.allclose(oa[OBS_ENV_STATE][:9], oc[OBS_ENV_STATE][:9])
    a.close()
    b.close()


@pytest.mark.slow
def test_worker_processes_match_in_process_envs():
    kw = {"num_envs": 2, "seed": 4, "obs_mode": "rgb"}
    serial, procs = make_env("mujoco/multi", num_workers=0, **kw), make_env("mujoco/multi", num_workers=2, **kw)
    try:
        os_, op = serial.reset(), procs.reset()
        assert os_[TASK] == op[TASK]
        for _ in range(5):
            act = serial.expert_actions()
            assert torch.equal(act, procs.expert_actions())
            os_, rs, *_ = serial.step(act)
            op, rp, *_ = procs.step(act)
            assert torch.equal(os_[FRONT], op[FRONT]) and torch.equal(rs, rp)
    finally:
        serial.close()
        procs.close()


# ---------------------------------------------------------------- experts


@pytest.mark.parametrize("task", ["pick-red", "pick-blue", "push-blue-to-pad", "stack-red-on-green", "multi"])
def test_expert_succeeds_on_10_episodes(task):
    env = _env(task)
    wins = sum(_run_expert(env, seed)[0] for seed in range(100, 110))
    assert wins >= 9, f"{task}: expert succeeded {wins}/10"


@pytest.mark.slow
@pytest.mark.parametrize("task", [t.name for t in TASKS] + ["multi"])
def test_expert_succeeds_on_50_episodes(task):
    env = _env(task)
    results = [_run_expert(env, seed) for seed in range(1000, 1050)]
    wins = sum(r[0] for r in results)
    assert wins >= 45, f"{task}: expert succeeded {wins}/50"
    assert max(r[1] for r in results if r[0]) < env.max_episode_steps


def test_stage_predicates_on_hand_built_states():
    pick, push = TASKS[TASK_INDEX["pick-red"]], TASKS[TASK_INDEX["push-blue-to-pad"]]
    stack = TASKS[TASK_INDEX["stack-red-on-green"]]
    assert pick.stages == ("reach", "grasp", "lift") and stack.stages[-1] == "place"
    s = _state()
    assert stage_progress(pick, s) == 0 and not any(stage_flags(stack, s).values())
    near = s.cubes.copy()
    near[RED] = s.pinch + [0.0, 0.0, -0.02]  # in the hand's reach, but not grasped
    assert stage_flags(pick, _state(cubes=near)) == {"reach": True, "grasp": False, "lift": False}
    assert stage_progress(pick, _state(cubes=near)) == 1
    grasped = np.array([True, False, False])
    on_table = s.cubes.copy()
    on_table[RED] = [s.pinch[0], s.pinch[1], CUBE_HALF]
    low = _state(pinch=on_table[RED] + [0, 0, 0.005], cubes=on_table, grasped=grasped)
    assert stage_progress(pick, low) == 2  # grasped on the table: not lifted yet
    lifted = on_table.copy()
    lifted[RED, 2] += 0.03
    assert stage_progress(pick, _state(pinch=lifted[RED], cubes=lifted, grasped=grasped)) == 3
    # a later stage alone does not count: a cube on the pad without the hand near it is progress 0
    on_pad = s.cubes.copy()
    on_pad[BLUE, :2] = s.pad[:2]
    flags = stage_flags(push, _state(cubes=on_pad))
    assert flags["place"] and not flags["reach"] and stage_progress(push, _state(cubes=on_pad)) == 0
    stacked = s.cubes.copy()
    stacked[RED] = stacked[GREEN] + [0.0, 0.0, 2 * CUBE_HALF]
    assert stage_progress(stack, _state(pinch=stacked[RED], cubes=stacked, grasped=grasped)) == 4


def _numpy_contact_scan(env: TabletopEnv) -> tuple[list[bool], list[bool], int]:
    """``touched``, ``grasped`` per cube and the count of obstacle collisions, by numpy membership on the raw
    contact array: the plain form of what the env computes with Python sets."""
    d, ids = env.data, env.ids
    pairs = d.contact.geom[: d.ncon]
    touched, grasped = [], []
    for g in ids.cube_geom:
        other = np.concatenate([pairs[pairs[:, 0] == g, 1], pairs[pairs[:, 1] == g, 0]])
        touched.append(bool(np.isin(other, ids.robot_geoms).any()))
        grasped.append(bool(np.isin(other, ids.left_finger_geoms).any() and np.isin(other, ids.right_finger_geoms).any()))
    obstacles = ids.cube_geom[env.obstacles()]
    movers = np.append(ids.robot_geoms, ids.cube_geom[env.task.cube])
    hits = sum(1 for g1, g2 in pairs if (g1 in obstacles and g2 in movers) or (g2 in obstacles and g1 in movers))
    return touched, grasped, hits


@pytest.mark.parametrize("task", ["pick-red", "stack-green-on-blue"])
def test_the_contact_scans_match_a_plain_numpy_scan_at_every_step(task):
    """Expert steps with noise (grasps, lifts, nudged cubes): the env's per-step touched / grasped flags and its
    collision count equal a straightforward numpy scan of the same contacts."""
    env = _env(task)
    rng = np.random.default_rng(0)
    seen_grasp = 0
    for episode in range(3):
        env.reset(episode)
        for _ in range(env.max_episode_steps):
            action = np.clip(env.expert_action() + rng.normal(0.0, 0.4, 4), -1.0, 1.0).astype(np.float32)
            out = env.step(action)
            touched, grasped, hits = _numpy_contact_scan(env)
            assert env._state.touched.tolist() == touched and env._state.grasped.tolist() == grasped
            assert out.signals["collision"] == hits
            seen_grasp += any(grasped)
            if out.terminated or out.truncated:
                break
    assert seen_grasp > 0  # the comparison covered grasps, not only empty contact sets


def test_achieved_task_names_the_other_task_an_episode_accomplished():
    """Hindsight relabeling reads ``achieved_task``: told to pick the blue cube, holding the red one up is
    ``pick-red`` of the env's task set (1 + its index), holding the blue one is the episode's own success (0), and a
    single-task env never reports one."""
    env = TabletopEnv(TabletopConfig(env_id="mujoco/pick-any", task="multi", obs_mode="state",
                                     multi_tasks=("pick-red", "pick-green", "pick-blue")))
    for seed in range(3, 40):
        obs, text = env.reset(seed)
        if env.task.name == "pick-blue":
            break
    assert env.task.name == "pick-blue" and env.spec.instructions[env.spec.tasks.index("pick-blue")] == text
    env.evaluate()
    assert env.signals()["achieved_task"] == 0.0  # nothing lifted yet
    pinch = env.read_state().pinch
    _teleport(env, RED, pinch)
    assert env.evaluate()[1] is False
    assert env.signals()["achieved_task"] == 1 + env.spec.tasks.index("pick-red")
    _teleport(env, RED, [0.45, -0.15, CUBE_HALF])
    _teleport(env, BLUE, pinch)
    assert env.evaluate()[1] is True and env.signals()["achieved_task"] == 0.0
    single = _env("pick-red")
    single.reset(0)
    _teleport(single, GREEN, single.read_state().pinch)
    single.evaluate()
    assert single.signals()["achieved_task"] == 0.0 and single.spec.instructions == ()
