"""Recomputing advantages with other reward weights from stored terms, without new rollouts."""

from __future__ import annotations

import dataclasses
import functools
import json

import pytest
import torch

from policies.base import ActMode
from rewards import RewardConfig
from sim.vector import SerialVecEnv
from tests.sim.toy_env import CounterEnv
from tests.vla_rl.toy_policy import GaussianPolicy
from vla_rl.algorithms.advantages import gae
from vla_rl.cli import run
from vla_rl.reweigh import (
    TRACE_DIR,
    ReweighError,
    advantage_shift,
    load_reward_trace,
    reweigh,
    reweighted_rewards,
    save_reward_trace,
)
from vla_rl.rollout import RolloutEngine

PPO = {"type": "ppo", "gamma": 0.9, "lam": 0.8, "normalize_advantages": False}
WEIGHTS = [("env", 1.0), ("success", 0.5), ("action_magnitude", -0.1)]


def _rollout():
    torch.manual_seed(0)
    env = SerialVecEnv([functools.partial(CounterEnv, episode_steps=4, goal=0.6) for _ in range(3)], "toy/counter")
    policy = GaussianPolicy(2, 1, horizon=3, init_mean=0.3)
    engine = RolloutEngine(env, policy, reward=RewardConfig(terms=dict(WEIGHTS)))
    engine.reset(seed=0)
    ro = engine.collect(5, ActMode.EXPLORE)
    assert ro.terminated.any() or ro.truncated.any()  # episodes end inside chunks: held steps exist
    return ro


def test_the_runs_own_weights_give_its_rewards_back_bit_for_bit_and_others_move_them_by_hand():
    ro = _rollout()
    assert torch.equal(reweighted_rewards(ro.step_reward_terms, WEIGHTS), ro.rewards)
    new = reweighted_rewards(ro.step_reward_terms, [("success", 2.0), ("env", -1.0)])
    by_hand = 2.0 * ro.reward_terms["success"] - ro.reward_terms["env"]
    assert torch.allclose(new, by_hand, atol=1e-6) and not torch.allclose(new, ro.rewards)
    with pytest.raises(ReweighError, match="'reach' was not stored.*action_magnitude, env, success"):
        reweighted_rewards(ro.step_reward_terms, [("reach", 1.0)])


def test_reweigh_reports_how_advantages_and_returns_move():
    ro = _rollout()
    same = reweigh(ro, PPO, WEIGHTS, WEIGHTS)
    assert same["reproduced"] == 1.0 and same["adv_abs_change"] == 0.0 and same["adv_sign_flips"] == 0.0
    assert same["adv_corr"] == pytest.approx(1.0)
    scaled = reweigh(ro, PPO, WEIGHTS, [(n, 3.0 * w) for n, w in WEIGHTS])
    assert scaled["reward_new"] == pytest.approx(3.0 * scaled["reward_old"], rel=1e-5)
    # the same numbers by hand: GAE with the stored values on the hand-weighted rewards
    new_r = 2.0 * ro.reward_terms["success"]
    a0, r0 = gae(ro.rewards, ro.values, ro.next_values, ro.terminated, ro.truncated, 0.9, 0.8)
    a1, r1 = gae(new_r, ro.values, ro.next_values, ro.terminated, ro.truncated, 0.9, 0.8)
    out = reweigh(ro, PPO, WEIGHTS, [("success", 2.0)])
    assert out["return_new"] == pytest.approx(float(r1.mean()), abs=1e-6)
    assert out["return_old"] == pytest.approx(float(r0.mean()), abs=1e-6)
    assert out["adv_sign_flips"] == pytest.approx(float(((a0 > 0) != (a1 > 0)).float().mean()))


def test_advantage_shift_on_hand_built_advantages():
    mask = torch.tensor([[True, True, True, False]])
    old = (torch.tensor([[1.0, -1.0, 2.0, 50.0]]), torch.tensor([[1.0, 1.0, 1.0, 9.0]]), mask)
    new = (torch.tensor([[-1.0, 1.0, -2.0, 0.0]]), torch.tensor([[2.0, 2.0, 2.0, 9.0]]), mask)
    s = advantage_shift(old, new, normalize=False)
    assert s["decisions"] == 3 and s["adv_sign_flips"] == 1.0 and s["adv_corr"] == pytest.approx(-1.0)
    assert s["adv_abs_change"] == pytest.approx(8 / 3) and (s["return_old"], s["return_new"]) == (1.0, 2.0)


def test_trace_round_trip_and_the_reweigh_command(tmp_path, capsys):
    ro = _rollout()
    ro.episodes[0] = dataclasses.replace(ro.episodes[0], task_index=2, ended_by_reward=True)
    run_dir = tmp_path / "run"
    save_reward_trace(ro, run_dir / TRACE_DIR / "iter_000001.pt", PPO, WEIGHTS)
    back, algo, weights = load_reward_trace(run_dir / TRACE_DIR / "iter_000001.pt")
    assert algo == PPO and weights == WEIGHTS and torch.equal(back.rewards, ro.rewards)
    assert back.episodes == ro.episodes  # every field, the task index and how it ended included
    result = run(["reward", "reweigh", "--run", str(run_dir), "--terms", "{success: 1.0}"])
    assert result["iterations"][0]["reproduced"] == 1.0
    assert json.loads((run_dir / "reweigh.json").read_text())["new_weights"] == {"success": 1.0}
    assert "pushed the other way" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        run(["reward", "reweigh", "--run", str(run_dir), "--terms", "{reach: 1.0}"])
    assert exc.value.code == 2 and "'reach' was not stored" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        run(["reward", "reweigh", "--run", str(tmp_path / "nothing"), "--terms", "{env: 1.0}"])
    assert exc.value.code == 2 and "no reward traces" in capsys.readouterr().err
    (run_dir / TRACE_DIR / "iter_000002.pt").write_bytes(b"not a trace")
    with pytest.raises(SystemExit) as exc:
        run(["reward", "reweigh", "--run", str(run_dir), "--terms", "{env: 1.0}"])
    assert exc.value.code == 2 and "iter_000002.pt: not a reward trace" in capsys.readouterr().err
