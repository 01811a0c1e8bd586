"""Privileged per-step signals (``StepOut.signals``) travel like reward terms through every executor."""

from __future__ import annotations

import functools

import pytest
import torch

from sim.core import VecEnv
from sim.vector import SerialVecEnv
from sim.vector_process import ProcessVecEnv
from tests.sim.toy_env import CounterEnv


def _make(kind: str, n: int = 4, signals: bool = True):
    factories = [functools.partial(CounterEnv, episode_steps=3, signals=signals) for _ in range(n)]
    if kind == "serial":
        return SerialVecEnv(factories, "toy/counter")
    return ProcessVecEnv(factories, "toy/counter", num_workers=2)


def _actions(n: int = 4) -> torch.Tensor:
    return torch.tensor([0.5, 0.9, 1.0, 0.2])[:n, None]


def test_step_signals_agree_between_serial_and_process_and_leave_rewards_alone():
    out = {}
    for kind, signals in (("serial", True), ("process", True), ("serial", False)):
        with _make(kind, signals=signals) as env:
            env.reset(seed=3)
            rows = [env.step(_actions() * (k + 1)) for k in range(4)]
            assert bool(env.step_chunk(torch.zeros(4, 2, 1)).signals) == signals
        out[kind, signals] = rows
    for (_, _, _, _, info_s), (_, _, _, _, info_p) in zip(out["serial", True], out["process", True]):
        assert list(info_s["signals"]) == list(info_p["signals"]) == ["pos", "t"]
        for k in ("pos", "t"):
            assert torch.equal(info_s["signals"][k], info_p["signals"][k])
    # the step counter restarts after an env's episode ended (auto-reset after 3 steps or a success)
    assert out["serial", True][0][4]["signals"]["t"].tolist() == [1.0] * 4
    for with_sig, without in zip(out["process", True], out["serial", False]):
        assert "signals" not in without[4]
        assert torch.equal(with_sig[1], without[1])  # rewards untouched, bit for bit
        assert torch.equal(with_sig[4]["reward_terms"]["success"], without[4]["reward_terms"]["success"])


def test_chunk_signals_agree_between_executors_and_the_step_by_step_default():
    chunk = torch.stack([_actions() * (h + 1) for h in range(5)], dim=1)  # [4, 5, 1]: episodes end inside
    with _make("serial") as serial, _make("serial") as default, _make("process") as process:
        for env in (serial, default, process):
            env.reset(seed=1)
        got = [serial.step_chunk(chunk), VecEnv.step_chunk(default, chunk), process.step_chunk(chunk)]
    a = got[0]
    assert set(a.signals) == {"pos", "t"} and a.signals["t"].shape == (5, 4)
    for b in got[1:]:
        assert a.signals.keys() == b.signals.keys()
        for k in a.signals:
            assert torch.equal(a.signals[k], b.signals[k]), k
        assert torch.equal(a.reward, b.reward)
    assert (a.terminated | a.truncated).any()  # the chunk did cross episode ends


def test_rollout_engine_stores_signals_per_step_and_policies_never_see_them():
    from policies.base import ActMode
    from tests.vla_rl.toy_policy import GaussianPolicy
    from vla_rl.rollout import RolloutEngine

    class Spy(GaussianPolicy):
        seen: list[set[str]] = []

        def act(self, obs, mode=ActMode.EXPLORE, generator=None):
            Spy.seen.append(set(obs))
            return super().act(obs, mode, generator)

    torch.manual_seed(0)
    with _make("serial") as env:
        engine = RolloutEngine(env, Spy(2, 1, horizon=2, init_mean=0.4), use_critic=False)
        engine.reset(seed=0)
        ro = engine.collect(3)
    assert set(ro.step_signals) == {"pos", "t"} and ro.step_signals["t"].shape == (3, 4, 2)
    live = ro.step_signals["t"] > 0  # t counts the episode's steps from 1; held steps read 0
    assert live[0].all()  # nothing ended before the first chunk's steps
    assert all("pos" not in keys and "signals" not in keys for keys in Spy.seen)


def test_mujoco_tabletop_signals_agree_between_serial_and_worker_envs():
    from sim import make_env

    chunk = torch.zeros(2, 3, 4)
    chunk[..., 2] = -1.0  # push the pinch point down towards the table
    got = {}
    for workers in (0, 1):
        with make_env("mujoco/pick-red", num_envs=2, seed=4, obs_mode="state", num_workers=workers) as env:
            env.reset(seed=4)
            got[workers] = [env.step_chunk(chunk) for _ in range(2)]
    for a, b in zip(got[0], got[1]):
        assert "stage_progress" in a.signals and "collision" in a.signals and "table_force" in a.signals
        assert a.signals.keys() == b.signals.keys()
        for k in a.signals:
            assert torch.equal(a.signals[k], b.signals[k]), k
        assert torch.equal(a.reward, b.reward)
    assert got[0][-1].signals["ee_z"][-1].lt(got[0][0].signals["ee_z"][0]).all()  # it moved down
