"""vla_rl.data: LeRobotDatasets read by feature name, chunk rows, seeded sampling and mixing of sources."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from vla_rl.config import ConfigError
from vla_rl.data import (
    ChunkDataset,
    DatasetError,
    MixedSource,
    PolicyInputs,
    dataset_spec,
    load_chunks,
    make_chunks,
    policy_inputs,
    split_rows,
)

STATE, ACT = 4, 2


def write_lerobot_dataset(root: Path, episodes: int = 3, length: int = 6, camera: int = 0, seed: int = 0) -> Path:
    """A dataset written with LeRobot's own API (as its recording tools do): state, action, ``is_intervention``,
    ``next.reward``, ``next.success`` (+ one ``front`` camera of ``camera`` px when > 0). The action is a fixed
    function of the state, so a policy can learn it."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    features = {
        "observation.state": {"dtype": "float32", "shape": (STATE,), "names": [f"s{i}" for i in range(STATE)]},
        "action": {"dtype": "float32", "shape": (ACT,), "names": [f"a{i}" for i in range(ACT)]},
        "is_intervention": {"dtype": "bool", "shape": (1,), "names": None},
        "next.reward": {"dtype": "float32", "shape": (1,), "names": None},
        "next.success": {"dtype": "bool", "shape": (1,), "names": None},
    }
    if camera:
        features["observation.images.front"] = {"dtype": "image", "shape": (camera, camera, 3),
                                                "names": ["height", "width", "channels"]}
    ds = LeRobotDataset.create(repo_id="local/lerobot-made", fps=10, features=features, root=root, use_videos=False,
                               video_backend="pyav")
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(ACT, STATE)).astype(np.float32)
    for ep in range(episodes):
        for t in range(length):
            state = rng.normal(size=STATE).astype(np.float32)
            frame = {
                "observation.state": state, "action": np.tanh(w @ state).astype(np.float32),
                "is_intervention": np.array([t % 3 == 1]), "next.reward": np.array([float(t)], dtype=np.float32),
                "next.success": np.array([t == length - 1]), "task": "reach the target",
            }
            if camera:
                frame["observation.images.front"] = rng.integers(0, 256, (camera, camera, 3), dtype=np.uint8)
            ds.add_frame(frame)
        ds.save_episode()
    ds.finalize()
    return root


@pytest.fixture(scope="module")
def lerobot_ds(tmp_path_factory) -> Path:
    return write_lerobot_dataset(tmp_path_factory.mktemp("data") / "ds", camera=8)


def test_dataset_spec_reads_the_policy_sizing_fields(lerobot_ds):
    spec = dataset_spec(lerobot_ds)
    assert (spec.action_dim, spec.state_dim, spec.cameras, spec.image_size) == (ACT, STATE, ("front",), (8, 8))
    assert (spec.episodes, spec.frames, spec.fps) == (3, 18, 10.0)
    assert set(spec.extras) == {"is_intervention", "next.reward", "next.success"}
    env_spec = spec.env_spec()
    from vla_rl.policy_factory import spec_fields

    assert spec_fields(env_spec) == {"action_dim": ACT, "state_dim": STATE, "cameras": ("front",), "image_size": (8, 8)}
    assert env_spec.action_dim == ACT and env_spec.observation["observation.images.front"].shape == (8, 8, 3)


def test_load_chunks_reads_intervention_reward_success(lerobot_ds):
    inputs = PolicyInputs(cameras=("front",), image_size=(8, 8), state_dim=STATE, action_dim=ACT)
    data = load_chunks(lerobot_ds, inputs, horizon=4, episodes=2)
    assert len(data) == 12 and data.episodes == 2
    assert data.obs["observation.images.front"].shape == (12, 8, 8, 3)
    assert data.obs["observation.images.front"].dtype == torch.uint8
    assert data.obs["observation.state"].shape == (12, STATE) and data.obs["task"][0] == "reach the target"
    assert data.actions.shape == (12, 4, ACT) and data.mask.shape == (12, 4)
    t = torch.arange(12) % 6
    assert torch.equal(data.intervention, t % 3 == 1)
    assert torch.equal(data.reward, t.float())
    assert torch.equal(data.success, t == 5)
    assert torch.equal(data.episode_index, torch.arange(12) // 6)
    # the last frame of an episode: one real step, the rest padded with its action and masked
    assert data.mask[5].tolist() == [True, False, False, False]
    assert torch.equal(data.actions[5, 1], data.actions[5, 0])
    batch = data.sample(5, torch.Generator().manual_seed(0))
    assert batch.intervention.shape == (5,) and len(batch.obs["task"]) == 5


def test_the_policy_reads_only_its_features(lerobot_ds):
    data = load_chunks(lerobot_ds, PolicyInputs((), None, STATE, ACT), horizon=2)
    assert set(data.obs) == {"observation.state", "task"}  # the camera the policy does not read is not loaded


def test_missing_feature_names_folder_and_feature(lerobot_ds):
    with pytest.raises(DatasetError) as exc:
        load_chunks(lerobot_ds, PolicyInputs(("front", "wrist"), (8, 8), STATE, ACT), horizon=2)
    msg = str(exc.value)
    assert "\n" not in msg and str(lerobot_ds) in msg and "'observation.images.wrist'" in msg
    assert isinstance(exc.value, ConfigError)


@pytest.mark.parametrize(("inputs", "feature", "got", "want"), [
    (PolicyInputs((), None, 5, ACT), "observation.state", "(4,)", "(5,)"),
    (PolicyInputs((), None, STATE, 7), "action", "(2,)", "(7,)"),
    (PolicyInputs(("front",), (16, 16), STATE, ACT), "observation.images.front", "(8, 8, 3)", "(16, 16, 3)"),
])
def test_shape_mismatch_names_feature_and_both_shapes(lerobot_ds, inputs, feature, got, want):
    with pytest.raises(DatasetError) as exc:
        load_chunks(lerobot_ds, inputs, horizon=2)
    msg = str(exc.value)
    assert "\n" not in msg and str(lerobot_ds) in msg and repr(feature) in msg
    assert f"shape {got} in the dataset but the policy expects {want}" in msg


def test_not_a_dataset_and_too_many_episodes(tmp_path, lerobot_ds):
    with pytest.raises(DatasetError, match="no meta/info.json"):
        dataset_spec(tmp_path)
    with pytest.raises(DatasetError, match="asked for 9 episodes, the dataset has 3"):
        load_chunks(lerobot_ds, PolicyInputs((), None, STATE, ACT), horizon=2, episodes=9)
    info = json.loads((lerobot_ds / "meta" / "info.json").read_text())
    bad = tmp_path / "noaction" / "meta"
    bad.mkdir(parents=True)
    (bad / "info.json").write_text(json.dumps({**info, "features": {k: v for k, v in info["features"].items()
                                                                    if k != "action"}}))
    with pytest.raises(DatasetError, match="no feature 'action'"):
        dataset_spec(bad.parent)


def test_policy_inputs_read_by_name():
    class Config:
        cameras, image_size, state_dim, action_dim = ("front",), (32, 32), 8, 7

    class Adapter:  # a LeRobot-style adapter keeps some of them on itself
        config = Config()
        state_dim = 9

    assert policy_inputs(Adapter()) == PolicyInputs(("front",), (32, 32), 9, 7)


def test_make_chunks_pads_and_masks_per_episode():
    acts = torch.arange(5, dtype=torch.float32)[:, None]
    data = make_chunks({"observation.state": torch.zeros(5, 1), "task": ["t"] * 5}, acts,
                       torch.tensor([0, 0, 0, 1, 1]), horizon=3)
    assert data.actions[..., 0].tolist() == [[0, 1, 2], [1, 2, 2], [2, 2, 2], [3, 4, 4], [4, 4, 4]]
    # The last episode's steps past the end of the frames stay unmasked (the index is clamped inside that
    # episode): a quirk kept so the quickstart's pre-trained weights stay bitwise as measured.
    assert data.mask.tolist() == [[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 1]]
    assert data.intervention is None and data.episodes == 2


def _rows(n: int, value: float, intervention: bool | None) -> ChunkDataset:
    return ChunkDataset(
        obs={"observation.state": torch.full((n, 1), value), "task": [f"t{value:g}"] * n},
        actions=torch.full((n, 2, 1), value), mask=torch.ones(n, 2, dtype=torch.bool), episodes=1,
        intervention=None if intervention is None else torch.full((n,), intervention),
        reward=torch.full((n,), value),
    )


def test_mixed_source_draws_rows_by_ratio_with_a_seed():
    demos, online = _rows(10, 0.0, None), _rows(50, 1.0, True)
    mix = MixedSource([(demos, 1.0), (online, 3.0)])
    batch = mix.sample(16, torch.Generator().manual_seed(0))
    assert batch.source.tolist() == [0] * 4 + [1] * 12  # exactly 1:3
    assert torch.equal(batch.obs["observation.state"][:, 0], batch.source.float())
    assert batch.obs["task"] == ["t0"] * 4 + ["t1"] * 12
    assert batch.intervention.tolist() == [False] * 4 + [True] * 12  # missing counts as no intervention
    assert batch.reward is not None and batch.success is None
    # a batch that does not split evenly: the odd row goes by ratio, reproducibly for a seed
    counts = [MixedSource([(demos, 1.0), (online, 1.0)]).sample(5, torch.Generator().manual_seed(s)).source.sum()
              for s in range(400)]
    share = sum(int(c) for c in counts) / (5 * 400)
    assert 0.45 < share < 0.55 and {int(c) for c in counts} == {2, 3}
    a = MixedSource([(demos, 0.3), (online, 0.7)]).sample(7, torch.Generator().manual_seed(3))
    b = MixedSource([(demos, 0.3), (online, 0.7)]).sample(7, torch.Generator().manual_seed(3))
    assert torch.equal(a.source, b.source) and torch.equal(a.actions, b.actions)


def test_split_rows_and_mixing_errors():
    gen = torch.Generator().manual_seed(0)
    assert split_rows(10, [1, 0], gen) == [10, 0]
    assert sum(split_rows(7, [0.2, 0.3, 0.5], gen)) == 7
    with pytest.raises(ValueError, match="non-negative"):
        split_rows(4, [1, -1], gen)
    with pytest.raises(ValueError, match="empty"):
        MixedSource([(_rows(0, 0.0, None), 1.0)])
    other = ChunkDataset(obs={"observation.state": torch.zeros(3, 1), "task": ["t"] * 3},
                         actions=torch.zeros(3, 4, 1), mask=torch.ones(3, 4, dtype=torch.bool), episodes=1)
    with pytest.raises(ValueError, match="cannot mix"):
        MixedSource([(_rows(3, 0.0, None), 1.0), (other, 1.0)]).sample(4, gen)


def test_dataset_spec_reads_channel_first_image_shapes(tmp_path):
    """LeRobot's tools store some camera shapes as (C, H, W) (named so); the spec reports (H, W) either way."""
    meta = tmp_path / "meta"
    meta.mkdir()
    (meta / "info.json").write_text(json.dumps({"fps": 30, "total_episodes": 1, "total_frames": 2, "features": {
        "observation.images.top": {"dtype": "video", "shape": [3, 48, 64], "names": ["channels", "height", "width"]},
        "observation.images.side": {"dtype": "image", "shape": [48, 64, 3], "names": ["height", "width", "channel"]},
        "observation.state": {"dtype": "float32", "shape": [6], "names": None},
        "action": {"dtype": "float32", "shape": [6], "names": None},
    }}))
    spec = dataset_spec(tmp_path)
    assert spec.cameras == ("top", "side") and spec.image_sizes == {"top": (48, 64), "side": (48, 64)}
    assert spec.extras == () and spec.fps == 30.0


def test_demos_record_the_privileged_env_state_and_only_privileged_policies_read_it(tmp_path):
    """``vla-rl collect`` records ``observation.env_state`` (the sim's privileged state) next to the robot state;
    ``load_chunks`` hands it over only to a policy whose actor reads it, and says when a dataset lacks it."""
    from sim.registry import make_env
    from vla_rl.data import collect_demos

    root = tmp_path / "demos"
    with make_env("mujoco/pick-red", num_envs=1, seed=0, obs_mode="state") as env:
        collect_demos(env, root, 1, "local/env-state", True, 0, 0.0, 0)
    spec = dataset_spec(root)
    assert spec.env_state_dim == 13 and spec.state_dim == 11
    plain = load_chunks(root, PolicyInputs((), None, 11, 4), horizon=2)
    assert "observation.env_state" not in plain.obs
    privileged = load_chunks(root, PolicyInputs((), None, 11, 4, env_state_dim=13), horizon=2)
    env_state = privileged.obs["observation.env_state"]
    assert env_state.shape == (len(privileged.actions), 13)
    assert torch.all(env_state[:, 12] == 0)  # the task index of pick-red
    assert not torch.allclose(env_state[0, :9], env_state[-1, :9])  # the red cube was lifted: the cubes moved
    with pytest.raises(DatasetError, match="observation.env_state"):
        load_chunks(root, PolicyInputs((), None, 11, 4, env_state_dim=12), horizon=2)
    with pytest.raises(DatasetError, match="observation.env_state"):
        write_lerobot_dataset(tmp_path / "no_env_state", episodes=1)
        load_chunks(tmp_path / "no_env_state", PolicyInputs((), None, STATE, ACT, env_state_dim=13), horizon=2)
