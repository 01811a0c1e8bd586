"""Reward terms, their weighting in one place, per-term storage, and the errors for unknown terms."""

from __future__ import annotations

import functools

import pytest
import torch

from policies.base import ActMode
from rewards import REWARDS, RewardConfig, RewardFunction, RewardTermError, chunk_sum, weighted_step_reward
from rewards.terms import StepInput, make_term
from sim.core import OBS_STATE, TASK, ChunkSteps
from sim.vector import SerialVecEnv
from tests.sim.toy_env import CounterEnv
from tests.vla_rl.toy_policy import GaussianPolicy
from vla_rl.rollout import Rollout, RolloutEngine, reward_scalars


def _steps(reward: list[list[float]], term: list[list[bool]], success: list[list[bool]],
           extra: dict[str, list[list[float]]]) -> ChunkSteps:
    """A hand-built chunk outcome ``[H, n]`` (no truncations)."""
    r = torch.tensor(reward)
    h, n = r.shape
    obs = {OBS_STATE: torch.zeros(n, 2), TASK: ["t"] * n}
    return ChunkSteps(
        env_ids=list(range(n)), reward=r, terminated=torch.tensor(term), truncated=torch.zeros(h, n, dtype=torch.bool),
        success=torch.tensor(success), reward_terms={k: torch.tensor(v) for k, v in extra.items()},
        episode_return=torch.zeros(h, n), episode_length=torch.zeros(h, n, dtype=torch.long), final_obs=obs, obs=obs,
    )


# Env 0 succeeds (and terminates) at step 1 of 3, then is held still; env 1 never ends.
STEPS = dict(
    reward=[[0.5, 0.25], [1.5, 0.25], [9.0, 0.25]],
    term=[[False, False], [True, False], [False, False]],
    success=[[False, False], [True, False], [False, False]],
    extra={"reach": [[0.5, 0.25], [0.5, 0.25], [9.0, 0.25]]},
)
ACTIONS = torch.tensor([[[1.0, 0.0], [0.0, 2.0], [3.0, 0.0]], [[0.0, 0.0], [1.0, 1.0], [0.0, 0.5]]])  # [n, H, A]


def test_weighted_sum_and_chunk_sum_on_hand_built_terms():
    terms = {"a": torch.tensor([[1.0, 2.0], [3.0, 4.0]]), "b": torch.tensor([[10.0, 0.0], [0.0, 10.0]])}
    step = weighted_step_reward(terms, [("a", 2.0), ("b", -0.5)])
    assert step.tolist() == [[-3.0, 4.0], [6.0, 3.0]]
    live = torch.tensor([[True, True], [False, True]])
    assert chunk_sum(step, live).tolist() == [-3.0, 7.0]


def test_unit_weight_on_one_term_is_bit_identical_to_the_old_sum():
    g = torch.Generator().manual_seed(0)
    per_step = torch.randn(7, 5, generator=g) * 1e-3 + torch.rand(7, 5, generator=g) * 1e3  # [H, n]
    live = torch.rand(7, 5, generator=g) > 0.2
    old = torch.zeros(5)  # how the rollout engine summed a chunk before reward terms
    for h in range(7):
        old += torch.where(live[h], per_step[h], torch.zeros_like(per_step[h]))
    new = chunk_sum(weighted_step_reward({"env": per_step}, [("env", 1.0)]), live)
    assert torch.equal(new, old)


def test_reward_function_composes_env_and_computed_terms_and_stops_at_the_episode_end():
    fn = RewardFunction(RewardConfig(terms={"env": 1.0, "success": 2.0, "action_magnitude": -0.5}), "toy/hand")
    out = fn(_steps(**STEPS), ACTIONS, {OBS_STATE: torch.zeros(2, 2), TASK: ["t", "t"]})
    # env 0: steps 0-1 count (step 2 is held still in its next episode); |a|^2 = 1, 4
    assert out.terms["env"].tolist() == [2.0, 0.75]
    assert out.terms["success"].tolist() == [1.0, 0.0]
    assert out.terms["action_magnitude"].tolist() == [5.0, 2.25]
    assert out.terms["reach"].tolist() == [1.0, 0.75]  # a breakdown term the env reports, stored though unweighted
    assert out.reward.tolist() == [2.0 + 2.0 * 1.0 - 0.5 * 5.0, 0.75 - 0.5 * 2.25]
    assert out.step_terms["env"][:, 0].tolist() == [0.5, 1.5, 0.0]  # per step, 0 on the held step
    assert out.step_reward[2, 0] == 0.0
    for name, per_step in out.step_terms.items():
        assert torch.allclose(per_step.sum(0), out.terms[name]), name


def test_computed_terms_see_the_executed_action_zero_after_the_end():
    seen: list[torch.Tensor] = []

    def spy(step: StepInput) -> torch.Tensor:
        seen.append(step.action.clone())
        assert step.env_id == "toy/hand" and set(step.env_terms) == {"env", "success", "reach"}
        return torch.zeros(step.action.shape[0])

    fn = RewardFunction(RewardConfig(terms={"env": 1.0}), "toy/hand")
    fn._terms["spy"] = spy  # an unregistered computed term, as a learned reward model would be
    fn(_steps(**STEPS), ACTIONS, {})
    assert seen[2][0].tolist() == [0.0, 0.0] and seen[2][1].tolist() == [0.0, 0.5]


def test_unknown_term_names_the_term_the_env_and_the_valid_terms():
    fn = RewardFunction(RewardConfig(terms={"env": 1.0, "reech": 0.1}), "toy/hand")
    with pytest.raises(RewardTermError) as err:
        fn(_steps(**STEPS), ACTIONS, {})
    message = str(err.value)
    for word in ("'reech'", "toy/hand", "reach", "success", "env", "action_magnitude"):
        assert word in message, (word, message)


def test_reward_config_validation_and_registry():
    assert RewardConfig().terms == {"env": 1.0}  # the env's own reward: training unchanged
    with pytest.raises(ValueError, match="empty"):
        RewardConfig(terms={})
    with pytest.raises(ValueError, match="reward.terms.success"):
        RewardConfig(terms={"success": float("nan")})
    assert {"env", "success", "action_magnitude"} <= set(REWARDS.names())
    no = torch.zeros(1, dtype=torch.bool)
    step = StepInput(env_id="x", step=0, obs={}, action=torch.tensor([[3.0, 4.0]]), env_terms={}, success=no,
                     terminated=no, truncated=no)
    assert make_term("action_magnitude")(step).tolist() == [25.0]


def test_annealed_weights_move_linearly_to_their_end_and_stay():
    cfg = RewardConfig(terms={"success": 1.0, "prm": 0.5}, anneal={"prm": 0.0}, anneal_end=0.5)
    assert cfg.weights() == [("success", 1.0), ("prm", 0.5)]  # the configured weights at the start
    assert cfg.weights(0.25) == [("success", 1.0), ("prm", 0.25)]
    assert cfg.weights(0.5) == cfg.weights(0.9) == [("success", 1.0), ("prm", 0.0)]
    assert RewardConfig(terms={"prm": 0.5}, anneal={"prm": 1.5}).weights(0.5) == [("prm", 1.0)]  # upwards too
    fn = RewardFunction(RewardConfig(terms={"success": 1.0, "action_magnitude": -1.0},
                                     anneal={"action_magnitude": 0.0}), "toy/hand")
    fn.set_progress(0.25)
    assert fn.weights == [("success", 1.0), ("action_magnitude", -0.75)]
    with pytest.raises(ValueError, match=r"reward.anneal.pmr: not a reward term; anneal one of reward.terms "
                                         r"\(success, prm\)"):
        RewardConfig(terms={"success": 1.0, "prm": 0.5}, anneal={"pmr": 0.0})
    with pytest.raises(ValueError, match="reward.anneal.prm: the final weight must be a finite number"):
        RewardConfig(terms={"prm": 0.5}, anneal={"prm": float("inf")})
    with pytest.raises(ValueError, match=r"reward.anneal_end must be in \(0, 1\], got 0.0"):
        RewardConfig(terms={"prm": 0.5}, anneal={"prm": 0.0}, anneal_end=0.0)


def _env(n: int = 2, steps: int = 3, goal: float = 100.0) -> SerialVecEnv:
    factories = [functools.partial(CounterEnv, episode_steps=steps, goal=goal) for _ in range(n)]
    return SerialVecEnv(factories, "toy/counter")


def test_rollout_stores_every_term_per_decision_and_per_step():
    torch.manual_seed(0)
    policy = GaussianPolicy(2, 1, horizon=2, init_mean=0.5)
    reward = RewardConfig(terms={"success": 1.0, "action_magnitude": -0.1})
    engine = RolloutEngine(_env(goal=0.6), policy, reward=reward)
    engine.reset(seed=0)
    ro = engine.collect(3, ActMode.EVAL)
    assert set(ro.reward_terms) == {"env", "success", "action_magnitude"}
    for name, per_step in ro.step_reward_terms.items():
        assert per_step.shape == (3, 2, 2)
        assert torch.allclose(per_step.sum(-1), ro.reward_terms[name]), name
    expected = ro.reward_terms["success"] - 0.1 * ro.reward_terms["action_magnitude"]
    assert torch.allclose(ro.rewards, expected)
    assert (ro.reward_terms["action_magnitude"] > 0).all()


def test_default_reward_is_the_envs_own_reward():
    torch.manual_seed(0)
    engine = RolloutEngine(_env(goal=0.6), GaussianPolicy(2, 1, horizon=2, init_mean=0.5))
    engine.reset(seed=0)
    ro = engine.collect(3, ActMode.EVAL)
    assert torch.equal(ro.rewards, ro.reward_terms["env"]) and ro.rewards.sum() > 0


def test_rollout_fails_on_a_term_the_env_lacks():
    engine = RolloutEngine(_env(), GaussianPolicy(2, 1, horizon=2), reward=RewardConfig(terms={"reach": 1.0}))
    engine.reset(seed=0)
    with pytest.raises(RewardTermError, match="toy/counter"):
        engine.collect(1)


def test_reward_metrics_log_every_term_over_valid_decisions():
    valid = torch.tensor([[True, True], [True, False]])
    ro = Rollout(
        obs={}, actions=torch.zeros(2, 2, 1, 1), logp=torch.zeros(2, 2), values=torch.zeros(2, 2), extras={},
        rewards=torch.tensor([[1.0, 2.0], [3.0, 100.0]]),
        reward_terms={"env": torch.tensor([[1.0, 2.0], [3.0, 100.0]]),
                      "success": torch.tensor([[0.0, 0.0], [1.0, 1.0]])},
        terminated=torch.zeros(2, 2, dtype=torch.bool), truncated=torch.zeros(2, 2, dtype=torch.bool),
        next_values=torch.zeros(2, 2), valid=valid,
    )
    expected = {"rollout/chunk_reward": 2.0, "reward/env": 2.0, "reward/success": pytest.approx(1 / 3)}
    assert reward_scalars(ro) == expected
