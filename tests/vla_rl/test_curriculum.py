"""Curriculum task selection (:mod:`vla_rl.curriculum`) and the per-task evaluation protocol."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sim import make_env
from sim.tasks import TASK_INDEX
from vla_rl.curriculum import TaskCurriculum, TaskSamplingConfig, curriculum_weights, progress_weights
from vla_rl.evaluation import evaluate_per_task

TASKS = ["a", "b", "c", "d"]


def _fed(sampler: str, rates: list[float], n: int = 20, **kw) -> TaskCurriculum:
    cur = TaskCurriculum(TASKS, TaskSamplingConfig(sampler=sampler, window=n, **kw))
    for t, p in enumerate(rates):
        wins = round(p * n)
        cur.observe([(t, k < wins) for k in range(n)])
    return cur


def test_curriculum_prefers_tasks_near_half_success():
    w = _fed("curriculum", [0.0, 0.5, 0.9, 1.0], floor=0.0).weights()
    np.testing.assert_allclose(w, np.array([0.0, 1.0, 0.2, 0.0]) / 1.2)
    raw = curriculum_weights(np.array([0.25, 0.0]), np.array([True, False]), floor=0.1)
    np.testing.assert_allclose(raw, [0.6, 1.1])  # an unseen task counts as p = 0.5


def test_progress_prefers_tasks_whose_success_changes():
    cur = TaskCurriculum(TASKS, TaskSamplingConfig(sampler="progress", window=10, floor=0.0))
    cur.observe([(0, False)] * 5 + [(0, True)] * 5)  # 0 -> 1: progress 1
    cur.observe([(1, True)] * 10)  # flat: progress 0
    cur.observe([(2, k % 2 == 0) for k in range(10)])  # 0.6 -> 0.4: progress 0.2
    w = cur.weights()  # task 3 unseen: weight 1
    np.testing.assert_allclose(w, np.array([1.0, 0.0, 0.2, 1.0]) / 2.2)
    np.testing.assert_allclose(progress_weights(np.array([0.2]), np.array([0.5]), np.array([True]), 0.1), [0.4])


def test_uniform_and_holdout():
    cur = _fed("uniform", [0.1, 0.2, 0.3, 0.4], holdout=["b", "d"])
    np.testing.assert_allclose(cur.weights(), [0.5, 0.0, 0.5, 0.0])
    assert cur.eval_tasks == [1, 3]
    scal = cur.scalars()
    assert scal["task/c/success"] == pytest.approx(0.3) and scal["task/b/weight"] == 0.0
    with pytest.raises(ValueError, match="env.tasks.holdout: unknown task"):
        TaskCurriculum(TASKS, TaskSamplingConfig(holdout=["z"]))
    with pytest.raises(ValueError, match="every task"):
        TaskCurriculum(TASKS, TaskSamplingConfig(holdout=TASKS))
    with pytest.raises(ValueError, match="env.tasks.sampler"):
        TaskSamplingConfig(sampler="greedy")


def test_window_forgets_old_episodes_and_state_round_trips():
    cur = _fed("curriculum", [0.0, 0.0, 0.0, 0.0], n=4)
    cur.observe([(0, True)] * 4)
    assert cur.success()[0][0] == 1.0
    other = TaskCurriculum(TASKS, TaskSamplingConfig(sampler="curriculum", window=4))
    other.load_state_dict(cur.state_dict())
    np.testing.assert_allclose(other.weights(), cur.weights())


def test_per_task_protocol_runs_each_task_episode_once_and_only_eval_tasks():
    with make_env("mujoco/multi", num_envs=3, seed=0, obs_mode="state", max_episode_steps=4) as env:
        plans_seen = []
        original = env.schedule_tasks

        def spy(weights=None, plans=None):
            plans_seen.append(plans)
            original(weights=weights, plans=plans)

        env.schedule_tasks = spy
        started = []

        def act(obs):
            started.extend(obs[TASK_INDEX].tolist())
            return torch.zeros(3, 4, 4)

        res = evaluate_per_task(env, act, tasks=[1, 5, 7], episodes_per_task=4, seed=10, progress=False)
    queued = [(a.task, a.seed) for p in plans_seen[0].values() for a in p]
    assert sorted(queued) == sorted((t, 10 + k) for t in (1, 5, 7) for k in range(4))  # each exactly once
    assert set(res.per_task) == {"pick-green", "push-blue-to-pad", "stack-red-on-blue"}
    assert all(row["episodes"] == 4 for row in res.per_task.values())
    assert res.episodes == 12 and set(started) <= {1, 5, 7} | set(range(12))
    assert all(not p for p in plans_seen[-1].values())  # queues cleared afterwards
