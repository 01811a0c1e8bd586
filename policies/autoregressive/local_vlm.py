"""A tiny, randomly initialized LLaVA (SigLIP vision + Llama text) built offline.

Used by tests, CPU smoke runs and benchmarks: no weights or tokenizer are
downloaded. The tokenizer is a real byte-level BPE (``tokenizers``) trained
in code on robot instructions and wrapped for ``transformers``; its
vocabulary ends with 256 dedicated action tokens ``<act_0> .. <act_255>`` so
that, as in OpenVLA, the action bins are the last 256 ids of the text
vocabulary. Special tokens come first: ``<pad>`` 0, ``<s>`` 1, ``</s>`` 2,
``<image>`` 3 (the LLaVA image placeholder).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    PreTrainedTokenizerFast,
    SiglipImageProcessor,
    SiglipVisionConfig,
)

from policies.autoregressive.action_tokenizer import NUM_BINS

PAD, BOS, EOS, IMAGE = "<pad>", "<s>", "</s>", "<image>"
SPECIAL_TOKENS = (PAD, BOS, EOS, IMAGE)

# Text the BPE merges are learned from: the prompt template and common task words.
CORPUS = (
    "In: What action should the robot take to pick up the red cube?\nOut:",
    "In: What action should the robot take to put the bowl on the plate?\nOut:",
    "In: What action should the robot take to open the top drawer of the cabinet?\nOut:",
    "push the block to the target, stack the green cube on the blue cube",
    "place the mug in the basket, turn on the stove, close the microwave",
    "lift the peg upright, insert the peg into the hole, pull the cube",
)


@dataclass(frozen=True)
class TinyVLMConfig:
    """Sizes of the tiny random LLaVA used when ``backbone = "tiny-llava"``."""

    text_hidden_size: int = 64
    """Width of the Llama text model."""
    text_layers: int = 2
    """Number of Llama decoder layers."""
    text_heads: int = 4
    """Attention heads of the text model (must divide ``text_hidden_size``)."""
    text_kv_heads: int = 2
    """Key/value heads (grouped-query attention; must divide ``text_heads``)."""
    vision_hidden_size: int = 32
    """Width of the SigLIP vision tower."""
    vision_layers: int = 1
    """Number of SigLIP encoder layers."""
    vision_heads: int = 2
    """Attention heads of the vision tower."""
    vision_image_size: int = 32
    """Side of the square image the vision tower sees (env images are resized to it)."""
    patch_size: int = 8
    """ViT patch side; ``(vision_image_size / patch_size) ** 2`` image tokens per camera."""
    bpe_merges: int = 96
    """BPE merges learned from the built-in corpus (vocabulary = 4 specials + 256 bytes + merges + 256 actions)."""
    init_std: float = 0.02
    """Std of the random weight initialization (larger values give peakier token distributions)."""
    seed: int = 0
    """Seed of the random weight initialization."""

    def __post_init__(self) -> None:
        if self.text_hidden_size % self.text_heads or self.text_heads % self.text_kv_heads:
            raise ValueError(f"TinyVLMConfig: text_heads={self.text_heads} must divide text_hidden_size="
                             f"{self.text_hidden_size} and text_kv_heads={self.text_kv_heads} must divide text_heads")
        if self.vision_image_size % self.patch_size:
            raise ValueError(f"TinyVLMConfig: patch_size={self.patch_size} must divide "
                             f"vision_image_size={self.vision_image_size}")


def build_local_tokenizer(bpe_merges: int = 96) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on :data:`CORPUS` and append 256 action tokens.

    Returns:
        A ``PreTrainedTokenizerFast`` whose ``vocab_size`` counts the action
        tokens, which occupy its last 256 ids.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=len(SPECIAL_TOKENS) + len(alphabet) + bpe_merges,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=alphabet,
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    # Put the action tokens inside the base vocabulary (not as "added" tokens) so
    # they count in ``vocab_size`` and can only be produced by id, never by text.
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    start = len(vocab)
    for k in range(NUM_BINS):
        vocab[f"<act_{k}>"] = start + k
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(data)),
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        padding_side="left",
    )


def build_tiny_llava(
    cfg: TinyVLMConfig, max_positions: int = 4096
) -> tuple[LlavaForConditionalGeneration, PreTrainedTokenizerFast, SiglipImageProcessor]:
    """Build a random tiny LLaVA, its local tokenizer and its image processor.

    Args:
        cfg: model sizes.
        max_positions: the text model's maximum sequence length.

    Returns:
        ``(model, tokenizer, image_processor)``; the model is in eval mode, float32.
    """
    import torch

    tokenizer = build_local_tokenizer(cfg.bpe_merges)
    vision = SiglipVisionConfig(
        hidden_size=cfg.vision_hidden_size,
        intermediate_size=2 * cfg.vision_hidden_size,
        num_hidden_layers=cfg.vision_layers,
        num_attention_heads=cfg.vision_heads,
        image_size=cfg.vision_image_size,
        patch_size=cfg.patch_size,
        initializer_range=cfg.init_std,
    )
    text = LlamaConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=cfg.text_hidden_size,
        intermediate_size=2 * cfg.text_hidden_size,
        num_hidden_layers=cfg.text_layers,
        num_attention_heads=cfg.text_heads,
        num_key_value_heads=cfg.text_kv_heads,
        max_position_embeddings=max_positions,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        initializer_range=cfg.init_std,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE),
        image_seq_length=(cfg.vision_image_size // cfg.patch_size) ** 2,
        vision_feature_select_strategy="full",  # SigLIP has no CLS token to drop
        vision_feature_layer=-1,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = LlavaForConditionalGeneration(config)
    processor = SiglipImageProcessor(size={"height": cfg.vision_image_size, "width": cfg.vision_image_size})
    return model.eval(), tokenizer, processor
