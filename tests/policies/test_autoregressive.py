"""The OpenVLA-style policy on a tiny random LLaVA (SigLIP + Llama) with a local BPE tokenizer."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from policies.autoregressive import (
    ACTION_TOKENS,
    PROMPT_IDS,
    PROMPT_MASK,
    AutoregressiveVLAConfig,
    AutoregressiveVLAPolicy,
    BackboneError,
    NormalizationStats,
    TinyVLMConfig,
    decode,
    score,
    token_logp_entropy,
)
from policies.autoregressive.backbones import Prompts, load_backbone
from policies.base import ActMode, LogProbLevel
from policies.io import ObservationError
from policies.loading import load_policy
from policies.registry import POLICIES

torch.set_num_threads(1)

A, H, SIZE = 3, 2, 32
TASKS = ["pick up the red cube", "open the drawer", "push the block to the target", "stack 3 cubes on the mug"]
# init_std 0.3 makes token distributions peaked, so a wrong log-prob or a shuffled token shows.
TINY = TinyVLMConfig(init_std=0.3)


def make_policy(**overrides: object) -> AutoregressiveVLAPolicy:
    values: dict[str, object] = {"action_dim": A, "chunk_size": H, "image_size": (SIZE, SIZE), "tiny": TINY,
                                 "max_text_tokens": 24}
    values.update(overrides)
    torch.manual_seed(1)  # the value head's initialization
    return AutoregressiveVLAPolicy(AutoregressiveVLAConfig(**values))  # type: ignore[arg-type]


def make_obs(batch: int = 4, seed: int = 0, cameras: tuple[str, ...] = ("front",)) -> dict[str, object]:
    g = torch.Generator().manual_seed(seed)
    obs: dict[str, object] = {
        f"observation.images.{cam}": torch.randint(0, 256, (batch, SIZE, SIZE, 3), dtype=torch.uint8, generator=g)
        for cam in cameras
    }
    obs["observation.state"] = torch.randn(batch, 5, generator=g)
    obs["task"] = [TASKS[i % len(TASKS)] for i in range(batch)]
    return obs


@pytest.fixture(scope="module")
def policy() -> AutoregressiveVLAPolicy:
    return make_policy()


# ------------------------------------------------------------------ decoding


def test_token_logp_entropy_on_hand_built_logits() -> None:
    logits = torch.tensor([[5.0, 0.0, 1.0, 2.0, 3.0]])  # V = 5; action ids 2, 3, 4
    tokens = torch.tensor([3])
    logp, entropy = token_logp_entropy(logits, tokens, first_id=2, num_bins=3, temperature=1.0, restrict=True)
    bins = torch.tensor([1.0, 2.0, 3.0])
    expected = bins.log_softmax(-1)
    assert logp.item() == pytest.approx(expected[1].item(), abs=1e-6)
    assert entropy.item() == pytest.approx(-(expected.exp() * expected).sum().item(), abs=1e-6)
    full, _ = token_logp_entropy(logits, tokens, first_id=2, num_bins=3, temperature=1.0, restrict=False)
    assert full.item() == pytest.approx(logits.log_softmax(-1)[0, 3].item(), abs=1e-6)
    assert full.item() < logp.item()  # the full vocabulary spends mass on non-action ids
    hot, _ = token_logp_entropy(logits, tokens, first_id=2, num_bins=3, temperature=2.0, restrict=True)
    assert hot.item() == pytest.approx((bins / 2).log_softmax(-1)[1].item(), abs=1e-6)


@pytest.mark.parametrize("greedy", [True, False])
def test_kv_cache_decoding_matches_rerunning_the_full_sequence(policy: AutoregressiveVLAPolicy, greedy: bool) -> None:
    prompts, pixels = policy.encode_observation(make_obs(4))
    assert len(set(prompts.attention_mask.sum(1).tolist())) > 1  # rows really have different padding
    bins = policy.action_tokenizer
    results = []
    for use_cache in (True, False):
        g = torch.Generator().manual_seed(7)
        with torch.no_grad():
            results.append(decode(policy.backbone, prompts, pixels, 8, bins.first_id, bins.num_bins, greedy=greedy,
                                  temperature=1.3, restrict=True, generator=g, use_cache=use_cache))
    cached, full = results
    assert torch.equal(cached.tokens, full.tokens)
    torch.testing.assert_close(cached.logp, full.logp, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(cached.entropy, full.entropy, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(cached.prompt_hidden, full.prompt_hidden)
    # and one teacher-forced pass scores the same tokens identically
    with torch.no_grad():
        scored = score(policy.backbone, prompts, pixels, cached.tokens, bins.first_id, bins.num_bins, 1.3, True)
    torch.testing.assert_close(scored.logp, cached.logp, atol=1e-4, rtol=1e-4)


def test_left_padding_does_not_change_a_row(policy: AutoregressiveVLAPolicy) -> None:
    """Each env decodes as if alone and unpadded: the padding is masked out."""
    prompts, pixels = policy.encode_observation(make_obs(4))
    bins = policy.action_tokenizer
    assert len(set(prompts.attention_mask.sum(1).tolist())) >= 3  # rows carry different paddings
    with torch.no_grad():
        batched = decode(policy.backbone, prompts, pixels, 6, bins.first_id, bins.num_bins, greedy=True,
                         temperature=1.0, restrict=True)
        for row in range(4):
            real = prompts.input_ids[row, prompts.attention_mask[row] == 1].unsqueeze(0)
            alone = decode(policy.backbone, Prompts(real, torch.ones_like(real)), pixels[row : row + 1], 6,
                           bins.first_id, bins.num_bins, greedy=True, temperature=1.0, restrict=True)
            assert torch.equal(alone.tokens[0], batched.tokens[row])
            torch.testing.assert_close(alone.logp[0], batched.logp[row], atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(alone.prompt_hidden[0], batched.prompt_hidden[row], atol=1e-4, rtol=1e-4)


# -------------------------------------------------------------------- acting


@pytest.mark.parametrize(("level", "shape"), [(LogProbLevel.TOKEN, (4, H, A)), (LogProbLevel.ACTION, (4, H)),
                                               (LogProbLevel.CHUNK, (4,))])
def test_act_shapes_and_evaluate_matches(level: LogProbLevel, shape: tuple[int, ...]) -> None:
    pol = make_policy(logp_level=level, temperature=1.4)
    obs = make_obs(4)
    out = pol.act(obs, ActMode.EXPLORE)
    assert out.actions.shape == (4, H, A) and out.actions.dtype == torch.float32
    assert out.logp.shape == shape and out.value.shape == (4,)
    assert bool((out.actions.abs() < 1).all())
    assert out.extras[ACTION_TOKENS].shape == (4, H * A)
    assert out.extras[PROMPT_IDS].shape == out.extras[PROMPT_MASK].shape
    assert bool((out.logp < 0).all())
    logp, entropy, value = pol.evaluate(obs, out.extras)
    assert logp.shape == entropy.shape == shape
    torch.testing.assert_close(logp, out.logp, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(value, out.value, atol=1e-5, rtol=1e-5)
    assert bool((entropy > 0).all()) and bool((entropy < math.log(256) * H * A).all())


def test_restricted_and_full_vocabulary_log_probs() -> None:
    obs = make_obs(3)
    restricted, full = make_policy(restrict_to_action_bins=True), make_policy(restrict_to_action_bins=False)
    out = full.act(obs)
    logp_full, _, _ = full.evaluate(obs, out.extras)
    torch.testing.assert_close(logp_full, out.logp, atol=1e-4, rtol=1e-4)
    logp_restricted, _, _ = restricted.evaluate(obs, out.extras)  # same weights, same tokens
    assert bool((logp_full < logp_restricted).all())


def test_eval_mode_is_greedy_and_deterministic(policy: AutoregressiveVLAPolicy) -> None:
    obs = make_obs(4)
    first, second = policy.act(obs, ActMode.EVAL), policy.act(obs, "eval")  # type: ignore[arg-type]
    assert torch.equal(first.actions, second.actions)
    assert bool((first.logp == 0).all())
    logp, _, _ = policy.evaluate(obs, first.extras)
    explore = [policy.act(obs, ActMode.EXPLORE, generator=torch.Generator().manual_seed(s)) for s in range(2)]
    assert not torch.equal(explore[0].extras[ACTION_TOKENS], explore[1].extras[ACTION_TOKENS])
    # greedy tokens are each the most likely bin, so they score at least as high as sampled ones
    sampled, _, _ = policy.evaluate(obs, explore[0].extras)
    assert logp.sum() > sampled.sum()


def test_gradients_reach_backbone_vision_and_value_head() -> None:
    pol = make_policy()
    obs = make_obs(2)
    out = pol.act(obs)
    logp, entropy, value = pol.evaluate(obs, out.extras)
    (logp.sum() + 0.01 * entropy.sum() + value.square().sum()).backward()
    model = pol.backbone.model
    for name, param in [("lm_head", model.lm_head.weight),
                        ("vision", model.model.vision_tower.vision_model.embeddings.patch_embedding.weight),
                        ("projector", model.model.multi_modal_projector.linear_1.weight),
                        ("value head", pol.value_head[0].weight)]:
        assert param.grad is not None and bool(param.grad.isfinite().all()), name
        assert param.grad.abs().sum() > 0, name


def test_value_stop_gradient_keeps_critic_loss_out_of_the_backbone() -> None:
    pol = make_policy(value_stop_gradient=True)
    obs = make_obs(2)
    pol.value(obs).sum().backward()
    assert pol.value_head[0].weight.grad is not None
    assert all(p.grad is None for p in pol.backbone.parameters())


def test_multiple_cameras_each_add_image_tokens() -> None:
    pol = make_policy(cameras=("front", "wrist"))
    obs = make_obs(2, cameras=("front", "wrist"))
    out = pol.act(obs)
    image_id = pol.backbone.image_placeholder_id
    assert int((out.extras[PROMPT_IDS][0] == image_id).sum()) == 2 * pol.backbone.num_image_tokens
    changed = dict(obs, **{"observation.images.wrist": torch.zeros(2, SIZE, SIZE, 3, dtype=torch.uint8)})
    logp, _, _ = pol.evaluate(obs, out.extras)
    logp_changed, _, _ = pol.evaluate(changed, out.extras)
    assert not torch.allclose(logp, logp_changed)  # the second camera is read


# ------------------------------------------------------- actions and statistics


def test_demo_actions_round_trip_through_tokens_and_count_clipping() -> None:
    pol = make_policy()
    low, high = torch.tensor([-0.5, 0.0, -2.0]), torch.tensor([0.5, 1.0, 2.0])
    pol.set_normalization(NormalizationStats(action_low=low, action_high=high))
    demo = low + torch.rand(5, H, A) * (high - low)
    tokens = pol.action_tokens(demo)
    assert tokens.shape == (5, H * A) and pol.action_tokenizer.num_clipped == 0
    half_bin = (high - low) / 256
    assert bool(((pol.decode_tokens(tokens) - demo).abs() <= half_bin + 1e-6).all())
    pol.action_tokens(torch.full((1, H, A), 10.0))
    assert pol.action_tokenizer.num_clipped == H * A
    obs = make_obs(5)
    logp, _, _ = pol.evaluate(obs, {**pol.act(obs).extras, ACTION_TOKENS: tokens})  # supervised likelihood
    assert logp.shape == (5, H, A) and bool(logp.isfinite().all())
    with pytest.raises(ValueError, match=r"\[B, 2, 3\]"):
        pol.action_tokens(torch.zeros(5, A))


def test_normalization_stats_validate_shapes() -> None:
    pol = make_policy(state_dim=2)
    with pytest.raises(ValueError, match=r"action_low must have shape \[3\]"):
        pol.set_normalization(NormalizationStats(action_low=torch.zeros(4), action_high=torch.ones(3),
                                                 state_mean=torch.zeros(2), state_std=torch.ones(2)))
    with pytest.raises(ValueError, match=r"state_std must have shape \[2\]"):
        pol.set_normalization(NormalizationStats(action_low=torch.zeros(3), action_high=torch.ones(3),
                                                 state_mean=torch.zeros(2), state_std=torch.ones(5)))
    with pytest.raises(ValueError, match=r"action_high < action_low in dims \[1\]"):
        pol.set_normalization(NormalizationStats(action_low=torch.zeros(3), action_high=torch.tensor([1.0, -1, 1])))
    torch.testing.assert_close(pol.normalizer.action_low, -torch.ones(3))  # nothing installed on error
    pol.set_normalization(NormalizationStats(action_low=-torch.ones(3), action_high=torch.ones(3),
                                             state_mean=torch.tensor([1.0, 2.0]), state_std=torch.tensor([2.0, 0.0])))
    torch.testing.assert_close(pol.normalizer.normalize_state(torch.tensor([[3.0, 5.0]])), torch.tensor([[1.0, 3.0]]))


# ---------------------------------------------------------------- checkpoints


def test_save_load_round_trip_gives_identical_actions(tmp_path: object) -> None:
    pol = make_policy(state_dim=2, temperature=1.2)
    stats = NormalizationStats(action_low=torch.tensor([-0.5, 0.0, -2.0]), action_high=torch.tensor([0.5, 1.0, 2.0]),
                               state_mean=torch.tensor([0.1, 0.2]), state_std=torch.tensor([2.0, 3.0]))
    pol.set_normalization(stats)
    with torch.no_grad():
        pol.value_head[-1].bias.fill_(0.25)  # not the initialization: must come from the file
    folder = tmp_path / "ckpt"  # type: ignore[operator]
    pol.save_pretrained(folder)
    pol.save_pretrained(folder)  # overwriting an existing checkpoint is atomic too
    assert sorted(p.name for p in folder.parent.iterdir()) == ["ckpt"]  # no temp folders left
    saved = json.loads((folder / "config.json").read_text())
    assert saved["type"] == "openvla-style" and saved["temperature"] == 1.2 and saved["chunk_size"] == H
    assert (folder / "model.safetensors").is_file() and (folder / "vlm" / "config.json").is_file()

    loaded = AutoregressiveVLAPolicy.from_pretrained(folder)
    assert loaded.config == pol.config
    torch.testing.assert_close(loaded.normalizer.state_std, stats.state_std)
    obs = make_obs(4, seed=3)
    torch.manual_seed(11)
    before = pol.act(obs)
    torch.manual_seed(11)
    after = loaded.act(obs)
    assert torch.equal(before.actions, after.actions)
    assert torch.equal(before.extras[ACTION_TOKENS], after.extras[ACTION_TOKENS])
    torch.testing.assert_close(before.logp, after.logp)
    torch.testing.assert_close(before.value, after.value)
    assert isinstance(load_policy(folder), AutoregressiveVLAPolicy)
    hotter = AutoregressiveVLAPolicy.from_pretrained(folder, temperature=1.6)
    assert hotter.config.temperature == 1.6
    with pytest.raises(Exception, match="unknown override"):
        AutoregressiveVLAPolicy.from_pretrained(folder, temprature=1.6)
    # a bare VLM folder (no "type") becomes the backbone of a fresh policy: same greedy tokens
    fresh = AutoregressiveVLAPolicy.from_pretrained(folder / "vlm", action_dim=A, chunk_size=H,
                                                    image_size=(SIZE, SIZE), max_text_tokens=24)
    assert fresh.config.backbone == str(folder / "vlm")
    greedy = [p.act(obs, ActMode.EVAL).extras[ACTION_TOKENS] for p in (fresh, pol)]
    assert torch.equal(greedy[0], greedy[1])


def test_registered_with_its_config() -> None:
    entry = POLICIES.get("openvla-style")
    assert entry.obj is AutoregressiveVLAPolicy and entry.config is AutoregressiveVLAConfig
    config = POLICIES.make_config("openvla-style", action_dim=2, tiny=TINY)
    assert config.num_action_tokens == 2
    with pytest.raises(ValueError, match="temperature"):
        AutoregressiveVLAConfig(temperature=0.0)


def test_unsupported_checkpoint_type_names_supported_ones(tmp_path: object) -> None:
    from transformers import BertConfig

    BertConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=1).save_pretrained(tmp_path)
    with pytest.raises(BackboneError, match="'bert' is not supported; supported: llava, openvla"):
        load_backbone(str(tmp_path), "float32", False, TINY)


# ------------------------------------------------------------------ errors


def test_errors_name_expected_keys_and_shapes(policy: AutoregressiveVLAPolicy) -> None:
    obs = make_obs(2)
    with pytest.raises(ObservationError, match=r"expected keys \['observation.images.front', 'task'\]"):
        policy.act({k: v for k, v in obs.items() if k != "observation.images.front"})
    wrong_size = r"observation.images.front must be uint8 \[2, 32, 32, 3\].*got \[2, 64, 64, 3\]"
    with pytest.raises(ObservationError, match=wrong_size):
        policy.act(dict(obs, **{"observation.images.front": torch.zeros(2, 64, 64, 3, dtype=torch.uint8)}))
    with pytest.raises(ObservationError, match="dtype torch.float32"):
        policy.act(dict(obs, **{"observation.images.front": torch.zeros(2, SIZE, SIZE, 3)}))
    with pytest.raises(ObservationError, match="list of B instruction strings"):
        policy.act(dict(obs, task="one string"))
    with pytest.raises(BackboneError, match="max_text_tokens=24"):
        policy.act(dict(obs, task=["pick up " * 20, "open the drawer"]))
    out = policy.act(obs)
    with pytest.raises(KeyError, match="action_tokens"):
        policy.evaluate(obs, {k: v for k, v in out.extras.items() if k != ACTION_TOKENS})
    with pytest.raises(ValueError, match=r"action_tokens \[2, 6\]"):
        policy.evaluate(obs, dict(out.extras, action_tokens=out.extras[ACTION_TOKENS][:, :3]))
    with pytest.raises(ValueError, match="not action tokens"):
        policy.evaluate(obs, dict(out.extras, action_tokens=torch.zeros(2, H * A, dtype=torch.long)))
    assert dataclasses.is_dataclass(policy.config)


def test_sft_loss_is_the_action_tokens_cross_entropy_and_teaches_greedy_decoding() -> None:
    """``sft_loss`` (OpenVLA's fine-tuning loss) is the mean negative log-prob, at temperature 1, of the tokens of the
    given actions, as :meth:`evaluate` scores them; masked steps do not count; a few Adam steps on it make greedy
    decoding play the demonstrated chunks (to the bin)."""
    pol = make_policy(temperature=1.4, logp_level=LogProbLevel.TOKEN)
    obs = make_obs(2, seed=3)
    demo = torch.rand(2, H, A) * 1.6 - 0.8
    tokens = pol.action_tokens(demo)
    extras = {**pol.act(obs).extras, ACTION_TOKENS: tokens}
    scored = make_policy(temperature=1.0, logp_level=LogProbLevel.TOKEN)
    scored.load_state_dict(pol.state_dict())
    per_token = scored.evaluate(obs, extras)[0].reshape(2, H, A)
    torch.testing.assert_close(pol.sft_loss(obs, demo), -per_token.mean(), atol=1e-4, rtol=1e-4)
    mask = torch.tensor([[True, False], [True, True]])
    torch.testing.assert_close(pol.sft_loss(obs, demo, mask), -per_token[mask].mean(), atol=1e-4, rtol=1e-4)
    assert not torch.equal(pol.act(obs, ActMode.EVAL).extras[ACTION_TOKENS], tokens)
    opt = torch.optim.Adam(pol.parameters(), lr=3e-3)
    for _ in range(40):
        opt.zero_grad()
        pol.sft_loss(obs, demo).backward()
        opt.step()
    assert torch.equal(pol.act(obs, ActMode.EVAL).extras[ACTION_TOKENS], tokens)
    with pytest.raises(ValueError, match=r"\[B, 2, 3\]"):
        pol.sft_loss(obs, demo[:, :1])
