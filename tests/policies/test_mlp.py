"""The ``gaussian-mlp`` policy (act / evaluate agreement, entropy, BC, checkpoints, input errors) and the compact
flow policy's ``actor_env_state`` (privileged state into the actor, no camera)."""

from __future__ import annotations

import math

import pytest
import torch

from policies.base import ActMode, LogProbLevel
from policies.compact import CompactFlowConfig, CompactFlowPolicy, TextEncoderKind
from policies.flow.sampler import SamplerConfig
from policies.io import ObservationError
from policies.loading import load_policy
from policies.mlp import GaussianMLPConfig, GaussianMLPPolicy
from policies.mlp.policy import RAW
from policies.registry import POLICIES

torch.set_num_threads(1)

S, P, A = 5, 4, 3


def make_obs(b: int = 6, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "observation.state": torch.randn(b, S, generator=g),
        "observation.env_state": torch.randn(b, P, generator=g),
        "task": [f"pick up cube {i % 3}" for i in range(b)],
    }


def mlp_policy(**kw: object) -> GaussianMLPPolicy:
    torch.manual_seed(0)
    base: dict = dict(state_dim=S, env_state_dim=P, action_dim=A, hidden=(16, 16))
    base.update(kw)
    return GaussianMLPPolicy(GaussianMLPConfig(**base))


def test_registered_and_loadable_by_type(tmp_path) -> None:
    entry = POLICIES.get("gaussian-mlp")
    assert entry.obj is GaussianMLPPolicy and entry.config is GaussianMLPConfig
    policy = mlp_policy()
    policy.save_pretrained(tmp_path / "p")
    assert isinstance(load_policy(tmp_path / "p"), GaussianMLPPolicy)


@pytest.mark.parametrize("chunk", [1, 4])
@pytest.mark.parametrize("level", list(LogProbLevel))
def test_evaluate_rescores_the_act_sample_exactly(chunk: int, level: LogProbLevel) -> None:
    policy = mlp_policy(chunk_size=chunk, logp_level=level, init_log_std=0.5)  # std 1.6: many samples get clipped
    obs = make_obs()
    with torch.no_grad():
        out = policy.act(obs, ActMode.EXPLORE)
    assert out.actions.shape == (6, chunk, A)
    assert out.actions.abs().max() <= 1.0 and out.extras[RAW].abs().max() > 1.0  # the env gets clipped actions
    want = {LogProbLevel.TOKEN: (6, chunk, A), LogProbLevel.ACTION: (6, chunk), LogProbLevel.CHUNK: (6,)}[level]
    logp, entropy, value = policy.evaluate(obs, out.extras)
    assert out.logp.shape == want and logp.shape == want and entropy.shape == want
    torch.testing.assert_close(logp, out.logp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(value, out.value)
    # the log-prob is the raw sample's under N(mean, std), not the clipped action's
    with torch.no_grad():
        mean = policy.act(obs, ActMode.EVAL).actions  # inside [-1, 1] here (the last layer's gain is 0.01)
    raw_logp = torch.distributions.Normal(mean, policy.log_std.exp()).log_prob(out.extras[RAW])
    from policies.base import reduce_logp

    torch.testing.assert_close(out.logp, reduce_logp(raw_logp, level), rtol=1e-5, atol=1e-5)
    logp.sum().backward()
    assert policy.log_std.grad is not None and policy.actor[0].weight.grad is not None
    assert all(p.grad is None for p in policy.critic_parameters())  # the log-prob does not reach the critic


def test_entropy_is_the_gaussians() -> None:
    policy = mlp_policy(chunk_size=4, init_log_std=-0.3)
    with torch.no_grad():
        policy.log_std[1, 2] = 0.7
        out = policy.act(make_obs(), ActMode.EXPLORE)
        _, entropy, _ = policy.evaluate(make_obs(), out.extras)
    per_dim = 0.5 * math.log(2 * math.pi * math.e) + policy.log_std  # [H, A]
    torch.testing.assert_close(entropy, per_dim.sum().expand(6))


def test_eval_mode_is_the_clipped_mean_with_zero_logp_and_no_value() -> None:
    policy = mlp_policy(chunk_size=2)
    obs = make_obs()
    with torch.no_grad():
        policy.actor[-1].bias.fill_(0.5)  # a mean that lies inside the bounds for some dims, outside for others
        policy.actor[-1].bias[:A].fill_(3.0)
        a, b = policy.act(obs, ActMode.EVAL), policy.act(obs, ActMode.EVAL)
    assert torch.equal(a.actions, b.actions) and a.value is None and not a.logp.any()
    assert (a.actions[:, 0] == 1.0).all() and (a.actions[:, 1] < 1.0).all()


def test_missing_env_state_is_named_and_a_spec_without_it_is_refused() -> None:
    policy = mlp_policy()
    obs = make_obs()
    del obs["observation.env_state"]
    with pytest.raises(ObservationError, match="observation.env_state"):
        policy.act(obs)
    with pytest.raises(ObservationError, match=r"observation.env_state must be float \[6, 4\]"):
        policy.act({**make_obs(), "observation.env_state": torch.zeros(6, 2)})
    with pytest.raises(ValueError, match="env_state_dim must be >= 1"):
        mlp_policy(env_state_dim=0)


def test_save_load_roundtrip_gives_identical_actions(tmp_path) -> None:
    policy = mlp_policy(chunk_size=4, logp_level="action")
    with torch.no_grad():
        policy.log_std.add_(0.1)
        policy.set_normalization(torch.linspace(-1, 1, S + P), torch.linspace(0.5, 2, S + P))
    policy.save_pretrained(tmp_path / "p")
    policy.save_pretrained(tmp_path / "p")  # overwriting is atomic too
    loaded = GaussianMLPPolicy.from_pretrained(tmp_path / "p")
    assert loaded.config == policy.config
    obs = make_obs()
    torch.manual_seed(5)
    a = policy.act(obs, ActMode.EXPLORE)
    torch.manual_seed(5)
    b = loaded.act(obs, ActMode.EXPLORE)
    assert torch.equal(a.actions, b.actions) and torch.equal(a.logp, b.logp) and torch.equal(a.value, b.value)
    assert torch.equal(policy.act(obs, ActMode.EVAL).actions, loaded.act(obs, ActMode.EVAL).actions)


def test_fit_normalization_keeps_the_identity_and_the_input_fit_standardizes_with_a_floor() -> None:
    policy = mlp_policy()
    policy.fit_normalization(torch.randn(50, S) * 5 + 3, torch.randn(50, A))
    assert torch.equal(policy.input_mean, torch.zeros(S + P)) and torch.equal(policy.input_std, torch.ones(S + P))
    obs = make_obs(b=400, seed=3)
    obs["observation.state"] = obs["observation.state"] * 0.02 + 0.3  # centimetre-scale spread around 0.3 m
    obs["observation.env_state"][:, 0] = 0.02  # a dim the demos never move
    policy.fit_input_normalization(obs)
    x = policy.inputs(obs)
    assert torch.allclose(x[:, :S].mean(0), torch.zeros(S), atol=1e-4)
    assert torch.allclose(x[:, :S].std(0), torch.ones(S), atol=1e-3)
    assert policy.input_std[S] == pytest.approx(0.01)  # floored, not 0
    raw = mlp_policy(normalize_inputs=False)
    raw.fit_input_normalization(obs)
    assert torch.equal(raw.input_std, torch.ones(S + P))


def test_behaviour_cloning_loss_decreases_and_ignores_masked_steps() -> None:
    torch.manual_seed(0)
    policy = mlp_policy(chunk_size=2)
    obs = make_obs(b=64, seed=1)
    x = torch.cat([obs["observation.state"], obs["observation.env_state"]], dim=-1)
    target = torch.tanh(x @ torch.randn(S + P, 2 * A) * 0.5).view(64, 2, A)  # a smooth function of the input
    mask = torch.ones(64, 2, dtype=torch.bool)
    mask[::2, 1] = False
    target[::2, 1] = float("nan")  # padded steps may hold anything
    opt = torch.optim.Adam(policy.parameters(), lr=3e-3)
    losses = []
    for _ in range(150):
        loss = policy.sft_loss(obs, target, mask)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert math.isfinite(losses[-1]) and losses[-1] < 0.2 * losses[0], (losses[0], losses[-1])
    with pytest.raises(ValueError, match=r"\[B, H, A\]"):
        policy.sft_loss(obs, target[:, :1], mask[:, :1])


# -- compact-flow with actor_env_state ----------------------------------------------------------------


def state_only_flow(**kw: object) -> CompactFlowPolicy:
    torch.manual_seed(0)
    base: dict = dict(cameras=(), state_dim=S, env_state_dim=P, action_dim=A, chunk_size=4, width=32, heads=2,
                      expert_layers=1, text_encoder=TextEncoderKind.HASHED, text_buckets=64, value_hidden=16,
                      noise_hidden=16, sampler=SamplerConfig(num_steps=2), actor_env_state=True)
    base.update(kw)
    return CompactFlowPolicy(CompactFlowConfig(**base))


def test_compact_flow_actor_reads_env_state_without_a_camera(tmp_path) -> None:
    policy = state_only_flow()
    assert policy.reads_env_state and not state_only_flow(actor_env_state=False).reads_env_state
    obs = make_obs(b=4)
    torch.manual_seed(1)
    out = policy.act(obs, ActMode.EXPLORE)
    assert out.actions.shape == (4, 4, A)
    logp, _, _ = policy.evaluate(obs, out.extras)
    torch.testing.assert_close(logp, out.logp, rtol=1e-4, atol=1e-4)

    def eval_actions(p: CompactFlowPolicy, o: dict) -> torch.Tensor:
        torch.manual_seed(2)  # the ODE starts from sampled noise: the same noise for every call
        with torch.no_grad():
            return p.act(o, ActMode.EVAL).actions

    moved = {**obs, "observation.env_state": obs["observation.env_state"] + 1.0}
    assert not torch.allclose(eval_actions(policy, obs), eval_actions(policy, moved))  # the actor reads env_state

    policy.fit_normalization(obs["observation.state"], out.actions)  # SFT fits observation.state only
    assert policy.state_mean.shape == (S,)
    policy.save_pretrained(tmp_path / "p")
    loaded = load_policy(tmp_path / "p")
    assert loaded.config.actor_env_state and loaded.config.cameras == ()
    torch.testing.assert_close(eval_actions(loaded, obs), eval_actions(policy, obs), rtol=0, atol=0)


def test_compact_flow_actor_env_state_errors_name_the_key() -> None:
    with pytest.raises(ValueError, match="actor_env_state needs env_state_dim"):
        state_only_flow(env_state_dim=0)
    obs = make_obs()
    del obs["observation.env_state"]
    with pytest.raises(ObservationError, match="observation.env_state"):
        state_only_flow().act(obs)


def test_compact_flow_fits_its_env_state_normalization_from_the_demos(tmp_path) -> None:
    """With ``actor_env_state`` the demos' env_state is standardized (std floored); without it nothing is kept."""
    policy = state_only_flow()
    obs = make_obs(b=300, seed=4)
    obs["observation.env_state"] = obs["observation.env_state"] * 0.02 + 0.3
    obs["observation.env_state"][:, 1] = 0.02  # never moves in the demos
    policy.fit_input_normalization(obs)
    assert torch.allclose(policy.env_state_mean[0], obs["observation.env_state"][:, 0].mean())
    assert float(policy.env_state_std[1]) == pytest.approx(0.01)
    before = policy.act(obs, ActMode.EVAL, noise=torch.zeros(300, policy.chunk_size, A)).actions
    policy.save_pretrained(tmp_path / "p")
    loaded = load_policy(tmp_path / "p")
    assert torch.equal(loaded.env_state_std, policy.env_state_std)
    torch.testing.assert_close(loaded.act(obs, ActMode.EVAL, noise=torch.zeros(300, policy.chunk_size, A)).actions,
                               before)
    plain = CompactFlowPolicy(CompactFlowConfig(cameras=(), state_dim=S, env_state_dim=P, action_dim=A,
                                                text_encoder=TextEncoderKind.HASHED, width=16, heads=2))
    plain.fit_input_normalization(obs)
    assert not hasattr(plain, "env_state_std")
