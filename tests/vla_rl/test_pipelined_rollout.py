"""Pipelined rollouts (env halves stepping while the policy acts on the other half) equal sequential ones."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from policies.base import ActMode
from sim.vector import SerialVecEnv
from sim.vector_process import ProcessVecEnv
from tests.sim.toy_env import CounterEnv
from tests.vla_rl.toy_policy import GaussianPolicy
from vla_rl.rollout import Rollout, RolloutEngine


def _env(n: int = 5, steps: int = 5, goal: float = 1.3, workers: int = 4) -> ProcessVecEnv:
    factories = [functools.partial(CounterEnv, episode_steps=steps, goal=goal) for _ in range(n)]
    return ProcessVecEnv(factories, "toy/counter", num_workers=workers)


def _policy() -> GaussianPolicy:
    torch.manual_seed(0)
    policy = GaussianPolicy(2, 1, horizon=3, init_mean=0.3)
    with torch.no_grad():  # state-dependent means: envs diverge, some succeed, some truncate
        policy.mu.weight.copy_(torch.tensor([[0.2, -0.05]] * 3))
    return policy


def _assert_same(a: Rollout, b: Rollout) -> None:
    for f in dataclasses.fields(Rollout):
        if f.name == "times":  # wall-clock seconds: the same stages, not the same values
            assert sorted(a.times) == sorted(b.times)
            continue
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, torch.Tensor):
            torch.testing.assert_close(x, y, rtol=0, atol=1e-6, msg=f.name)
        elif isinstance(x, dict):
            assert sorted(x) == sorted(y), f.name
            for k in x:
                if isinstance(x[k], torch.Tensor):
                    torch.testing.assert_close(x[k], y[k], rtol=0, atol=1e-6, msg=f"{f.name}.{k}")
                else:
                    assert x[k] == y[k], f"{f.name}.{k}"
        else:
            assert x == y, f.name


@pytest.mark.parametrize("exec_steps", [0, 2])
def test_pipelined_equals_sequential_ppo_collection(exec_steps):
    with _env() as env_a, _env() as env_b:
        policy = _policy()
        seq = RolloutEngine(env_a, policy, exec_steps)
        pipe = RolloutEngine(env_b, policy, exec_steps, pipelined=True)
        assert seq.pipeline_groups is None and pipe.pipeline_groups == [[0, 1], [2, 3, 4]]
        for engine in (seq, pipe):
            engine.reset(seed=7)
        ends = torch.zeros(2, dtype=torch.bool)
        for _ in range(2):  # the second call continues from where the envs are
            a, b = seq.collect(4, ActMode.EVAL), pipe.collect(4, ActMode.EVAL)
            _assert_same(a, b)
            ends |= torch.stack([a.terminated.any(), a.truncated.any()])
        assert ends.all()  # both kinds of episode ends occurred
        assert seq.total_env_steps == pipe.total_env_steps
        for k in seq._obs:
            assert (seq._obs[k] == pipe._obs[k]) if k == "task" else torch.equal(seq._obs[k], pipe._obs[k])


def test_pipelined_equals_sequential_group_collection_and_stops_at_the_same_decision():
    with _env(n=4, steps=7, goal=0.9) as env_a, _env(n=4, steps=7, goal=0.9) as env_b:
        policy = _policy()
        a = RolloutEngine(env_a, policy, use_critic=False).collect_groups([3, 4], 2, 10, ActMode.EVAL)
        b = RolloutEngine(env_b, policy, use_critic=False, pipelined=True).collect_groups([3, 4], 2, 10, ActMode.EVAL)
        assert a.valid.shape[0] < 10  # stopped early once every env had ended
        _assert_same(a, b)


def test_pipelined_falls_back_to_sequential_without_async_chunks():
    env = SerialVecEnv([functools.partial(CounterEnv) for _ in range(2)], "toy/counter")
    engine = RolloutEngine(env, _policy(), pipelined=True)
    assert engine.pipeline_groups is None
    engine.reset(seed=0)
    assert engine.collect(2, ActMode.EVAL).actions.shape == (2, 2, 3, 1)
    with _env(n=2, workers=1) as one_worker:
        assert RolloutEngine(one_worker, _policy(), pipelined=True).pipeline_groups is None


def test_chunk_api_rejects_partial_worker_groups_and_steps_while_in_flight():
    from sim.core import EnvError

    with _env(n=4, workers=2) as env:
        env.reset(seed=0)
        with pytest.raises(EnvError, match="whole worker slices"):
            env.chunk_async(torch.zeros(1, 2, 1), [0])
        env.chunk_async(torch.full((2, 2, 1), 0.1), [0, 1])
        with pytest.raises(EnvError, match="in flight"):
            env.step(torch.zeros(4, 1))
        steps = env.chunk_wait([0, 1])
        assert steps.reward.shape == (2, 2) and steps.obs["observation.state"][:, 1].tolist() == [2.0, 2.0]
