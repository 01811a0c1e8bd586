"""``maniskill/TabletopSet-v1``: every task of the set reachable by assignment, episodes fixed by the assigned seed.

Needs a Vulkan driver (skips with the backend's message otherwise, like ``test_maniskill.py``); builds one
scene per task, so it is slow.
"""

from __future__ import annotations

import pytest
import torch

from sim import OBS_ENV_STATE, TASK, make_env
from sim.backends.maniskill_set import SET_TASKS
from sim.tasks import TASK_INDEX, Assignment
from tests.sim.test_maniskill import icd  # noqa: F401  (fixture)


@pytest.mark.slow
def test_every_task_of_the_set_is_reachable_by_assignment_and_fixed_by_its_seed(icd: str):  # noqa: F811
    with make_env("maniskill/TabletopSet-v1", num_envs=1, seed=0, obs_mode="state", num_workers=0,
                  vulkan_icd=icd, task_cache=len(SET_TASKS)) as env:
        assert env.spec.tasks == SET_TASKS and env.spec.init_states == ()  # episodes start from seeds
        plan = [Assignment(t, seed=100 + t) for t in range(len(SET_TASKS))]
        env.schedule_tasks(plans={0: plan + plan})
        first = [env.reset() for _ in plan]
        second = [env.reset(seed=999) for _ in plan]  # the queue's seeds win over the reset's own
    for t, (a, b) in enumerate(zip(first, second)):
        assert a[TASK_INDEX][0] == t == b[TASK_INDEX][0]
        assert torch.equal(a[OBS_ENV_STATE], b[OBS_ENV_STATE]), SET_TASKS[t]  # the assignment's seed decides
    assert len({obs[TASK][0] for obs in first}) == len(SET_TASKS)  # each task its own instruction
