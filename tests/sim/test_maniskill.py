"""ManiSkill3 backend: observations, truncation, seeding, Vulkan errors, GPU-path logic, experts.

Needs a Vulkan driver (``scripts/install_lavapipe.sh`` on machines without an
NVIDIA driver); tests that build envs skip with the backend's own message
when none is found. Most tests step envs in this process (``num_workers=0``)
to pay ManiSkill's import once.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from rewards.terms import env_terms
from sim import OBS_ENV_STATE, OBS_STATE, TASK, EnvError, image_key, list_envs, make_env
from sim.backends import maniskill as maniskill_backend
from sim.backends.maniskill_common import (
    ManiSkillOptions,
    default_lavapipe_icd,
    physx_gpu_error,
    vulkan_error,
    vulkan_message,
)
from sim.backends.maniskill_tasks import TASKS
from sim.experts import maniskill as experts

REPO = Path(__file__).resolve().parents[2]
ALL_TASKS = [
    "PickCube-v1",
    "PushCube-v1",
    "PullCube-v1",
    "StackCube-v1",
    "LiftPegUpright-v1",
    "PokeCube-v1",
    "PegInsertionSide-v1",
]
EXPERT_TASKS = ["PickCube-v1", "PushCube-v1", "StackCube-v1"]


@pytest.fixture(scope="module")
def icd() -> str:
    """A working Vulkan ICD json ('' = system drivers), or skip with the backend's message."""
    path = os.environ.get("VK_ICD_FILENAMES") or (
        default_lavapipe_icd() if os.path.isfile(default_lavapipe_icd()) else ""
    )
    reason = vulkan_error(path)
    if reason is not None:
        pytest.skip(vulkan_message("maniskill", reason, path))
    return path


@pytest.fixture(scope="module")
def pick_env(icd: str):
    env = make_env("maniskill/PickCube-v1", num_envs=1, seed=0, obs_mode="state", num_workers=0, vulkan_icd=icd)
    yield env
    env.close()


def run_expert(env, episodes: int, seed0: int) -> int:
    """Episodes (seeded ``seed0 + k``) the scripted expert solves within the step limit."""
    wins = 0
    for k in range(episodes):
        env.reset(seed=seed0 + k)
        for _ in range(env.spec.max_episode_steps):
            _, _, term, trunc, info = env.step(env.expert_actions())
            if bool(term[0] or trunc[0]):
                wins += bool(info["episode"]["success"][0])
                break
    return wins


# ------------------------------------------------------------------ no simulator needed


def test_all_tasks_registered() -> None:
    ids = list_envs()
    for task in ALL_TASKS:
        assert f"maniskill/{task}" in ids
    assert sorted(TASKS) == sorted(ALL_TASKS)


def test_bad_options_name_the_field() -> None:
    with pytest.raises(EnvError, match="reward_mode"):
        make_env("maniskill/PickCube-v1", reward_mode="shaped")
    with pytest.raises(EnvError, match="sim_backend"):
        make_env("maniskill/PickCube-v1", sim_backend="tpu")
    with pytest.raises(EnvError, match="vulkan_icd.*install_lavapipe.sh"):
        make_env("maniskill/PickCube-v1", vulkan_icd="/nonexistent/lvp_icd.json")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without CUDA")
def test_gpu_backend_without_cuda_is_a_clear_error() -> None:
    with pytest.raises(EnvError, match="CUDA"):
        make_env("maniskill/PickCube-v1", sim_backend="gpu")


def test_broken_vulkan_driver_gives_one_clear_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "bad_icd.json"
    bad.write_text(
        json.dumps(
            {
                "file_format_version": "1.0.0",
                "ICD": {"api_version": "1.4.305", "library_path": str(tmp_path / "nope.so")},
            }
        )
    )
    monkeypatch.setenv("VK_ICD_FILENAMES", str(bad))
    with pytest.raises(EnvError) as info:
        make_env("maniskill/PushCube-v1", obs_mode="state", num_workers=0)
    msg = str(info.value)
    assert "maniskill/PushCube-v1" in msg and "install_lavapipe.sh" in msg and str(bad) in msg
    assert "Traceback" not in msg and "\n" not in msg


def test_pose_action_points_at_target_and_respects_caps() -> None:
    tcp = np.array([0.0, 0.0, 0.2, 0.0, 1.0, 0.0, 0.0])  # pointing down, yaw 0
    act = experts.pose_action(tcp, np.array([0.3, 0.0, 0.2]), experts.top_down(0.0), experts.CLOSED)
    assert act.shape == (7,) and act.dtype == np.float32
    assert act[0] > 0 and abs(act[1]) < 1e-6 and abs(act[2]) < 1e-6
    assert np.linalg.norm(act[:3]) <= experts.MAX_TRANSLATION + 1e-6
    assert np.allclose(act[3:6], 0.0, atol=1e-6) and act[6] == experts.CLOSED
    # A 0.2 rad yaw error asks for a turn about world z with ManiSkill's negative rotation scale.
    act = experts.pose_action(tcp, tcp[:3], experts.top_down(0.2), experts.OPEN)
    assert act[5] < 0 and abs(act[3]) < 1e-6 and abs(act[4]) < 1e-6
    assert np.linalg.norm(act[3:6]) <= experts.MAX_ROT_ACTION + 1e-6


def test_rotation_helpers() -> None:
    for yaw in (-2.0, 0.0, 0.7, 3.0):
        r = experts.top_down(yaw)
        assert np.allclose(r @ r.T, np.eye(3), atol=1e-9) and np.allclose(r[:, 2], [0, 0, -1])
        assert abs(experts.wrap(np.arctan2(r[1, 0], r[0, 0]) - yaw, 2 * np.pi)) < 1e-9
    half = np.cos(0.3), 0.0, 0.0, np.sin(0.3)  # 0.6 rad about z
    assert np.allclose(experts.mat_to_rotvec(experts.quat_to_mat(np.array(half))), [0, 0, 0.6], atol=1e-9)
    # A cube turned by 80 deg looks like one turned by -10 deg: the gripper turns the short way.
    cube = np.array([np.cos(np.radians(40)), 0.0, 0.0, np.sin(np.radians(40))])
    assert abs(experts.grasp_yaw(np.array([0.0, 1.0, 0.0, 0.0]), cube) - np.radians(-10)) < 1e-6


def test_install_script_is_idempotent(tmp_path: Path) -> None:
    lib = tmp_path / "root" / "libvulkan_lvp.so"
    lib.parent.mkdir()
    lib.write_bytes(b"")
    (tmp_path / "lvp_icd.json").write_text(json.dumps({"ICD": {"library_path": str(lib)}}))
    res = subprocess.run(
        ["bash", str(REPO / "scripts" / "install_lavapipe.sh"), str(tmp_path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == str(tmp_path / "lvp_icd.json")
    assert "already installed" in res.stderr


# ------------------------------------------------------------------ CPU path


def test_state_observations_match_the_simulator(pick_env) -> None:
    env = pick_env
    obs = env.reset(seed=3)
    assert obs[OBS_STATE].shape == (1, 25) and obs[OBS_STATE].dtype == torch.float32
    assert obs[OBS_ENV_STATE].shape == (1, TASKS["PickCube-v1"].state_dim) and obs[OBS_ENV_STATE].dtype == torch.float32
    assert obs[TASK] == ["pick up the red cube and move it to the green goal"]
    assert not any(k.startswith("observation.images.") for k in obs)
    spec = env.spec
    assert spec.env_id == "maniskill/PickCube-v1" and spec.max_episode_steps == 50 and spec.control_freq == 20.0
    assert spec.action.shape == (7,) and (spec.action.low, spec.action.high) == (-1.0, 1.0)
    layout = TASKS["PickCube-v1"].layout()
    es, st = obs[OBS_ENV_STATE][0].numpy(), obs[OBS_STATE][0].numpy()
    assert np.allclose(es[layout["tcp_pose"]], st[18:25])  # TCP pose appears in both
    assert np.isclose(es[layout["gripper_width"]][0], st[7] + st[8])
    cube = es[layout["cube_pose"]]
    assert abs(cube[2] - 0.02) < 1e-3 and abs(np.linalg.norm(cube[3:]) - 1.0) < 1e-4  # resting, unit quaternion
    _, reward, term, trunc, info = env.step(torch.zeros(1, 7))
    assert reward.shape == (1,) and 0.0 <= float(reward[0]) <= 1.0  # normalized_dense
    assert "reward_terms" not in info  # ManiSkill's reward is not decomposed: it is the ``env`` term
    assert info["success"].dtype == torch.bool and not bool(term[0] or trunc[0])
    steps = env.step_chunk(torch.zeros(1, 2, 7))
    terms = env_terms(steps)  # the documented terms, as on every backend
    assert set(terms) == {"env", "success"}
    assert torch.equal(terms["env"], steps.reward) and torch.equal(terms["success"], steps.success.float())


def test_seeded_resets_are_reproducible(pick_env) -> None:
    a = pick_env.reset(seed=11)[OBS_ENV_STATE]
    b = pick_env.reset(seed=11)[OBS_ENV_STATE]
    c = pick_env.reset(seed=12)[OBS_ENV_STATE]
    assert torch.equal(a, b)
    assert not torch.allclose(a, c)


def test_truncation_at_max_episode_steps_and_auto_reset(icd: str) -> None:
    env = make_env(
        "maniskill/PushCube-v1", seed=5, obs_mode="state", num_workers=0, max_episode_steps=4, vulkan_icd=icd
    )
    try:
        assert env.spec.max_episode_steps == 4
        env.reset()
        push = torch.tensor([[0.0, 0.0, -1.0, 0.0, 0.0, 0.0, -1.0]])  # move down: the TCP leaves its start pose
        for t in range(4):
            obs, _, term, trunc, info = env.step(push)
            assert bool(trunc[0]) == (t == 3) and not bool(term[0])
        final = info["final_obs"][OBS_STATE][0]
        assert info["episode"]["length"][0] == 4
        assert not torch.allclose(final, obs[OBS_STATE][0])  # auto-reset moved the arm back
    finally:
        env.close()


def test_worker_processes_and_expert_actions(icd: str) -> None:
    env = make_env("maniskill/StackCube-v1", num_envs=2, seed=0, obs_mode="state", num_workers=1, vulkan_icd=icd)
    try:
        obs = env.reset()
        assert obs[OBS_ENV_STATE].shape == (2, TASKS["StackCube-v1"].state_dim)
        assert not torch.allclose(obs[OBS_ENV_STATE][0], obs[OBS_ENV_STATE][1])  # seeds 0 and 1 differ
        acts = env.expert_actions()
        assert acts.shape == (2, 7) and acts.abs().max() <= 1.0
        obs, reward, *_ = env.step(acts)
        assert reward.shape == (2,) and obs[TASK] == ["stack the red cube on top of the green cube"] * 2
    finally:
        env.close()


@pytest.mark.parametrize("task", EXPERT_TASKS)
def test_expert_solves_most_episodes(icd: str, task: str) -> None:
    env = make_env(f"maniskill/{task}", obs_mode="state", num_workers=0, vulkan_icd=icd)
    try:
        assert run_expert(env, episodes=10, seed0=100) >= 8
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.parametrize("task", EXPERT_TASKS)
def test_expert_success_rate_over_50_episodes(icd: str, task: str) -> None:
    env = make_env(f"maniskill/{task}", obs_mode="state", num_workers=0, vulkan_icd=icd)
    try:
        assert run_expert(env, episodes=50, seed0=1000) >= 45
    finally:
        env.close()


def test_expert_refuses_other_control_modes(icd: str) -> None:
    env = make_env(
        "maniskill/PickCube-v1", obs_mode="state", num_workers=0, control_mode="pd_joint_delta_pos", vulkan_icd=icd
    )
    try:
        env.reset()
        with pytest.raises(NotImplementedError, match="pd_ee_delta_pose"):
            env.expert_actions()
    finally:
        env.close()


@pytest.mark.render
def test_rgb_observations_have_every_sensor_camera(icd: str) -> None:
    env = make_env("maniskill/StackCube-v1", obs_mode="rgb", image_size=64, num_workers=0, vulkan_icd=icd)
    try:
        assert env.spec.cameras == ("base_camera", "hand_camera")  # panda_wristcam is StackCube's robot
        obs = env.reset(seed=0)
        for cam in env.spec.cameras:
            img = obs[image_key(cam)]
            assert img.shape == (1, 64, 64, 3) and img.dtype == torch.uint8
            assert img.float().std() > 5.0  # a rendered scene, not a blank frame
        assert env.render().shape == (64, 64, 3)
    finally:
        env.close()


# ------------------------------------------------------------------ GPU path


def test_gpu_vec_env_logic_on_physx_cpu(icd: str) -> None:
    """ManiSkillGPUVecEnv's reset/step/auto-reset code, run on PhysX CPU with one env."""
    from sim.backends.maniskill_gpu import ManiSkillGPUVecEnv

    opts = ManiSkillOptions(obs_mode="state", max_episode_steps=3, vulkan_icd=icd)
    env = ManiSkillGPUVecEnv("PickCube-v1", 1, opts, "maniskill/PickCube-v1", device="cpu")
    try:
        obs = env.reset(seed=4)
        assert obs[OBS_ENV_STATE].shape == (1, TASKS["PickCube-v1"].state_dim) and obs[OBS_STATE].shape == (1, 25)
        for _ in range(3):
            obs, _, _, trunc, info = env.step(torch.tensor([[0.0, 0.0, -1.0, 0, 0, 0, 1.0]]))
        assert bool(trunc[0]) and info["episode"]["length"][0] == 3
        assert not torch.allclose(info["final_obs"][OBS_STATE], obs[OBS_STATE])
        assert env.expert_actions().shape == (1, 7)
        with pytest.raises(EnvError, match="action shape"):
            env.step(torch.zeros(2, 7))
        env.reset(seed=4)
        steps = env.step_chunk(torch.zeros(1, 4, 7))  # VecEnv's default chunk runner: ends at step 3, then holds
        assert steps.truncated[:, 0].tolist() == [False, False, True, False]
        assert set(env_terms(steps)) == {"env", "success"}
    finally:
        env.close()


class _TorchWithCuda:
    """``torch`` as the backend module sees it on a CUDA machine (only ``cuda.is_available`` differs)."""

    class cuda:  # noqa: N801  mirrors torch.cuda
        @staticmethod
        def is_available() -> bool:
            return True

    def __getattr__(self, name: str):
        return getattr(torch, name)


def test_auto_falls_back_to_the_cpu_backend_without_physx_cuda_library(icd, monkeypatch, capsys) -> None:
    """On a CUDA machine that cannot get PhysX's CUDA library (offline: SAPIEN downloads it from GitHub on first
    use), ``auto`` builds the CPU backend with a note, and ``gpu`` fails naming the reason."""
    reason = "SAPIEN could not load PhysX's CUDA library (test)"
    monkeypatch.setattr(maniskill_backend, "torch", _TorchWithCuda())
    monkeypatch.setattr(maniskill_backend, "physx_gpu_error", lambda: reason)
    env = make_env("maniskill/PickCube-v1", num_envs=1, seed=0, obs_mode="state", num_workers=0, vulkan_icd=icd)
    try:
        assert type(env).__name__ != "ManiSkillGPUVecEnv" and env.reset(seed=0)[OBS_STATE].shape[0] == 1
    finally:
        env.close()
    assert "runs ManiSkill on the CPU backend" in capsys.readouterr().err
    with pytest.raises(EnvError, match=r"sim_backend='gpu'.*PhysX's CUDA library \(test\)"):
        make_env("maniskill/PickCube-v1", num_envs=2, obs_mode="state", sim_backend="gpu", vulkan_icd=icd)


def test_physx_cuda_library_error_names_the_download(icd, monkeypatch) -> None:
    import sapien.physx

    def offline() -> None:
        raise ConnectionError("Failed to resolve 'github.com'")

    monkeypatch.setattr(sapien.physx, "enable_gpu", offline)
    physx_gpu_error.cache_clear()
    try:
        why = physx_gpu_error()
        assert why is not None and "ConnectionError" in why and "github.com" in why
        assert f"physx-precompiled/releases/download/{sapien.physx.version()}/linux-so.zip" in why
        assert os.path.join(".sapien", "physx", sapien.physx.version()) in why
        assert physx_gpu_error() is why  # asked once per process
    finally:
        physx_gpu_error.cache_clear()  # the answer with the stand-in must not outlive the test


@pytest.mark.skipif(not torch.cuda.is_available(), reason="ManiSkill's physx_cuda backend needs a CUDA GPU")
def test_gpu_batched_envs(icd: str) -> None:
    if physx_gpu_error() is not None:
        pytest.skip(physx_gpu_error())
    env = make_env(
        "maniskill/PickCube-v1", num_envs=4, seed=0, obs_mode="state", sim_backend="gpu", max_episode_steps=5
    )
    try:
        obs = env.reset()
        assert obs[OBS_ENV_STATE].shape == (4, TASKS["PickCube-v1"].state_dim)
        for _ in range(5):
            obs, reward, _, trunc, info = env.step(env.expert_actions())
        assert reward.shape == (4,) and bool(trunc.all()) and "final_obs" in info
        env.reset(env_ids=[1])
    finally:
        env.close()


@pytest.mark.parametrize("task", ["PickCube-v1", "StackCube-v1", "PokeCube-v1"])
def test_state_fields_reused_from_info_match_a_fresh_read(icd: str, task: str) -> None:
    """``is_grasped`` taken from ManiSkill's step info equals the contact query it replaces."""
    from sim.backends.maniskill import ManiSkillSingleEnv

    env = ManiSkillSingleEnv(task, ManiSkillOptions(obs_mode="state", sim_backend="cpu"), icd)
    try:
        assert any(f.info_key for f in TASKS[task].fields)
        env.reset(0)
        base, rng = env._base, np.random.default_rng(0)
        grasp = TASKS[task].layout()["is_grasped"]
        for t in range(30):
            # close the gripper on the spot after a few steps so some states are grasps
            action = rng.uniform(-1, 1, 7).astype(np.float32) if t < 3 else np.array([0, 0, 0, 0, 0, 0, -1], np.float32)
            _, _, _, _, info = base.step(action[None])
            assert torch.equal(TASKS[task].read(base, info), TASKS[task].read(base))
            assert TASKS[task].read(base, info)[0, grasp].item() in (0.0, 1.0)
    finally:
        env.close()
