"""GRAPE's pairing, scoring and evaluation summaries on hand-built trajectories, and the pairs table."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from vla_rl.grape.pairs import instruction_pairs, select_pairs, write_pairs_table
from vla_rl.grape.report import collisions_by_outcome, shared_success_steps, summarize
from vla_rl.grape.scoring import ScoreConfig, score_trajectory
from vla_rl.grape.trajectory import Trajectory


def _t(tid: int, state: int, score: float, success: bool, **costs: list[float]) -> Trajectory:
    return Trajectory(id=tid, state=state, seed=100 + state, obs={}, actions=torch.zeros(1, 1, 1), extras={},
                      logp=torch.zeros(1), success=success, steps=10, costs={k: sum(v) for k, v in costs.items()},
                      stage_costs=costs, score=score)


def test_top_m_are_paired_with_bottom_m_per_state_and_single_outcome_states_give_none():
    trajs = [_t(0, 0, 5.2, True), _t(1, 0, 0.3, False), _t(2, 0, 5.9, True), _t(3, 0, 0.1, False), _t(4, 0, 0.2, False),
             _t(5, 1, 5.0, True), _t(6, 1, 5.5, True),  # all successes: no pair
             _t(7, 2, 0.1, False), _t(8, 2, 5.0, True)]
    one = select_pairs(trajs, m=1)
    assert [(p.state, p.chosen.id, p.rejected.id) for p in one] == [(0, 2, 3), (2, 8, 7)]
    two = select_pairs(trajs, m=2)
    assert [(p.chosen.id, p.rejected.id) for p in two if p.state == 0] == [(2, 3), (0, 4)]
    assert [p.state for p in two].count(2) == 1  # two trajectories make one pair at most
    with pytest.raises(ValueError, match="pairs per state must be >= 1"):
        select_pairs(trajs, m=0)


def test_score_is_grapes_formula_with_stage_wise_thresholds():
    score = ScoreConfig(lam_self=0.01, lam_ext=1.0, lam_success=5.0, costs={"collision": 0.5, "episode_steps": 0.01},
                        thresholds={"episode_steps": 4.0}, min_prob=0.05)
    t = _t(0, 0, 0.0, True, collision=[1.0, 0.0, 2.0], episode_steps=[3.0, 6.0, 5.0])
    t.logp = torch.tensor([-0.1, -10.0, 0.7])  # clipped to [log 0.05, 0]
    got = score_trajectory(t, score)
    log_r_self = -0.1 + math.log(0.05) + 0.0
    penalty = 0.5 * (1 + 0 + 2) + 0.01 * (0 + 2 + 1)
    assert got == pytest.approx(0.01 * log_r_self + math.exp(-penalty) + 5.0)
    assert t.score == got and t.score_parts["r_ext"] == pytest.approx(math.exp(-penalty))


def test_unknown_cost_in_the_score_lists_the_valid_ones():
    with pytest.raises(ValueError, match="unknown cost term.*'colisions'.*valid cost terms: collision"):
        ScoreConfig(costs={"colisions": 0.1})


def test_pairs_table_round_trips(tmp_path):
    trajs = [_t(0, 0, 5.0, True, collision=[0.0]), _t(1, 0, 0.5, False, collision=[2.0])]
    for t in trajs:
        t.score_parts = {"log_r_self": -1.0, "r_ext": 0.5, "success": float(t.success)}
    path = write_pairs_table(tmp_path / "pairs.parquet", select_pairs(trajs, 1), ["collision"])
    df = pd.read_parquet(path)
    assert df.loc[0, "chosen_id"] == 0 and df.loc[0, "rejected_id"] == 1
    assert df.loc[0, "rejected_cost_collision"] == 2.0 and df.loc[0, "chosen_r_ext"] == 0.5
    assert len(pd.read_parquet(write_pairs_table(tmp_path / "none.parquet", [], ["collision"]))) == 0


def test_single_outcome_states_pair_by_score_when_both_outcomes_are_not_required():
    trajs = [_t(0, 1, 5.0, True), _t(1, 1, 5.5, True), _t(2, 1, 5.5, True)]
    assert select_pairs(trajs, 1) == []
    pairs = select_pairs(trajs, 1, require_both_outcomes=False)
    assert [(p.chosen.id, p.rejected.id) for p in pairs] == [(1, 0)]


def test_pair_single_outcome_keeps_grapes_sampling_and_pairs_every_state():
    from vla_rl.grape.sampling import GrapeSettings, _done

    fails = [_t(i, 0, 4.0 - i, False) for i in range(6)]
    grape = GrapeSettings(min_samples=6, max_samples=11)
    for settings in (grape, GrapeSettings(min_samples=6, max_samples=11, pair_single_outcome=True)):
        assert not _done(fails, settings)  # six failures: sample on, looking for a success
        assert _done(fails + [_t(6, 0, 5.0, True)], settings) and _done(fails * 2, settings)
    assert not GrapeSettings(require_both_outcomes=False).pairs_need_both_outcomes
    assert grape.pairs_need_both_outcomes
    assert not GrapeSettings(pair_single_outcome=True).pairs_need_both_outcomes
    pairs = select_pairs(fails, 2, GrapeSettings(pair_single_outcome=True).pairs_need_both_outcomes)
    assert [(p.chosen.id, p.rejected.id) for p in pairs] == [(0, 5), (1, 4)]  # the clean failures over the worst


def test_within_outcome_pairs_order_successes_and_failures_by_their_costs():
    # state 0: clean success 5.9, colliding success 5.1; clean failure 0.9, colliding failures 0.2 and 0.1
    trajs = [_t(0, 0, 5.9, True), _t(1, 0, 5.1, True), _t(2, 0, 0.9, False), _t(3, 0, 0.2, False),
             _t(4, 0, 0.1, False), _t(5, 1, 0.5, False), _t(6, 1, 0.5, False)]  # state 1: two equal failures
    grape = [(p.chosen.id, p.rejected.id) for p in select_pairs(trajs, 1)]
    assert grape == [(0, 4)]  # GRAPE: best success against worst failure; the colliding success is never rejected
    within = [(p.state, p.chosen.id, p.rejected.id) for p in select_pairs(trajs, 1, within_outcome=True)]
    assert within == [(0, 0, 4), (0, 0, 1), (0, 2, 4)]  # (0, 4) once; state 1's tie gives none
    assert [(p.chosen.id, p.rejected.id) for p in select_pairs(trajs, 2, within_outcome=True) if p.state == 0] == [
        (0, 4), (1, 3), (0, 1), (2, 4)]  # the failures' top-2 against bottom-2 repeat nothing new but (2, 4)


def test_success_pairs_give_every_success_of_a_mostly_solved_state_a_failure_to_beat():
    # state 0: four successes (5.9, 5.5, 5.2, 5.1) and two failures (0.3, 0.1); state 1: all successes
    trajs = [_t(0, 0, 5.9, True), _t(1, 0, 5.5, True), _t(2, 0, 5.2, True), _t(3, 0, 5.1, True),
             _t(4, 0, 0.3, False), _t(5, 0, 0.1, False), _t(6, 1, 5.0, True), _t(7, 1, 5.4, True)]
    assert [(p.chosen.id, p.rejected.id) for p in select_pairs(trajs, 2)] == [(0, 5), (1, 4)]  # GRAPE: 2 of 4
    pairs = [(p.state, p.chosen.id, p.rejected.id) for p in select_pairs(trajs, 2, success_pairs=4)]
    # each success against a failure, the worst first and reused in turn; GRAPE's two pairs are not repeated
    assert pairs == [(0, 0, 5), (0, 1, 4), (0, 2, 5), (0, 3, 4)]
    assert [(p.chosen.id, p.rejected.id) for p in select_pairs(trajs, 1, success_pairs=3)] == [(0, 5), (1, 4), (2, 5)]
    assert select_pairs(trajs[6:], 2, success_pairs=4) == []  # a state without a failure still gives none
    with pytest.raises(ValueError, match="success pairs per state must be >= 0"):
        select_pairs(trajs, 1, success_pairs=-1)


def test_steps_on_states_solved_by_both_evaluations_separate_speed_from_harder_states():
    def traj(state: int, success: bool, steps: int) -> Trajectory:
        return Trajectory(id=state, state=state, seed=100 + state, obs={}, actions=torch.zeros(1, 1, 1), extras={},
                          logp=torch.zeros(1), success=success, steps=steps, costs={}, stage_costs={})

    # before: states 0 and 1 solved in 20 steps; after: both in 15, and the hard state 2 too, in 60
    before = summarize([traj(0, True, 20), traj(1, True, 20), traj(2, False, 80)], [])
    after = summarize([traj(0, True, 15), traj(1, True, 15), traj(2, True, 60)], [])
    assert after["per_episode"] == {"seed": [100, 101, 102], "success": [True, True, True], "steps": [15, 15, 60]}
    assert after["mean_steps_success"] == 30.0 > before["mean_steps_success"]  # the plain mean says slower
    assert shared_success_steps(before, after) == (2, 20.0, 15.0)  # on the same states: faster
    assert shared_success_steps(before, summarize([traj(0, False, 80)], [])) == (0, None, None)
    assert shared_success_steps({"success": 0.5}, after) == (0, None, None)  # a report without per-episode records


def test_collisions_are_counted_per_outcome_from_the_per_episode_records():
    trajs = [_t(0, 0, 5.0, True, collision=[0.0]), _t(1, 1, 5.0, True, collision=[2.0]),
             _t(2, 2, 0.0, False, collision=[1.0]), _t(3, 3, 0.0, False, collision=[0.0, 0.0])]
    ev = summarize(trajs, ["collision"])
    assert ev["per_episode"]["collided"] == [False, True, True, False] and ev["collision_rate"] == 0.5
    assert collisions_by_outcome(ev) == {"successes": (1, 2), "failures": (1, 2)}
    assert collisions_by_outcome(summarize(trajs, [])) is None  # no collision cost: no record


def test_instruction_pairs_contrast_each_best_success_with_itself_under_the_other_instructions(tmp_path):
    red, green, blue = "pick up the red cube", "pick up the green cube", "pick up the blue cube"
    trajs = [_t(0, 0, 5.1, True), _t(1, 0, 5.9, True), _t(2, 0, 0.5, False), _t(3, 1, 0.4, False)]
    for t in trajs:
        t.obs = {"task": [red, red], "x": torch.arange(2)}
    pairs = instruction_pairs(trajs, [red, green, "", blue, green], m=1)  # duplicates and empty ones are skipped
    assert [(p.state, p.chosen.id, p.rejected.id) for p in pairs] == [(0, 1, 1), (0, 1, 1)]  # state 1: no success
    assert [p.rejected.obs["task"] for p in pairs] == [[green, green], [blue, blue]]
    for p in pairs:
        assert p.chosen is trajs[1] and p.chosen.obs["task"] == [red, red]  # the original is not touched
        assert not p.rejected.success and p.rejected.obs["x"] is p.chosen.obs["x"]
        assert p.rejected.extras is p.chosen.extras and p.rejected.actions is p.chosen.actions
    assert len(instruction_pairs(trajs, [red, green, blue], m=2)) == 4
    score = ScoreConfig(lam_success=5.0)
    for p in pairs:
        score_trajectory(p.chosen, score), score_trajectory(p.rejected, score)
        assert p.chosen.score - p.rejected.score == pytest.approx(5.0)  # same motion and costs: only success differs
    df = pd.read_parquet(write_pairs_table(tmp_path / "pairs.parquet", pairs, []))
    assert list(df.rejected_task) == [green, blue] and (df.chosen_task == red).all() and (df.chosen_id == 1).all()
    with pytest.raises(ValueError, match="instruction pairs per state must be >= 1"):
        instruction_pairs(trajs, [red, green], m=0)
