"""``RobotEnv``: a robot behind the ``sim`` VecEnv contract (on the simulated LeRobot arm)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hardware.config_mujoco_robot import MujocoRobotConfig
from hardware.env import RobotEnv
from hardware.lerobot_adapter import LeRobotAdapter
from hardware.safety import SafetyConfig
from sim.core import OBS_STATE, TASK, EnvError, image_key


def test_robot_env_follows_the_vecenv_contract(tmp_path):
    adapter = LeRobotAdapter(MujocoRobotConfig(model="so101", camera_names=["front"], calibration_dir=tmp_path))
    adapter.connect()
    env = RobotEnv(adapter, control_hz=20, max_episode_steps=6, task="reach", safety=SafetyConfig(max_delta=[0.05]))
    try:
        obs = env.reset()
        assert env.num_envs == 1 and env.spec.action_dim == 6 and env.spec.cameras == ("front",)
        assert obs[OBS_STATE].shape == (1, 6) and obs[OBS_STATE].dtype == torch.float32
        assert obs[image_key("front")].shape == (1, 64, 64, 3) and obs[image_key("front")].dtype == torch.uint8
        assert obs[TASK] == ["reach"]
        with pytest.raises(EnvError, match=r"expected \[1, 6\]"):
            env.step(torch.zeros(6))
        start = obs[OBS_STATE][0].numpy().astype(np.float64)
        far = torch.full((1, 6), 10.0)  # out of every limit and a huge jump
        truncated = torch.tensor([False])
        steps = 0
        while not truncated.item():
            obs, reward, terminated, truncated, info = env.step(far)
            steps += 1
            target = adapter.robot.arm.targets
            assert np.all(target <= adapter.robot.arm.upper + 1e-9)
            assert np.all(np.abs(target - start) <= 0.05 * steps + 1e-9)
        assert steps == 6 and reward.shape == (1,) and not terminated.item()
        assert "final_obs" in info and info["episode"]["length"].item() == 6
        assert {v.kind for v in info["safety_violations"]} >= {"position_limit", "jump"}
    finally:
        env.close()
        adapter.disconnect()


def test_a_chunk_on_the_robot_holds_the_last_target_after_the_episode_ends(tmp_path):
    """Held steps of a chunk send the hold command (the new episode's reference), never zero joint targets."""
    adapter = LeRobotAdapter(MujocoRobotConfig(model="so101", camera_names=["front"], calibration_dir=tmp_path))
    adapter.connect()
    env = RobotEnv(adapter, control_hz=20, max_episode_steps=2, task="reach", safety=SafetyConfig(max_delta=[0.05]))
    try:
        env.reset()
        nudge = torch.full((1, 3, 6), 0.02) + torch.as_tensor(env.still_actions())[:, None]
        steps = env.step_chunk(nudge)  # ends after step 2; step 3 is held
        assert steps.truncated[:, 0].tolist() == [False, True, False]
        reference = env.guard.envelope.reference.copy()  # the new episode's reference, set at its auto-reset
        assert np.allclose(adapter.robot.arm.targets, reference, atol=1e-6)
        assert not np.allclose(adapter.robot.arm.targets, 0.0)
    finally:
        env.close()
        adapter.disconnect()
