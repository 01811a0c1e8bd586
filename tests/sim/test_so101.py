"""The ``lerobot_env_so101/*`` backend: the SO-101 arm envs behind the sim contract."""

from __future__ import annotations

import pytest
import torch

from sim import OBS_ENV_STATE, OBS_STATE, TASK, EnvError, list_envs, make_env

pytest.importorskip(
    "lerobot_env_so101", reason="lerobot-env-so101 is not installed (pip install 'lerobot-env-so101==0.4.0')"
)

PICK = "lerobot_env_so101/SO101PickCube-v0"
PLACE = "lerobot_env_so101/SO101PickPlace-v0"
GRIPPER = 10  # index of the gripper opening (-1 closed .. +1 open) in the package's agent_pos
EE = slice(11, 14)  # end-effector xyz in agent_pos


def test_ids_are_listed():
    assert {PICK, PLACE} <= set(list_envs())


def test_image_state_instruction_and_fast_render_settings():
    vec = make_env(PICK, num_envs=1, seed=0, image_size=64)
    try:
        obs = vec.reset()
        assert obs["observation.images.front"].shape == (1, 64, 64, 3)
        assert obs["observation.images.front"].float().std() > 5
        assert obs[OBS_STATE].shape == (1, 14) and obs[OBS_ENV_STATE].shape == (1, 3)
        assert obs[TASK] == ["pick up the cube"]
        model = vec._envs[0].unwrapped.model
        assert (model.light_castshadow == 0).all() and model.vis.quality.offsamples == 0
    finally:
        vec.close()


def test_action_scale_and_gripper_convention():
    vec = make_env(PICK, num_envs=1, seed=0, obs_mode="state", action_scale=0.02)
    try:
        start = vec.reset()[OBS_STATE][0]
        obs, *_ = vec.step(torch.tensor([[0.0, 0.0, 0.0, -1.0]]))
        assert obs[OBS_STATE][0, GRIPPER] == pytest.approx(1.0)
        for _ in range(4):
            obs, *_ = vec.step(torch.tensor([[0.0, 0.0, 1.0, 1.0]]))
        assert obs[OBS_STATE][0, GRIPPER] == pytest.approx(-1.0)
        rise = float(obs[OBS_STATE][0, EE][2] - start[EE][2])
        # commanded 8 cm; the servos lag, but the package's own 1 m/unit scale would have saturated the workspace
        assert 0.015 < rise < 0.09, f"4 steps of +z at 2 cm/step raised the gripper {rise:.3f} m"
    finally:
        vec.close()


def test_seeded_block_and_goal_positions():
    vec = make_env(PLACE, num_envs=2, seed=0, obs_mode="state")
    try:
        a = vec.reset(seed=1)[OBS_ENV_STATE]
        b = vec.reset(seed=1)[OBS_ENV_STATE]
        c = vec.reset(seed=2)[OBS_ENV_STATE]
        assert a.shape == (2, 6) and torch.equal(a, b) and not torch.allclose(a, c)
        assert torch.linalg.norm(a[:, :2] - a[:, 3:5], dim=1).min() >= 0.08  # goal away from the block
    finally:
        vec.close()


def test_pick_place_expert_succeeds():
    vec = make_env(PLACE, num_envs=1, seed=0, obs_mode="state")
    try:
        vec.reset(seed=20)
        wins = episodes = 0
        for _ in range(5 * 100):
            _, _, _, _, info = vec.step(vec.expert_actions())
            if "episode" in info:
                episodes += 1
                wins += int(info["episode"]["success"][0])
                if episodes == 5:
                    break
        assert episodes == 5 and wins >= 4, f"expert: {wins}/{episodes}"
    finally:
        vec.close()
    pick = make_env(PICK, obs_mode="state")
    pick.reset()
    with pytest.raises(NotImplementedError, match="no scripted expert"):
        pick.expert_actions()
    pick.close()


def test_option_errors_name_the_field():
    with pytest.raises(EnvError, match="action_scale"):
        make_env(PICK, action_scale=1.0)
    with pytest.raises(EnvError, match="sparse only"):
        make_env(PLACE, reward_type="dense")
