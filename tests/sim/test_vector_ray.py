"""``--env.executor ray``: the env workers as Ray actors give the process executor's episodes; a dead actor is an error.

A local Ray (2 CPUs, no dashboard) is started once for the module and shut down after it.
"""

from __future__ import annotations

import pytest
import torch

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'vla-rl[ray]')")

from sim import make_env  # noqa: E402
from sim.core import EnvError  # noqa: E402

ENV = "mujoco/pick-red"
OPTS = {"obs_mode": "state", "num_workers": 2, "max_episode_steps": 6}


@pytest.fixture(scope="module")
def local_ray():
    torch.set_num_threads(1)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    yield
    ray.shutdown()


def _play(executor: str) -> list:
    """Reset with seed 11, six single steps then two chunks of 4 with fixed actions; everything observed."""
    env = make_env(ENV, num_envs=4, seed=11, executor=executor, **OPTS)
    try:
        gen = torch.Generator().manual_seed(0)
        seen = [env.reset(seed=11)]
        for _ in range(6):
            obs, reward, term, trunc, info = env.step(torch.rand((4, env.spec.action_dim), generator=gen) * 2 - 1)
            seen += [obs, reward, term, trunc, info["success"], info.get("final_obs")]
        for _ in range(2):
            out = env.step_chunk(torch.rand((4, 4, env.spec.action_dim), generator=gen) * 2 - 1)
            seen += [out.obs, out.reward, out.terminated, out.truncated, out.episode_return, out.final_obs,
                     out.reward_terms]
        return seen
    finally:
        env.close()


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


@pytest.mark.slow  # ~35 s with Ray's start
def test_ray_actors_give_the_process_executors_observations_and_rewards(local_ray) -> None:
    by_process, by_ray = _play("process"), _play("ray")
    assert len(by_process) == len(by_ray)
    ended = sum(bool((t | u).any()) for t, u in zip(by_process[3:37:6], by_process[4:37:6]))  # single steps
    assert ended > 0, "no episode ended: auto-reset was not compared"
    for i, (p, r) in enumerate(zip(by_process, by_ray)):
        assert _same(p, r), f"item {i} differs between the process and the Ray executor"


@pytest.mark.slow
def test_a_dead_actor_is_an_error_naming_its_envs_not_a_hang(local_ray) -> None:
    env = make_env(ENV, num_envs=4, seed=0, executor="ray", **OPTS)
    try:
        env.reset(seed=0)
        ray.kill(env._actors[1])
        with pytest.raises(EnvError, match=r"worker 1 \(envs 2-3\) died"):
            env.step(torch.zeros((4, env.spec.action_dim)))
    finally:
        env.close()


def test_ray_executor_needs_workers() -> None:
    with pytest.raises(EnvError, match="num_workers >= 1"):
        make_env(ENV, num_envs=2, executor="ray", obs_mode="state", num_workers=0)
