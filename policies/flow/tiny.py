"""Tiny random LeRobot flow models (pi0, pi0.5, SmolVLA) for offline tests and benchmarks.

LeRobot 0.6.1 builds pi0 / pi0.5 only from the ``gemma_300m`` / ``gemma_2b``
variants and a full-size SigLIP, and its processors fetch the PaliGemma
tokenizer from the Hub. None of that is available offline, so this module:

- :func:`tiny_paligemma_configs`: a context manager that, while building or
  loading a pi0 / pi0.5 model, makes LeRobot's Gemma config factory return a
  tiny config for both variants (8 heads, as LeRobot requires) and shrinks the
  SigLIP tower (its projector maps straight to the tiny text width). Outside
  the context LeRobot is untouched.
- :func:`train_tokenizer`: a byte-level BPE tokenizer trained in code, wrapped
  as ``PreTrainedTokenizerFast`` (stands in for the PaliGemma tokenizer).
- :func:`policies.flow.tokenizer.local_hub_tokenizer` (production code, used
  here) exposes that tokenizer under the PaliGemma Hub id, so LeRobot's own
  processor factories run unchanged.
- :func:`write_tiny_smolvlm`: a local folder with a tiny SmolVLM config and
  processor, usable as SmolVLA's ``vlm_model_name``.

This is a test / smoke fixture: it imports production modules, and no
production module imports it. Real checkpoints load through
:meth:`policies.flow.lerobot_base.LeRobotFlowPolicy.from_pretrained`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from policies.flow.tokenizer import local_hub_tokenizer

_CORPUS = [
    "pick up the red cube", "push the blue block to the goal", "open the drawer", "put the bowl on the plate",
    "stack the green cube on the red cube", "lift the peg upright", "move the arm to the left", "close the gripper",
    "Task: pick up the cube, State: 12 200 31;\nAction: ", "0 1 2 3 4 5 6 7 8 9 10 100 128 255",
]


@dataclass(frozen=True)
class TinyGemma:
    """Sizes of the tiny Gemma used for both the VLM and the action expert (pi0 / pi0.5)."""

    width: int = 64
    depth: int = 2
    mlp_dim: int = 128
    head_dim: int = 16
    vision_hidden: int = 32
    vision_layers: int = 1
    vision_heads: int = 2
    vision_intermediate: int = 64
    patch_size: int = 16
    vocab_size: int = 512


def train_tokenizer(vocab_size: int = 400, named_special: dict[str, str] | None = None) -> Any:
    """A byte-level BPE ``PreTrainedTokenizerFast`` trained on a few robot instructions.

    Special tokens: ``<pad>`` (id 0), ``<bos>``, ``<eos>``, ``<unk>`` plus
    ``named_special`` (attribute name -> token, e.g. ``{"image_token": "<image>"}``,
    exposed as ``tokenizer.image_token`` / ``tokenizer.image_token_id``).
    """
    extra_special = tuple((named_special or {}).values())
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    special = ["<pad>", "<bos>", "<eos>", "<unk>", *extra_special]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(_CORPUS, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>",
        extra_special_tokens=dict(named_special or {}),
    )


@contextlib.contextmanager
def tiny_paligemma_configs(sizes: TinyGemma = TinyGemma()) -> Iterator[None]:
    """While active, LeRobot's pi0 / pi0.5 build tiny Gemma + SigLIP models (see module doc).

    Three names in LeRobot's pi0 / pi0.5 modeling modules are swapped for the
    duration: ``get_gemma_config`` (tiny widths for both variants) and
    ``PaliGemmaForConditionalGenerationWithPiGemma`` (shrinks the SigLIP config
    LeRobot filled in, then builds LeRobot's own class).
    """
    from lerobot.policies.pi0 import modeling_pi0
    from lerobot.policies.pi05 import modeling_pi05

    s = sizes

    def gemma_config(module: Any) -> Any:
        def make(variant: str) -> Any:
            if variant not in ("gemma_300m", "gemma_2b"):
                raise ValueError(f"Unknown variant: {variant}")
            return module.GemmaConfig(
                width=s.width, depth=s.depth, mlp_dim=s.mlp_dim, num_heads=8, num_kv_heads=1, head_dim=s.head_dim
            )

        return make

    def paligemma(real: Any) -> Any:
        def build(config: Any) -> Any:
            vision = config.vision_config
            vision.hidden_size, vision.num_hidden_layers = s.vision_hidden, s.vision_layers
            vision.num_attention_heads, vision.patch_size = s.vision_heads, s.patch_size
            vision.intermediate_size, vision.projection_dim = s.vision_intermediate, s.width
            config.projection_dim = s.width
            config.text_config.num_image_tokens = (vision.image_size // vision.patch_size) ** 2
            config._vocab_size = config.text_config.vocab_size = config.image_token_index = s.vocab_size
            return real(config=config)

        return build

    def expert(real: Any) -> Any:
        def build(config: Any) -> Any:
            config.vocab_size = s.vocab_size  # its embeddings are dropped; only the unused lm_head shrinks
            return real(config=config)

        return build

    names = {"PaliGemmaForConditionalGenerationWithPiGemma": paligemma, "PiGemmaForCausalLM": expert}
    modules = (modeling_pi0, modeling_pi05)
    saved = [(m, "get_gemma_config", m.get_gemma_config) for m in modules]
    saved += [(m, name, getattr(m, name)) for m in modules for name in names]
    try:
        for m in modules:
            m.get_gemma_config = gemma_config(m)
            for name, wrap in names.items():
                setattr(m, name, wrap(getattr(m, name)))
        yield
    finally:
        for m, name, value in saved:
            setattr(m, name, value)


def write_tiny_smolvlm(folder: str | Path, hidden: int = 64, layers: int = 2, image_size: int = 64) -> Path:
    """Write a tiny SmolVLM (config + processor with a locally trained tokenizer) to ``folder``.

    The folder works as SmolVLA's ``vlm_model_name`` with ``load_vlm_weights=False``
    and ``num_expert_layers == layers``.
    """
    from transformers import SmolVLMConfig, SmolVLMImageProcessor, SmolVLMProcessor, SmolVLMVideoProcessor

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(named_special={
        "fake_image_token": "<fake_token_around_image>", "image_token": "<image>",
        "global_image_token": "<global-img>", "end_of_utterance_token": "<end_of_utterance>",
    })
    config = SmolVLMConfig(
        text_config={
            "model_type": "llama", "hidden_size": hidden, "intermediate_size": 2 * hidden, "num_hidden_layers": layers,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": len(tokenizer),
            "max_position_embeddings": 2048, "pad_token_id": tokenizer.pad_token_id,
        },
        vision_config={
            "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
            "image_size": image_size, "patch_size": 16,
        },
        scale_factor=2,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
    )
    config.save_pretrained(folder)
    image_processor = SmolVLMImageProcessor(
        do_resize=False, do_image_splitting=False, max_image_size={"longest_edge": image_size},
        size={"longest_edge": image_size},
    )
    processor = SmolVLMProcessor(
        image_processor=image_processor, tokenizer=tokenizer, video_processor=SmolVLMVideoProcessor(),
        image_seq_len=4,
    )
    processor.save_pretrained(folder)
    (folder / "vla_rl_tiny.json").write_text(json.dumps({"hidden": hidden, "layers": layers}))
    return folder


def tiny_dataset_stats(state_dim: int, action_dim: int) -> dict[str, dict[str, Any]]:
    """Normalization statistics (mean/std, min/max, quantiles) for a tiny model's state and action."""
    import torch

    def stats(n: int, scale: float) -> dict[str, Any]:
        offset = torch.linspace(-0.5, 0.5, n)
        return {
            "mean": offset, "std": torch.full((n,), scale), "min": offset - 2 * scale, "max": offset + 2 * scale,
            "q01": offset - 2 * scale, "q99": offset + 2 * scale,
        }

    return {"observation.state": stats(state_dim, 1.0), "action": stats(action_dim, 0.5)}


def build_tiny_lerobot_policy(
    kind: str,
    adapter_config: Any | None = None,
    cameras: tuple[str, ...] = ("front",),
    image_size: int = 64,
    state_dim: int = 5,
    action_dim: int = 3,
    chunk_size: int = 4,
    max_dim: int = 8,
    vlm_folder: str | Path | None = None,
    full_size: bool = False,
    dtype: str = "float32",
    device: str = "cpu",
) -> Any:
    """A tiny random ``pi0`` / ``pi05`` / ``smolvla`` adapter built with LeRobot's own classes and processors.

    With ``full_size`` (pi0 / pi0.5 only) the model keeps LeRobot's real sizes (PaliGemma 2B + the 300M action
    expert): the same architecture as the released checkpoints, random weights, for GPU memory and speed
    measurements (``benchmarks/gpu.py``); ``dtype`` (LeRobot's ``bfloat16`` / ``float32``) and ``device`` are then
    LeRobot's config fields, and the weights are created on ``device`` directly.

    Args:
        kind: ``pi0``, ``pi05`` or ``smolvla``.
        adapter_config: adapter settings (default: the registry config's defaults, no ``pretrained``).
        cameras, image_size, state_dim, action_dim, chunk_size: the tiny model's features.
        max_dim: LeRobot's padded ``max_state_dim`` / ``max_action_dim``.
        vlm_folder: where to write the tiny SmolVLM (smolvla only; must outlive the policy).
        full_size: LeRobot's real model sizes instead of the tiny ones (pi0 / pi05).
        dtype: LeRobot's ``dtype`` for the model (``float32`` or ``bfloat16``).
        device: LeRobot's ``device`` (where the model and the pre-processor's outputs go).

    Raises:
        ValueError: for an unknown ``kind``, a smolvla build without ``vlm_folder`` or a full-size smolvla.
    """
    import torch
    from lerobot.configs import FeatureType, PolicyFeature
    from lerobot.policies.factory import make_pre_post_processors

    from policies.flow.lerobot import LeRobotParts, LeRobotPI0Policy, LeRobotPI05Policy, LeRobotSmolVLAPolicy

    visual = PolicyFeature(FeatureType.VISUAL, (3, image_size, image_size))
    inputs = {f"observation.images.{c}": visual for c in cameras}
    inputs["observation.state"] = PolicyFeature(FeatureType.STATE, (state_dim,))
    outputs = {"action": PolicyFeature(FeatureType.ACTION, (action_dim,))}
    common = dict(
        input_features=inputs, output_features=outputs, chunk_size=chunk_size, n_action_steps=chunk_size,
        max_state_dim=max_dim, max_action_dim=max_dim, device=device,
    )
    stats = tiny_dataset_stats(state_dim, action_dim)
    if kind in ("pi0", "pi05"):
        from lerobot.policies.pi0 import PI0Config, PI0Policy
        from lerobot.policies.pi05 import PI05Config, PI05Policy

        config_cls, policy_cls, adapter_cls = (
            (PI0Config, PI0Policy, LeRobotPI0Policy) if kind == "pi0" else (PI05Config, PI05Policy, LeRobotPI05Policy)
        )
        sizes = {} if full_size else {"tokenizer_max_length": 24}
        cfg = config_cls(**common, image_resolution=(image_size, image_size), dtype=dtype, **sizes)
        # full size: 3B random weights, created where they will run
        with torch.device(device) if full_size else tiny_paligemma_configs():
            lerobot_policy = policy_cls(cfg)
        with local_hub_tokenizer(train_tokenizer()):
            pre, post = make_pre_post_processors(cfg, dataset_stats=stats)
    elif kind == "smolvla":
        from lerobot.policies.smolvla import SmolVLAConfig, SmolVLAPolicy

        if full_size:
            raise ValueError("full_size is for pi0 / pi05; SmolVLA's full size needs its VLM's files from the hub")

        if vlm_folder is None:
            raise ValueError("smolvla: pass vlm_folder, a folder for the tiny SmolVLM config and processor")
        folder = write_tiny_smolvlm(vlm_folder, image_size=image_size)
        cfg = SmolVLAConfig(
            **common, vlm_model_name=str(folder), load_vlm_weights=False, num_vlm_layers=2, num_expert_layers=2,
            resize_imgs_with_padding=(image_size, image_size), tokenizer_max_length=24,
        )
        lerobot_policy, adapter_cls = SmolVLAPolicy(cfg), LeRobotSmolVLAPolicy
        pre, post = make_pre_post_processors(cfg, dataset_stats=stats)
    else:
        raise ValueError(f"unknown tiny LeRobot policy {kind!r}; valid: pi0, pi05, smolvla")
    config = adapter_config if adapter_config is not None else adapter_cls.CONFIG(pretrained="")
    return adapter_cls(config, LeRobotParts(lerobot_policy, pre, post)).to(device)
