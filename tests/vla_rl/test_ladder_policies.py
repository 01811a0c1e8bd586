"""The RL ladder's privileged-state policies through the loop: PPO learns a ``gaussian-mlp`` on a toy task that
needs ``observation.env_state``; ``vla-rl train`` / ``collect`` + ``sft`` run ``gaussian-mlp`` and the no-camera
``compact-flow --policy.actor_env_state true`` on ``mujoco/pick-any`` state observations."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
import torch

from policies.base import ActMode
from policies.mlp import GaussianMLPConfig, GaussianMLPPolicy
from sim.core import OBS_ENV_STATE, OBS_STATE, EnvSpec, TensorSpec
from sim.single import SingleEnv, StepOut
from sim.vector import SerialVecEnv
from vla_rl.algorithms.base import IterationInputs
from vla_rl.algorithms.ppo import PPOConfig, PPOLearner
from vla_rl.cli import run
from vla_rl.evaluation import evaluate_episodes
from vla_rl.rollout import RolloutEngine

torch.set_num_threads(1)


class SignedGoalEnv(SingleEnv):
    """``observation.state = [position, t]``; the privileged ``observation.env_state = [direction]`` (+1 or -1,
    drawn per episode); the action adds to the position; success when ``position * direction >= goal``.

    A policy that ignores the env state succeeds on at most the episodes of one direction."""

    def __init__(self, episode_steps: int = 4, goal: float = 1.0) -> None:
        self.spec = EnvSpec(
            env_id="toy/signed-goal",
            observation={OBS_STATE: TensorSpec((2,), torch.float32), OBS_ENV_STATE: TensorSpec((1,), torch.float32)},
            action=TensorSpec((1,), torch.float32, -1.0, 1.0), max_episode_steps=episode_steps, control_freq=10.0,
            cameras=(),
        )
        self.goal = goal
        self.rng = np.random.default_rng(0)
        self.pos, self.t, self.direction = 0.0, 0, 1.0

    def _obs(self) -> dict[str, np.ndarray]:
        return {OBS_STATE: np.array([self.pos, self.t], dtype=np.float32),
                OBS_ENV_STATE: np.array([self.direction], dtype=np.float32)}

    def reset(self, seed):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.pos, self.t, self.direction = 0.0, 0, float(self.rng.choice([-1.0, 1.0]))
        return self._obs(), "reach the goal"

    def step(self, action):
        move = float(np.clip(action[0], -1.0, 1.0))
        self.pos += move
        self.t += 1
        success = self.pos * self.direction >= self.goal
        progress = 0.1 * move * self.direction  # a dense term: only a policy that reads the direction earns it
        return StepOut(self._obs(), float(success) + progress, success, self.t >= self.spec.max_episode_steps,
                       success, {"success": float(success), "progress": progress}, None)


def _env(n: int = 8) -> SerialVecEnv:
    return SerialVecEnv([functools.partial(SignedGoalEnv) for _ in range(n)], "toy/signed-goal")


def test_ppo_learns_a_task_that_needs_the_privileged_state():
    torch.manual_seed(0)
    policy = GaussianMLPPolicy(GaussianMLPConfig(state_dim=2, env_state_dim=1, action_dim=1, chunk_size=2,
                                                 hidden=(32, 32)))
    cfg = PPOConfig(decisions_per_iter=2, epochs=4, minibatch_size=8, lr_actor=1e-2, lr_critic=1e-2)
    learner = PPOLearner(cfg, policy)
    engine = RolloutEngine(_env(), policy, use_critic=learner.uses_critic)

    def success() -> float:
        def act(obs):
            with torch.no_grad():
                return policy.act(obs, ActMode.EVAL).actions

        return evaluate_episodes(_env(), act, 32, seed=10_000, progress=False).success_rate

    before = success()
    for it in range(45):
        learner.update(learner.collect(IterationInputs(iteration=it, seed_base=100 * it, reset=True, engine=engine)))
    after = success()
    assert before <= 0.1 and after >= 0.9, (before, after)  # ignoring the env state caps success near 0.5


STATE_ENV = ["--env.id", "mujoco/pick-any", "--env.obs_mode", "state", "--env.num_envs", "2",
             "--env.max_episode_steps", "16"]
TRAIN = ["--algo.decisions_per_iter", "16", "--algo.epochs", "1", "--algo.minibatch_size", "8", "--iterations", "2",
         "--eval.episodes", "2", "--eval.video", "false", "--logging.wandb", "false", "--logging.tensorboard", "false"]
MLP = ["--policy.type", "gaussian-mlp", "--policy.hidden", "[16,16]"]
FLOW = ["--policy.type", "compact-flow", "--policy.cameras", "[]", "--policy.actor_env_state", "true",
        "--policy.width", "32", "--policy.heads", "2", "--policy.chunk_size", "4", "--policy.text_encoder", "hashed",
        "--policy.sampler.num_steps", "2", "--policy.value_hidden", "32"]


@pytest.fixture(scope="module")
def state_demos(tmp_path_factory):
    """Four expert episodes of mujoco/pick-any with state observations (``observation.env_state`` included)."""
    root = tmp_path_factory.mktemp("ladder") / "demos"
    run(["collect", "--env.id", "mujoco/pick-any", "--env.obs_mode", "state", "--env.num_envs", "2",
         "--episodes", "4", "--output", str(root)])
    return root


@pytest.mark.parametrize("policy", [MLP, FLOW], ids=["gaussian-mlp", "compact-flow-state"])
def test_sft_then_train_on_privileged_state_through_the_cli(policy, state_demos, tmp_path):
    features = json.loads((state_demos / "meta" / "info.json").read_text())["features"]
    assert features[OBS_ENV_STATE]["shape"] == [13]
    sft = run(["sft", "--dataset", str(state_demos), *policy, "--steps", "20", "--output", str(tmp_path / "sft")])
    assert sft["sft/loss_last"] < sft["sft/loss_first"]
    saved = json.loads((tmp_path / "sft" / "config.json").read_text())
    assert saved["env_state_dim"] == 13 and saved["state_dim"] == 11
    run(["train", *STATE_ENV, *policy, *TRAIN, "--run_dir", str(tmp_path / "fresh")])
    run(["train", *STATE_ENV, "--policy.path", str(tmp_path / "sft"), *TRAIN, "--run_dir", str(tmp_path / "tuned")])
    for run_dir in ("fresh", "tuned"):
        after = json.loads((tmp_path / run_dir / "eval_after.json").read_text())
        assert after["episodes"] >= 2, after


def test_sft_on_a_dataset_without_env_state_names_the_feature(tmp_path, capsys):
    from sim.dataset import EpisodeRecorder

    root = tmp_path / "demos"
    spec = EnvSpec(env_id="x", observation={OBS_STATE: TensorSpec((11,), torch.float32)},
                action=TensorSpec((4,), torch.float32, -1.0, 1.0), max_episode_steps=4, control_freq=10.0, cameras=())
    rec = EpisodeRecorder(root, "test/no-env-state", spec, fps=10)
    for _ in range(3):
        rec.add_frame({OBS_STATE: torch.zeros(1, 11), "task": ["pick up the red cube"]}, torch.zeros(4), 0.0, False)
    rec.save_episode()
    rec.finalize()
    for policy in (MLP, FLOW):  # the MLP is sized from the dataset; the flow policy's data check names the folder
        with pytest.raises(SystemExit) as exc:
            run(["sft", "--dataset", str(root), *policy, "--policy.env_state_dim", "13", "--steps", "2",
                 "--output", str(tmp_path / "out")])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert "observation.env_state" in err and "vla-rl collect" in err, err


def test_an_explicit_empty_camera_selection_is_kept_in_an_env_with_cameras():
    from vla_rl.policy_factory import build_policy_from_fields

    derived = {"action_dim": 4, "state_dim": 11, "env_state_dim": 13, "cameras": ("front", "wrist"),
               "image_size": (32, 32)}
    small = {"text_encoder": "hashed", "width": 32, "heads": 2, "cnn_channels": (8, 16), "image_tokens": 2}
    none = build_policy_from_fields("compact-flow", {**small, "cameras": (), "actor_env_state": True}, derived)
    assert none.config.cameras == () and none.reads_env_state
    default = build_policy_from_fields("compact-flow", {**small, "cameras": ("front",)}, derived)
    assert default.config.cameras == ("front", "wrist")  # the config's default means every env camera
