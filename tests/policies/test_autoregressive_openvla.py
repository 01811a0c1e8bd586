"""The OpenVLA adapter on an offline stand-in with OpenVLA's attribute layout.

The real checkpoint's remote code cannot be fetched offline, so this builds a
module shaped like ``OpenVLAForActionPrediction`` (``vision_backbone``,
``projector``, ``language_model`` = a real ``LlamaForCausalLM``, ``config``
with ``image_sizes`` / ``norm_stats``) and a processor with ``tokenizer`` and
``image_processor``, then checks what the adapter itself does: placeholder
scatter of patch features, the trailing empty token, OpenVLA's bin scheme,
q01/q99 statistics, and KV-cache decoding equal to re-running the sequence.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM, SiglipImageProcessor

from policies.autoregressive import AutoregressiveVLAConfig, AutoregressiveVLAPolicy, BackboneError, BinScheme, decode
from policies.autoregressive.backbones import OpenVLABackbone
from policies.autoregressive.local_vlm import build_local_tokenizer
from policies.base import ActMode

torch.set_num_threads(1)
SIZE, PATCH = 32, 8


class StandInVisionBackbone(nn.Module):
    """Pixel values ``[B, 3, 32, 32]`` -> patch features ``[B, 16, 24]`` (like Prismatic's featurizer)."""

    def __init__(self) -> None:
        super().__init__()
        self.patchify = nn.Conv2d(3, 24, kernel_size=PATCH, stride=PATCH)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.patchify(pixel_values).flatten(2).transpose(1, 2)


class StandInOpenVLA(nn.Module):
    """The parts of ``OpenVLAForActionPrediction`` the adapter touches."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vision_backbone = StandInVisionBackbone()
        self.projector = nn.Sequential(nn.Linear(24, 64), nn.GELU(), nn.Linear(64, 64))
        text = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=4, initializer_range=0.3)
        self.language_model = LlamaForCausalLM(text)
        self.norm_stats = {
            "bridge_orig": {"action": {"q01": [-0.1, -0.2, 0.0], "q99": [0.1, 0.2, 1.0], "mask": [True, True, False]}},
            "libero_spatial": {"action": {"q01": [-1.0, -1.0, -1.0], "q99": [1.0, 1.0, 1.0]}},
        }
        self.config = SimpleNamespace(image_sizes=[SIZE], use_fused_vision_backbone=False, norm_stats=self.norm_stats)

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")


def make_backbone() -> OpenVLABackbone:
    tokenizer = build_local_tokenizer()
    tokenizer.add_tokens(["\u2581"])  # Llama's empty piece, id 29871 in OpenVLA
    torch.manual_seed(0)
    model = StandInOpenVLA(vocab=len(tokenizer) + 8).eval()  # padded embedding table, like OpenVLA's 32064
    processor = SimpleNamespace(tokenizer=tokenizer, image_processor=SiglipImageProcessor(
        size={"height": SIZE, "width": SIZE}))
    return OpenVLABackbone(model, processor)


def test_openvla_adapter_layout_and_statistics() -> None:
    backbone = make_backbone()
    assert backbone.num_image_tokens == (SIZE // PATCH) ** 2
    assert backbone.bin_scheme is BinScheme.OPENVLA
    assert backbone.image_placeholder_id == len(backbone.tokenizer)  # outside the tokenizer, inside the table
    ids = backbone.text_ids("In: What action should the robot take to open the drawer?\nOut:")
    assert ids[-1] == backbone.tokenizer.get_vocab()["\u2581"]
    with pytest.raises(BackboneError, match="bridge_orig"):
        backbone.action_norm_bounds(None)  # two datasets: ambiguous
    low, high = backbone.action_norm_bounds("bridge_orig")
    torch.testing.assert_close(low, torch.tensor([-0.1, -0.2, -1.0]))  # masked gripper dim stays in [-1, 1]
    torch.testing.assert_close(high, torch.tensor([0.1, 0.2, 1.0]))
    with pytest.raises(BackboneError, match="not in the checkpoint's norm_stats"):
        backbone.action_norm_bounds("droid")


def test_openvla_adapter_kv_cache_matches_rerun_and_policy_round_trip() -> None:
    backbone = make_backbone()
    config = AutoregressiveVLAConfig(backbone="openvla/openvla-7b", trust_remote_code=True, action_dim=3,
                                     image_size=(SIZE, SIZE), max_text_tokens=32, unnorm_key="bridge_orig",
                                     lowercase_instruction=True)
    policy = AutoregressiveVLAPolicy(config, backbone=backbone)
    torch.testing.assert_close(policy.normalizer.action_high, torch.tensor([0.1, 0.2, 1.0]))
    obs = {"observation.images.front": torch.randint(0, 256, (3, SIZE, SIZE, 3), dtype=torch.uint8),
           "task": ["Open the drawer", "pick up the red cube", "push the block to the target"]}
    prompts, pixels = policy.encode_observation(obs)
    assert int((prompts.input_ids == backbone.image_placeholder_id).sum()) == 3 * backbone.num_image_tokens
    bins = policy.action_tokenizer
    with torch.no_grad():
        runs = [decode(backbone, prompts, pixels, 5, bins.first_id, bins.num_bins, greedy=False, temperature=1.0,
                       restrict=True, generator=torch.Generator().manual_seed(3), use_cache=c) for c in (True, False)]
    assert torch.equal(runs[0].tokens, runs[1].tokens)
    torch.testing.assert_close(runs[0].logp, runs[1].logp, atol=1e-4, rtol=1e-4)
    out = policy.act(obs, ActMode.EXPLORE)
    logp, _, value = policy.evaluate(obs, out.extras)
    torch.testing.assert_close(logp, out.logp, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(value, out.value, atol=1e-5, rtol=1e-5)
    assert bool((out.actions[..., 0].abs() <= 0.1).all()) and bool((out.actions[..., 2].abs() <= 1).all())
    with pytest.raises(BackboneError, match=r"at most 1 camera\(s\), config.cameras is \['front', 'wrist'\]"):
        AutoregressiveVLAPolicy(dataclasses.replace(config, cameras=("front", "wrist")), backbone=backbone)
