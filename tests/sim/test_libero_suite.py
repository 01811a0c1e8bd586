"""LIBERO suite ids as one multi-task env: every task reachable, init states checked in the main process,
the per-task protocol playing each task's fixed init states once, training and evaluation init states apart.

Skipped (with the reason) where hf-libero or its assets are missing. Tests that build scenes are slow.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sim import OBS_ENV_STATE, TASK, EnvError, make_env
from sim.backends import libero as backend
from sim.backends.libero_suite import task_facts
from sim.tasks import TASK_INDEX, Assignment
from tests.sim.test_libero import config_dir  # noqa: F401  (fixture)
from vla_rl.evaluation import evaluate_per_task

SUITE = "libero/libero_spatial"


def _suite(config_dir: str, n: int = 1, env_id: str = SUITE, **kw):
    """A state-only suite env in this process (scenes are built at the first reset of each task)."""
    return make_env(env_id, num_envs=n, seed=0, obs_mode="state", num_workers=0, config_path=config_dir, **kw)


# ------------------------------------------------------------------ no scene built


@pytest.mark.parametrize("name, count, suites", [
    ("libero_spatial", 10, {"libero_spatial"}),
    ("libero_standard", 40, {"libero_spatial", "libero_object", "libero_goal", "libero_10"}),
    ("libero_130", 130, {"libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90"}),
])
def test_suite_spec_lists_every_task_with_its_init_states(config_dir: str, name: str, count: int, suites: set[str]):
    with _suite(config_dir, env_id=f"libero/{name}") as env:
        spec = env.spec
    assert len(spec.tasks) == len(set(spec.tasks)) == count
    assert {t.split("/")[0] for t in spec.tasks} == suites
    assert spec.init_states == tuple(f.init_states for f in task_facts(name, config_dir))
    assert all(n == 50 for n in spec.init_states)  # LIBERO's protocol: 50 fixed init states per task


def test_bad_init_state_in_a_plan_is_one_line_naming_env_task_and_index(config_dir: str):
    with _suite(config_dir, n=2) as env:
        with pytest.raises(EnvError) as err:
            env.schedule_tasks(plans={1: [Assignment(3, init=7), Assignment(3, init=57)]})
        with pytest.raises(EnvError, match="task index 10 out of range"):
            env.schedule_tasks(plans={0: [Assignment(10, init=0)]})
    msg = str(err.value)
    assert msg == f"{SUITE}: task libero_spatial/3 has no init state 57 (it has 50: 0-49)"


def test_train_init_states_beyond_a_tasks_count_is_rejected(config_dir: str):
    with pytest.raises(EnvError, match="train_init_states=51 exceeds the 50 init states"):
        _suite(config_dir, train_init_states=51)


# ------------------------------------------------------------------ scenes built


@pytest.mark.slow
def test_bad_init_state_is_caught_before_a_worker_sees_it(config_dir: str):
    env = make_env(SUITE, num_envs=2, seed=0, obs_mode="state", num_workers=1, config_path=config_dir)
    try:
        with pytest.raises(EnvError) as err:
            env.schedule_tasks(plans={0: [Assignment(4, init=50)]})
        assert "\n" not in str(err.value) and "worker" not in str(err.value)
        assert "libero_spatial/4 has no init state 50" in str(err.value)
        env.schedule_tasks(plans={0: [Assignment(4, init=49)]})  # the worker is alive and takes a good plan
        assert env.reset(seed=0)[TASK_INDEX][0] == 4
    finally:
        env.close()


@pytest.mark.slow
def test_every_task_of_the_suite_is_reachable_by_assignment(config_dir: str):
    """Task ``t`` queued with init state ``t`` starts exactly from that benchmark init state (no settling)."""
    facts = task_facts("libero_spatial", config_dir)
    with _suite(config_dir, settle_steps=0, task_cache=1) as env:
        env.schedule_tasks(plans={0: [Assignment(t, init=t) for t in range(len(facts))]})
        for t, f in enumerate(facts):
            obs = env.reset()
            assert obs[TASK_INDEX][0] == t and obs[TASK][0] == f.instruction
            init = env._envs[0]._cache[t]._init_states[t]  # the task's own init state t
            expected = torch.from_numpy(np.asarray(init, dtype=np.float32))
            assert torch.equal(obs[OBS_ENV_STATE][0, : f.state_size], expected), f.name


@pytest.mark.slow
def test_per_task_protocol_plays_each_eval_init_state_once_and_training_the_others(config_dir, monkeypatch):
    restored: list[tuple[str, int]] = []
    original = backend.LiberoEnv.restore

    def spy(self, index):
        restored.append((self.spec.env_id.removeprefix("libero/"), index))
        return original(self, index)

    monkeypatch.setattr(backend.LiberoEnv, "restore", spy)
    with _suite(config_dir, n=2, settle_steps=0, max_episode_steps=2, train_init_states=40) as env:
        res = evaluate_per_task(env, lambda obs: torch.zeros(2, 2, 7), tasks=[2, 7], episodes_per_task=3,
                                seed=5, progress=False, first_init=40)
        evaluated = [r for r in restored if r[1] >= 40]
        assert sorted(evaluated) == [(f"libero_spatial/{t}", 40 + k) for t in (2, 7) for k in range(3)]
        assert {name: row["episodes"] for name, row in res.per_task.items()} == {
            "libero_spatial/2": 3, "libero_spatial/7": 3}
        restored.clear()
        env.reset(seed=1)  # training resets (queues cleared) draw from the first 40 init states only
        for _ in range(3):
            env.step_chunk(torch.zeros(2, 2, 7))
    assert len(restored) >= 6 and all(i < 40 for _, i in restored)
