"""Vision-language backbones behind one small interface for action decoding.

A :class:`VLMBackbone` wraps a Hugging Face vision-language model, its
tokenizer and its image preprocessing, and exposes exactly what batched
action decoding needs:

- :meth:`VLMBackbone.build_prompts`: left-padded prompt ids of a fixed length
  ``P = 1 + cameras * num_image_tokens + max_text_tokens`` laid out as
  ``[pad ... pad, BOS, image placeholders ..., prompt text]`` (a fixed length
  lets rollouts stack the ids over time);
- :meth:`VLMBackbone.pixel_values`: env images ``uint8 [B, H, W, 3]`` -> the
  vision tower's input;
- :meth:`VLMBackbone.forward`: one causal pass (prefill, a cached decoding
  step, or a teacher-forced pass) returning logits and last-layer hidden
  states of the last ``keep`` positions and the KV cache.

Implementations, keyed by the checkpoint's ``config.model_type`` in
:data:`BACKBONES`: ``llava`` (transformers' ``LlavaForConditionalGeneration``;
also the tiny random model of :mod:`.local_vlm`) and ``openvla`` (the
OpenVLA / Prismatic checkpoints through ``trust_remote_code``).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from policies.autoregressive.action_tokenizer import BinScheme
from vla_core.registry import Registry

PROMPT_TEMPLATE = "In: What action should the robot take to {instruction}?\nOut:"
TINY_BACKBONE = "tiny-llava"


@dataclass
class Prompts:
    """A batch of left-padded prompts.

    Attributes:
        input_ids: ``int64 [B, P]``.
        attention_mask: ``int64 [B, P]``, 0 on left padding.
    """

    input_ids: Tensor
    attention_mask: Tensor

    @property
    def position_ids(self) -> Tensor:
        """``int64 [B, P]``: positions counted from each row's first real token."""
        return positions_from_mask(self.attention_mask)


@dataclass
class ForwardOutput:
    """Output of :meth:`VLMBackbone.forward` for the last ``keep`` positions.

    Attributes:
        logits: ``[B, keep, V]`` next-token logits (model dtype).
        hidden: ``[B, keep, D]`` last-layer hidden states (after the final norm).
        past: the KV cache (a transformers ``Cache``) or None without ``use_cache``.
    """

    logits: Tensor
    hidden: Tensor
    past: Any


def positions_from_mask(attention_mask: Tensor) -> Tensor:
    """Position ids ``[B, T]`` of a left-padded mask: 0 at each row's first real token."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


class BackboneError(ValueError):
    """A checkpoint or prompt the backbone cannot handle; the message says what to change."""


class VLMBackbone(nn.Module, abc.ABC):
    """A vision-language model prepared for batched action-token decoding.

    Attributes:
        model: the wrapped ``transformers`` model.
        tokenizer: its tokenizer.
        text_vocab_size: size of the text vocabulary whose last 256 ids are action bins.
        bin_scheme: the bin layout the checkpoint was trained with.
        image_placeholder_id: id marking image-token positions in prompt ids.
        num_image_tokens: image tokens per camera.
        max_cameras: most cameras the model accepts (None: any).
    """

    model: nn.Module
    tokenizer: Any
    text_vocab_size: int
    bin_scheme: BinScheme = BinScheme.UNIFORM
    image_placeholder_id: int
    num_image_tokens: int
    max_cameras: int | None = None

    @abc.abstractmethod
    def pixel_values(self, images: list[Tensor]) -> Tensor:
        """Preprocess one ``uint8 [B, H, W, 3]`` tensor per camera for the vision tower."""

    @abc.abstractmethod
    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        position_ids: Tensor,
        pixel_values: Tensor | None = None,
        past: Any = None,
        keep: int = 1,
        use_cache: bool = False,
    ) -> ForwardOutput:
        """Run the model on ``input_ids [B, T]`` (with images when ``pixel_values`` is given).

        ``attention_mask`` covers the cached positions plus the new ones
        (``[B, past_len + T]``); ``position_ids`` are ``[B, T]``.
        """

    @abc.abstractmethod
    def save(self, directory: Path) -> None:
        """Write the model, tokenizer and preprocessing config to ``directory`` (loadable by ``load``)."""

    def action_norm_bounds(self, unnorm_key: str | None) -> tuple[Tensor, Tensor] | None:
        """Action de-normalization bounds ``(low [A], high [A])`` shipped with the checkpoint, if any."""
        return None

    def text_ids(self, text: str) -> list[int]:
        """Token ids of the prompt text (no BOS)."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def input_embeddings(self) -> nn.Embedding:
        """The language model's token embedding table ``[rows, D]``."""
        return self.model.get_input_embeddings()

    @property
    def hidden_size(self) -> int:
        """Width D of the language model's hidden states."""
        return int(self.input_embeddings().weight.shape[1])

    def build_prompts(self, instructions: list[str], num_cameras: int, max_text_tokens: int,
                      lowercase: bool = False) -> Prompts:
        """Assemble left-padded prompts ``[pad.., BOS, image x (cameras*N), text]`` of fixed length.

        Raises:
            BackboneError: if an instruction's prompt exceeds ``max_text_tokens``
                tokens (naming it and its length), or for too many cameras.
        """
        if self.max_cameras is not None and num_cameras > self.max_cameras:
            raise BackboneError(f"{type(self).__name__} takes at most {self.max_cameras} camera(s), "
                                f"got {num_cameras}; configure fewer cameras")
        images = [self.image_placeholder_id] * (num_cameras * self.num_image_tokens)
        length = 1 + len(images) + max_text_tokens
        pad = self.tokenizer.pad_token_id
        bos = self.tokenizer.bos_token_id
        if pad is None or bos is None:
            raise BackboneError(f"tokenizer {type(self.tokenizer).__name__} needs a pad and a BOS token")
        ids = torch.full((len(instructions), length), pad, dtype=torch.long)
        mask = torch.zeros((len(instructions), length), dtype=torch.long)
        for row, instruction in enumerate(instructions):
            text = PROMPT_TEMPLATE.format(instruction=instruction.lower() if lowercase else instruction)
            tokens = self.text_ids(text)
            if len(tokens) > max_text_tokens:
                raise BackboneError(f"prompt for instruction {instruction!r} has {len(tokens)} tokens, more than "
                                    f"max_text_tokens={max_text_tokens}; raise the policy's max_text_tokens")
            seq = [bos, *images, *tokens]
            ids[row, length - len(seq):] = torch.tensor(seq, dtype=torch.long)
            mask[row, length - len(seq):] = 1
        return Prompts(input_ids=ids, attention_mask=mask)


BACKBONES: Registry = Registry("VLM backbone (checkpoint model_type)")


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise BackboneError(f"unknown floating dtype {name!r}; use float32, bfloat16 or float16")
    return dtype


@BACKBONES.register("llava")
class LlavaBackbone(VLMBackbone):
    """``LlavaForConditionalGeneration`` (CLIP/SigLIP vision + Llama-family text), any size.

    Args:
        model: the LLaVA model.
        tokenizer: its tokenizer (pad and BOS tokens required).
        image_processor: a ``transformers`` image processor producing the vision tower's input.
    """

    def __init__(self, model: nn.Module, tokenizer: Any, image_processor: Any) -> None:
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.text_vocab_size = int(tokenizer.vocab_size)
        self.image_placeholder_id = int(model.config.image_token_id)
        self.num_image_tokens = int(model.config.image_seq_length)

    @classmethod
    def build_tiny(cls, tiny: Any) -> LlavaBackbone:
        """A random tiny LLaVA with a local tokenizer (see :mod:`.local_vlm`)."""
        from policies.autoregressive.local_vlm import build_tiny_llava

        return cls(*build_tiny_llava(tiny))

    @classmethod
    def load(cls, path: str, dtype: str, trust_remote_code: bool) -> LlavaBackbone:
        """Load a LLaVA checkpoint folder or cached hub id (model, tokenizer, image processor)."""
        from transformers import AutoImageProcessor, AutoTokenizer, LlavaForConditionalGeneration

        model = LlavaForConditionalGeneration.from_pretrained(path, dtype=_dtype(dtype))
        tokenizer = AutoTokenizer.from_pretrained(path)
        processor = AutoImageProcessor.from_pretrained(path)
        return cls(model.eval(), tokenizer, processor)

    def pixel_values(self, images: list[Tensor]) -> Tensor:
        """Resize and normalize with the checkpoint's image processor -> ``[B * cameras, 3, h, w]``.

        Rows are ordered env-major (env 0's cameras first), matching the order
        of the image placeholders in :meth:`build_prompts`.
        """
        stacked = torch.stack(images, dim=1).flatten(0, 1).permute(0, 3, 1, 2)  # [B*C, 3, H, W]
        out = self.image_processor(images=list(stacked), return_tensors="pt")["pixel_values"]
        return out.to(device=stacked.device, dtype=self.model.dtype)

    def forward(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor,
                pixel_values: Tensor | None = None, past: Any = None, keep: int = 1,
                use_cache: bool = False) -> ForwardOutput:
        out = self.model.model(
            input_ids=input_ids,
            pixel_values=pixel_values,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past,
            use_cache=use_cache,
        )
        hidden = out.last_hidden_state[:, -keep:]
        return ForwardOutput(logits=self.model.lm_head(hidden), hidden=hidden, past=out.past_key_values)

    def save(self, directory: Path) -> None:
        self.model.save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)
        self.image_processor.save_pretrained(directory)


@BACKBONES.register("openvla")
class OpenVLABackbone(VLMBackbone):
    """OpenVLA (Prismatic: DINOv2 + SigLIP fused vision, Llama-2 text) through ``trust_remote_code``.

    The checkpoint's own ``forward`` inserts image patches after position 0
    and drops the attention mask in cached decoding, which breaks left-padded
    batches; this adapter therefore drives its parts (``vision_backbone``,
    ``projector``, ``language_model``) directly: patch features replace
    placeholder ids (an id of the padded embedding table the tokenizer never
    emits) and the Llama model runs with explicit mask and positions. Bins use
    :attr:`BinScheme.OPENVLA` and the prompt ends with the empty token ``"▁"``
    (id 29871) as in OpenVLA's ``predict_action``. The remote code targets
    transformers 4.40 / timm 0.9; loading it on other versions may fail inside
    the checkpoint's code.
    """

    bin_scheme = BinScheme.OPENVLA
    max_cameras = 1

    def __init__(self, model: nn.Module, processor: Any) -> None:
        super().__init__()
        self.model = model
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.text_vocab_size = int(self.tokenizer.vocab_size)
        embed_rows = int(self.input_embeddings().weight.shape[0])
        self.image_placeholder_id = len(self.tokenizer)
        if self.image_placeholder_id >= embed_rows:
            raise BackboneError(f"OpenVLA checkpoint: no spare embedding row for an image placeholder "
                                f"(tokenizer has {len(self.tokenizer)} ids, embeddings {embed_rows})")
        self._empty_token: int | None = self.tokenizer.get_vocab().get("\u2581")  # Llama's 29871
        with torch.no_grad():
            size = model.config.image_sizes[0] if hasattr(model.config, "image_sizes") else 224
            channels = 6 if getattr(model.config, "use_fused_vision_backbone", False) else 3
            dummy = torch.zeros(1, channels, size, size, dtype=model.dtype, device=model.device)
            self.num_image_tokens = int(model.projector(model.vision_backbone(dummy)).shape[1])

    @classmethod
    def load(cls, path: str, dtype: str, trust_remote_code: bool) -> OpenVLABackbone:
        """Load an OpenVLA checkpoint (folder or cached hub id) with its remote code.

        Raises:
            BackboneError: if ``trust_remote_code`` is False or the config has no model class.
        """
        from transformers import AutoConfig, AutoProcessor
        from transformers.dynamic_module_utils import get_class_from_dynamic_module

        if not trust_remote_code:
            raise BackboneError(f"{path}: OpenVLA checkpoints ship their own model code; set trust_remote_code=true")
        config = AutoConfig.from_pretrained(path, trust_remote_code=True)
        auto_map = getattr(config, "auto_map", {}) or {}
        # transformers 5 dropped AutoModelForVision2Seq, the auto class OpenVLA registers under.
        reference = auto_map.get("AutoModelForVision2Seq") or auto_map.get("AutoModelForImageTextToText")
        if reference is None:
            raise BackboneError(f"{path}: config.auto_map has no model class (keys: {sorted(auto_map)})")
        model_cls = get_class_from_dynamic_module(reference, path)
        model_cls.register_for_auto_class("AutoModelForVision2Seq")
        model = model_cls.from_pretrained(path, dtype=_dtype(dtype), trust_remote_code=True)
        processor = AutoProcessor.from_pretrained(path, trust_remote_code=True)
        return cls(model.eval(), processor)

    def input_embeddings(self) -> nn.Embedding:
        return self.model.language_model.get_input_embeddings()

    def text_ids(self, text: str) -> list[int]:
        ids = super().text_ids(text)
        if self._empty_token is None or (ids and ids[-1] == self._empty_token):
            return ids
        return [*ids, self._empty_token]

    def pixel_values(self, images: list[Tensor]) -> Tensor:
        """PIL conversion + the checkpoint's (resize, crop, fused DINO/SigLIP normalize) -> ``[B, 6, 224, 224]``."""
        from PIL import Image

        pil = [Image.fromarray(img.cpu().numpy()) for img in images[0]]
        out = self.processor.image_processor(pil, return_tensors="pt")["pixel_values"]
        return out.to(device=images[0].device, dtype=self.model.dtype)

    def forward(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor,
                pixel_values: Tensor | None = None, past: Any = None, keep: int = 1,
                use_cache: bool = False) -> ForwardOutput:
        lm = self.model.language_model
        embeds = self.input_embeddings()(input_ids)
        if pixel_values is not None:
            patches = self.model.projector(self.model.vision_backbone(pixel_values))
            where = (input_ids == self.image_placeholder_id).unsqueeze(-1).expand_as(embeds)
            embeds = embeds.masked_scatter(where, patches.to(embeds.dtype))
        out = lm.model(inputs_embeds=embeds, attention_mask=attention_mask, position_ids=position_ids,
                       past_key_values=past, use_cache=use_cache)
        hidden = out.last_hidden_state[:, -keep:]
        return ForwardOutput(logits=lm.lm_head(hidden), hidden=hidden, past=out.past_key_values)

    def action_norm_bounds(self, unnorm_key: str | None) -> tuple[Tensor, Tensor] | None:
        """OpenVLA's q01/q99 bounds for ``unnorm_key`` (dims with ``mask = False`` stay in [-1, 1]).

        Raises:
            BackboneError: if ``unnorm_key`` is ambiguous or unknown, listing the valid keys.
        """
        stats = getattr(self.model, "norm_stats", None) or getattr(self.model.config, "norm_stats", None)
        if not stats:
            return None
        if unnorm_key is None:
            if len(stats) != 1:
                raise BackboneError(f"OpenVLA checkpoint has statistics for {sorted(stats)}; set unnorm_key")
            unnorm_key = next(iter(stats))
        if unnorm_key not in stats:
            raise BackboneError(f"unnorm_key {unnorm_key!r} not in the checkpoint's norm_stats {sorted(stats)}")
        action = stats[unnorm_key]["action"]
        low, high = torch.tensor(action["q01"]), torch.tensor(action["q99"])
        mask = torch.tensor(action.get("mask", [True] * len(low)), dtype=torch.bool)
        return torch.where(mask, low, -1.0).float(), torch.where(mask, high, 1.0).float()

    def save(self, directory: Path) -> None:
        self.model.save_pretrained(directory)
        self.processor.save_pretrained(directory)


def load_backbone(spec: str, dtype: str, trust_remote_code: bool, tiny: Any) -> VLMBackbone:
    """Build :data:`TINY_BACKBONE` or load a checkpoint, dispatching on its ``model_type``.

    Args:
        spec: ``"tiny-llava"``, a local folder or a cached hub id.
        dtype: weight dtype name for loaded checkpoints.
        trust_remote_code: allow the checkpoint's own model code (OpenVLA).
        tiny: :class:`~policies.autoregressive.local_vlm.TinyVLMConfig` for the tiny model.

    Raises:
        BackboneError: for an unsupported ``model_type`` (listing the supported ones).
    """
    if spec == TINY_BACKBONE:
        return LlavaBackbone.build_tiny(tiny).to(_dtype(dtype))
    from transformers import AutoConfig

    model_type = AutoConfig.from_pretrained(spec, trust_remote_code=trust_remote_code).model_type
    if model_type not in BACKBONES:
        raise BackboneError(f"{spec}: model_type {model_type!r} is not supported; supported: "
                            f"{', '.join(BACKBONES.names())} (or {TINY_BACKBONE!r})")
    return BACKBONES.get(model_type).obj.load(spec, dtype, trust_remote_code)
