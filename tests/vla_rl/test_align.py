"""``vla-rl align`` at toy size: rounds write their data, train TPO, report; resume after a kill between rounds;
bad input gets one clear line."""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from vla_rl.cli import run
from vla_rl.config import ConfigError
from vla_rl.grape.tpo import TPOConfig
from vla_rl.grape.trajectory import load_trajectories

torch.set_num_threads(1)
TOY = ["--smoke", "true", "--env.num_envs", "4", "--env.image_size", "32", "--env.max_episode_steps", "12", "--rounds", "2", "--states_per_round", "2",
       "--grape.min_samples", "2", "--grape.max_samples", "3", "--grape.require_both_outcomes", "false",
       "--eval_episodes", "4", "--round_eval_episodes", "4", "--tpo.lr", "1e-3", "--tpo.epochs", "1",
       "--logging.wandb", "false", "--logging.tensorboard", "false"]


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    return load_file(run_dir / "checkpoints" / latest / "policy" / "model.safetensors")


def test_align_toy_run_on_mujoco_writes_rounds_trains_and_reports(tmp_path: Path):
    out = tmp_path / "run"
    summary = run(["align", "--preset", "align_efficiency", *TOY, "--rounds", "1", "--run_dir", str(out)])
    assert summary["objective"] == "efficiency" and [r["round"] for r in summary["per_round"]] == [0, 1]
    for k, row in enumerate(summary["per_round"][1:]):
        rd = out / "rounds" / f"round_{k:03d}"
        assert row["trajectories"] == 4 and row["pairs"] == 2  # 2 states x 2 samples, one pair each
        assert row["update"]["pairs"] == 2.0 and "tpo_loss" in row["update"]
        trajs = load_trajectories(rd / "trajectories.pt")  # the sampled episodes the row counts
        assert row["successes"] == sum(t.success for t in trajs)
        assert row["colliding"] == sum(t.costs["collision"] > 0 for t in trajs)
        pairs = pd.read_parquet(rd / "pairs.parquet")
        assert len(pairs) == 2 and (pairs.chosen_score > pairs.rejected_score).all()
        assert {"chosen_cost_episode_steps", "rejected_cost_path_length"} <= set(pairs.columns)
        from sim.dataset import load_dataset

        ds = load_dataset(rd / "trajectories")
        assert ds.meta.total_episodes == 4 and "observation.images.front" in ds.meta.features
        assert ds.meta.total_frames == sum(1 for _ in range(len(ds)))
    report = json.loads((out / "report.json").read_text())
    assert report["after"]["episodes"] == 4 and "path_length" in report["before"]["costs"]
    md = (out / "report.md").read_text()
    assert "collision rate" in md and "mean steps of successes" in md and "chosen.mp4" in md
    assert (out / "videos" / "chosen.mp4").stat().st_size > 0 and (out / "videos" / "rejected.mp4").exists()
    assert (out / "plots" / "success.png").exists() and (out / "plots" / "costs.png").exists()


def test_align_reports_where_each_rounds_time_goes(tmp_path: Path):
    out = tmp_path / "run"
    summary = run(["align", *TOY, "--env.obs_mode", "state", "--env.wrist_camera", "false", "--save_dataset", "false",
                   "--run_dir", str(out)])
    for row in summary["per_round"][1:]:
        t = row["time"]
        # every stage was timed, and the parts never exceed the round's sampling seconds they split
        assert {"time/sample_env_s", "time/sample_act_s", "time/sample_other_s", "time/write_s", "time/update_s",
                "time/eval_s", "time/checkpoint_s"} <= set(t)
        assert t["time/sample_env_s"] > 0 and t["time/sample_act_s"] > 0 and t["time/update_s"] > 0
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rounds = [r for r in logged if "time/update_s" in r]
    assert len(rounds) == 2 and "time/checkpoint_s" in rounds[1]  # the round before's checkpoint, carried
    for row, logged_row in zip(summary["per_round"][1:], rounds):  # the sampled episodes' rates, as they come
        assert logged_row["sample/success"] == row["successes"] / row["trajectories"]
        assert logged_row["sample/collision_rate"] == row["colliding"] / row["trajectories"]
    assert (out / "plots" / "time.png").stat().st_size > 0
    assert "Where the time went over 2 rounds" in (out / "report.md").read_text()


def test_resume_after_a_kill_between_rounds_matches_an_uninterrupted_run(tmp_path: Path, monkeypatch):
    import vla_rl.grape.rounds as align

    args = [*TOY, "--env.obs_mode", "state", "--env.wrist_camera", "false", "--save_dataset", "false"]
    full = tmp_path / "full"
    run(["align", *args, "--run_dir", str(full)])

    real = align.GrapeRounds.before_iteration

    def killed(self, k):
        if k == 1:
            raise KeyboardInterrupt  # the process dies after round 1's checkpoint
        return real(self, k)

    cut = tmp_path / "cut"
    monkeypatch.setattr(align.GrapeRounds, "before_iteration", killed)
    with pytest.raises(SystemExit):
        run(["align", *args, "--run_dir", str(cut)])
    assert (cut / "checkpoints" / "iter_000001").exists() and not (cut / "checkpoints" / "iter_000002").exists()
    monkeypatch.setattr(align.GrapeRounds, "before_iteration", real)
    with pytest.raises(SystemExit):  # the folder holds a run: resuming must be asked for
        run(["align", *args, "--run_dir", str(cut)])
    resumed = run(["align", *args, "--run_dir", str(cut), "--resume", "true"])
    assert [r["round"] for r in resumed["per_round"]] == [0, 1, 2]
    a, b = _weights(full), _weights(cut)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((full / "report.json").read_text())["after"] == resumed["after"]


def test_a_checkpoint_aligns_with_the_sampler_given_on_the_command_line(tmp_path: Path):
    """``--policy.path`` with ``--policy.sampler.noise_level``: the rounds sample with that noise, not the saved one."""
    args = [*TOY, "--rounds", "1", "--env.obs_mode", "state", "--env.wrist_camera", "false", "--save_dataset", "false"]
    first = tmp_path / "first"
    run(["align", *args, "--run_dir", str(first)])
    saved = first / "checkpoints" / (first / "checkpoints" / "latest").read_text().strip() / "policy"
    assert json.loads((saved / "config.json").read_text())["sampler"]["noise_level"] == 0.5
    second = tmp_path / "second"
    run(["align", *args, "--policy.path", str(saved), "--policy.sampler.noise_level", "0.125", "--run_dir", str(second)])
    latest = second / "checkpoints" / (second / "checkpoints" / "latest").read_text().strip() / "policy"
    assert json.loads((latest / "config.json").read_text())["sampler"]["noise_level"] == 0.125


def test_a_round_without_pairs_is_reported_and_skipped(tmp_path: Path, capsys):
    i = TOY.index("--grape.require_both_outcomes")
    args = TOY[:i] + TOY[i + 2 :]  # GRAPE's default: pair only states with successes and failures
    summary = run(["align", *args, "--rounds", "1", "--env.obs_mode", "state", "--env.wrist_camera", "false",
                   "--save_dataset", "false", "--run_dir", str(tmp_path / "r")])
    row = summary["per_round"][1]
    assert row["skipped"] and row["pairs"] == 0 and row["trajectories"] == 6  # the smoke policy never succeeds
    assert "round 1: no pair" in capsys.readouterr().out


def test_unknown_cost_term_lists_the_valid_ones(capsys):
    with pytest.raises(SystemExit) as exc:
        run(["align", "--grape.score.costs", "{colision: 1.0}"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "unknown cost term(s) 'colision'" in err and "valid cost terms: collision, table_force" in err


def test_stage_wise_scoring_on_a_task_without_stages_names_the_task():
    from sim.vector import SerialVecEnv
    from tests.sim.toy_env import CounterEnv
    from vla_rl.grape.scoring import ScoreConfig, check_scoring

    with SerialVecEnv([functools.partial(CounterEnv, signals=True)] * 2, "toy/counter") as env:
        assert check_scoring(env, ScoreConfig(costs={"episode_steps": 0.1}, stagewise=False), 0) == [
            "episode_steps", "action_jerk"]
        with pytest.raises(ValueError, match="task toy/counter declares no stage predicates"):
            check_scoring(env, ScoreConfig(costs={"episode_steps": 0.1}), 0)
        with pytest.raises(ValueError, match=r"toy/counter does not report the signals of \['collision'\]"):
            check_scoring(env, ScoreConfig(costs={"collision": 0.1}, stagewise=False), 0)


def test_instruction_pairs_on_a_single_task_env_name_the_env(tmp_path: Path, capsys):
    with pytest.raises(SystemExit) as exc:
        run(["align", *TOY, "--env.id", "mujoco/pick-red", "--env.obs_mode", "state", "--env.wrist_camera", "false",
             "--grape.instruction_pairs", "1", "--run_dir", str(tmp_path / "r")])
    assert exc.value.code == 2
    assert "grape.instruction_pairs: mujoco/pick-red declares 0 task instruction(s)" in capsys.readouterr().err


def _backend_toy(tmp_path: Path, name: str, *args: str) -> dict:
    """One toy round whose two trajectories of one state are paired by score (no success needed)."""
    base = ["--smoke", "true", "--env.num_envs", "2", "--rounds", "1", "--states_per_round", "1",
            "--grape.min_samples", "2", "--grape.max_samples", "2", "--grape.require_both_outcomes", "false",
            "--eval_episodes", "2", "--run_dir", str(tmp_path / name), "--logging.wandb", "false",
            "--logging.tensorboard", "false"]
    summary = run(["align", *base, *args])
    row = summary["per_round"][1]
    assert row["trajectories"] == 2 and row["pairs"] == 1 and row["update"]["pairs"] == 1.0
    assert (tmp_path / name / "rounds" / "round_000" / "pairs.parquet").exists()
    return summary


@pytest.mark.slow
def test_align_toy_run_on_maniskill_pickcube(tmp_path: Path):
    pytest.importorskip("mani_skill")
    s = _backend_toy(tmp_path, "maniskill", "--env.id", "maniskill/PickCube-v1", "--env.obs_mode", "state",
                     "--env.max_episode_steps", "10", "--env.num_workers", "0", "--save_dataset", "false",
                     "--grape.score.stagewise", "false",  # ManiSkill's tasks report no stage predicates (docs/sim.md)
                     "--grape.score.costs", "{episode_steps: 0.01, joint_limit: 0.01, action_jerk: 0.001}")
    assert set(s["after"]["costs"]) == {"episode_steps", "joint_limit", "action_jerk"}


@pytest.mark.slow
def test_align_toy_run_on_libero_with_tiny_pi0(tmp_path: Path):
    pytest.importorskip("libero")
    pytest.importorskip("lerobot.policies.pi0")
    _backend_toy(tmp_path, "libero", "--policy.type", "pi0", "--env.id", "libero/libero_object/0",
                 "--env.max_episode_steps", "8", "--grape.score.stagewise", "false",
                 "--grape.score.costs", "{episode_steps: 0.01, action_jerk: 0.001}")
    from sim.dataset import load_dataset

    assert load_dataset(tmp_path / "libero" / "rounds" / "round_000" / "trajectories").meta.total_episodes == 2


@pytest.mark.slow
def test_align_toy_run_with_the_autoregressive_policy(tmp_path: Path):
    # the preset's imitation of the chosen successes runs on the token policy's cross-entropy; a fresh policy has
    # no pre-training demos to mix in
    _backend_toy(tmp_path, "ar", "--preset", "align_task", "--policy.type", "openvla-style", "--env.image_size", "32",
                 "--env.max_episode_steps", "8", "--save_dataset", "false", "--tpo.demo_bc", "0")


def test_a_checkpoint_evaluated_alone_reproduces_the_runs_evaluation_episode_by_episode(tmp_path: Path):
    """``evaluate_policy_folder`` (what ``benchmarks/grape.py`` evaluates other policies on a run's episodes with)
    plays the run's held-out episodes again."""
    from vla_rl.cli import parse_config
    from vla_rl.grape.rounds import AlignConfig, evaluate_policy_folder

    out = tmp_path / "align-task"  # where benchmarks/grape.py keeps a seed's task run
    run(["align", "--preset", "align_efficiency", *TOY, "--rounds", "1", "--run_dir", str(out)])
    report = json.loads((out / "report.json").read_text())
    last = out / "checkpoints" / (out / "checkpoints" / "latest").read_text().strip()
    cfg = parse_config(AlignConfig, ["--config_path", str(last / "config.json"), "--policy.path", str(last / "policy")])
    again = evaluate_policy_folder(cfg)
    assert again["per_episode"] == report["after"]["per_episode"] and again["success"] == report["after"]["success"]
    assert len(again["per_episode"]["seed"]) == 4 == len(set(again["per_episode"]["seed"]))


@pytest.mark.parametrize("objective", ["task", "safety", "efficiency"])
def test_align_presets_parse_with_their_measured_settings(objective: str):
    """Each ``align_<objective>`` preset sets its objective and its rounds (10; 15 for efficiency); the
    task and safety presets imitate the chosen successes and the pre-training demos at filtered_bc's rate; the
    efficiency preset leaves both out (they slow its successes)."""
    from vla_rl.cli import parse_config
    from vla_rl.grape.rounds import AlignConfig

    cfg = parse_config(AlignConfig, ["--preset", f"align_{objective}"])
    rounds = 15 if objective == "efficiency" else 10
    assert (cfg.objective, cfg.rounds, cfg.tpo.beta, cfg.tpo.chosen_nll) == (objective, rounds, 1.0, 1.0)
    imitates = objective != "efficiency"
    assert (cfg.tpo.chosen_bc, cfg.tpo.demo_bc, cfg.tpo.bc_lr) == ((10.0, 10.0, 1e-3) if imitates else (0.0, 0.0, 0.0))
    assert cfg.grape.pair_within_outcome == (objective == "safety")


def test_demo_bc_defaults_to_the_demos_the_policy_was_pretrained_on(tmp_path: Path, capsys):
    """``--tpo.demo_bc`` without ``--tpo.demos`` reads the ``dataset`` of the policy folder's ``sft.json`` (the
    quickstart and ``vla-rl sft`` write it); a policy that records none is refused with the field to set, except in
    a smoke run, which leaves the demo mix out and says so."""
    from vla_rl.grape.rounds import AlignConfig, _with_pretraining_demos
    from vla_rl.train_config import POLICY_CHOICES

    policy = tmp_path / "sft_policy"
    policy.mkdir()
    (policy / "sft.json").write_text(json.dumps({"sft/steps": 700, "dataset": "/data/demos-s1"}))
    path = dataclasses.replace(POLICY_CHOICES["compact-flow"](), path=str(policy))
    cfg = _with_pretraining_demos(AlignConfig(policy=path, tpo=TPOConfig(demo_bc=10.0)))
    assert cfg.tpo.demos == "/data/demos-s1" and cfg.tpo.demo_bc == 10.0
    named = AlignConfig(policy=path, tpo=TPOConfig(demo_bc=10.0, demos="/mine"))
    assert _with_pretraining_demos(named).tpo.demos == "/mine"
    (policy / "sft.json").write_text(json.dumps({"sft/steps": 700}))
    with pytest.raises(ConfigError, match=f"name their LeRobotDataset with --tpo.demos, or leave the demo mix out "
                                          f"with --tpo.demo_bc 0 \\({policy}/sft.json names no"):
        _with_pretraining_demos(AlignConfig(policy=path, tpo=TPOConfig(demo_bc=10.0)))
    with pytest.raises(SystemExit) as exc:
        run(["align", "--tpo.demo_bc", "10", "--run_dir", str(tmp_path / "r")])
    assert exc.value.code == 2 and "a fresh policy has no pre-training data" in capsys.readouterr().err
    smoke = _with_pretraining_demos(AlignConfig(tpo=TPOConfig(demo_bc=10.0, bc_lr=1e-3), smoke=True))
    assert (smoke.tpo.demo_bc, smoke.tpo.bc_lr) == (0.0, 0.0)  # a smoke run leaves the mix (and its rate) out
    assert "smoke: the demo mix tpo.demo_bc 10 is left out" in capsys.readouterr().out


def test_the_readme_smoke_command_runs_as_written_without_the_demo_mix(tmp_path: Path, capsys):
    """``vla-rl align --preset align_task --smoke true --rounds 1`` (README.md, "Using the stack") on a fresh clone:
    the preset mixes in the demos its policy was pre-trained on (``tpo.demo_bc``), which a fresh policy does not
    have; the smoke run leaves the mix out, says so, and runs its round with the preset's other terms."""
    out = tmp_path / "run"
    summary = run(["align", "--preset", "align_task", "--smoke", "true", "--rounds", "1", "--run_dir", str(out)])
    assert ("smoke: the demo mix tpo.demo_bc 10 is left out (a fresh policy has no pre-training data)"
            in capsys.readouterr().out)
    assert [r["round"] for r in summary["per_round"]] == [0, 1] and summary["per_round"][1]["update"]["pairs"] > 0
    saved = json.loads((out / "checkpoints" / "iter_000001" / "config.json").read_text())
    assert (saved["tpo"]["demo_bc"], saved["tpo"]["chosen_bc"], saved["tpo"]["bc_lr"]) == (0.0, 10.0, 1e-3)


def _stub_trajectory(tid: int, success: bool) -> "Trajectory":
    from vla_rl.grape.trajectory import Trajectory

    return Trajectory(id=tid, state=0, seed=tid, obs={"observation.state": torch.zeros(1, 2)},
                      actions=torch.zeros(1, 2, 3), extras={}, logp=torch.zeros(1), success=success, steps=1,
                      costs={}, stage_costs={})


def test_replay_reads_the_successes_of_the_rounds_before_from_their_files(tmp_path: Path):
    """``--tpo.replay_rounds K``: round k's update gets the successes written by rounds k-K .. k-1 (failures and
    older rounds left out; a round without a file skipped), read from ``trajectories.pt`` so that a resumed run
    replays what the uninterrupted one did."""
    from vla_rl.grape.rounds import AlignConfig, GrapeRounds
    from vla_rl.grape.trajectory import save_trajectories

    rounds = {0: [(0, True), (1, False)], 1: [(2, True), (3, True)], 3: [(4, True)]}
    for k, trajs in rounds.items():
        (tmp_path / "rounds" / f"round_{k:03d}").mkdir(parents=True)
        save_trajectories(tmp_path / "rounds" / f"round_{k:03d}" / "trajectories.pt",
                          [_stub_trajectory(i, s) for i, s in trajs])

    def ids(replay_rounds: int, k: int) -> list[int]:
        cfg = AlignConfig(tpo=TPOConfig(chosen_bc=1.0, replay_rounds=replay_rounds))
        return [t.id for t in GrapeRounds(cfg, tmp_path, []).replay(k)]

    assert ids(1, 1) == [0] and ids(2, 2) == [0, 2, 3] and ids(1, 2) == [2, 3]
    assert ids(2, 4) == [4] and ids(1, 0) == [] and ids(0, 3) == []
    run_ = GrapeRounds(AlignConfig(tpo=TPOConfig(chosen_bc=1.0, replay_rounds=2)), tmp_path, [])
    assert len(run_.replay(2)) == 3 and len(run_.replay(4)) == 1 and set(run_._successes) == {3}  # older ones dropped


def test_align_toy_run_with_replay_trains_and_resumes_like_an_uninterrupted_run(tmp_path: Path, monkeypatch):
    """A toy run with ``--tpo.chosen_bc 1 --tpo.replay_rounds 1`` whose first round has successes: round 2's update
    reports the pool it replayed, and a run killed after round 1 and resumed ends with the same weights."""
    import vla_rl.grape.rounds as align
    import vla_rl.grape.tpo as tpo

    args = [*TOY, "--env.obs_mode", "state", "--env.wrist_camera", "false", "--save_dataset", "false",
            "--tpo.chosen_bc", "1", "--tpo.replay_rounds", "1"]
    real_round = tpo.preference_round

    def with_successes(*a, **kw):  # a random toy policy rarely succeeds: mark half its episodes successes
        data = real_round(*a, **kw)
        for t in data.trajectories[::2]:
            t.success = True
        return data

    monkeypatch.setattr(tpo, "preference_round", with_successes)
    full = run(["align", *args, "--run_dir", str(tmp_path / "full")])
    pool = full["per_round"][2]["update"].get("replay_pool")
    written = [t for t in load_trajectories(tmp_path / "full" / "rounds" / "round_000" / "trajectories.pt") if t.success]
    assert pool == len(written) > 0 and "replay_pool" not in full["per_round"][1]["update"]

    real = align.GrapeRounds.before_iteration

    def killed(self, k):
        if k == 1:
            raise KeyboardInterrupt
        return real(self, k)

    monkeypatch.setattr(align.GrapeRounds, "before_iteration", killed)
    with pytest.raises(SystemExit):
        run(["align", *args, "--run_dir", str(tmp_path / "cut")])
    monkeypatch.setattr(align.GrapeRounds, "before_iteration", real)
    run(["align", *args, "--run_dir", str(tmp_path / "cut"), "--resume", "true"])
    a, b = _weights(tmp_path / "full"), _weights(tmp_path / "cut")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_round_line_shows_the_losses_the_update_had(capsys):
    """A preference update prints its TPO loss and accuracy; one with ``--tpo.preference false`` (the ablation) its
    imitation losses only, not a NaN TPO loss; a round without pairs neither."""
    from vla_rl.grape.report import print_round

    base = {"round": 3, "trajectories": 10, "successes": 4, "pairs": 2, "eval": None}
    print_round({**base, "update": {"tpo_loss": 0.5, "accuracy": 0.75, "chosen_bc": 0.25, "pairs": 2.0}})
    print_round({**base, "update": {"chosen_nll": 1.5, "chosen_bc": 0.25, "demo_bc": 0.125, "pairs": 2.0}})
    print_round({**base, "pairs": 0, "update": {"pairs": 0.0}})
    pref, ablation, empty = capsys.readouterr().out.strip().splitlines()
    assert "tpo loss 0.5000, accuracy 0.75, chosen_bc 0.2500" in pref
    assert "tpo loss" not in ablation and "chosen_nll 1.5000, chosen_bc 0.2500, demo_bc 0.1250" in ablation
    assert empty.endswith("(4 successes), 0 pairs;")
