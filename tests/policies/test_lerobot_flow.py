"""LeRobot pi0 / pi0.5 / SmolVLA adapters, on tiny random models built with LeRobot's own classes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch

pytest.importorskip("lerobot.policies.pi0", reason="LeRobot with the [pi,smolvla] extras is not installed")

from policies.base import ActMode, LogProbLevel  # noqa: E402
from policies.flow.lerobot import (  # noqa: E402
    LeRobotFlowPolicy,
    LeRobotPI0Policy,
    LeRobotPI05Policy,
    LeRobotSmolVLAPolicy,
    PI0AdapterConfig,
)
from policies.flow.sampler import SamplerConfig, SamplerKind, SdeMode  # noqa: E402
from policies.flow.tiny import build_tiny_lerobot_policy, tiny_paligemma_configs  # noqa: E402
from policies.flow.value import ValuePlacement  # noqa: E402
from policies.io import CheckpointError, ObservationError  # noqa: E402
from policies.loading import load_policy  # noqa: E402
from policies.registry import POLICIES  # noqa: E402

torch.set_num_threads(1)
KINDS = ["pi0", "pi05", "smolvla"]
B, H, A, A_MODEL = 2, 4, 3, 8
SAMPLERS = {
    "sde-one-step": SamplerConfig(kind=SamplerKind.FLOW_SDE, sde_mode=SdeMode.ONE_STEP, num_steps=3),
    "sde-full-chain": SamplerConfig(kind=SamplerKind.FLOW_SDE, sde_mode=SdeMode.FULL_CHAIN, num_steps=3),
    "flow-noise": SamplerConfig(kind=SamplerKind.FLOW_NOISE, num_steps=3),
}
# Trained parameters that must receive gradients from evaluate(): the action expert, its projections,
# and (pi0 / pi0.5, whose VLM is trainable) the vision tower.
EXPECT_GRAD = {
    "pi0": ["gemma_expert.model.layers.0.self_attn.q_proj", "action_in_proj", "action_out_proj",
            "action_time_mlp_in", "state_proj", "vision_tower.vision_model.embeddings.patch_embedding"],
    "pi05": ["gemma_expert.model.layers.1.mlp.down_proj", "action_in_proj", "action_out_proj",
             "gemma_expert.model.layers.0.input_layernorm",  # adaRMS (its zero init blocks time_mlp grads at first)
             "vision_tower.vision_model.embeddings.patch_embedding"],
    "smolvla": ["lm_expert.layers.1.self_attn.q_proj", "action_in_proj", "action_out_proj", "action_time_mlp_in",
                "state_proj"],
}


@pytest.fixture(scope="module")
def vlm_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny-smolvlm")


@pytest.fixture(scope="module")
def policies(vlm_folder: Path) -> Iterator[dict[str, LeRobotFlowPolicy]]:
    torch.manual_seed(0)
    yield {k: build_tiny_lerobot_policy(k, vlm_folder=vlm_folder) for k in KINDS}


def make_obs(size: int = 64, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "observation.images.front": torch.randint(0, 256, (B, size, size, 3), dtype=torch.uint8, generator=g),
        "observation.state": torch.randn(B, 5, generator=g),
        "task": ["pick up the red cube", "open the drawer"],
    }


def test_registered_under_lerobot_type_names() -> None:
    assert POLICIES.get("pi0").obj is LeRobotPI0Policy and POLICIES.get("pi0").config is PI0AdapterConfig
    assert POLICIES.get("pi05").obj is LeRobotPI05Policy
    assert POLICIES.get("smolvla").obj is LeRobotSmolVLAPolicy
    assert POLICIES.make_config("pi05").value_placement is ValuePlacement.PREFIX
    assert POLICIES.make_config("pi0").value_placement is ValuePlacement.EXPERT


@pytest.mark.parametrize("kind", KINDS)
def test_ode_equals_lerobot_sample_actions_for_the_same_noise(policies: dict, kind: str) -> None:
    policy = policies[kind]
    policy.configure_sampler(SamplerConfig(num_steps=10))  # LeRobot's own K for these configs
    obs = make_obs()
    noise = torch.randn(B, H, A_MODEL, generator=torch.Generator().manual_seed(1))
    ours = policy.act(obs, ActMode.EVAL, noise=noise)
    reference = policy.reference_actions(obs, noise)
    assert ours.actions.shape == (B, H, A)
    torch.testing.assert_close(ours.actions, reference, rtol=0, atol=1e-6)
    other = policy.act(obs, ActMode.EVAL, noise=noise + 1.0)
    assert float((other.actions - ours.actions).abs().max()) > 1e-4  # the noise is really used


@pytest.mark.parametrize("sampler", list(SAMPLERS))
@pytest.mark.parametrize("kind", KINDS)
def test_evaluate_reproduces_act_and_gradients_flow(policies: dict, kind: str, sampler: str) -> None:
    policy = policies[kind]
    policy.configure_sampler(SAMPLERS[sampler])
    policy.logp_level = LogProbLevel.ACTION
    obs = make_obs(seed=2)
    out = policy.act(obs, ActMode.EXPLORE)
    assert out.actions.shape == (B, H, A) and out.logp.shape == (B, H) and out.value.shape == (B,)
    assert torch.isfinite(out.logp).all() and float(out.logp.abs().sum()) > 0
    policy.zero_grad(set_to_none=True)
    logp, entropy, value = policy.evaluate(obs, out.extras)
    torch.testing.assert_close(logp, out.logp, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(value, out.value, rtol=1e-5, atol=1e-5)
    (logp.sum() + value.sum() + 0.01 * entropy.sum()).backward()
    grads = {n: p.grad for n, p in policy.named_parameters()}
    for fragment in EXPECT_GRAD[kind] + ["value_head.net.1"]:
        hits = [n for n in grads if fragment in n]
        assert hits, fragment
        assert all(grads[n] is not None and float(grads[n].abs().sum()) > 0 for n in hits), fragment
    if sampler == "flow-noise":
        assert all(float(p.grad.abs().sum()) > 0 for p in policy.noise_net.parameters())
    policy.logp_level = LogProbLevel.CHUNK


def test_value_placements_follow_pi_rl(policies: dict) -> None:
    assert policies["pi0"].value_placement is ValuePlacement.EXPERT
    assert policies["pi05"].value_placement is ValuePlacement.PREFIX
    pi05 = policies["pi05"]
    obs = make_obs(seed=4)
    v1 = pi05.value(obs)
    v2 = pi05.value({**obs, "observation.images.front": make_obs(seed=5)["observation.images.front"]})
    assert v1.shape == (B,) and float((v1 - v2).detach().abs().max()) > 0  # reads the image prefix


@pytest.mark.parametrize("kind", KINDS)
def test_save_load_round_trip_gives_identical_actions(policies: dict, kind: str, tmp_path: Path) -> None:
    policy = policies[kind]
    policy.configure_sampler(SAMPLERS["flow-noise"])
    folder = tmp_path / kind
    policy.save_pretrained(folder)
    lerobot_config = json.loads((folder / "config.json").read_text())
    assert lerobot_config["type"] == kind  # also a plain LeRobot checkpoint
    assert json.loads((folder / "vla_rl_policy.json").read_text())["sampler"]["kind"] == "flow_noise"
    entry = POLICIES.get(kind)
    with tiny_paligemma_configs():
        loaded = load_policy(folder)
        # the registry's uniform constructor, cls(config), loads config.pretrained the same way
        built = entry.obj(entry.config(pretrained=str(folder), sampler=SAMPLERS["flow-noise"]))
    assert type(loaded) is type(policy) and loaded.sampler.kind is SamplerKind.FLOW_NOISE
    torch.testing.assert_close(built.noise_net.net[0].weight, policy.noise_net.net[0].weight, rtol=0, atol=0)
    obs = make_obs(seed=3)
    for mode in ActMode:
        torch.manual_seed(7)
        a = policy.act(obs, mode)
        torch.manual_seed(7)
        b = loaded.act(obs, mode)
        torch.testing.assert_close(a.actions, b.actions, rtol=0, atol=0)
        torch.testing.assert_close(a.logp, b.logp, rtol=0, atol=0)
        torch.testing.assert_close(a.value, b.value, rtol=0, atol=0)


def test_lerobot_config_overrides_adapt_a_checkpoint_to_new_camera_sizes(policies: dict, tmp_path: Path) -> None:
    from lerobot.configs import FeatureType, PolicyFeature

    policies["pi0"].save_pretrained(tmp_path / "p0")
    features = {
        "observation.images.front": PolicyFeature(FeatureType.VISUAL, (3, 32, 32)),
        "observation.state": PolicyFeature(FeatureType.STATE, (5,)),
    }
    with tiny_paligemma_configs():
        loaded = LeRobotPI0Policy.from_pretrained(tmp_path / "p0", lerobot_overrides={"input_features": features})
    out = loaded.act(make_obs(size=32), ActMode.EVAL)  # LeRobot resizes with padding to its 64 px
    assert out.actions.shape == (B, H, A) and torch.isfinite(out.actions).all()
    with pytest.raises(CheckpointError, match="no field 'not_a_field'"):
        LeRobotPI0Policy.from_pretrained(tmp_path / "p0", lerobot_overrides={"not_a_field": 1})


@pytest.mark.parametrize("kind", ["pi0", "pi05"])
def test_plain_lerobot_checkpoint_loads_with_a_given_tokenizer(policies: dict, kind: str, tmp_path: Path) -> None:
    """A folder written by LeRobot alone (no vla-rl files, tokenizer by Hub name) loads like a Hub checkpoint."""
    from policies.flow.tiny import train_tokenizer

    policy = policies[kind]
    policy.lerobot.save_pretrained(tmp_path)
    policy.preprocessor.save_pretrained(tmp_path)
    policy.postprocessor.save_pretrained(tmp_path)
    assert not (tmp_path / "vla_rl_policy.json").exists() and not (tmp_path / "tokenizer").exists()
    with tiny_paligemma_configs():
        loaded = load_policy(tmp_path, tokenizer=train_tokenizer())
    assert loaded.value_placement is POLICIES.make_config(kind).value_placement
    obs = make_obs(seed=8)
    noise = torch.randn(B, H, A_MODEL, generator=torch.Generator().manual_seed(2))
    policy.configure_sampler(loaded.sampler)
    torch.testing.assert_close(loaded.act(obs, ActMode.EVAL, noise=noise).actions,
                               policy.act(obs, ActMode.EVAL, noise=noise).actions, rtol=0, atol=0)


def test_lerobot_weights_without_processor_files_load_with_a_given_tokenizer(policies: dict, tmp_path: Path) -> None:
    """LeRobot's config + weights only: the processors are rebuilt for the given tokenizer and statistics (the
    tokenizer served under the PaliGemma Hub id by :func:`policies.flow.tokenizer.local_hub_tokenizer`)."""
    from policies.flow.tiny import tiny_dataset_stats, train_tokenizer

    policy = policies["pi0"]
    policy.lerobot.save_pretrained(tmp_path)
    assert not (tmp_path / "policy_preprocessor.json").exists()
    with tiny_paligemma_configs():
        loaded = LeRobotPI0Policy.from_pretrained(tmp_path, tokenizer=train_tokenizer(),
                                                  dataset_stats=tiny_dataset_stats(5, A))
    obs = make_obs(seed=8)
    noise = torch.randn(B, H, A_MODEL, generator=torch.Generator().manual_seed(2))
    policy.configure_sampler(loaded.sampler)
    torch.testing.assert_close(loaded.act(obs, ActMode.EVAL, noise=noise).actions,
                               policy.act(obs, ActMode.EVAL, noise=noise).actions, rtol=0, atol=0)


def test_loading_errors_name_the_problem(policies: dict, tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no config.json, model.safetensors"):
        LeRobotPI0Policy.from_pretrained(tmp_path)
    policies["pi05"].save_pretrained(tmp_path / "p05")
    with pytest.raises(CheckpointError, match="holds a 'pi05' policy; load it as 'pi05'"):
        with tiny_paligemma_configs():
            LeRobotPI0Policy.from_pretrained(tmp_path / "p05")
    policies["pi05"].lerobot.save_pretrained(tmp_path / "plain")  # LeRobot's files only
    with pytest.raises(CheckpointError, match="holds a LeRobot 'pi05' model; load it as 'pi05'"):
        LeRobotPI0Policy.from_pretrained(tmp_path / "plain")


@pytest.mark.parametrize("kind", KINDS)
def test_wrong_observations_raise_errors_naming_keys_and_shapes(policies: dict, kind: str) -> None:
    policy = policies[kind]
    obs = make_obs()
    with pytest.raises(ObservationError, match=r"observation\.images\.front.*expected keys"):
        policy.act({k: v for k, v in obs.items() if k != "observation.images.front"})
    with pytest.raises(ObservationError, match=r"\[2, 64, 64, 3\].*got \[2, 32, 32, 3\]"):
        policy.act({**obs, "observation.images.front": make_obs(size=32)["observation.images.front"]})
    with pytest.raises(ObservationError, match=r"observation\.state must be float \[B, 5\]"):
        policy.act({**obs, "observation.state": torch.zeros(B, 6)})


@pytest.mark.parametrize("kind", ["pi0", "pi05"])
def test_fit_normalization_changes_what_the_model_sees(vlm_folder: Path, kind: str) -> None:
    policy = build_tiny_lerobot_policy(kind, vlm_folder=vlm_folder)
    obs = make_obs(seed=9)
    noise = torch.randn(B, H, A_MODEL, generator=torch.Generator().manual_seed(3))
    before = policy.act(obs, ActMode.EVAL, noise=noise).actions
    g = torch.Generator().manual_seed(4)
    policy.fit_normalization(torch.randn(100, 5, generator=g) * 3 + 2, torch.randn(100, H, A, generator=g) * 5 - 1)
    after = policy.act(obs, ActMode.EVAL, noise=noise).actions
    # actions are unnormalized with the new statistics (std 5, mean -1): a clearly different scale
    assert float((after - before).abs().mean()) > 0.5
    torch.testing.assert_close(policy.reference_actions(obs, noise), after, rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_sft_loss_is_lerobots_flow_matching_loss_and_trains(policies: dict, kind: str) -> None:
    policy = policies[kind]
    obs = make_obs(seed=6)
    actions = torch.randn(B, H, A, generator=torch.Generator().manual_seed(0))
    policy.zero_grad(set_to_none=True)
    loss = policy.sft_loss(obs, actions)
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    grad = policy.lerobot.model.action_out_proj.weight.grad
    assert grad is not None and float(grad.abs().sum()) > 0
    with pytest.raises(ValueError, match=r"\[B, H, A\] = \[2, 4, 3\]"):
        policy.sft_loss(obs, actions[:, :, :2])


@pytest.mark.parametrize("kind", KINDS)
def test_encoder_parameters_are_the_vlm_not_the_action_expert(policies: dict, kind: str) -> None:
    policy = policies[kind]
    encoder = {id(p) for p in policy.encoder_parameters()}
    names = {id(p): n for n, p in policy.named_parameters()}
    assert encoder, "no encoder parameters"
    assert all("vision" in names[i] or "language_model" in names[i] or "text_model" in names[i] or "vlm" in names[i]
               or "paligemma" in names[i] for i in encoder)
    head = [n for n, p in policy.named_parameters() if id(p) not in encoder and p.requires_grad]
    assert any("expert" in n for n in head), head[:10]


@pytest.mark.parametrize("kind", ["pi0", "smolvla"])
def test_privileged_state_critic_on_a_lerobot_model(vlm_folder: Path, kind: str) -> None:
    """``value_placement='state'``: the critic reads ``[observation.state (5), observation.env_state (7)]``."""
    config = replace(POLICIES.make_config(kind), value_placement=ValuePlacement.STATE, env_state_dim=7,
                     sampler=SAMPLERS["sde-full-chain"])
    policy = build_tiny_lerobot_policy(kind, adapter_config=config, vlm_folder=vlm_folder)
    obs = {**make_obs(), "observation.env_state": torch.randn(B, 7, generator=torch.Generator().manual_seed(2))}
    out = policy.act(obs)
    _, _, value = policy.evaluate(obs, out.extras)
    torch.testing.assert_close(value, out.value, rtol=0, atol=0)
    torch.testing.assert_close(policy.value(obs), out.value, rtol=0, atol=0)
    moved = {**obs, "observation.env_state": obs["observation.env_state"] + 1.0}
    assert float((policy.value(moved) - out.value).detach().abs().min()) > 0
    assert {n for n, _ in policy.value_head.named_parameters()} and all(
        p is q for p, q in zip(policy.critic_parameters(), policy.value_head.parameters(), strict=True))


@pytest.mark.parametrize("kind", KINDS)
def test_latent_noise_on_a_lerobot_model_trains_only_its_actor_and_round_trips(
    policies: dict, kind: str, tmp_path: Path
) -> None:
    """The latent-noise actor reads the VLM prefix and the normalized state; the LeRobot model stays frozen."""
    policy = policies[kind]
    latent = SamplerConfig(kind=SamplerKind.LATENT_NOISE, num_steps=3, latent_hidden=16)
    policy.configure_sampler(latent)
    try:
        with torch.no_grad():
            for p in policy.latent_actor.parameters():
                p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
        obs = make_obs(seed=6)
        out = policy.act(obs, ActMode.EXPLORE, generator=torch.Generator().manual_seed(2))
        assert out.extras["flow.latent"].shape == (B, H, A_MODEL)
        policy.zero_grad(set_to_none=True)
        logp, entropy, value = policy.evaluate(obs, out.extras)
        torch.testing.assert_close(logp, out.logp, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(value, out.value, rtol=1e-5, atol=1e-5)
        (logp.sum() + value.sum() + 0.01 * entropy.sum()).backward()
        got = {n for n, p in policy.named_parameters() if p.grad is not None}
        assert got and all(n.startswith(("latent_actor.", "value_head.")) for n in got), sorted(got)[:4]
        assert "latent_actor.net.0.weight" in got
        state = make_obs(seed=6)
        state["observation.state"] = state["observation.state"] + 1.0  # the actor reads the state
        moved = policy.evaluate(state, out.extras)[0].detach()
        assert float((moved - out.logp).abs().max()) > 1e-4
        policy.save_pretrained(tmp_path / kind)
        with tiny_paligemma_configs():
            loaded = load_policy(tmp_path / kind)
        assert loaded.sampler.kind is SamplerKind.LATENT_NOISE
        for mode in ActMode:
            a = policy.act(obs, mode, generator=torch.Generator().manual_seed(3))
            b = loaded.act(obs, mode, generator=torch.Generator().manual_seed(3))
            torch.testing.assert_close(a.actions, b.actions, rtol=0, atol=0)
            torch.testing.assert_close(a.logp, b.logp, rtol=0, atol=0)
    finally:
        policy.latent_actor = None  # the module-scoped policies serve the other tests without it
        policy.configure_sampler(SAMPLERS["sde-one-step"])
