"""``vla-rl sft``, the SFT learner and updater: any policy, any LeRobotDataset folder, errors that name the feature."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch

from tests.vla_rl.test_data import ACT, STATE, write_lerobot_dataset
from vla_rl.cli import run

TINY = [
    "--policy.type", "compact-flow", "--policy.width", "32", "--policy.heads", "2", "--policy.chunk_size", "4",
    "--policy.prefix_layers", "1", "--policy.expert_layers", "1", "--policy.text_encoder", "hashed",
    "--policy.text_buckets", "256", "--policy.cnn_channels", "[8,16]", "--policy.image_tokens", "2",
    "--policy.keypoints", "4", "--policy.value_hidden", "32", "--policy.noise_hidden", "16",
]


def _sft(dataset: Path, out: Path, *extra: str) -> dict:
    return run(["sft", "--dataset", str(dataset), "--output", str(out), "--batch_size", "16", "--lr", "3e-3",
                *TINY, *extra])


def test_sft_trains_a_policy_on_a_dataset_written_by_lerobot(tmp_path, capsys):
    data = write_lerobot_dataset(tmp_path / "lerobot-made", episodes=4, length=8)
    out = tmp_path / "policy"
    stats = _sft(data, out, "--steps", "150", "--episodes", "3")
    assert stats["sft/steps"] == 150 and stats["episodes"] == 3 and stats["frames"] == 24
    assert stats["sft/loss_last"] < 0.6 * stats["sft/loss_first"], stats  # it learns the state -> action map
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("sft: 150 steps on 24 frames of 3 episodes")
    assert {"config.json", "sft.json"} <= {p.name for p in out.iterdir()}
    assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())  # written atomically
    assert json.loads((out / "sft.json").read_text())["sft/steps"] == 150
    from policies.loading import load_policy

    policy = load_policy(out)
    assert (policy.config.state_dim, policy.config.action_dim, policy.config.cameras) == (STATE, ACT, ())
    with pytest.raises(SystemExit) as exc:  # never overwrites
        _sft(data, out, "--steps", "1")
    assert exc.value.code == 1 and "exists" in capsys.readouterr().err


def test_sft_on_collected_demos_then_evaluates_in_the_env(tmp_path, capsys):
    demos = tmp_path / "demos"
    run(["collect", "--env.id", "mujoco/pick-red", "--env.num_envs", "2", "--env.obs_mode", "state",
         "--episodes", "2", "--output", str(demos)])
    stats = _sft(demos, tmp_path / "policy", "--steps", "60", "--env.id", "mujoco/pick-red", "--env.obs_mode",
                 "state", "--env.num_envs", "2", "--env.num_workers", "0", "--env.max_episode_steps", "8",
                 "--eval_episodes", "2")
    assert stats["sft/loss_last"] < 0.7 * stats["sft/loss_first"], stats
    assert stats["eval/episodes"] == 2 and 0.0 <= stats["eval/success"] <= 1.0
    assert "success" in capsys.readouterr().out.strip().splitlines()[-1]


def test_sft_errors_name_the_feature_and_both_shapes(tmp_path, capsys):
    with_camera = write_lerobot_dataset(tmp_path / "cam", episodes=1, length=4, camera=8)
    trained = tmp_path / "cam-policy"
    _sft(with_camera, trained, "--steps", "1")
    capsys.readouterr()
    state_only = write_lerobot_dataset(tmp_path / "state", episodes=1, length=4)
    capsys.readouterr()  # LeRobot's own progress bars while writing
    with pytest.raises(SystemExit) as exc:  # the checkpoint reads a camera the dataset lacks
        _sft(state_only, tmp_path / "x", "--steps", "1", "--policy.path", str(trained))
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1  # a DatasetError: bad input
    assert str(state_only) in err and "'observation.images.front'" in err
    import numpy as np
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    wide = LeRobotDataset.create(repo_id="local/wide", fps=10, root=tmp_path / "wide", use_videos=False,
                                video_backend="pyav", features={
        "observation.state": {"dtype": "float32", "shape": (STATE + 1,), "names": None},
        "observation.images.front": {"dtype": "image", "shape": (8, 8, 3), "names": ["height", "width", "channels"]},
        "action": {"dtype": "float32", "shape": (ACT,), "names": None}})
    for _ in range(2):
        wide.add_frame({"observation.state": np.zeros(STATE + 1, np.float32), "action": np.zeros(ACT, np.float32),
                        "observation.images.front": np.zeros((8, 8, 3), np.uint8), "task": "t"})
    wide.save_episode()
    wide.finalize()
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        _sft(tmp_path / "wide", tmp_path / "y", "--steps", "1", "--policy.path", str(trained))
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1  # a DatasetError: bad input
    assert f"'observation.state' has shape ({STATE + 1},) in the dataset but the policy expects ({STATE},)" in err
    with pytest.raises(SystemExit) as exc:
        run(["sft", "--steps", "1"])
    assert exc.value.code == 2 and "--dataset is required" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        run(["sft", "--dataset", str(state_only), "--stop_at_success", "0.5"])
    assert exc.value.code == 2 and "--env.id" in capsys.readouterr().err


def test_sft_updater_state_dict_resumes_exactly():
    """Three steps, a save, a fresh updater loaded from it and three more = six steps in one go."""
    from policies.compact.config import CompactFlowConfig
    from policies.compact.policy import CompactFlowPolicy
    from vla_rl.data import make_chunks
    from vla_rl.algorithms.sft import SFTConfig, SFTUpdater

    gen = torch.Generator().manual_seed(0)
    states = torch.randn(12, STATE, generator=gen)
    data = make_chunks({"observation.state": states, "task": ["t"] * 12}, torch.tanh(states[:, :ACT]),
                       torch.arange(12) // 6, horizon=4)
    cfg = SFTConfig(steps=6, batch_size=4, ema=0.5)

    def fresh() -> CompactFlowPolicy:
        torch.manual_seed(0)
        policy = CompactFlowPolicy(CompactFlowConfig(
            cameras=(), state_dim=STATE, action_dim=ACT, chunk_size=4, width=32, heads=2, expert_layers=1,
            text_encoder="hashed", text_buckets=64, value_hidden=16, noise_hidden=8))
        policy.fit_normalization(*data.normalization_data())
        return policy

    def steps(updater: SFTUpdater, n: int, sampler: torch.Generator) -> list[float]:
        return [updater.step(data.sample(4, sampler))["sft/loss"] for _ in range(n)]

    torch.manual_seed(1)
    straight = SFTUpdater(fresh(), cfg, seed=5)
    losses = steps(straight, 6, torch.Generator().manual_seed(2))
    torch.manual_seed(1)
    first = SFTUpdater(fresh(), cfg, seed=5)
    sampler = torch.Generator().manual_seed(2)
    head = steps(first, 3, sampler)
    state, rng = first.state_dict(), torch.get_rng_state()
    weights = {k: v.clone() for k, v in first.policy.state_dict().items()}
    second_policy = fresh()
    second_policy.load_state_dict(weights)
    second = SFTUpdater(second_policy, cfg, seed=99)
    second.load_state_dict(state)
    torch.set_rng_state(rng)
    tail = steps(second, 3, sampler)
    assert head + tail == losses and second.steps == 6
    for a, b in zip(straight.policy.parameters(), second.policy.parameters(), strict=True):
        assert torch.equal(a, b)
    straight.ema.apply()
    assert not all(torch.equal(a, b) for a, b in zip(straight.policy.parameters(), second.policy.parameters()))
    with pytest.raises(ValueError, match="EMA"):
        SFTUpdater(fresh(), SFTConfig(steps=6)).load_state_dict(state)
    for bad in (1.0, -0.1):  # a decay of 1 would freeze the average at the initial weights
        with pytest.raises(ValueError, match="SFT ema"):
            SFTConfig(ema=bad)


def test_the_sft_learners_ema_shows_the_average_and_trains_on_from_the_raw_iterate():
    """``algo.ema``: after every iteration the policy holds the averaged weights (what evaluation, checkpoints and
    RaC's next round use), the gradient steps go on from the raw iterate exactly as without the average, and a
    learner resumed from its state and the shown weights continues bit for bit."""
    from policies.compact.config import CompactFlowConfig
    from policies.compact.policy import CompactFlowPolicy
    from vla_rl.algorithms.base import IterationInputs
    from vla_rl.algorithms.filtered_bc import FilteredBCConfig
    from vla_rl.algorithms.sft import SFTConfig, SFTLearner
    from vla_rl.data import make_chunks

    gen = torch.Generator().manual_seed(0)
    states = torch.randn(12, STATE, generator=gen)
    data = make_chunks({"observation.state": states, "task": ["t"] * 12}, torch.tanh(states[:, :ACT]),
                       torch.arange(12) // 6, horizon=4)

    def fresh(ema: float) -> SFTLearner:
        torch.manual_seed(0)
        policy = CompactFlowPolicy(CompactFlowConfig(
            cameras=(), state_dim=STATE, action_dim=ACT, chunk_size=4, width=32, heads=2, expert_layers=1,
            text_encoder="hashed", text_buckets=64, value_hidden=16, noise_hidden=8))
        return SFTLearner(SFTConfig(steps=6, steps_per_iter=2, batch_size=4, lr=3e-3, ema=ema), policy)

    def iterate(learner: SFTLearner, iterations: range) -> None:
        for it in iterations:
            learner.update(learner.collect(IterationInputs(iteration=it, seed_base=0, reset=True, data=data)))

    def trainable(learner: SFTLearner) -> list[torch.Tensor]:
        return [p.detach().clone() for p in learner.policy.parameters() if p.requires_grad]

    torch.manual_seed(1)
    plain = fresh(0.0)
    iterate(plain, range(3))
    torch.manual_seed(1)
    averaged = fresh(0.5)
    iterate(averaged, range(1))
    state, rng, shown = copy.deepcopy((averaged.state_dict(), torch.get_rng_state(), averaged.policy.state_dict()))
    iterate(averaged, range(1, 3))
    assert averaged.updater is not None and averaged.updater.ema is not None and averaged.updater.ema.is_applied
    for p, q in zip(trainable(averaged), averaged.updater.ema.shadow, strict=True):
        assert torch.equal(p, q)  # the policy shows the average
    for raw, p in zip(averaged.updater.ema.state_dict()["trained"], trainable(plain), strict=True):
        assert torch.equal(raw, p)  # and training went on from the raw iterate, as without it
    assert not all(torch.equal(a, b) for a, b in zip(trainable(averaged), trainable(plain)))

    resumed = fresh(0.5)
    resumed.policy.load_state_dict(shown)
    resumed.load_state_dict(state)
    torch.set_rng_state(rng)
    iterate(resumed, range(1, 3))
    for a, b in zip(trainable(resumed), trainable(averaged), strict=True):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="SFT ema"):
        SFTConfig(ema=1.0)
    with pytest.raises(ValueError, match="algo.ema"):
        FilteredBCConfig(ema=0.9)


def test_the_sft_learner_trains_under_vla_rl_train_and_resumes(tmp_path):
    """``--algo.type sft``: the same updater as ``vla-rl sft``, as a registered learner inside the training loop."""
    demos = tmp_path / "demos"
    run(["collect", "--env.id", "mujoco/pick-red", "--env.num_envs", "2", "--env.obs_mode", "state",
         "--episodes", "2", "--output", str(demos)])
    args = ["train", "--algo.type", "sft", "--data.path", str(demos), "--algo.steps_per_iter", "40",
            "--algo.batch_size", "16", "--algo.lr", "3e-3", "--algo.steps", "120", *TINY,
            "--env.id", "mujoco/pick-red", "--env.obs_mode", "state", "--env.num_envs", "2", "--env.num_workers", "0",
            "--env.max_episode_steps", "8", "--eval.episodes", "2", "--eval.every", "0", "--eval.video", "false",
            "--logging.wandb", "false", "--logging.tensorboard", "false", "--run_dir", str(tmp_path / "run")]
    run([*args, "--iterations", "2"])
    run([*args, "--iterations", "3", "--resume", "true"])
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["update/loss"] for r in rows if "update/loss" in r]
    assert len(losses) == 3 and losses[-1] < 0.7 * losses[0], losses
    assert not any("rollout/success" in r for r in rows)  # no env rollouts: it trains on the dataset only


def _tiny_compact(spec):
    from policies.compact.config import CompactFlowConfig
    from policies.compact.policy import CompactFlowPolicy

    return CompactFlowPolicy(CompactFlowConfig(
        cameras=(), state_dim=STATE, action_dim=ACT, chunk_size=4, width=32, heads=2, expert_layers=1,
        text_encoder="hashed", text_buckets=64, value_hidden=16, noise_hidden=8))


def _pretrained(tmp_path: Path, cfg, check=None) -> tuple[dict, dict[str, torch.Tensor]]:
    from vla_rl.commands.sft import pretrain

    data = tmp_path / "data"
    if not data.exists():
        write_lerobot_dataset(data, episodes=2, length=4)
    policy, stats = pretrain(cfg, data, _tiny_compact, seed=3, success_check=check)
    return stats, {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}


def test_pretraining_s_ema_keeps_the_moving_average_of_the_iterates(tmp_path):
    """Pre-training runs the sft learner in the trainer, one step per iteration; its EMA starts at the first
    iterate (the random initial weights stay out of the average) and ends up in the policy."""
    from vla_rl.algorithms.sft import SFTConfig

    (_, first), (_, last) = (_pretrained(tmp_path, SFTConfig(steps=n, batch_size=4)) for n in (1, 2))
    stats, averaged = _pretrained(tmp_path, SFTConfig(steps=2, batch_size=4, ema=0.25))
    assert stats["sft/steps"] == 2 and stats["frames"] == 8 and stats["episodes"] == 2
    for name, p in averaged.items():  # the first update copies iterate 1, the second mixes in iterate 2
        torch.testing.assert_close(p, 0.25 * first[name] + 0.75 * last[name], rtol=1e-5, atol=1e-6)
    assert any(not torch.equal(first[n], last[n]) for n in first)


def test_pretraining_stops_at_the_first_success_check_that_reaches_the_target(tmp_path):
    """Checks run every ``check_every`` steps from ``check_from`` in eval mode; the first one at the target
    ends pre-training there, with the weights (and RNG stream) of a run that stops at that step."""
    from vla_rl.algorithms.sft import SFTConfig

    calls: list[tuple[bool, float]] = []
    rates = iter([0.05, 0.10, 0.30, 0.90])

    def probe(policy) -> float:
        torch.rand(5)  # a check that draws random numbers must not shift training's stream
        calls.append((policy.training, next(rates)))
        return calls[-1][1]

    stats, stopped = _pretrained(tmp_path, SFTConfig(steps=9, batch_size=4, stop_at_success=0.25, check_from=2,
                                                     check_every=2), probe)
    assert [c[1] for c in calls] == [0.05, 0.10, 0.30] and not any(c[0] for c in calls)  # steps 2, 4, 6
    assert stats["sft/steps"] == 6 and stats["sft/check_success"] == 0.30
    # same weights as the run that trains 6 of the same 9-step schedule with no check (LR decays over 9)
    plain_stats, plain = _pretrained(tmp_path, SFTConfig(steps=9, batch_size=4))
    assert plain_stats["sft/steps"] == 9 and "sft/check_success" not in plain_stats
    rates = iter([1.0])
    _, six = _pretrained(tmp_path, SFTConfig(steps=9, batch_size=4, stop_at_success=1.0, check_from=6,
                                             check_every=100), probe)
    for name, p in stopped.items():
        torch.testing.assert_close(p, six[name])
    assert any(not torch.equal(six[n], plain[n]) for n in six)
    with pytest.raises(ValueError, match="stop_at_success"):
        SFTConfig(stop_at_success=1.5)


def test_vla_rl_train_leaves_the_success_based_stop_to_vla_rl_sft(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        run(["train", "--algo.type", "sft", "--algo.stop_at_success", "0.5", *TINY, "--env.id", "mujoco/pick-red",
             "--run_dir", str(tmp_path / "run"), "--logging.wandb", "false"])
    assert exc.value.code == 2 and "vla-rl sft" in capsys.readouterr().err


def test_the_sft_learner_needs_a_dataset(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        run(["train", "--algo.type", "sft", *TINY, "--env.id", "mujoco/pick-red", "--env.obs_mode", "state",
             "--env.num_workers", "0", "--run_dir", str(tmp_path / "run"), "--logging.wandb", "false"])
    assert exc.value.code == 2 and "--data.path" in capsys.readouterr().err


def test_the_sft_learners_schedule_spans_the_run_unless_given():
    """``algo.steps`` 0 (the default of the SFT-style learners) becomes ``iterations x steps_per_iter`` when the
    trainer builds the learner; a given length is kept, and an unresolved 0 is refused instead of a 1-step schedule."""
    from vla_rl.algorithms.filtered_bc import FilteredBCConfig
    from vla_rl.algorithms.sft import SFTConfig, SFTLearner

    assert SFTConfig(steps_per_iter=40).for_run(3).steps == 120
    assert FilteredBCConfig().for_run(200).steps == 200 * FilteredBCConfig().steps_per_iter
    assert FilteredBCConfig(steps=50).for_run(200).steps == 50
    with pytest.raises(ValueError, match="SFT steps"):
        SFTConfig(steps=-1)
    learner = SFTLearner(SFTConfig(), torch.nn.Linear(1, 1))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="for_run"):
        learner._start(None)


def test_the_learning_rate_warms_up_linearly_then_follows_the_cosine():
    """``warmup_steps``: lr / w, 2 lr / w, ... lr over the first w steps, then the cosine from lr to 10% over the
    rest, held at 10% past the schedule's end; 0 is the cosine from the first step, as before the option."""
    import math

    from vla_rl.algorithms.rac import RaCLearnerConfig
    from vla_rl.algorithms.sft import SFTConfig, SFTUpdater, lr_factor

    assert [lr_factor(s, 4, 14) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_factor(4, 4, 14) == 1.0 and lr_factor(9, 4, 14) == pytest.approx(0.55)
    assert lr_factor(14, 4, 14) == pytest.approx(0.1) and lr_factor(30, 4, 14) == pytest.approx(0.1)
    for s in range(11):  # no warm-up: the schedule every run had before
        assert lr_factor(s, 0, 10) == 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * s / 10))
    updater = SFTUpdater(torch.nn.Linear(3, 2), SFTConfig(steps=14, lr=1e-3, warmup_steps=4))  # type: ignore[arg-type]
    lrs = []
    for _ in range(6):  # the rates the updater's steps take (each step ends with scheduler.step())
        lrs.append(updater.optimizer.param_groups[0]["lr"])
        updater.optimizer.step()
        updater.scheduler.step()
    assert lrs == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3 * lr_factor(5, 4, 14)])
    for bad in (SFTConfig, RaCLearnerConfig):
        with pytest.raises(ValueError, match="warmup_steps"):
            bad(warmup_steps=-1)


AR = ["--policy.type", "openvla-style", "--policy.backbone", "tiny-llava", "--policy.chunk_size", "1",
      "--policy.value_hidden_dim", "32"]
RGB = ["--env.id", "mujoco/pick-red", "--env.obs_mode", "rgb", "--env.image_size", "32", "--env.num_envs", "2",
       "--env.num_workers", "0"]


def test_the_autoregressive_policy_pretrains_with_sft_then_imitates_its_successes_with_filtered_bc(tmp_path):
    """The quickstart's two stages on the openvla-style policy: ``vla-rl sft`` on camera demos (the cross-entropy of
    the demo's action tokens falls), then ``filtered_bc`` from that checkpoint (the episodes it keeps are judged on
    the negated env reward, so the tiny policy fills its buffer) trains and saves a policy of the same kind."""
    from policies.loading import load_policy

    demos = tmp_path / "demos"
    run(["collect", *RGB, "--episodes", "2", "--output", str(demos)])
    stats = run(["sft", "--dataset", str(demos), "--output", str(tmp_path / "sft"), "--steps", "40",
                 "--batch_size", "8", "--lr", "1e-3", *AR])
    assert stats["sft/loss_last"] < 0.8 * stats["sft/loss_first"], stats
    assert load_policy(tmp_path / "sft").config.backbone == "tiny-llava"
    run(["train", *RGB, "--env.max_episode_steps", "8", "--policy.path", str(tmp_path / "sft"),
         "--algo.type", "filtered_bc", "--algo.decisions_per_iter", "16", "--algo.steps_per_iter", "2",
         "--algo.batch_size", "4",
         "--algo.min_buffer", "1", "--algo.success_return", "0.000001", "--reward.terms", "{env: -1.0}",
         "--iterations", "2", "--eval.episodes", "2", "--eval.every", "0", "--eval.video", "false",
         "--logging.wandb", "false", "--logging.tensorboard", "false", "--run_dir", str(tmp_path / "run")])
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "update/buffer_decisions" in r]
    assert len(trained) == 2 and trained[-1]["update/buffer_decisions"] > 0, rows
    assert trained[-1]["update/steps"] == 2 and math.isfinite(trained[-1]["update/loss"]), trained[-1]
    from vla_rl.checkpoint import latest_checkpoint

    assert type(load_policy(latest_checkpoint(tmp_path / "run" / "checkpoints") / "policy")).__name__ == \
        type(load_policy(tmp_path / "sft")).__name__
