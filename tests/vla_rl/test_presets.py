"""Every training preset in ``configs/`` parses, and runs one ``--smoke true`` iteration on the CPU."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vla_rl.cli import CONFIG_DIR, parse_config
from vla_rl.smoke import MAX_ENVS, MAX_EVAL_TASKS, apply_smoke
from vla_rl.train_config import TrainConfig, policy_type

TRAIN_PRESETS = {
    "maniskill_pi0_flowsde_ppo": ("pi0", "ppo"),
    "maniskill_compact_flownoise_ppo": ("compact-flow", "ppo"),
    "libero_pi05_flowsde_ppo": ("pi05", "ppo"),
    "libero_openvla_ppo": ("openvla-style", "ppo"),
    "maniskill_ar_grpo": ("openvla-style", "grpo"),
    "libero_spatial_pi0_flowsde_ppo": ("pi0", "ppo"),
    "libero_standard_pi05_flownoise_ppo": ("pi05", "ppo"),
    "libero_goal_openvla_ppo": ("openvla-style", "ppo"),
    "maniskill_set_pi05_flowsde_ppo": ("pi05", "ppo"),
}
EPISODE_STEPS = {"maniskill/PickCube-v1": 50, "libero/libero_object/0": 280,  # the tasks' default limits
                 "libero/libero_spatial": 220, "libero/libero_standard": 520, "libero/libero_goal": 300,
                 "maniskill/TabletopSet-v1": 100}
SUITE_PRESETS = {"libero_spatial_pi0_flowsde_ppo", "libero_standard_pi05_flownoise_ppo", "libero_goal_openvla_ppo",
                 "maniskill_set_pi05_flowsde_ppo"}  # multi-task: several tasks per batch, per-task report
FAST = {"maniskill_compact_flownoise_ppo"}  # state mode, no rendering: about a minute


QUICKSTART_PRESETS = {"quickstart_ppo"}  # `vla-rl quickstart --preset ...` (tests/vla_rl/test_quickstart.py)


def test_every_train_preset_is_listed_here():
    on_disk = {p.stem for p in CONFIG_DIR.glob("*.yaml") if "\nalgo:" in p.read_text()}
    assert on_disk == set(TRAIN_PRESETS) | QUICKSTART_PRESETS


@pytest.mark.parametrize("name", sorted(TRAIN_PRESETS))
def test_preset_parses_at_full_size_and_shrinks_under_smoke(name):
    full = parse_config(TrainConfig, ["--preset", name])
    kind, algo = TRAIN_PRESETS[name]
    assert policy_type(full.policy) == kind and full.algo.type == algo and not full.smoke
    assert full.env.num_envs >= 64 and full.iterations >= 100
    assert apply_smoke(full) is full  # smoke off: untouched
    steps = full.exec_steps or getattr(full.policy, "chunk_size", 0)
    assert steps and full.algo.decisions_per_iter * steps >= EPISODE_STEPS[full.env.id]  # an episode per iteration
    small = apply_smoke(parse_config(TrainConfig, ["--preset", name, "--smoke", "true"]))
    assert small.env.num_envs <= MAX_ENVS and small.iterations <= 2 and small.env.num_workers == 0
    assert small.env.id == full.env.id and policy_type(small.policy) == kind and small.algo.type == algo
    assert getattr(small.policy, "sampler", None) is None or small.policy.sampler.kind == full.policy.sampler.kind
    # A value below a cap given on the command line is kept.
    one = apply_smoke(parse_config(TrainConfig, ["--preset", name, "--smoke", "true", "--iterations", "1"]))
    assert one.iterations == 1


def test_published_settings_in_presets():
    pi05 = parse_config(TrainConfig, ["--preset", "libero_pi05_flowsde_ppo"])
    assert (pi05.env.num_envs, pi05.exec_steps, pi05.policy.sampler.num_steps) == (64, 5, 3)
    assert (pi05.algo.lr_actor, pi05.algo.lr_critic) == (5e-6, 1e-4)
    assert pi05.policy.value_placement.value == "prefix"
    noise = parse_config(TrainConfig, ["--preset", "maniskill_compact_flownoise_ppo"])
    assert noise.algo.ent_coef == 0.005 and noise.policy.sampler.kind.value == "flow_noise"
    assert parse_config(TrainConfig, ["--preset", "maniskill_ar_grpo"]).algo.group_size == 8
    assert parse_config(TrainConfig, ["--preset", "libero_openvla_ppo"]).algo.critic_warmup_iters > 0


def _smoke_run(name: str, tmp_path: Path) -> dict:
    # A fresh process, as a user runs it (LIBERO, for one, binds its config folder once per process).
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "vla_rl.cli", "train", "--preset", name, "--smoke", "true", "--iterations", "1",
         "--run_dir", str(tmp_path / name)], capture_output=True, text=True, timeout=900,
    )
    print(f"{name}: --smoke true --iterations 1 took {time.perf_counter() - start:.0f} s")  # pytest -s shows it
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / name / "eval_after.json").read_text())
    assert result["episodes"] >= 1
    rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    assert any("update/loss" in r or "update/skipped" in r for r in rows), rows
    assert (tmp_path / name / "checkpoints" / "iter_000001").is_dir()
    if name in SUITE_PRESETS:  # under --smoke: a few tasks spread over the suite, each once; the report lists each
        assert result["protocol"] == "per_task" and len(result["per_task"]) == MAX_EVAL_TASKS
        assert all(row["episodes"] == 1 for row in result["per_task"].values())
        report = (tmp_path / name / "report.md").read_text()
        assert all(f"| {task} |" in report for task in result["per_task"])
        assert any(k.startswith("task/") for r in rows for k in r)
        suites = {task.split("/")[0] for task in result["per_task"]}
        assert name != "libero_standard_pi05_flownoise_ppo" or len(suites) == MAX_EVAL_TASKS  # spans the 4 suites
    return result


@pytest.mark.parametrize("name", sorted(FAST))
def test_smoke_run(name, tmp_path):
    _smoke_run(name, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(TRAIN_PRESETS) - FAST))
def test_smoke_run_slow(name, tmp_path):
    _smoke_run(name, tmp_path)


@pytest.mark.slow
def test_eval_init_states_overlapping_training_ones_are_one_line_exit_2(tmp_path):
    """Caught in the main process before any scene is built or policy made: one line naming the fields."""
    proc = subprocess.run(
        [sys.executable, "-m", "vla_rl.cli", "train", "--preset", "libero_spatial_pi0_flowsde_ppo", "--smoke", "true",
         "--env.tasks.train_init_states", "50", "--run_dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert "env.tasks.train_init_states=50 + eval.episodes_per_task=1 exceed the 50 init states of " \
           "libero/libero_spatial task libero_spatial/0" in line
