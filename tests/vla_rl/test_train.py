"""``vla-rl train`` end to end on a real env with the compact flow policy: config errors, resume after SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import time
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vla_rl.cli import parse_config
from vla_rl.faults.scenarios import TINY_RUN
from vla_rl.train_config import SEED_BLOCK, TRAIN_SEED_STRIDE, TrainConfig, training_seed_overlap

TINY = TINY_RUN


@pytest.mark.parametrize(
    "args, field",
    [
        (["--algo.type", "trpo"], "algo.type: unknown algo type 'trpo'"),
        (["--algo.type", "grpo", "--algo.group_size", "3", "--env.num_envs", "4"], "algo.group_size"),
        (["--env.max_episode_steps", "4", "--policy.chunk_size", "8"], "env.max_episode_steps"),
        (["--exec_steps", "9", "--policy.chunk_size", "8"], "exec_steps"),
        (["--algo.dual_clip", "0.5"], "algo.dual_clip"),
        (["--seed", "1", "--eval.seed", "1003001", "--iterations", "5"], "eval.seed"),  # iteration 3's seeds
    ],
)
def test_bad_configs_fail_at_parse_time_naming_the_field(args, field, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_config(TrainConfig, args)
    assert exc.value.code == 2
    assert field in capsys.readouterr().err


def test_default_eval_seeds_are_held_out_of_training(capsys):
    for seed, iterations in ((0, 899), (1, 5000), (2, 1000), (7, 20)):
        cfg = parse_config(TrainConfig, ["--seed", str(seed), "--iterations", str(iterations), "--env.num_envs", "320"])
        train = {cfg.seed * SEED_BLOCK + k * TRAIN_SEED_STRIDE + i for k in range(cfg.iterations) for i in range(320)}
        held_out = set(range(cfg.eval.seed, cfg.eval.seed + cfg.eval_envs))
        assert held_out and not held_out & train
    # an overlap anywhere in an iteration's seed range counts, not only at its first seed
    args = ["--env.num_envs", "16", "--eval.seed", "7010"]
    assert training_seed_overlap(parse_config(TrainConfig, [*args, "--iterations", "7"])) is None
    with pytest.raises(SystemExit):
        parse_config(TrainConfig, [*args, "--iterations", "8"])
    assert "iteration 7" in capsys.readouterr().err


def _train(run_dir: Path, iterations: int, resume: bool = False) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "vla_rl.cli", "train", *TINY, "--iterations", str(iterations), "--run_dir", str(run_dir)]
    if resume:
        cmd += ["--resume", "true"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def _metric_rows(run_dir: Path) -> dict[int, dict]:
    rows = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        rows.setdefault(r["step"], {}).update({k: v for k, v in r.items() if not k.startswith("time/")})
    return rows


def test_sigkill_mid_iteration_then_resume_continues_exactly(tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    p = _train(straight, 8)
    out = p.communicate(timeout=600)[0]
    assert p.returncode == 0, out

    p = _train(killed, 8)
    target = killed / "checkpoints" / "iter_000002" / "trainer.pt"
    deadline = time.time() + 600
    while not target.exists() and p.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert target.exists(), p.communicate()[0]
    p.send_signal(signal.SIGKILL)  # somewhere in iterations 3..8
    p.wait()
    assert not (killed / "checkpoints" / "iter_000008").exists()

    p = _train(killed, 8, resume=True)
    out = p.communicate(timeout=600)[0]
    assert p.returncode == 0 and "resuming" in out, out

    a, b = _metric_rows(straight), _metric_rows(killed)
    assert sorted(a) == sorted(b)
    for step in a:
        for key, value in a[step].items():
            if value is None:  # NaN (e.g. no episode ended in that iteration)
                assert b[step].get(key, 0) is None, (step, key)
            else:
                assert b[step].get(key) == pytest.approx(value, rel=1e-5, abs=1e-6), (step, key)
    wa = torch.load(straight / "checkpoints" / "iter_000008" / "trainer.pt", weights_only=True)
    wb = torch.load(killed / "checkpoints" / "iter_000008" / "trainer.pt", weights_only=True)
    assert torch.equal(wa["rng"]["torch"], wb["rng"]["torch"])
    from safetensors.torch import load_file

    pa = load_file(straight / "checkpoints" / "iter_000008" / "policy" / "model.safetensors")
    pb = load_file(killed / "checkpoints" / "iter_000008" / "policy" / "model.safetensors")
    assert pa.keys() == pb.keys() and all(torch.allclose(pa[k], pb[k], atol=1e-6) for k in pa)


def test_build_policy_uses_every_env_camera_unless_a_selection_is_given():
    from sim import make_env
    from vla_rl.train_config import POLICY_CHOICES
    from vla_rl.policy_factory import build_policy

    small = dict(text_encoder="hashed", width=32, heads=2, cnn_channels=(8, 16), image_tokens=2)
    with make_env("mujoco/pick-red", num_envs=1, wrist_camera=True, num_workers=0, image_size=32) as env:
        spec = env.spec
    default = build_policy(POLICY_CHOICES["compact-flow"](**small), spec)
    assert default.config.cameras == ("front", "wrist")
    chosen = build_policy(POLICY_CHOICES["compact-flow"](cameras=("wrist",), **small), spec)
    assert chosen.config.cameras == ("wrist",)


def test_evaluation_scores_a_policy_the_same_every_time_and_leaves_the_training_rng_alone(tmp_path):
    from vla_rl.policy_factory import build_policy
    from vla_rl.trainer import Trainer

    cfg = parse_config(TrainConfig, [*TINY, "--run_dir", str(tmp_path), "--eval.episodes", "4"])
    trainer = Trainer(cfg)
    with cfg.env.make(seed=cfg.eval.seed) as env:
        torch.manual_seed(0)
        policy = build_policy(cfg.policy, env.spec, smoke=cfg.smoke)  # random weights: flow noise decides what the policy does
        state = torch.random.get_rng_state()
        first = trainer._evaluate(policy, env, 0, None, "a")
        assert torch.equal(torch.random.get_rng_state(), state), "evaluation consumed the training RNG"
        torch.rand(123)  # a different global stream
        second = trainer._evaluate(policy, env, 0, None, "b")
    assert first.mean_return == second.mean_return and first.mean_length == second.mean_length
    assert first.successes == second.successes


def test_freeze_encoder_trains_only_the_action_head_and_critic(tmp_path):
    from vla_rl.algorithms.ppo import PPOLearner
    from vla_rl.rollout import RolloutEngine
    from vla_rl.policy_factory import build_policy

    cfg = parse_config(TrainConfig, [*TINY, "--run_dir", str(tmp_path), "--algo.freeze_encoder", "true",
                                     "--algo.critic_warmup_iters", "0"])
    with cfg.env.make(seed=0) as env:
        torch.manual_seed(0)
        policy = build_policy(cfg.policy, env.spec, smoke=cfg.smoke)
        encoder = {id(p) for p in policy.encoder_parameters()}
        assert encoder and len(encoder) < len(list(policy.parameters()))
        before = {n: p.detach().clone() for n, p in policy.named_parameters()}
        learner = PPOLearner(cfg.algo, policy)
        trained = {id(p) for g in learner.optimizer.param_groups for p in g["params"]}
        assert not trained & encoder, "the optimizer holds encoder parameters"
        engine = RolloutEngine(env, policy, use_critic=True)
        engine.reset(seed=0)
        learner.update(engine.collect(4))
    changed = {n for n, p in policy.named_parameters() if not torch.equal(p, before[n])}
    assert any(n.startswith("expert.") for n in changed), changed
    assert not any(n.startswith(("prefix.", "hashed_text.")) for n in changed), changed


def test_freeze_encoder_needs_a_policy_that_names_its_encoder():
    from tests.vla_rl.toy_policy import GaussianPolicy
    from vla_rl.algorithms.ppo import PPOConfig, PPOLearner

    with pytest.raises(ValueError, match="freeze_encoder"):
        PPOLearner(PPOConfig(freeze_encoder=True), GaussianPolicy(state_dim=1, action_dim=1))


def test_state_critic_is_sized_from_the_env_spec_and_reads_the_env_observation():
    from vla_rl.policy_factory import build_policy

    cfg = parse_config(TrainConfig, [*TINY, "--policy.value_placement", "state"])
    with cfg.env.make() as env:
        obs = env.reset(seed=3)
        policy = build_policy(cfg.policy, env.spec, smoke=cfg.smoke)
        assert policy.dims.critic_state_dim == obs["observation.state"].shape[1] + obs["observation.env_state"].shape[1]
        values = policy.value(obs)
    assert values.shape == (cfg.env.num_envs,) and torch.isfinite(values).all()


def test_a_checkpoint_sampled_with_another_sampler_is_announced(tmp_path, capsys):
    import dataclasses
    import json

    from policies.flow.sampler import SamplerConfig, SdeMode
    from vla_rl.policy_factory import note_sampler_change

    saved = SamplerConfig(sde_mode=SdeMode.FULL_CHAIN)
    (tmp_path / "config.json").write_text(json.dumps({"type": "compact-flow", "sampler": json.loads(json.dumps(
        dataclasses.asdict(saved), default=lambda v: v.value))}))
    note_sampler_change(str(tmp_path), saved)
    assert capsys.readouterr().out == ""
    note_sampler_change(str(tmp_path), SamplerConfig(sde_mode=SdeMode.ONE_STEP))
    assert "sampling with another policy.sampler than the checkpoint was saved with (sde_mode='full_chain' -> " \
        "'one_step')" in capsys.readouterr().out
