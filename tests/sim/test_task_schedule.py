"""Per-slot task assignment at reset (:mod:`sim.tasks`) on the MuJoCo multi-task envs, in-process and in workers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sim import EnvError, make_env
from sim.tasks import TASK_INDEX, Assignment, TaskSchedule, split_plans


def _env(num_workers: int = 0, task: str = "multi", n: int = 4):
    return make_env(f"mujoco/{task}", num_envs=n, seed=0, obs_mode="state", num_workers=num_workers)


def test_queued_assignments_are_honoured_per_slot_then_sampling_resumes():
    with _env() as env:
        env.schedule_tasks(plans={0: [Assignment(2), Assignment(9)], 3: [Assignment(11)]})
        obs = env.reset(seed=7)
        assert obs[TASK_INDEX][0] == 2 and obs[TASK_INDEX][3] == 11
        assert obs["task"][0] == "pick up the blue cube"
        obs = env.reset(seed=7, env_ids=[0])  # the slot's next queued task
        assert obs[TASK_INDEX][0] == 9
        weights = np.zeros(len(env.spec.tasks))
        weights[5] = 1.0
        env.schedule_tasks(weights=weights)
        obs = env.reset(seed=8)
        assert obs[TASK_INDEX].tolist() == [5, 5, 5, 5]


def test_auto_resets_follow_the_queue_and_report_the_ended_task():
    with _env(n=2) as env:
        env.schedule_tasks(plans={0: [Assignment(0), Assignment(6)], 1: [Assignment(3), Assignment(4)]})
        env.reset(seed=1)
        steps = env.step_chunk(torch.zeros(2, env.spec.max_episode_steps, 4))  # every episode truncates
        assert steps.obs[TASK_INDEX].tolist() == [6, 4]
        assert steps.final_obs[TASK_INDEX].tolist() == [0, 3]


@pytest.mark.parametrize("workers", [0, 2])
def test_sampling_is_reproducible_from_the_seed(workers):
    weights = np.arange(1, 13, dtype=float)
    draws = []
    for _ in range(2):
        with _env(workers) as env:
            env.schedule_tasks(weights=weights)
            seq = [env.reset(seed=s)[TASK_INDEX].tolist() for s in (3, 4, 3)]
            draws.append(seq)
    assert draws[0] == draws[1]
    assert draws[0][0] == draws[0][2]  # the same seed draws the same tasks
    assert draws[0][0] != draws[0][1]


def test_worker_processes_assign_like_the_in_process_env():
    plans = {i: [Assignment((3 * i + k) % 12, seed=100 + k) for k in range(2)] for i in range(4)}
    got = []
    for workers in (0, 2):
        with _env(workers) as env:
            env.schedule_tasks(plans=plans)
            a = env.reset(seed=0)
            b = env.reset(seed=0)
            got.append((a[TASK_INDEX].tolist(), b[TASK_INDEX].tolist(), a["observation.env_state"]))
    assert got[0][:2] == got[1][:2] == ([0, 3, 6, 9], [1, 4, 7, 10])
    torch.testing.assert_close(got[0][2], got[1][2])  # the assignment's seed fixes the layout


def test_every_task_of_the_set_is_reachable_by_uniform_sampling():
    with _env(n=4) as env:
        seen = set()
        for s in range(15):
            seen |= set(env.reset(seed=100 * s)[TASK_INDEX].tolist())
        assert seen == set(range(len(env.spec.tasks)))


def test_skill_subset_lists_its_tasks_and_single_task_envs_refuse_schedules():
    with _env(task="pick-any", n=1) as env:
        assert env.spec.tasks == ("pick-red", "pick-green", "pick-blue")
    with _env(task="pick-red", n=1) as env:
        assert env.spec.tasks == () and TASK_INDEX not in env.reset()
        with pytest.raises(EnvError, match="single-task"):
            env.schedule_tasks(weights=[1.0])


def test_bad_schedules_name_the_problem():
    with _env(n=2) as env:
        with pytest.raises(EnvError, match="one entry per task"):
            env.schedule_tasks(weights=[1.0, 2.0])
        with pytest.raises(EnvError, match="not all 0"):
            env.schedule_tasks(weights=np.zeros(12))
        with pytest.raises(EnvError, match="env 5 out of range"):
            env.schedule_tasks(plans={5: [Assignment(0)]})
        with pytest.raises(EnvError, match="task index 12 out of range"):
            env.schedule_tasks(plans={0: [Assignment(12)]})


def test_weighted_draws_follow_the_weights():
    sched = TaskSchedule(3, "x")
    sched.set(np.array([0.0, 1.0, 3.0]), None)
    rng = np.random.default_rng(0)
    counts = np.bincount([sched.next(rng).task for _ in range(4000)], minlength=3)
    assert counts[0] == 0
    assert abs(counts[2] / counts.sum() - 0.75) < 0.03


def test_split_plans_deals_round_robin():
    plan = [Assignment(t) for t in range(5)]
    assert {i: [a.task for a in p] for i, p in split_plans(plan, 2).items()} == {0: [0, 2, 4], 1: [1, 3]}
