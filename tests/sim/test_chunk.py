"""Hold-after-done, the one rule for running an action chunk (sim.chunk), on every chunk executor."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from sim.chunk import ChunkHold, first_episode_steps
from sim.core import OBS_STATE
from sim.vector import SerialVecEnv
from sim.vectorize import build_vec_env
from tests.sim.toy_env import CounterEnv


def test_hold_zeroes_ended_envs_and_reports_first_ends():
    hold = ChunkHold(3)
    acts = np.ones((3, 2), np.float32)
    assert hold.actions(acts) is acts
    assert hold.end(np.array([False, True, False])).tolist() == [False, True, False]
    assert hold.actions(acts).tolist() == [[1, 1], [0, 0], [1, 1]]
    assert hold.end(np.array([False, True, True])).tolist() == [False, False, True]  # env 1: a second end


def test_first_episode_steps():
    term = torch.tensor([[False, False], [True, False], [False, False], [False, True]])
    trunc = torch.tensor([[False, False], [False, False], [True, False], [False, False]])
    assert first_episode_steps(term, trunc).T.tolist() == [[True, True, False, False], [True, True, True, True]]


def _counter(n: int, steps: int) -> list:
    return [functools.partial(CounterEnv, episode_steps=steps, goal=100.0) for _ in range(n)]


CHUNK = torch.tensor([0.1, 0.1, 0.1, 0.7, 0.5])[None, :, None].repeat(2, 1, 1)  # [2, H=5, 1]


@pytest.mark.parametrize("driver", ["serial", "serial-record", "default", "workers", "workers-record"])
def test_every_executor_holds_after_done(driver: str):
    """3-step episodes, a 5-step chunk: the env truncates at step 3 and is held for steps 4-5."""
    if driver.startswith("workers"):
        env = build_vec_env(_counter(2, 3), "toy/counter", num_workers=1)
    else:
        env = SerialVecEnv(_counter(2, 3), "toy/counter")
    try:
        start = env.reset(seed=0)[OBS_STATE][:, 0].clone()
        if driver == "default":  # VecEnv's step-based default (ManiSkill's GPU env and other batched envs)
            steps = super(SerialVecEnv, env).step_chunk(CHUNK)
        else:
            steps = env.step_chunk(CHUNK, record_obs=driver.endswith("record"))
        assert steps.truncated[:, 0].tolist() == [False, False, True, False, False]
        final = steps.final_obs[OBS_STATE]
        assert torch.allclose(final[:, 0], start + 0.3) and final[:, 1].tolist() == [3.0, 3.0]
        state = steps.obs[OBS_STATE]
        assert state[:, 1].tolist() == [2.0, 2.0]  # two held steps into the new episode
        assert (state[:, 0] < 0.25).all()  # a reset position (0, 0.1 or 0.2): the 0.7 and 0.5 never ran
        if driver.endswith("record"):
            assert steps.step_obs is not None and len(steps.step_obs) == 5
            assert [float(o[OBS_STATE][0, 1]) for o in steps.step_obs] == [1.0, 2.0, 0.0, 1.0, 2.0]
            assert torch.equal(steps.step_obs[-1][OBS_STATE], state)
        else:
            assert steps.step_obs is None
    finally:
        env.close()
