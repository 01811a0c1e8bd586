"""The vectorization layer (serial and worker processes) on a toy env with known dynamics."""

from __future__ import annotations

import functools
import os

import pytest
import torch

from sim.core import OBS_STATE, EnvError
from sim.vector import SerialVecEnv
from sim.vector_process import ProcessVecEnv
from tests.sim.toy_env import CounterEnv


def _make(kind: str, n: int = 3, **kw):
    factories = [functools.partial(CounterEnv, **kw) for _ in range(n)]
    if kind == "serial":
        return SerialVecEnv(factories, "toy/counter")
    return ProcessVecEnv(factories, "toy/counter", num_workers=2)


@pytest.fixture(params=["serial", "process"])
def kind(request):
    return request.param


def test_auto_reset_final_obs_and_episode_stats(kind):
    with _make(kind, episode_steps=4) as env:
        env.reset(seed=0)
        ones = torch.ones(3, 1)
        # Expert pushes +1 per step: success (terminated) after 2 steps from pos < 0.3.
        env.step(ones)
        obs, reward, term, trunc, info = env.step(ones)
        assert term.all() and not trunc.any()
        assert torch.equal(reward, torch.ones(3))
        assert info["final_obs"][OBS_STATE][:, 0].ge(2.0).all()  # last obs of the old episode
        assert obs[OBS_STATE][:, 1].eq(0).all()  # new episode started at t = 0
        assert info["episode"]["length"].tolist() == [2, 2, 2]
        assert info["episode"]["return"].tolist() == [1.0, 1.0, 1.0]
        assert info["reward_terms"]["success"].tolist() == [1.0, 1.0, 1.0]


def test_truncation_is_not_termination(kind):
    with _make(kind, episode_steps=2) as env:
        env.reset(seed=0)
        env.step(torch.zeros(3, 1))
        _, _, term, trunc, info = env.step(torch.zeros(3, 1))
        assert trunc.all() and not term.any() and not info["episode"]["success"].any()


def test_partial_reset_and_seeding(kind):
    with _make(kind) as env:
        a = env.reset(seed=1)
        env.step(torch.full((3, 1), 0.5))
        moved = env._last_obs
        b = env.reset(seed=1, env_ids=[2])
        assert torch.equal(b[OBS_STATE][2], a[OBS_STATE][2])
        assert torch.equal(b[OBS_STATE][:2], moved[OBS_STATE][:2])
        assert env.expert_actions().shape == (3, 1)


def test_worker_crash_is_reported_with_env_id():
    with _make("process", fail_at=1) as env:
        env.reset(seed=0)
        env.step(torch.zeros(3, 1))
        with pytest.raises(EnvError, match="toy/counter: worker 0 failed: RuntimeError: simulated crash"):
            env.step(torch.zeros(3, 1))


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="no nice values on this OS")
def test_lower_worker_priority_renices_every_worker_and_not_the_caller(kind):
    with _make(kind) as env:
        env.reset(seed=0)
        own = os.getpriority(os.PRIO_PROCESS, 0)
        if kind == "serial":  # no workers: nothing to renice
            assert env.lower_worker_priority(5) == 0
        else:
            before = [os.getpriority(os.PRIO_PROCESS, p.pid) for p in env._procs]
            assert env.lower_worker_priority(5) >= len(env._procs)
            assert [os.getpriority(os.PRIO_PROCESS, p.pid) for p in env._procs] == [min(19, b + 5) for b in before]
            env.step(torch.zeros(3, 1))  # the workers still serve
        assert os.getpriority(os.PRIO_PROCESS, 0) == own


def test_fork_context_is_refused():
    with pytest.raises(EnvError, match="fork"):
        ProcessVecEnv([CounterEnv], "toy/counter", 1, context="fork")


def test_per_env_seed_list_starts_envs_from_one_state(kind):
    with _make(kind) as env:
        obs = env.reset(seed=[4, 4, 4])
        assert obs[OBS_STATE][:, 0].unique().numel() == 1
        with pytest.raises(EnvError, match="2 seeds for 3 envs"):
            env.reset(seed=[1, 2])


@pytest.mark.parametrize("spin", [True, False])
def test_process_and_serial_steps_agree_over_many_episodes(spin):
    """Shared-memory step results (scalars, terms, instructions, final obs, episode stats) equal the serial ones,
    whether the pipes are busy-polled or slept on."""
    torch.manual_seed(0)
    actions = [torch.rand(4, 1) * 0.9 for _ in range(40)]
    results = []
    for kind in ("serial", "process"):
        factories = [functools.partial(CounterEnv, episode_steps=3 + i) for i in range(4)]
        env = (SerialVecEnv(factories, "toy/counter") if kind == "serial"
               else ProcessVecEnv(factories, "toy/counter", 3, spin=spin))
        with env:
            steps = [env.reset(seed=7)]
            for a in actions:
                obs, reward, term, trunc, info = env.step(a)
                steps.append((obs, reward, term, trunc, info))
                env.reset(seed=3, env_ids=[1]) if len(steps) == 20 else None
            results.append(steps)
    for s, p in zip(*results):
        _assert_same(s, p)


def _assert_same(a, b):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b) and b.is_contiguous()
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    else:
        assert a == b


def test_serial_obs_are_not_overwritten_by_later_steps_or_resets(kind):
    with _make(kind) as env:
        first = env.reset(seed=0)
        snap = {k: v.clone() for k, v in first.items() if isinstance(v, torch.Tensor)}
        obs, *_ = env.step(torch.full((3, 1), 0.5))
        snap2 = {k: v.clone() for k, v in obs.items() if isinstance(v, torch.Tensor)}
        env.reset(seed=5, env_ids=[0])
        env.step(torch.full((3, 1), 0.5))
        for k in snap:
            assert torch.equal(first[k], snap[k]) and torch.equal(obs[k], snap2[k])


def test_workers_reporting_different_reward_terms_get_the_union():
    factories = [functools.partial(CounterEnv, extra_term=t) for t in ("", "", "pos", "pos")]
    with ProcessVecEnv(factories, "toy/counter", num_workers=2) as env:
        env.reset(seed=0)
        _, _, _, _, info = env.step(torch.full((4, 1), 0.5))
        terms = info["reward_terms"]
        assert list(terms) == ["success", "pos"]
        assert terms["pos"][:2].tolist() == [0.0, 0.0] and terms["pos"][2:].gt(0.4).all()
        steps = [env.step(torch.full((4, 1), 0.1))[4]["reward_terms"]["pos"] for _ in range(2)]
        assert steps[1][2:].gt(steps[0][2:]).all()


def test_spin_wait_is_on_only_when_the_workers_fit_the_cpus(monkeypatch):
    import sim.vector_process as vp

    monkeypatch.setattr(vp, "_usable_cpus", lambda: 2)
    factories = [functools.partial(CounterEnv) for _ in range(2)]
    with ProcessVecEnv(factories, "toy/counter", num_workers=1) as one, \
            ProcessVecEnv(factories, "toy/counter", num_workers=2) as two:
        assert one.spin and not two.spin  # 1 worker + this process fit 2 cores; 2 workers + this process do not
        one.reset(seed=0)
        assert one.step(torch.zeros(2, 1))[0][OBS_STATE].shape[0] == 2


def test_bad_spin_wait_names_the_option():
    from sim import make_env

    with pytest.raises(Exception, match="spin_wait must be 'auto', 'on' or 'off', got 'sometimes'"):
        make_env("mujoco/pick-red", num_envs=1, num_workers=0, spin_wait="sometimes")


def test_usable_cpus_respect_a_cgroup_quota(tmp_path):
    import os

    from sim.vector_process import _usable_cpus

    affinity = len(os.sched_getaffinity(0))
    (tmp_path / "none").write_text("max 100000\n")
    (tmp_path / "one_and_a_half").write_text("150000 100000\n")
    (tmp_path / "tenth").write_text("10000 100000\n")
    assert _usable_cpus(str(tmp_path / "none")) == affinity == _usable_cpus(str(tmp_path / "missing"))
    assert _usable_cpus(str(tmp_path / "one_and_a_half")) == min(affinity, 2)
    assert _usable_cpus(str(tmp_path / "tenth")) == 1
