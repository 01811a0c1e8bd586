"""RaC intervention data: labels through datasets, teleop sessions, the simulated operator, ingestion, the learner."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import mujoco
import numpy as np
import pytest
import torch

from sim import OBS_ENV_STATE, OBS_STATE, make_env
from sim.dataset import EpisodeRecorder, load_dataset
from sim.mujoco_tasks.env import TabletopEnv
from vla_core.labels import Label, label_features
from vla_core.manifest import IntegrityError
from vla_rl.data import DatasetError, PolicyInputs, load_chunks
from vla_rl.intervention.labels import labels_from_flags
from vla_rl.intervention.operator import OperatorConfig
from vla_rl.intervention.session import (PassiveController, TeleopController, make_operators, run_session,
                                         tabletop_progress)
from vla_rl.intervention.teleop import LeRobotEETeleop, ScriptedKeys, SessionKeys

P, R, C = int(Label.POLICY), int(Label.RECOVERY), int(Label.CORRECTION)
STATE_ONLY = PolicyInputs(cameras=(), image_size=None, state_dim=11, action_dim=4)


class FakeEETeleop:
    """Stands in for LeRobot's ``keyboard_ee`` teleoperator: its action dict, with the gripper closed on step 3."""

    def __init__(self) -> None:
        self.calls = 0

    def get_action(self) -> dict[str, float]:
        self.calls += 1
        return {"delta_x": 0.0, "delta_y": 0.0, "delta_z": 1.0, "gripper": 0.0 if self.calls == 3 else 1.0}


def still_policy(obs: dict) -> torch.Tensor:
    return torch.zeros(len(obs["task"]), 2, 4)


def test_a_scripted_teleop_session_labels_segments_and_the_labels_round_trip(tmp_path):
    env = make_env("mujoco/pick-red", num_envs=1, seed=0, obs_mode="state", max_episode_steps=14)
    keys = SessionKeys()
    teleop = FakeEETeleop()
    # take over at step 3, mark correction at 6, hand back at 9; the second episode gets one takeover at 2
    script = ScriptedKeys({3: "t", 6: "m", 9: "h", 16: "t", 18: "h"})
    ctrl = TeleopController(keys, LeRobotEETeleop(teleop), 4, script)
    rec = EpisodeRecorder(tmp_path / "ds", "local/t", env.spec, fps=10, extra_features=label_features())
    stats = run_session(env, still_policy, [ctrl], episodes=2, seed=0, recorder=rec, progress=False)
    rec.finalize()
    env.close()
    want_ep0 = [P] * 3 + [R] * 3 + [C] * 3 + [P] * 5
    want_ep1 = [P] * 2 + [R] * 2 + [P] * 10
    assert stats.steps == {"policy": 20, "recovery": 5, "correction": 3}
    data = load_chunks(tmp_path / "ds", STATE_ONLY, horizon=2)
    assert data.label.tolist() == want_ep0 + want_ep1
    assert data.intervention.tolist() == [x != P for x in want_ep0 + want_ep1]
    # the operator's commands were recorded: z up, gripper closed from its third read on (latched)
    acts = data.actions[:, 0]
    taken = data.label != P
    assert torch.all(acts[taken, 2] == 1.0) and torch.all(acts[~taken, :3] == 0.0)
    assert acts[taken, 3].tolist()[:2] == [-1.0, -1.0] and acts[taken, 3].tolist()[2] == 1.0
    # LeRobot opens the dataset unchanged and sees its own field
    ds = load_dataset(tmp_path / "ds")
    assert "intervention" in ds.features and bool(ds[3]["intervention"]) and not bool(ds[0]["intervention"])


def test_session_keys_map():
    keys = SessionKeys()
    assert keys.label() == Label.POLICY
    keys.handle_key("m")  # marking correction while not in control does nothing
    assert keys.label() == Label.POLICY
    keys.handle_key("t")
    assert keys.label() == Label.RECOVERY
    keys.handle_key("m")
    assert keys.label() == Label.CORRECTION
    keys.handle_key("s")
    assert keys.take_episode_end() == (True, True) and keys.label() == Label.POLICY


def wrong_cube_policy(obs: dict) -> torch.Tensor:
    """Goes for the green cube and closes on it: wrong for every pick-place-stack episode."""
    st, es = obs[OBS_STATE], obs[OBS_ENV_STATE]
    goal = es[:, 3:6].clone()
    d = ((goal - st[:, :3]) / 0.04).clamp(-1, 1)
    grip = torch.where((goal - st[:, :3]).norm(dim=1, keepdim=True) < 0.02, 1.0, -1.0)
    return torch.cat([d, grip], 1)[:, None].repeat(1, 4, 1)


def test_simulated_operator_recovers_without_resetting_the_simulator(monkeypatch):
    resets, episode_starts = [], []
    real_reset, real_env_reset = mujoco.mj_resetData, TabletopEnv.reset
    monkeypatch.setattr(mujoco, "mj_resetData", lambda m, d: (resets.append(1), real_reset(m, d))[1])
    monkeypatch.setattr(TabletopEnv, "reset", lambda self, seed: (episode_starts.append(1), real_env_reset(self, seed))[1])
    env = make_env("mujoco/pick-place-stack", num_envs=2, seed=0, obs_mode="state")
    cubes: list[np.ndarray] = []
    labels: list[int] = []
    ops = make_operators(OperatorConfig(reaction_delay=1, action_noise=0.05), 2, 0.04, seed=0)

    class Spy:  # records what the operator saw and did for env 0
        def __init__(self, inner):
            self.inner = inner

        def reset(self):
            self.inner.reset()

        def act(self, obs, i, step):
            action, label = self.inner.act(obs, i, step)
            cubes.append(obs[OBS_ENV_STATE][0, :9].numpy().copy())
            labels.append(int(label))
            return action, label

    stats = run_session(env, wrong_cube_policy, [Spy(ops[0]), ops[1]], episodes=4, seed=3, progress=False)
    env.close()
    assert stats.steps["recovery"] > 0 and stats.steps["correction"] > 0 and stats.takeovers >= 3
    # resets happen only when episodes start: one per env at the start plus one per finished episode
    assert len(resets) == len(episode_starts) <= 2 + stats.episodes + 1
    # no teleport: during recovery and correction no cube jumps more than a few cm between steps
    for t in range(1, len(labels)):
        if labels[t] != P and labels[t - 1] != P:
            assert np.abs(cubes[t] - cubes[t - 1]).max() < 0.05
    # recovery comes before correction within each takeover, and the operator finished some episodes
    for t in range(1, len(labels)):
        assert not (labels[t - 1] == C and labels[t] == R)
    assert stats.successes >= 1


def test_corrections_from_here_push_on_where_the_approach_backs_off():
    """``correct_from="approach"`` starts the expert over (hover 7 cm above the cube first, gripper open);
    ``"here"`` pushes on from the state as it is: straight at the cube, or, holding it, on with the lift."""
    import dataclasses

    from sim.mujoco_tasks.privileged import observed_state
    from sim.mujoco_tasks.tasks import subtask
    from vla_rl.intervention.operator import SimulatedOperator

    env = make_env("mujoco/pick-place-stack", num_envs=1, seed=0, obs_mode="state")
    obs = env.reset(seed=1)
    env.close()
    task, s, _ = observed_state(obs[OBS_STATE][0].numpy(), obs[OBS_ENV_STATE][0].numpy())
    cube = s.cubes[subtask(task, s)[0].cube]
    near = dataclasses.replace(s, pinch=cube + np.array([0.01, 0.0, 0.03]))  # low beside the cube, open
    held = dataclasses.replace(s, pinch=cube + np.array([0.0, 0.0, 0.005]), grasped=s.grasped.copy())
    held.grasped[subtask(task, s)[0].cube] = True

    def first_correction(where: str, state, closure: float) -> np.ndarray:
        op = SimulatedOperator(OperatorConfig(recover=False, action_noise=0.0, correct_from=where), 0.04)
        op._take_over(task, state, closure)
        return op._correct(task, state, closure)

    assert first_correction("approach", near, 0.0)[2] > 0 > first_correction("here", near, 0.0)[2]  # up vs down
    assert first_correction("approach", held, 1.0)[3] < 0 < first_correction("here", held, 1.0)[3]  # opens vs holds
    assert first_correction("here", held, 1.0)[2] > 0  # and lifts
    with pytest.raises(ValueError, match="correct_from"):
        OperatorConfig(correct_from="there")


def test_a_session_records_how_far_each_episode_got():
    """``furthest``: the most leading stages held at once per episode, what the RaC benchmark reads to say where a
    policy's failures stop. The operator finishes what the wrong-cube policy cannot: an episode it saves placed red
    on the pad (4 stages) before it stacked blue."""
    env = make_env("mujoco/pick-place-stack", num_envs=2, seed=0, obs_mode="state")
    ops = make_operators(OperatorConfig(reaction_delay=1, action_noise=0.0), 2, 0.04, seed=0)
    stats = run_session(env, wrong_cube_policy, ops, episodes=2, seed=3, progress_of=tabletop_progress,
                        progress=False)
    env.close()
    assert len(stats.furthest) == stats.episodes == 2 and stats.successes >= 1
    for furthest, ok in zip(stats.furthest, stats.outcomes):
        assert 0 <= furthest <= 8 and (furthest >= 4 or not ok)
    unwatched = make_env("mujoco/pick-red", num_envs=1, seed=0, obs_mode="state", max_episode_steps=5)
    assert run_session(unwatched, still_policy, [ops[0]], episodes=1, seed=0, progress=False).furthest == [-1]
    unwatched.close()


class RaceEnv:
    """Two envs: env 0's episodes succeed after 2 steps, env 1's fail at a 10-step time limit."""

    num_envs = 2

    class spec:  # noqa: N801 - what run_session reads of an EnvSpec
        env_id, action_dim, image_keys = "race", 4, ()

    def __init__(self) -> None:
        self.t = np.zeros(2, dtype=int)

    def _obs(self) -> dict:
        return {"task": ["race", "race"]}

    def reset(self, seed=None, env_ids=None):
        self.t[:] = 0
        return self._obs()

    def step(self, actions):
        self.t += 1
        win = np.array([self.t[0] >= 2, False])
        end = np.array([self.t[0] >= 2, self.t[1] >= 10])
        self.t[end] = 0
        info = {"success": win, "episode": {"success": win}}
        return self._obs(), np.zeros(2), win, end & ~win, info


def test_a_session_counts_each_env_s_share_so_short_episodes_are_not_favoured():
    """Counting whichever episodes end first would take 9 of env 0's 2-step successes for every failure of env 1
    (a success rate of 0.9 where the envs' episodes succeed half the time); each env counts its share instead."""
    stats = run_session(RaceEnv(), still_policy, [PassiveController(), PassiveController()], episodes=10, seed=0,
                        progress=False)
    assert stats.episodes == 10 and stats.successes == 5 and stats.steps["policy"] == 5 * 2 + 5 * 10


def test_a_budget_cut_session_counts_the_takeovers_of_the_episodes_it_cuts(tmp_path):
    """RaC rounds stop at an operator budget with episodes under way in every env: those are recorded, and their
    takeovers count (counting only the finished episodes once reported 1 takeover against 25 recorded)."""
    env = make_env("mujoco/pick-place-stack", num_envs=2, seed=0, obs_mode="state")
    rec = EpisodeRecorder(tmp_path / "cut", "local/cut", env.spec, fps=10, extra_features=label_features())
    ops = make_operators(OperatorConfig(reaction_delay=1, action_noise=0.0), 2, 0.04, seed=0)
    stats = run_session(env, wrong_cube_policy, ops, episodes=100, seed=3, recorder=rec, progress=False,
                        operator_budget=15)
    env.close()
    rec.finalize()
    assert stats.operator_steps >= 15 and stats.episodes == 0 and stats.cut == 2
    data = load_chunks(tmp_path / "cut", STATE_ONLY, horizon=1)
    taken = {int(e) for e, lab in zip(data.episode_index.tolist(), data.label.tolist()) if lab != P}
    assert stats.takeovers == len(taken) == 2


def test_unlabelled_intervention_flags_split_rules():
    flags = torch.tensor([0, 1, 1, 1, 0, 1, 1, 0, 1], dtype=torch.bool)
    eps = torch.tensor([0, 0, 0, 0, 0, 0, 1, 1, 1])
    assert labels_from_flags(flags, eps).tolist() == [P, C, C, C, P, C, C, P, C]
    assert labels_from_flags(flags, eps, "first-k", 2).tolist() == [P, R, R, C, P, R, R, P, R]
    z = torch.tensor([0.0, 0.1, 0.2, 0.1, 0.0, 0.1, 0.2, 0.3, 0.0])
    assert labels_from_flags(flags, eps, "retreat", pinch_z=z).tolist() == [P, R, C, C, P, C, C, P, C]
    with pytest.raises(ValueError, match="split rule"):
        labels_from_flags(flags, eps, "halves")


def write_dagger_dataset(root: Path, field: str = "intervention") -> Path:
    """A dataset written with LeRobot's API the way ``lerobot-rollout --strategy.type dagger`` records:
    ``intervention`` bool [1], no labels."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    features = {
        "observation.state": {"dtype": "float32", "shape": (11,), "names": None},
        "action": {"dtype": "float32", "shape": (4,), "names": None},
        field: {"dtype": "bool", "shape": (1,), "names": None},
    }
    ds = LeRobotDataset.create(repo_id="local/rollout_dagger", fps=10, features=features, root=root, use_videos=False)
    for ep in range(2):
        for t in range(8):
            ds.add_frame({"observation.state": np.full(11, t, np.float32), "action": np.full(4, 0.1 * t, np.float32),
                          field: np.array([3 <= t < 7]), "task": "stack"})
        ds.save_episode()
    ds.finalize()
    return root


def test_a_dataset_written_by_lerobot_with_its_intervention_field_ingests(tmp_path):
    root = write_dagger_dataset(tmp_path / "dagger")
    data = load_chunks(root, STATE_ONLY, horizon=3)
    one = [P] * 3 + [C] * 4 + [P]
    assert data.label.tolist() == one + one and data.intervention.sum() == 8
    split = load_chunks(root, STATE_ONLY, horizon=3, split_rule="first-k", recovery_steps=1)
    assert split.label.tolist()[:8] == [P, P, P, R, C, C, C, P]
    legacy = load_chunks(write_dagger_dataset(tmp_path / "old", "is_intervention"), STATE_ONLY, horizon=3)
    assert legacy.label.tolist() == data.label.tolist()
    plain = load_chunks(_plain(tmp_path / "plain"), STATE_ONLY, horizon=3)
    assert plain.label is None and plain.intervention is None  # no field: trains as demos


def _plain(root: Path) -> Path:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    feats = {"observation.state": {"dtype": "float32", "shape": (11,), "names": None},
             "action": {"dtype": "float32", "shape": (4,), "names": None}}
    ds = LeRobotDataset.create(repo_id="local/plain", fps=10, features=feats, root=root, use_videos=False)
    for t in range(5):
        ds.add_frame({"observation.state": np.zeros(11, np.float32), "action": np.zeros(4, np.float32), "task": "x"})
    ds.save_episode()
    ds.finalize()
    return root


def _digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_bad_datasets_get_clear_errors_and_are_left_untouched(tmp_path):
    root = write_dagger_dataset(tmp_path / "dagger")
    before = _digest(root)
    with pytest.raises(DatasetError, match=r"'observation.state' has shape \(11,\) in the dataset but the policy "
                                           r"expects \(9,\)"):
        load_chunks(root, PolicyInputs((), None, 9, 4), 2)
    with pytest.raises(DatasetError, match=r"'action' has shape \(4,\) in the dataset but the policy expects \(7,\)"):
        load_chunks(root, PolicyInputs((), None, 11, 7), 2)
    with pytest.raises(DatasetError, match=r"no feature 'observation.images.front'"):
        load_chunks(root, PolicyInputs(("front",), (64, 64), 11, 4), 2)
    assert _digest(root) == before
    parquet = next((root / "data").rglob("*.parquet"))
    parquet.write_bytes(parquet.read_bytes()[: parquet.stat().st_size // 2])
    damaged = _digest(root)
    with pytest.raises((DatasetError, IntegrityError), match=str(root)):  # the truncated file is named
        load_chunks(root, STATE_ONLY, 2)
    assert _digest(root) == damaged  # reading never rewrites a file


def test_rac_sampling_weights_and_policy_masking():
    from vla_rl.algorithms.rac import RaCLearnerConfig, intervention_source, step_labels
    from vla_rl.data import make_chunks

    labels = torch.tensor([P, P, R, C, C, P, R, C])
    eps = torch.tensor([0, 0, 0, 0, 0, 1, 1, 1])
    data = make_chunks({OBS_STATE: torch.zeros(8, 11), "task": ["x"] * 8}, torch.arange(8.0)[:, None].repeat(1, 4),
                       eps, horizon=3, label=labels)
    assert step_labels(data)[0].tolist() == [P, P, R] and step_labels(data)[4].tolist() == [C, C, C]
    src = intervention_source(data, RaCLearnerConfig(recovery_weight=3.0, correction_weight=1.0))
    batch = src.sample(4000, torch.Generator().manual_seed(0))
    assert not (batch.label == P).any()  # policy rows masked
    frac_r = float((batch.label == R).float().mean())
    assert abs(frac_r - 6 / 9) < 0.03, frac_r  # 2 recovery rows x 3 vs 3 correction rows x 1
    row1 = batch.actions[:, 0, 0] == 1.0  # row 1 is policy: never drawn; row 2's chunk has policy step? no
    assert not row1.any()
    # a recovery row whose chunk runs into policy steps would mask them: row 6 (R) -> [6, 7, 7] all kept
    keep_rows = batch.mask[batch.actions[:, 0, 0] == 6.0]
    assert keep_rows.all()
    unmasked = intervention_source(data, RaCLearnerConfig(mask_policy=False, policy_weight=1.0))
    assert (unmasked.sample(500, torch.Generator().manual_seed(1)).label == P).any()
    with pytest.raises(ValueError, match="rounds_dir"):
        RaCLearnerConfig(episodes_per_round=4)


@pytest.mark.slow
def test_rac_learner_trains_in_rounds_and_resumes(tmp_path):
    """``--algo.type rac`` with rounds: collect with the simulated operator -> fine-tune -> collect; a resumed run
    reloads the finished rounds and collects only the missing ones."""
    from tests.vla_rl.test_sft import TINY
    from vla_rl.cli import run

    demos, rounds, run_dir = tmp_path / "demos", tmp_path / "rounds", tmp_path / "run"
    run(["collect", "--env.id", "mujoco/pick-place-stack", "--env.num_envs", "2", "--env.obs_mode", "state",
         "--episodes", "2", "--output", str(demos)])
    args = ["train", "--algo.type", "rac", "--data.path", str(demos), "--algo.steps_per_iter", "10",
            "--algo.batch_size", "16", "--algo.steps", "50", "--algo.episodes_per_round", "2",
            "--algo.iters_per_round", "2", "--algo.operator.patience", "6", "--algo.rounds_dir", str(rounds), *TINY,
            "--env.id", "mujoco/pick-place-stack", "--env.obs_mode", "state", "--env.num_envs", "2",
            "--env.num_workers", "0", "--env.max_episode_steps", "30", "--eval.episodes", "2", "--eval.every", "0",
            "--eval.video", "false", "--logging.wandb", "false", "--logging.tensorboard", "false",
            "--run_dir", str(run_dir), "--checkpoint_every", "1"]
    run([*args, "--iterations", "3"])
    assert sorted(p.name for p in rounds.iterdir()) == ["round_000", "round_001"]
    stamp = (rounds / "round_000" / "meta" / "info.json").stat().st_mtime_ns
    run([*args, "--iterations", "5", "--resume", "true"])
    assert sorted(p.name for p in rounds.iterdir()) == ["round_000", "round_001", "round_002"]
    assert (rounds / "round_000" / "meta" / "info.json").stat().st_mtime_ns == stamp  # reloaded, not recollected
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    collected = [r for r in rows if "rac/round_operator_steps" in r]
    assert len(collected) == 3 and all(r["rac/round_operator_steps"] > 0 for r in collected)
    trained = [r for r in rows if "update/rows_policy" in r]
    assert len(trained) == 5 and all(r["update/rows_policy"] == 0.0 for r in trained)  # policy steps masked
    assert trained[-1]["update/rows_correction"] > 0
