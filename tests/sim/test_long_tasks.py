"""Long-horizon tabletop tasks (``mujoco/pick-place-stack``): stages, expert, and no change to the other ids.

The fingerprints below were computed with the code before long-horizon tasks
existed (commit 9176128): every existing env id must still produce the same
episodes for the same seeds, bit for bit (task draw, layout, physics, rewards,
expert actions).
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from sim import OBS_ENV_STATE, OBS_STATE, list_envs, make_env
from sim.mujoco_tasks.env import TabletopConfig, TabletopEnv
from sim.mujoco_tasks.tasks import (
    CUBE_HALF,
    LONG_TASKS,
    TASK_INDEX,
    TASKS,
    TaskState,
    is_success,
    stage_flags,
    stage_progress,
)

RED, GREEN, BLUE = 0, 1, 2
PPS = LONG_TASKS[0]


def fingerprint(env_id: str, seeds: range, steps: int = 25) -> str:
    """sha256 over reset observations, instructions, and ``steps`` expert steps (obs, reward) per seed."""
    env = make_env(env_id, num_envs=1, seed=0, obs_mode="state")
    h = hashlib.sha256()
    try:
        for seed in seeds:
            obs = env.reset(seed=seed)
            h.update(obs["task"][0].encode())
            for _ in range(steps):
                act = env.expert_actions()
                obs, rew, *_ = env.step(act)
                for t in (act, obs[OBS_STATE], obs[OBS_ENV_STATE], rew):
                    h.update(t.numpy().tobytes())
    finally:
        env.close()
    return h.hexdigest()[:16]


GOLDEN = {
    "mujoco/pick-red": "b869468b7b1d64a8",
    "mujoco/push-green-to-pad": "2bfeda78eff9a1af",
    "mujoco/stack-blue-on-red": "f72e1bd2875fc67d",
    "mujoco/multi": "e3a2769a9e24a694",
    "mujoco/pick-any": "5455f650cc4daf12",
    "mujoco/push-any": "1ec05149663344db",
    "mujoco/stack-any": "db657fa291361393",
}


@pytest.mark.parametrize("env_id", sorted(GOLDEN))
def test_existing_ids_produce_the_same_episodes_as_before(env_id):
    assert fingerprint(env_id, range(3)) == GOLDEN[env_id]


def test_long_task_is_listed_but_joins_no_task_set():
    assert "mujoco/pick-place-stack" in list_envs()
    assert PPS.name not in {t.name for t in TASKS}
    vec = make_env("mujoco/multi", num_envs=8, seed=0, obs_mode="state")
    try:
        seen = set()
        for seed in range(40):
            seen.add(vec.reset(seed=seed)["task"][0])
        assert PPS.instruction not in seen and len(seen) > 5
    finally:
        vec.close()


def _state(pinch, cubes, grasped=(False, False, False), touched=(False, False, False)) -> TaskState:
    return TaskState(pinch=np.asarray(pinch, float), cubes=np.asarray(cubes, float), cube_speed=np.zeros(3),
                     pad=np.array([0.45, 0.1, 0.0]), grasped=np.array(grasped), touched=np.array(touched))


def test_sequence_stages_and_success_on_hand_built_states():
    pad = [0.45, 0.1, CUBE_HALF]
    far = [[0.4, -0.1, CUBE_HALF], [0.5, -0.1, CUBE_HALF], [0.55, 0.0, CUBE_HALF]]
    s = _state([0.3, 0.0, 0.2], far)
    assert stage_progress(PPS, s) == 0 and not is_success(PPS, s)
    held = [[0.4, -0.1, CUBE_HALF + 0.03], far[1], far[2]]
    assert stage_progress(PPS, _state(held[0], held, grasped=(True, False, False))) == 3
    placed = [pad, far[1], far[2]]
    flags = stage_flags(PPS, _state([0.3, 0.0, 0.2], placed))
    assert flags["place"] and flags["reach"] and not flags["reach2"]  # first sub-task done, hand gone
    assert stage_progress(PPS, _state([0.3, 0.0, 0.2], placed)) == 4
    stacked = [pad, far[1], [pad[0], pad[1], pad[2] + 2 * CUBE_HALF]]
    done = _state([0.3, 0.0, 0.2], stacked)
    assert stage_progress(PPS, done) == 8 and is_success(PPS, done)
    off_pad = [[0.3, -0.15, CUBE_HALF], far[1], [0.3, -0.15, 3 * CUBE_HALF]]  # stacked, but not on the pad
    assert not is_success(PPS, _state([0.3, 0.0, 0.2], off_pad))


def test_sequence_expert_succeeds_and_passes_every_stage():
    env = TabletopEnv(TabletopConfig(env_id="mujoco/pick-place-stack", task="pick-place-stack", obs_mode="state"))
    wins = 0
    for seed in range(200, 208):
        env.reset(seed)
        best = 0
        for _ in range(env.max_episode_steps):
            out = env.step(env.expert_action())
            best = max(best, stage_progress(env.task, env.read_state()))
            if out.terminated or out.truncated:
                break
        wins += out.success
        assert best == len(PPS.stages) or not out.success
    assert wins >= 7, f"expert succeeded {wins}/8"
    env.close()
