"""``vla-rl reward train | eval`` on a real env, and a toy ``vla-rl train`` whose reward is a learned term."""

from __future__ import annotations

import json

import pytest

from rewards.learned.model import RewardModel, RewardModelConfig, load_reward_model
from tests.vla_rl.test_train import TINY
from vla_rl.cli import run

ENV = ["--env.id", "mujoco/pick-red", "--env.num_envs", "2", "--env.image_size", "32", "--env.max_episode_steps", "16",
       "--env.num_workers", "0"]


def test_reward_train_then_eval_on_recorded_episodes(tmp_path, capsys):
    out = run(["reward", "train", *ENV, "--kind", "progress", "--source.episodes", "4", "--fit.epochs", "1",
               "--fit.width", "4", "--output", str(tmp_path / "prm")])
    model = load_reward_model(out["path"])
    assert model.config.kind == "progress" and set(model.config.inputs) == {
        "observation.images.front", "observation.state"}  # the policy's inputs; privileged state only labels
    assert model.config.inputs["observation.images.front"] == [32, 32, 3] and "mae" in out["held_out"]
    assert "--reward.prm.path" in capsys.readouterr().out
    metrics = run(["reward", "eval", *ENV, "--path", out["path"], "--source.episodes", "2",
                   "--output", str(tmp_path / "m.json")])
    assert json.loads((tmp_path / "m.json").read_text()) == metrics and metrics["episodes"] == 2
    with pytest.raises(SystemExit) as exc:  # a 64-pixel env for a model of 32-pixel inputs: before any episode
        run(["reward", "eval", *ENV, "--env.image_size", "64", "--path", out["path"], "--source.episodes", "2"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and all(w in err for w in ("mujoco/pick-red", "observation.images.front",
                                                          "[64, 64, 3]", "[32, 32, 3]")), err
    with pytest.raises(SystemExit) as exc:
        run(["reward", "train", *ENV, "--source.dataset", str(tmp_path / "nothing")])
    assert exc.value.code == 2 and "nothing is not a LeRobotDataset" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        run(["reward", "nonsense"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "unknown reward subcommand 'nonsense'. Valid: eval, reweigh, train" in err


def test_toy_train_with_a_learned_reward_logs_its_term_stores_traces_and_reweighs(tmp_path, capsys):
    inputs = {"observation.images.front": [32, 32, 3], "observation.state": [11]}
    clf = RewardModel(RewardModelConfig(kind="classifier", inputs=inputs, width=4)).save(tmp_path / "clf")
    run_dir = tmp_path / "run"
    run(["train", *TINY, "--iterations", "2", "--run_dir", str(run_dir), "--reward.terms",
         "{classifier: 1.0, success: 0.0}", "--reward.classifier.path", str(clf), "--reward.classifier.threshold", "0"])
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "reward/classifier" in r]
    assert len(trained) == 2 and all(r["reward/classifier"] > 0 for r in trained)  # a probability every chunk
    assert all(r["rollout/chunk_reward"] == pytest.approx(r["reward/classifier"], rel=1e-5) for r in trained)
    assert sorted(p.name for p in (run_dir / "reward_terms").iterdir()) == ["iter_000001.pt", "iter_000002.pt"]
    result = run(["reward", "reweigh", "--run", str(run_dir), "--terms", "{env: 1.0}"])
    assert [r["reproduced"] for r in result["iterations"]] == [1.0, 1.0]
    # between phases: refit a process reward model on the phase's policy's own rollouts
    out = run(["reward", "train", *ENV, "--kind", "progress", "--source.episodes", "2", "--fit.epochs", "1",
               "--fit.width", "4", "--source.policy", str(run_dir / "checkpoints" / "iter_000002" / "policy"),
               "--output", str(tmp_path / "prm1")])
    assert load_reward_model(out["path"]).config.kind == "progress"
    # the expert's episodes plus the policy's own
    policy = str(run_dir / "checkpoints" / "iter_000002" / "policy")
    out = run(["reward", "train", *ENV, "--kind", "progress", "--source.episodes", "2", "--fit.epochs", "1",
               "--fit.width", "4", "--also.policy", policy, "--also.episodes", "3", "--output", str(tmp_path / "prm2")])
    config = load_reward_model(out["path"]).config
    assert config.metrics["episodes"] == 5 and config.metrics["also"]["policy"] == policy
    with pytest.raises(SystemExit) as exc:
        run(["reward", "train", *ENV, "--kind", "progress", "--source.episodes", "2", "--also.policy", policy])
    assert exc.value.code == 2 and "also.episodes must be > 0 when recording, got 0" in capsys.readouterr().err
    bad = RewardModel(RewardModelConfig(inputs={"observation.images.front": [64, 64, 3]}, width=4)).save(tmp_path / "b")
    with pytest.raises(SystemExit) as exc:
        run(["train", *TINY, "--iterations", "1", "--run_dir", str(tmp_path / "run2"), "--reward.terms",
             "{classifier: 1.0}", "--reward.classifier.path", str(bad)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and all(w in err for w in ("observation.images.front", "[32, 32, 3]", "[64, 64, 3]"))


def test_an_annealed_term_weight_is_logged_applied_and_stored_per_iteration(tmp_path):
    run_dir = tmp_path / "run"
    run(["train", *TINY, "--iterations", "3", "--run_dir", str(run_dir), "--reward.terms",
         "{success: 1.0, action_magnitude: -1.0}", "--reward.anneal", "{action_magnitude: 0.0}"])
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "reward/action_magnitude" in r]
    weights = [r["reward/weight/action_magnitude"] for r in trained]
    assert weights == pytest.approx([-1.0, -2 / 3, -1 / 3])  # iteration / iterations of the way to 0
    assert all(r["reward/action_magnitude"] > 0 for r in trained)
    for r, w in zip(trained, weights):  # the decision reward is the weighted terms with that iteration's weight
        assert r["rollout/chunk_reward"] == pytest.approx(r["reward/success"] + w * r["reward/action_magnitude"],
                                                          rel=1e-4, abs=1e-6)
    result = run(["reward", "reweigh", "--run", str(run_dir), "--terms", "{success: 1.0}"])
    assert [r["reproduced"] for r in result["iterations"]] == [1.0, 1.0, 1.0]  # each trace keeps its weights


def test_reward_terms_from_the_command_line_or_a_preset_replace_the_default(tmp_path):
    from vla_rl.cli import parse_config
    from vla_rl.train_config import TrainConfig

    assert parse_config(TrainConfig, []).reward.terms == {"env": 1.0}
    assert parse_config(TrainConfig, ["--reward.terms", "{classifier: 1.0}"]).reward.terms == {"classifier": 1.0}
    preset = tmp_path / "p.yaml"
    preset.write_text("reward:\n  terms: {success: 2.0}\n")
    assert parse_config(TrainConfig, ["--config_path", str(preset)]).reward.terms == {"success": 2.0}
    assert parse_config(TrainConfig, ["--config_path", str(preset), "--reward.terms", "{prm: 0.5}"]).reward.terms == {
        "prm": 0.5}


def test_episodes_recorded_from_a_policy_folder_depend_on_the_seed_alone(tmp_path):
    """A classifier's training and held-out episodes of an exploring policy are the same whatever ran before in
    the process (the policy samples from a generator of ``--source.seed``, not torch's global RNG)."""
    import torch

    from rewards.learned.data import record_episodes
    from sim import make_env
    from vla_rl.commands.reward import _actor
    from vla_rl.config import EnvConfig
    from vla_rl.policy_factory import build_policy
    from vla_rl.train_config import TrainConfig

    torch.manual_seed(0)
    with make_env("mujoco/pick-red", num_envs=2, image_size=32, max_episode_steps=8) as env:
        cfg = TrainConfig(env=EnvConfig(id="mujoco/pick-red", image_size=32)).policy
        build_policy(cfg, env.spec).save_pretrained(tmp_path / "policy")
        runs = []
        for global_seed, seed in ((1, 5), (2, 5), (1, 6)):
            torch.manual_seed(global_seed)
            episodes = record_episodes(env, _actor(str(tmp_path / "policy"), env, [], seed), 2, seed=3)
            runs.append(torch.cat([e.obs["observation.state"] for e in episodes]))
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])


def test_two_episode_sources_must_show_the_same_observations():
    import torch

    from rewards.learned.labels import Episode
    from vla_rl.commands.reward import same_observations
    from vla_rl.config import ConfigError

    def episode(size: int, wrist: bool) -> Episode:
        obs = {"observation.images.front": torch.zeros(3, size, size, 3, dtype=torch.uint8),
               "observation.state": torch.zeros(3, 11)}
        if wrist:
            obs["observation.images.wrist"] = obs["observation.images.front"]
        return Episode(obs=obs, success=torch.zeros(3, dtype=torch.bool), task="pick")

    same_observations([episode(32, True)], [episode(32, True)])
    for other in (episode(32, False), episode(64, True)):
        with pytest.raises(ConfigError, match="also: its episodes' observations .* differ from source's"):
            same_observations([episode(32, True)], [other])
