"""The ``gym_hil/*`` backend: LeRobot's gym-hil Panda envs behind the sim contract.

gym-hil steps a Python operational-space controller at 500 Hz and renders a
high-poly Panda, so these tests keep episodes to a few steps and mostly use
``state`` observations.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from rewards.terms import env_step_terms
from sim import OBS_ENV_STATE, OBS_STATE, TASK, EnvError, list_envs, make_env

pytest.importorskip("gym_hil", reason="gym-hil is not installed (pip install 'gym-hil==0.1.14')")

PICK = "gym_hil/PandaPickCube-v0"
GRIPPER_CMD = 14  # index of the gripper command (0..255) in gym-hil's agent_pos


def _inner(vec):
    """The adapter of env 0 of an in-process vector env."""
    return vec._envs[0]


def test_ids_are_listed():
    ids = [e for e in list_envs() if e.startswith("gym_hil/")]
    assert set(ids) == {"gym_hil/PandaPickCube-v0", "gym_hil/PandaArrangeBoxes-v0"}
    with pytest.raises(EnvError, match="gym_hil/PandaPickCube-v0"):
        make_env("gym_hil/PandaPickCubeKeyboard-v0")


def test_images_state_instruction_and_fast_render_settings():
    vec = make_env(PICK, num_envs=1, seed=0, image_size=64)
    try:
        obs = vec.reset()
        assert obs["observation.images.front"].shape == (1, 64, 64, 3)
        assert obs["observation.images.wrist"].shape == (1, 64, 64, 3)
        assert obs["observation.images.front"].float().std() > 5
        assert obs[OBS_STATE].shape == (1, 18) and obs[OBS_ENV_STATE].shape == (1, 3)
        assert obs[TASK] == ["pick up the cube"]
        model = _inner(vec).unwrapped.model
        assert (model.light_castshadow == 0).all() and model.vis.quality.offsamples == 0
        obs, reward, _, _, info = vec.step(torch.zeros(1, 4))
        assert set(info["reward_terms"]) == {"task", "discrete_penalty"}
        assert torch.allclose(reward, info["reward_terms"]["task"] + info["reward_terms"]["discrete_penalty"])
        assert set(env_step_terms(reward, info)) == {"env", "success", "task", "discrete_penalty"}
    finally:
        vec.close()


def test_reset_does_not_sleep_and_seeds_the_block_without_touching_global_rng():
    vec = make_env(PICK, num_envs=2, seed=0, obs_mode="state")
    try:
        np.random.seed(123)
        outer = np.random.get_state()[1].copy()
        t = time.perf_counter()
        a = vec.reset(seed=5)[OBS_ENV_STATE]
        assert time.perf_counter() - t < 0.9, "gym-hil's 1 s reset delay is still on"
        b = vec.reset(seed=5)[OBS_ENV_STATE]
        c = vec.reset(seed=6)[OBS_ENV_STATE]
        assert np.array_equal(np.random.get_state()[1], outer), "reset changed numpy's global RNG"
        assert torch.equal(a, b)
        assert not torch.equal(a[0], a[1]), "env 0 and env 1 got the same block position"
        assert not torch.allclose(a[0], c[0])
        assert ((a[:, :2] >= torch.tensor([0.3, -0.15])) & (a[:, :2] <= torch.tensor([0.5, 0.15]))).all()
    finally:
        vec.close()


def test_gripper_convention_minus_one_opens_plus_one_closes():
    vec = make_env(PICK, num_envs=1, seed=0, obs_mode="state")
    try:
        vec.reset()
        obs, *_ = vec.step(torch.tensor([[0.0, 0.0, 0.0, 1.0]]))
        assert obs[OBS_STATE][0, GRIPPER_CMD] == pytest.approx(255.0)
        obs, *_ = vec.step(torch.tensor([[0.0, 0.0, 0.0, -1.0]]))
        assert obs[OBS_STATE][0, GRIPPER_CMD] == pytest.approx(0.0)
        start = obs[OBS_STATE][0, 15:18].clone()
        for _ in range(3):
            obs, *_ = vec.step(torch.tensor([[0.0, 0.0, 1.0, 0.0]]))
        assert obs[OBS_STATE][0, 17] > start[2] + 0.03, "+z action did not raise the pinch point"
    finally:
        vec.close()


def test_arrange_boxes_state_mode_and_option_errors():
    vec = make_env("gym_hil/PandaArrangeBoxes-v0", num_envs=1, seed=0, obs_mode="state")
    try:
        obs = vec.reset()
        assert "observation.images.front" not in obs
        assert obs[OBS_ENV_STATE].shape[1] % 3 == 0 and obs[OBS_ENV_STATE].shape[1] >= 6
        assert vec.spec.max_episode_steps == 100
    finally:
        vec.close()
    with pytest.raises(EnvError, match="reward_type"):
        make_env(PICK, reward_type="shaped")
