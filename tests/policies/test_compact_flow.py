"""The compact CPU flow VLA: act / evaluate / value, SFT, checkpoints, input errors."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from policies.base import ActMode, LogProbLevel
from policies.compact import CompactFlowConfig, CompactFlowPolicy, TextEncoderKind
from policies.compact.modules import flow_matching_loss
from policies.flow.sampler import ChainReduce, SamplerConfig, SamplerKind, SdeMode
from policies.flow.value import ValuePlacement
from policies.io import CheckpointError, ObservationError
from policies.loading import load_policy
from policies.registry import POLICIES

torch.set_num_threads(1)

SAMPLERS = [
    SamplerConfig(kind=SamplerKind.FLOW_SDE, sde_mode=SdeMode.ONE_STEP, num_steps=3),
    SamplerConfig(kind=SamplerKind.FLOW_SDE, sde_mode=SdeMode.FULL_CHAIN, num_steps=3),
    SamplerConfig(kind=SamplerKind.FLOW_SDE, sde_mode=SdeMode.FULL_CHAIN, chain_reduce=ChainReduce.SUM, num_steps=3),
    SamplerConfig(kind=SamplerKind.FLOW_NOISE, num_steps=3),
]


def tiny_config(**kw: object) -> CompactFlowConfig:
    base = dict(
        cameras=("front", "wrist"), image_size=(32, 32), state_dim=5, action_dim=3, chunk_size=4, width=32,
        heads=2, expert_layers=1, cnn_channels=(8, 16), image_tokens=2, text_encoder=TextEncoderKind.HASHED,
        text_buckets=64, value_hidden=16, noise_hidden=16, sampler=SAMPLERS[0],
    )
    base.update(kw)
    return CompactFlowConfig(**base)  # type: ignore[arg-type]


def make_obs(b: int = 3, size: int = 32, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "observation.images.front": torch.randint(0, 256, (b, size, size, 3), dtype=torch.uint8, generator=g),
        "observation.images.wrist": torch.randint(0, 256, (b, size, size, 3), dtype=torch.uint8, generator=g),
        "observation.state": torch.randn(b, 5, generator=g),
        "task": [f"pick up cube {i % 2}" for i in range(b)],
    }


def test_registered_with_its_config() -> None:
    entry = POLICIES.get("compact-flow")
    assert entry.obj is CompactFlowPolicy and entry.config is CompactFlowConfig


@pytest.mark.parametrize("level", list(LogProbLevel))
def test_act_shapes_and_eval_mode_is_the_deterministic_ode(level: LogProbLevel) -> None:
    policy = CompactFlowPolicy(tiny_config(logp_level=level))
    obs = make_obs()
    out = policy.act(obs, ActMode.EXPLORE)
    want_logp = {LogProbLevel.TOKEN: (3, 4, 3), LogProbLevel.ACTION: (3, 4), LogProbLevel.CHUNK: (3,)}[level]
    assert out.actions.shape == (3, 4, 3) and out.logp.shape == want_logp and out.value.shape == (3,)
    assert torch.isfinite(out.logp).all() and float(out.logp.abs().sum()) > 0
    e1 = policy.act(obs, ActMode.EVAL, generator=torch.Generator().manual_seed(5))
    e2 = policy.act(obs, ActMode.EVAL, generator=torch.Generator().manual_seed(5))
    assert e1.extras == {} and float(e1.logp.abs().sum()) == 0.0
    torch.testing.assert_close(e1.actions, e2.actions, rtol=0, atol=0)
    assert e1.value is None  # evaluation reads no value, so EVAL skips the critic's expert pass
    torch.testing.assert_close(policy.value(obs), out.value)  # value depends on the observation only


@pytest.mark.parametrize("sampler", SAMPLERS, ids=lambda s: f"{s.kind.value}-{s.sde_mode.value}-{s.chain_reduce.value}")
@pytest.mark.parametrize("placement", [ValuePlacement.EXPERT, ValuePlacement.PREFIX])
def test_evaluate_reproduces_act_and_gradients_reach_trained_params(
    sampler: SamplerConfig, placement: ValuePlacement
) -> None:
    policy = CompactFlowPolicy(tiny_config(sampler=sampler, value_placement=placement))
    obs = make_obs()
    out = policy.act(obs)
    logp, entropy, value = policy.evaluate(obs, out.extras)
    torch.testing.assert_close(logp, out.logp, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(value, out.value, rtol=1e-5, atol=1e-5)
    assert entropy.shape == logp.shape
    (logp.sum() + value.sum() + 0.01 * entropy.sum()).backward()
    for name in ("prefix.cameras.0.blocks.0.0.weight", "prefix.cameras.1.proj.weight", "prefix.text_proj.weight",
                 "hashed_text.bag.weight", "expert.action_out.weight", "expert.state_proj.weight",
                 "value_head.net.3.weight"):
        grad = dict(policy.named_parameters())[name].grad
        assert grad is not None and float(grad.abs().sum()) > 0, name
    if sampler.kind is SamplerKind.FLOW_NOISE:
        assert all(float(p.grad.abs().sum()) > 0 for p in policy.noise_net.parameters())


def test_evaluate_detects_a_changed_action_log_prob() -> None:
    """Perturbing a recorded chain must change the re-scored log-prob (no trivially equal values)."""
    policy = CompactFlowPolicy(tiny_config(sampler=SAMPLERS[1]))
    obs = make_obs()
    out = policy.act(obs)
    extras = {k: v.clone() for k, v in out.extras.items()}
    extras["flow.chain"][:, -1] += 0.5
    logp, _, _ = policy.evaluate(obs, extras)
    assert float((logp.detach() - out.logp).abs().min()) > 1e-3


def test_save_load_round_trip_gives_identical_actions(tmp_path: Path) -> None:
    policy = CompactFlowPolicy(tiny_config(sampler=SAMPLERS[3]))
    policy.set_normalization(torch.arange(5.0), torch.full((5,), 2.0), torch.tensor([1.0, -1.0, 0.5]),
                             torch.tensor([0.1, 0.2, 0.3]))
    folder = tmp_path / "ckpt"
    policy.save_pretrained(folder)
    policy.save_pretrained(folder)  # overwriting an existing checkpoint works
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temporary folders left behind
    config = json.loads((folder / "config.json").read_text())
    assert config["type"] == "compact-flow" and config["sampler"]["kind"] == "flow_noise"
    loaded = load_policy(folder)
    assert isinstance(loaded, CompactFlowPolicy)
    obs = make_obs()
    for mode in ActMode:
        torch.manual_seed(11)
        a = policy.act(obs, mode)
        torch.manual_seed(11)
        b = loaded.act(obs, mode)
        torch.testing.assert_close(a.actions, b.actions, rtol=0, atol=0)
        torch.testing.assert_close(a.logp, b.logp, rtol=0, atol=0)
    torch.testing.assert_close(loaded.action_mean, torch.tensor([1.0, -1.0, 0.5]))


def test_loading_checks_type_and_files(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="config.json"):
        CompactFlowPolicy.from_pretrained(tmp_path)
    CompactFlowPolicy(tiny_config()).save_pretrained(tmp_path / "c")
    raw = json.loads((tmp_path / "c" / "config.json").read_text())
    (tmp_path / "c" / "config.json").write_text(json.dumps({**raw, "type": "pi0"}))
    with pytest.raises(CheckpointError, match="expected 'compact-flow'"):
        CompactFlowPolicy.from_pretrained(tmp_path / "c")


def test_state_only_policy_without_cameras() -> None:
    policy = CompactFlowPolicy(tiny_config(cameras=()))
    obs = {k: v for k, v in make_obs().items() if not k.startswith("observation.images.")}
    out = policy.act(obs)
    assert out.actions.shape == (3, 4, 3)
    torch.testing.assert_close(policy.evaluate(obs, out.extras)[0], out.logp, rtol=1e-4, atol=1e-4)


def test_wrong_observations_raise_errors_naming_keys_and_shapes() -> None:
    policy = CompactFlowPolicy(tiny_config())
    obs = make_obs()
    bad = dict(obs)
    del bad["observation.images.wrist"]
    with pytest.raises(ObservationError, match=r"observation\.images\.wrist.*expected keys"):
        policy.act(bad)
    wrong_size = r"observation\.images\.front must be uint8 \[3, 32, 32, 3\].*\[3, 64, 64, 3\]"
    with pytest.raises(ObservationError, match=wrong_size):
        policy.act({**obs, "observation.images.front": make_obs(size=64)["observation.images.front"]})
    with pytest.raises(ObservationError, match=r"observation\.state must be float \[B, 5\]"):
        policy.act({**obs, "observation.state": torch.zeros(3, 7)})
    with pytest.raises(ObservationError, match="dtype uint8"):
        policy.act({**obs, "observation.images.front": obs["observation.images.front"].float()})
    with pytest.raises(ObservationError, match="list of 3 strings"):
        policy.act({**obs, "task": ["only one"]})


def test_sft_learns_a_demo_mapping_and_normalization_round_trips() -> None:
    torch.manual_seed(0)
    policy = CompactFlowPolicy(tiny_config(sampler=replace(SAMPLERS[0], num_steps=5)))
    obs = make_obs(b=8)
    # demo: the action chunk is a fixed function of the state, in un-normalized units
    actions = (obs["observation.state"][:, :3, None] * 3.0 + 10.0).transpose(1, 2).expand(8, 4, 3).contiguous()
    policy.fit_normalization(obs["observation.state"], actions)
    torch.testing.assert_close(policy.actions_to_env(policy.normalize_actions(actions)), actions)
    opt = torch.optim.Adam(policy.parameters(), lr=3e-3)
    first = None
    for _ in range(150):
        loss = policy.sft_loss(obs, actions)
        opt.zero_grad()
        loss.backward()
        opt.step()
        first = float(loss.detach()) if first is None else first
    assert float(loss.detach()) < 0.5 * first
    err_after = (policy.act(obs, ActMode.EVAL).actions - actions).abs().mean()
    assert float(err_after) < 0.5 * float(actions.std())
    with pytest.raises(ValueError, match=r"\[B, H, A\] = \[8, 4, 3\]"):
        policy.sft_loss(obs, actions[:, :2])


def test_minilm_text_encoder_is_frozen_cached_and_distinguishes_instructions() -> None:
    policy = CompactFlowPolicy(tiny_config(text_encoder=TextEncoderKind.MINILM))
    assert not any("minilm" in n for n, _ in policy.named_parameters())
    emb = policy._text(["pick up the red cube", "pick up the red cube", "open the drawer"])
    assert emb.shape == (3, 384)
    torch.testing.assert_close(emb.norm(dim=-1), torch.ones(3))
    torch.testing.assert_close(emb[0], emb[1])
    assert float((emb[0] - emb[2]).abs().max()) > 1e-2
    assert len(policy.minilm._cache) == 2
    similar = policy._text(["pick up the blue cube"])[0]
    assert float(similar @ emb[0]) > float(emb[2] @ emb[0])  # a real sentence encoder, not random
    out = policy.act(make_obs())
    assert out.actions.shape == (3, 4, 3)


def test_global_conditioning_is_a_direct_path_from_the_observation_to_the_actions() -> None:
    """With ``global_cond`` the velocity depends on the state through the MLP even with attention cut off."""
    torch.manual_seed(0)
    with_cond = CompactFlowPolicy(tiny_config())
    without = CompactFlowPolicy(tiny_config(global_cond=False))
    assert with_cond.expert.cond_mlp is not None and without.expert.cond_mlp is None
    n_with = sum(p.numel() for p in with_cond.parameters())
    n_without = sum(p.numel() for p in without.parameters())
    assert n_with > n_without
    expert = with_cond.expert
    x = torch.randn(2, expert.pos.shape[0] - 1, with_cond.config.action_dim)
    t = torch.full((2,), 0.5)
    prefix = torch.randn(2, 3, with_cond.config.width)
    state = torch.randn(2, with_cond.config.state_dim)
    v1, _ = expert(state, x, t, prefix)
    v2, _ = expert(state + 1.0, x, t, prefix)
    assert not torch.allclose(v1, v2)


def test_action_expert_with_cached_memory_matches_the_torch_decoder() -> None:
    """The expert's own layer loop (keys/values projected once) computes what nn.TransformerDecoder computes."""
    from policies.compact.modules import ActionExpert, sinusoidal_time_embedding

    torch.manual_seed(0)
    expert = ActionExpert(state_dim=5, action_dim=3, horizon=4, width=32, heads=4, layers=2).train()
    state, x_t, t, prefix = torch.randn(6, 5), torch.randn(6, 4, 3), torch.rand(6), torch.randn(6, 9, 32)
    act = expert.action_time_mlp(torch.cat(
        [expert.action_in(x_t), sinusoidal_time_embedding(t, 32)[:, None, :].expand(6, 4, 32)], dim=-1))
    state_tok = expert.state_proj(state)
    act = act + expert.cond_mlp(torch.cat([state_tok, prefix.mean(1)], dim=-1))[:, None, :]
    reference = expert.decoder(torch.cat([state_tok[:, None, :], act], dim=1) + expert.pos, prefix)[:, 1:]

    velocity, features = expert(state, x_t, t, prefix)
    torch.testing.assert_close(features, reference, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(velocity, expert.action_out(reference), rtol=1e-5, atol=1e-5)
    memory = expert.memory(prefix)
    for _ in range(2):  # reused across denoising steps
        v2, f2 = expert(state, x_t, t, memory)
        torch.testing.assert_close(v2, velocity)
    # gradients reach the cross-attention projections through the cached keys/values
    v2.sum().backward()
    assert expert.decoder.layers[0].multihead_attn.in_proj_weight.grad.abs()[32:].sum() > 0


def test_privileged_state_critic_reads_state_and_env_state_but_not_the_images() -> None:
    """``value_placement='state'`` (asymmetric actor-critic): the value is a function of
    ``[observation.state, observation.env_state]`` only, agrees between act / evaluate / value, and trains."""
    policy = CompactFlowPolicy(tiny_config(sampler=SAMPLERS[1], value_placement=ValuePlacement.STATE, env_state_dim=6))
    obs = make_obs()
    obs["observation.env_state"] = torch.randn(3, 6, generator=torch.Generator().manual_seed(1))
    out = policy.act(obs)
    logp, _, value = policy.evaluate(obs, out.extras)
    torch.testing.assert_close(value, out.value, rtol=0, atol=0)
    torch.testing.assert_close(policy.value(obs), out.value, rtol=0, atol=0)
    other_images = {**obs, **{k: v for k, v in make_obs(seed=9).items() if k.startswith("observation.images.")}}
    torch.testing.assert_close(policy.value(other_images), out.value, rtol=0, atol=0)
    moved = {**obs, "observation.env_state": obs["observation.env_state"] + 0.5}
    assert float((policy.value(moved) - out.value).detach().abs().min()) > 0
    value.sum().backward()
    assert all(float(p.grad.abs().sum()) > 0 for p in policy.value_head.parameters())
    assert policy.prefix.text_proj.weight.grad is None  # the critic does not reach the actor
    with pytest.raises(ObservationError, match="observation.env_state"):
        policy.value({k: v for k, v in obs.items() if k != "observation.env_state"})
    with pytest.raises(ObservationError, match=r"\[B, 11\]"):
        policy.value({**obs, "observation.env_state": torch.zeros(3, 4)})
    with pytest.raises(ValueError, match="env_state"):
        CompactFlowPolicy(tiny_config(value_placement=ValuePlacement.STATE))


def test_flow_matching_loss_hand_computed() -> None:
    f64 = torch.float64
    actions = torch.tensor([[[1.0, 2.0], [0.0, -1.0]]], dtype=f64)  # [B=1, H=2, A=2]
    noise = torch.tensor([[[0.0, 1.0], [1.0, 1.0]]], dtype=f64)
    # target u = noise - actions = [[-1, -1], [1, 2]]; prediction off by [[1, 0], [2, 2]]
    pred = torch.tensor([[[0.0, -1.0], [3.0, 4.0]]], dtype=f64, requires_grad=True)
    loss = flow_matching_loss(pred, noise, actions)
    torch.testing.assert_close(loss, torch.tensor((1.0 + 0.0 + 4.0 + 4.0) / 4, dtype=f64))
    loss.backward()
    torch.testing.assert_close(pred.grad, torch.tensor([[[0.5, 0.0], [1.0, 1.0]]], dtype=f64))  # 2 * diff / 4
    # a perfect predictor of d x_t / d t = noise - actions has zero loss
    torch.testing.assert_close(flow_matching_loss(noise - actions, noise, actions), torch.tensor(0.0, dtype=f64))
    # the padded second step (nan) counts neither in the value (only [1, 0] -> 1 / 2) nor the gradient
    padded = pred.detach().clone()
    padded[0, 1] = float("nan")
    padded.requires_grad_(True)
    masked = flow_matching_loss(padded, noise, actions, mask=torch.tensor([[True, False]]))
    torch.testing.assert_close(masked, torch.tensor(0.5, dtype=f64))
    masked.backward()
    torch.testing.assert_close(padded.grad, torch.tensor([[[1.0, 0.0], [0.0, 0.0]]], dtype=f64))



def test_image_encoder_runs_channels_first_and_matches_the_channels_last_layout() -> None:
    """Camera images arrive ``[B, H, W, 3]``; their permuted view is channels-last, which the convs keep and on which
    GroupNorm's CPU kernels are about 10x slower (a PPO update step about 12% slower in all). The encoder makes the maps
    channels-first before the first conv; its tokens and gradients equal those of the channels-last layout."""
    from policies.compact.modules import ImageEncoder

    torch.manual_seed(0)
    enc = ImageEncoder((16, 32, 64), grid=4, width=32, keypoints=4, film_dim=8)
    for film in enc.film:  # away from identity, so the FiLM path counts too
        torch.nn.init.normal_(film.weight, std=0.1)
    images = torch.randint(0, 256, (3, 32, 32, 3), dtype=torch.uint8)
    cond = torch.randn(3, 8)
    layouts = []
    enc.blocks[0].register_forward_hook(lambda m, i, o: layouts.append(i[0].is_contiguous()))
    ours = enc(images, cond)
    assert layouts == [True]  # channels-first in memory when the first conv runs
    grads_ours = torch.autograd.grad(ours.square().sum(), list(enc.parameters()))

    features = images.permute(0, 3, 1, 2).float() / 127.5 - 1.0  # the channels-last view, as before
    assert not features.is_contiguous()
    for i, block in enumerate(enc.blocks):
        features = block(features)
        gamma, beta = enc.film[i](cond)[:, :, None, None].chunk(2, dim=1)
        features = torch.nn.functional.silu(features * (1.0 + gamma) + beta)
    tokens = enc.proj(enc.pool(features).flatten(2).transpose(1, 2)) + enc.pos
    from policies.compact.modules import spatial_softmax

    theirs = torch.cat([tokens, enc.kp_proj(spatial_softmax(enc.kp_maps(features))) + enc.kp_embed], dim=1)
    grads_theirs = torch.autograd.grad(theirs.square().sum(), list(enc.parameters()))
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    for a, b in zip(grads_ours, grads_theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)  # float summation order differs
