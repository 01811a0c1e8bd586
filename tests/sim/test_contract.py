"""The sim contract, checked identically on every backend."""

from __future__ import annotations

import pytest
import torch

from sim import OBS_STATE, TASK, EnvError, WristCamera, backends_with_wrist_camera, make_env, wrist_camera_support

# (env id, options) — one representative task per backend; short episodes so truncation happens fast.
BACKENDS = [
    pytest.param(("mujoco/multi", {"obs_mode": "rgb", "num_workers": 0}), id="mujoco"),
    pytest.param(("mujoco/pick-red", {"obs_mode": "rgb", "num_workers": 2}), id="mujoco-workers"),
    pytest.param(("maniskill/PickCube-v1", {"obs_mode": "state"}), id="maniskill-state", marks=pytest.mark.render),
    pytest.param(("maniskill/PushCube-v1", {"obs_mode": "rgb", "image_size": 64}), id="maniskill-rgb", marks=pytest.mark.render),
    pytest.param(("libero/libero_object/0", {"obs_mode": "rgb", "image_size": 64}), id="libero", marks=pytest.mark.render),
    pytest.param(("gym_hil/PandaPickCube-v0", {"obs_mode": "rgb"}), id="gym_hil"),
    pytest.param(("lerobot_env_so101/SO101PickCube-v0", {"obs_mode": "rgb"}), id="so101"),
]

NUM_ENVS = 2
EPISODE_STEPS = 3


@pytest.fixture(scope="module", params=BACKENDS)
def env(request):
    env_id, options = request.param
    env = make_env(env_id, num_envs=NUM_ENVS, seed=7, max_episode_steps=EPISODE_STEPS, **options)
    yield env
    env.close()


def _zeros(env) -> torch.Tensor:
    return torch.zeros(env.num_envs, env.spec.action_dim)


def _check_obs(env, obs) -> None:
    for key, spec in env.spec.observation.items():
        assert key in obs, f"missing {key}"
        assert obs[key].dtype == spec.dtype, key
        assert tuple(obs[key].shape) == (env.num_envs, *spec.shape), key
    assert OBS_STATE in obs and obs[OBS_STATE].dtype == torch.float32
    for key in env.spec.image_keys:
        assert obs[key].dtype == torch.uint8 and obs[key].shape[-1] == 3
        assert obs[key].float().std() > 0, f"{key} is a blank image"
    assert isinstance(obs[TASK], list) and len(obs[TASK]) == env.num_envs
    assert all(isinstance(t, str) and t for t in obs[TASK])
    assert obs[TASK] == env.instructions


def test_shapes_and_dtypes(env):
    obs = env.reset(seed=3)
    _check_obs(env, obs)
    obs, reward, term, trunc, info = env.step(_zeros(env))
    _check_obs(env, obs)
    assert reward.shape == (NUM_ENVS,) and reward.dtype == torch.float32
    assert term.dtype == torch.bool and trunc.dtype == torch.bool and term.shape == (NUM_ENVS,)
    assert info["success"].dtype == torch.bool and info["success"].shape == (NUM_ENVS,)


def test_same_seed_same_first_observation(env):
    first = env.reset(seed=11)
    env.step(torch.rand(NUM_ENVS, env.spec.action_dim) * 2 - 1)
    again = env.reset(seed=11)
    for key in env.spec.observation:
        assert torch.equal(first[key], again[key]), key
    assert first[TASK] == again[TASK]


def test_partial_reset_leaves_other_envs_untouched(env):
    env.reset(seed=5)
    torch.manual_seed(0)
    obs, *_ = env.step(torch.rand(NUM_ENVS, env.spec.action_dim) * 2 - 1)
    after = env.reset(seed=100, env_ids=[0])
    for key in env.spec.observation:
        assert torch.equal(after[key][1], obs[key][1]), f"{key} of env 1 changed by resetting env 0"
    assert after[TASK][1] == obs[TASK][1]


def test_final_observation_for_ended_envs_and_auto_reset(env):
    env.reset(seed=1)
    torch.manual_seed(1)
    info = {}
    for _ in range(EPISODE_STEPS):
        obs, _, term, trunc, info = env.step(torch.rand(NUM_ENVS, env.spec.action_dim) * 2 - 1)
        if (term | trunc).all():
            break
    assert (term | trunc).all(), "episodes did not end at max_episode_steps"
    assert "final_obs" in info and "episode" in info
    final = info["final_obs"]
    for key in env.spec.observation:
        assert final[key].shape == obs[key].shape
    assert info["episode"]["length"].le(EPISODE_STEPS).all()
    assert info["episode"]["success"].dtype == torch.bool
    # The final observation is the old episode's last one, not the new episode's first.
    assert not torch.equal(final[OBS_STATE], obs[OBS_STATE])
    # Auto-reset: the returned obs starts a new episode, so the next step does not end it again.
    _, _, term2, trunc2, _ = env.step(_zeros(env))
    if EPISODE_STEPS > 1:
        assert not trunc2.any()


def test_step_chunk_matches_stepping_one_action_at_a_time(env):
    """A chunk longer than the episode: the same rewards, ends, final and next observations as step()."""
    horizon = EPISODE_STEPS + 2
    torch.manual_seed(2)
    chunk = torch.rand(NUM_ENVS, horizon, env.spec.action_dim) * 2 - 1
    env.reset(seed=21)
    steps = env.step_chunk(chunk)
    assert steps.env_ids == list(range(NUM_ENVS))
    assert steps.reward.shape == (horizon, NUM_ENVS) and steps.terminated.dtype == torch.bool

    start = env.reset(seed=21)
    ended = torch.zeros(NUM_ENVS, dtype=torch.bool)
    final = {k: (list(v) if k == TASK else v.clone()) for k, v in start.items()}
    for h in range(horizon):
        actions = torch.where(ended[:, None], torch.zeros_like(chunk[:, h]), chunk[:, h])
        obs, reward, term, trunc, info = env.step(actions)
        torch.testing.assert_close(steps.reward[h], reward.float().cpu(), msg=f"reward at step {h}")
        assert torch.equal(steps.terminated[h], term.cpu()) and torch.equal(steps.truncated[h], trunc.cpu())
        assert torch.equal(steps.success[h], info["success"].cpu())
        done = (term | trunc).cpu()
        if done.any():
            assert torch.equal(steps.episode_length[h][done], info["episode"]["length"].cpu()[done])
            for i in (done & ~ended).nonzero().flatten().tolist():
                for k, v in info["final_obs"].items():
                    final[k][i] = v[i]
        ended |= done
    assert ended.all(), "the chunk is longer than the episode, so every env's episode ends inside it"
    for key in env.spec.observation:
        torch.testing.assert_close(steps.obs[key], obs[key].cpu(), msg=f"obs {key} after the chunk")
        torch.testing.assert_close(steps.final_obs[key], final[key].cpu(), msg=f"final obs {key}")
    assert steps.obs[TASK] == obs[TASK] == env.instructions and steps.final_obs[TASK] == final[TASK]
    with pytest.raises(EnvError, match="chunk action shape mismatch"):
        env.step_chunk(torch.zeros(NUM_ENVS, env.spec.action_dim))


def test_action_shape_mismatch_is_a_clear_error(env):
    env.reset()
    with pytest.raises(EnvError, match=r"expected \[2, \d+\]"):
        env.step(torch.zeros(NUM_ENVS, env.spec.action_dim + 1))
    with pytest.raises(EnvError, match="action shape mismatch"):
        env.step(torch.zeros(env.spec.action_dim))


def test_unknown_env_id_lists_valid_ids():
    with pytest.raises(EnvError) as err:
        make_env("mujoco/pick-purple")
    assert "Did you mean mujoco/pick-red" in str(err.value) and "mujoco/multi" in str(err.value)
    with pytest.raises(EnvError) as err:  # unknown backend: every backend's ids
        make_env("mujocoo/pick-red")
    for expected in ("mujoco/pick-red", "maniskill/PickCube-v1", "libero/libero_object/{0..9}", "gym_hil/"):
        assert expected in str(err.value)
    with pytest.raises(EnvError, match="Did you mean maniskill/PickCube-v1"):
        make_env("maniskill/PickCube-v2")
    with pytest.raises(EnvError, match="unknown option"):
        make_env("mujoco/pick-red", not_an_option=1)


def test_wrist_camera_support_is_a_backend_capability():
    assert wrist_camera_support("libero/libero_object/0") is WristCamera.ALWAYS  # the class says so
    assert wrist_camera_support("mujoco/pick-red") is WristCamera.OPTIONAL  # its options have wrist_camera
    assert wrist_camera_support("maniskill/PickCube-v1") is WristCamera.NONE
    assert wrist_camera_support("no-such-backend/x") is WristCamera.NONE
    assert "libero" in backends_with_wrist_camera(WristCamera.ALWAYS)
    assert "mujoco" in backends_with_wrist_camera(WristCamera.OPTIONAL)

