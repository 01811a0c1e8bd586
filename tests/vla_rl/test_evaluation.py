"""Evaluation runs chunks as training does: an env that ends mid-chunk is held, never continues the old chunk."""

from __future__ import annotations

import functools

import torch

from sim.core import OBS_STATE
from sim.vector import SerialVecEnv
from tests.sim.toy_env import CounterEnv
from vla_rl.evaluation import evaluate_episodes


def test_an_env_that_ends_mid_chunk_does_not_run_the_old_chunk_in_its_new_episode():
    env = SerialVecEnv([functools.partial(CounterEnv, episode_steps=3, goal=100.0) for _ in range(2)], "toy/counter")
    seen: list[torch.Tensor] = []

    def act(obs):
        seen.append(obs[OBS_STATE].clone())
        return torch.tensor([0.1, 0.1, 0.1, 5.0])[None, :, None].repeat(2, 1, 1)  # step 4 would be a jump

    res = evaluate_episodes(env, act, episodes=4, seed=0, progress=False)
    assert res.episodes == 4 and res.mean_length == 3.0
    # decision 1 starts one held step into the new episode: position still its reset value, t = 1
    assert seen[1][:, 1].tolist() == [1.0, 1.0] and (seen[1][:, 0] < 0.25).all()
    env.close()


def test_evaluation_is_deterministic_with_chunks_and_video_frames_per_step(tmp_path):
    def run(video):
        env = SerialVecEnv([functools.partial(CounterEnv, episode_steps=3, goal=0.35) for _ in range(3)], "toy/counter")
        try:
            return evaluate_episodes(env, lambda obs: torch.full((3, 2, 1), 0.2), episodes=5, seed=7,
                                     video_path=video, progress=False)
        finally:
            env.close()

    plain = run(None)
    assert plain.episodes == 5 and plain == run(None)
    recorded = run(tmp_path / "eval.mp4")
    assert (recorded.success_rate, recorded.mean_return, recorded.mean_length) == (
        plain.success_rate, plain.mean_return, plain.mean_length)


def test_the_video_films_its_episodes_then_the_chunks_run_batched_with_the_same_results(tmp_path):
    """``video_episodes``: every step is rendered (``record_obs``) only until each video env has played that many
    episodes; the rest of the evaluation runs batched chunks. Episodes, returns and lengths are the same as with
    every episode filmed and as without a video, and the video holds the filmed steps' frames."""
    import imageio.v3 as iio

    calls: list[bool] = []

    class Spy(SerialVecEnv):
        def step_chunk(self, actions, record_obs=False):
            calls.append(record_obs)
            return super().step_chunk(actions, record_obs)

    def run(video, video_episodes=0):
        calls.clear()
        env = Spy([functools.partial(CounterEnv, episode_steps=3, goal=0.35) for _ in range(3)], "toy/counter")
        try:
            res = evaluate_episodes(env, lambda obs: torch.full((3, 2, 1), 0.2), episodes=12, seed=7,
                                    video_path=video, video_envs=2, progress=False, video_episodes=video_episodes)
        finally:
            env.close()
        return res, list(calls)

    plain, plain_calls = run(None)
    every, every_calls = run(tmp_path / "all.mp4")
    first, first_calls = run(tmp_path / "first.mp4", video_episodes=1)
    for res in (every, first):
        assert (res.episodes, res.successes, res.mean_return, res.mean_length) == (
            plain.episodes, plain.successes, plain.mean_return, plain.mean_length)
    assert not any(plain_calls) and all(every_calls)
    # steps of 0.2 reach the goal 0.35 at the second step, the end of the first chunk: one filmed chunk
    assert first_calls[0] and not any(first_calls[1:]) and len(first_calls) == len(every_calls) > 3
    frames = {name: len(iio.imread(tmp_path / f"{name}.mp4")) for name in ("all", "first")}
    assert frames == {"all": 1 + 2 * len(every_calls), "first": 1 + 2}, frames  # the reset + 2 steps a chunk


def test_a_negative_video_episodes_is_refused_naming_the_field(capsys):
    import pytest

    from vla_rl.cli import parse_config
    from vla_rl.train_config import TrainConfig

    with pytest.raises(SystemExit):
        parse_config(TrainConfig, ["--eval.video_episodes", "-1"])
    assert "eval.video_episodes must be >= 0" in capsys.readouterr().err
