"""Curriculum task selection (:mod:`vla_rl.curriculum`) and the per-task evaluation protocol."""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest
import torch

from sim import EnvSpec, TensorSpec, make_env
from sim.tasks import TASK_INDEX
from vla_rl.cli import parse_config
from vla_rl.config import ConfigError
from vla_rl.curriculum import (
    TaskCurriculum,
    TaskSamplingConfig,
    balanced_weights,
    curriculum_weights,
    progress_weights,
    spread,
)
from vla_rl.evaluation import evaluate_per_task, paired_difference
from vla_rl.smoke import apply_smoke
from vla_rl.train_config import TrainConfig
from vla_rl.trainer import check_init_state_split

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


def test_balanced_gives_each_task_about_equal_successes():
    rates = [0.7, 0.1, 0.3, 0.0]
    w = _fed("balanced", rates, floor=0.05, holdout=["d"]).weights()
    np.testing.assert_allclose(w, np.array([1 / 0.75, 1 / 0.15, 1 / 0.35, 0.0]) / (1 / 0.75 + 1 / 0.15 + 1 / 0.35))
    expected = np.array(rates[:3]) * w[:3]  # successes per reset, per task
    assert expected.max() / expected.min() < 1.5  # uniform: 0.7 / 0.1 = 7; here (0.7 / 0.75) / (0.1 / 0.15) = 1.4
    raw = balanced_weights(np.array([0.5, 0.9]), np.array([False, True]), floor=0.1)
    np.testing.assert_allclose(raw, [10.0, 1.0])  # an unseen task counts as p = 0: the cap 1 / floor
    with pytest.raises(ValueError, match="env.tasks.floor must be > 0 with env.tasks.sampler balanced"):
        TaskSamplingConfig(sampler="balanced", floor=0.0)


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


def test_per_task_outcomes_are_ordered_by_episode_seed_so_evaluations_pair_up():
    """Character k of a task's outcome string is the episode played from seed ``seed + k``, whichever env slot played
    it: the spy marks as successes the episodes of chosen (task, seed) pairs, on 2 and on 3 slots."""
    wins = {(1, 11), (1, 13), (5, 10), (7, 12)}  # (task, reset seed) of the episodes made to succeed
    for num_envs in (2, 3):
        with make_env("mujoco/multi", num_envs=num_envs, seed=0, obs_mode="state", max_episode_steps=4) as env:
            queued, played = {}, [0] * num_envs
            schedule, step = env.schedule_tasks, env.step_chunk

            def spy_schedule(weights=None, plans=None):
                queued.update({i: p for i, p in (plans or {}).items() if p})
                schedule(weights=weights, plans=plans)

            def spy_step(chunk):
                out = step(chunk)
                for h, i in (out.terminated | out.truncated).nonzero().tolist():
                    if i in queued and played[i] < len(queued[i]):
                        a = queued[i][played[i]]
                        played[i] += 1
                        out.success[h, i] = (a.task, a.seed) in wins
                return out

            env.schedule_tasks, env.step_chunk = spy_schedule, spy_step
            res = evaluate_per_task(env, lambda obs: torch.zeros(obs[TASK_INDEX].shape[0], 4, 4), tasks=[1, 5, 7],
                                    episodes_per_task=4, seed=10, progress=False)
        assert res.outcomes == {"pick-green": "0101", "push-blue-to-pad": "1000", "stack-red-on-blue": "0010"}
        assert res.per_task["pick-green"]["success"] == 0.5 and res.successes == 4


def test_paired_difference_pairs_episodes_and_pools_evaluations():
    base = [{"a": "0011", "b": "1100"}, {"a": "0000", "b": "1111"}]
    other = [{"a": "0111", "b": "1100"}, {"a": "1000", "b": "1111"}]
    mean, lo, hi, n = paired_difference(base, other)
    assert n == 16 and mean == pytest.approx(2 / 16)
    assert lo < mean < hi and hi - lo == pytest.approx(2 * 1.96 * np.std([1, 1] + [0] * 14, ddof=1) / 4)
    assert paired_difference(base, base)[:3] == (0.0, 0.0, 0.0)  # the same outcomes: no difference, no noise
    # the same rates on other states: unpaired means would agree, the paired interval is wide
    mean, lo, hi, _ = paired_difference([{"a": "1100"}], [{"a": "0011"}])
    assert mean == 0.0 and hi - lo > 1.0
    with pytest.raises(ValueError, match="task a: 4 episodes against 3"):
        paired_difference([{"a": "0011"}], [{"a": "001"}])
    with pytest.raises(ValueError, match=r"tasks \['a'\] against \['b'\]"):
        paired_difference([{"a": "0011"}], [{"b": "0011"}])


def test_spread_picks_evenly_spaced_tasks():
    assert spread(list(range(40)), 4) == [0, 13, 26, 39]
    assert spread([3, 5], 4) == [3, 5] and spread([3, 5, 8], 0) == [3, 5, 8]


def _spec(init_states: tuple[int, ...]) -> EnvSpec:
    return EnvSpec("libero/libero_spatial", {}, TensorSpec((7,), torch.float32), 220, 20.0,
                   tasks=tuple(f"libero_spatial/{i}" for i in range(len(init_states))), init_states=init_states)


@pytest.mark.parametrize("args, spec, message", [
    (["--env.tasks.train_init_states", "40", "--eval.episodes_per_task", "11"], (50, 50, 50),
     "env.tasks.train_init_states=40 + eval.episodes_per_task=11 exceed the 50 init states of "
     "libero/libero_spatial task libero_spatial/0: training and evaluation init states would overlap"),
    (["--env.tasks.train_init_states", "10", "--eval.episodes_per_task", "35"], (50, 44, 50),
     "exceed the 44 init states of libero/libero_spatial task libero_spatial/1"),
    (["--eval.episodes_per_task", "60"], (50, 50), "eval.episodes_per_task=60 exceeds the 50 init states"),
    (["--env.tasks.train_init_states", "40", "--eval.protocol", "seeds"], (50,), "needs eval.protocol per_task"),
    (["--env.tasks.train_init_states", "40"], (), "has no fixed init states"),
])
def test_train_and_eval_init_states_must_not_overlap(args, spec, message):
    cfg = parse_config(TrainConfig, ["--env.id", "libero/libero_spatial", "--eval.protocol", "per_task", *args])
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_init_state_split(cfg, _spec(spec))


def test_disjoint_split_passes_and_is_handed_to_the_env(monkeypatch):
    cfg = parse_config(TrainConfig, ["--env.id", "libero/libero_spatial", "--eval.protocol", "per_task",
                                     "--env.tasks.train_init_states", "40", "--eval.episodes_per_task", "10"])
    check_init_state_split(cfg, _spec((50,) * 10))
    plain = parse_config(TrainConfig, ["--env.id", "libero/libero_spatial", "--eval.protocol", "per_task"])
    check_init_state_split(plain, _spec((50,) * 10))  # 0: the published setting, train on all 50
    seen = []
    monkeypatch.setattr("vla_rl.config.make_env", lambda env_id, **kw: seen.append(kw))
    cfg.env.make()
    plain.env.make()
    assert seen[0]["train_init_states"] == 40 and "train_init_states" not in seen[1]  # other backends never see it


def test_holdout_keeps_training_tasks_out_of_evaluation_and_held_out_tasks_out_of_training(tmp_path):
    from vla_rl.trainer import Trainer

    held = ["pick-green", "push-blue-to-pad", "stack-red-on-blue", "pick-blue"]
    cfg = parse_config(TrainConfig, [
        "--env.id", "mujoco/multi", "--env.num_envs", "8", "--env.image_size", "32", "--env.max_episode_steps", "8",
        "--smoke", "true", "--policy.type", "compact-flow", "--algo.decisions_per_iter", "4",
        "--eval.protocol", "per_task", "--eval.episodes_per_task", "1", "--env.tasks.holdout", f"[{', '.join(held)}]",
        "--iterations", "2", "--run_dir", str(tmp_path),
    ])
    cfg = apply_smoke(cfg)
    cfg = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, num_envs=8))  # smoke caps it at 2
    final = Trainer(cfg).run()
    assert set(json.loads((tmp_path / "eval_after.json").read_text())["per_task"]) == set(held)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    trained = {k.split("/")[1] for r in rows for k in r if k.startswith("task/") and k.endswith("/success")}
    assert len(trained) >= 4 and not trained & set(held), trained  # 32 training episodes, none on a held-out task
    assert final is not None
