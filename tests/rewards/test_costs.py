"""Constraint costs (rewards/costs.py) on hand-built steps, and as penalties through the reward seam."""

from __future__ import annotations

import pytest
import torch

from rewards import COSTS, REWARDS, RewardConfig, RewardFunction, RewardTermError, StepInput, check_costs, make_term
from sim.core import ChunkSteps


def _step(signals: dict[str, list[float]], action=None, executed=None, h: int = 0, env_id="mujoco/pick-red"):
    b = len(next(iter(signals.values()))) if signals else 2
    action = torch.zeros(b, 4) if action is None else action
    flags = torch.zeros(b, dtype=torch.bool)
    return StepInput(env_id=env_id, step=h, obs={}, action=action, env_terms={}, success=flags, terminated=flags,
                     truncated=flags, signals={k: torch.tensor(v) for k, v in signals.items()}, executed=executed)


def _scene(ee, target, obstacles, stage):
    """Signals of B envs: ee / target xyz, obstacle xyz lists (count = len), stage progress."""
    sig: dict[str, list[float]] = {"stage_progress": stage, "obstacle_count": [float(len(o)) for o in obstacles]}
    for name, pts in (("ee", ee), ("target", target)):
        for i, a in enumerate("xyz"):
            sig[f"{name}_{a}"] = [p[i] for p in pts]
    for k in range(2):
        for i, a in enumerate("xyz"):
            sig[f"obstacle{k}_{a}"] = [o[k][i] if k < len(o) else 0.0 for o in obstacles]
    return sig


def test_every_cost_is_registered_and_unknown_ones_list_the_valid_costs():
    assert all(name in REWARDS for name in COSTS)
    check_costs(["collision", "path_length"])
    with pytest.raises(ValueError, match="unknown cost term.*'colision'.*valid cost terms: collision, table_force"):
        check_costs(["colision"])


def test_signal_costs_on_hand_built_states():
    step = _step({"collision": [0.0, 2.0, 1.0], "table_force": [0.0, 3.5, -1e-9], "ee_step": [0.01, 0.0, 0.02],
                  "joint_limit_margin": [0.5, 0.05, 0.0]})
    assert make_term("collision")(step).tolist() == [0.0, 1.0, 1.0]  # an indicator, not a contact count
    assert make_term("table_force")(step).tolist() == pytest.approx([0.0, 3.5, 0.0])
    assert make_term("path_length")(step).tolist() == pytest.approx([0.01, 0.0, 0.02])
    assert make_term("episode_steps")(step).tolist() == [1.0, 1.0, 1.0]
    assert make_term("joint_limit")(step).tolist() == pytest.approx([0.0, 0.5, 1.0])


def test_action_jerk_is_the_squared_second_difference_inside_the_chunk():
    executed = torch.tensor([[[0.0], [1.0], [2.0], [0.0]], [[0.0], [0.0], [1.0], [1.0]]])  # [B=2, H=4, A=1]
    term = make_term("action_jerk")
    assert term(_step({}, action=executed[:, 1], executed=executed, h=1)).tolist() == [0.0, 0.0]
    assert term(_step({}, action=executed[:, 2], executed=executed, h=2)).tolist() == [0.0, 1.0]  # 2-2+0, 1-0+0
    assert term(_step({}, action=executed[:, 3], executed=executed, h=3)).tolist() == [9.0, 1.0]  # 0-4+1, 1-2+0


def test_keypoint_obstacle_is_stage_wise():
    obstacle = [(0.5, 0.0, 0.02), (0.9, 0.9, 0.02)]
    ee = [(0.5, 0.0, 0.06), (0.5, 0.0, 0.2), (0.5, 0.0, 0.2)]  # 4 cm above the obstacle / far above
    target = [(0.8, 0.0, 0.02), (0.5, 0.03, 0.02), (0.5, 0.03, 0.02)]  # far / 3 cm beside the obstacle
    sig = _scene(ee, target, [obstacle, obstacle, obstacle[:1]], stage=[0.0, 1.0, 2.0])
    cost = make_term("keypoint_obstacle")(_step(sig))
    # env 0: EE 4 cm away -> 2 cm short; env 1: the target is not held yet (stage 1) -> 0; env 2: held, 3 cm
    assert cost.tolist() == pytest.approx([0.02, 0.0, 0.03], abs=1e-6)


def test_keypoint_target_is_the_distance_to_the_target_until_reach():
    target = [(0.5, 0.0, 0.02)] * 3
    ee = [(0.5, 0.3, 0.02), (0.5, 0.0, 0.06), (0.9, 0.0, 0.02)]  # 30 cm off / 4 cm above / far but reached
    sig = _scene(ee, target, [[], [], []], stage=[0.0, 0.0, 1.0])
    cost = make_term("keypoint_target")(_step(sig))
    assert cost.tolist() == pytest.approx([0.3, 0.04, 0.0], abs=1e-6)  # from the reach stage on it is 0
    del sig["stage_progress"]
    with pytest.raises(RewardTermError, match="'keypoint_target' is stage-wise.*task libero/libero_object/0"):
        make_term("keypoint_target")(_step(sig, env_id="libero/libero_object/0"))


def test_stage_wise_cost_on_a_task_without_stages_names_the_task():
    sig = _scene([(0, 0, 0)], [(0, 0, 0)], [[]], stage=[0.0])
    del sig["stage_progress"]
    with pytest.raises(RewardTermError, match="task libero/libero_object/0 declares no stage predicates"):
        make_term("keypoint_obstacle")(_step(sig, env_id="libero/libero_object/0"))


def test_a_cost_whose_signal_is_missing_names_the_env_and_its_signals():
    with pytest.raises(RewardTermError, match="'table_force'.*env maniskill/PickCube-v1.*its signals: ee_x"):
        make_term("table_force")(_step({"ee_x": [0.0]}, env_id="maniskill/PickCube-v1"))


def test_costs_as_ppo_penalties_through_the_reward_function():
    h, n = 3, 2
    zeros = torch.zeros(h, n)
    flags = torch.zeros(h, n, dtype=torch.bool)
    term = flags.clone()
    term[1, 0] = True  # env 0 ends at step 1: its step 2 is held and must not count
    steps = ChunkSteps(
        env_ids=[0, 1], reward=torch.ones(h, n), terminated=term, truncated=flags, success=flags, reward_terms={},
        episode_return=zeros, episode_length=zeros.long(), final_obs={}, obs={},
        signals={"collision": torch.tensor([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]])},
    )
    fn = RewardFunction(RewardConfig(terms={"env": 1.0, "collision": -0.5, "episode_steps": -0.1}), "toy")
    out = fn(steps, torch.zeros(n, h, 1), {})
    assert out.terms["collision"].tolist() == [1.0, 1.0]
    assert out.terms["episode_steps"].tolist() == [2.0, 3.0]
    assert out.reward.tolist() == pytest.approx([2 - 0.5 - 0.2, 3 - 0.5 - 0.3])
