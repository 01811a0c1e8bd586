"""Mixing several chunk sources (demos, intervention data, a replay of online frames) into one batch stream."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
from torch import Tensor

from vla_rl.data.chunks import ChunkBatch, cat_obs


class ChunkSource(Protocol):
    """Anything that draws seeded minibatches of chunk rows (:class:`~vla_rl.data.chunks.ChunkDataset`,
    :class:`MixedSource`)."""

    def __len__(self) -> int: ...

    def sample(self, batch_size: int, generator: torch.Generator) -> ChunkBatch: ...


def split_rows(batch_size: int, weights: Sequence[float], generator: torch.Generator) -> list[int]:
    """Rows per source for one batch: ``floor(batch_size * w_i / sum(w))`` each, the remaining rows drawn one
    by one (without replacement) with probabilities proportional to the fractional parts, so every batch holds
    the ratio as closely as whole rows allow (``[8, 8]`` for weights ``1, 1`` and 16 rows, always).

    Raises:
        ValueError: for a negative weight, all-zero weights or a negative ``batch_size``.
    """
    w = torch.tensor([float(x) for x in weights], dtype=torch.float64)
    if batch_size < 0 or w.numel() == 0 or bool((w < 0).any()) or float(w.sum()) <= 0:
        raise ValueError(f"split_rows: need batch_size >= 0 and non-negative weights with a positive sum, got "
                         f"batch_size={batch_size}, weights={list(weights)}")
    share = batch_size * w / w.sum()
    counts = share.floor().long()
    left = batch_size - int(counts.sum())
    if left:
        frac = share - counts
        extra = torch.multinomial(frac.float(), left, replacement=False, generator=generator)
        counts[extra] += 1
    return counts.tolist()


def concat_batches(parts: Sequence[ChunkBatch]) -> ChunkBatch:
    """Rows of ``parts`` one after the other, with ``source`` the index of the part each row came from.

    ``intervention`` missing from a part counts as False (no human acted), ``label`` missing from a part as -1
    (a demo frame); ``reward``, ``success`` and ``episode_index`` are kept only when every part has them.

    Raises:
        ValueError: when the parts' observation keys or chunk shapes ``[H, A]`` differ.
    """
    keys = list(parts[0].obs)
    shape = tuple(parts[0].actions.shape[1:])
    for p in parts[1:]:
        if list(p.obs) != keys or tuple(p.actions.shape[1:]) != shape:
            raise ValueError(f"cannot mix sources with observation keys {keys} and chunks {list(shape)} with one "
                             f"with keys {list(p.obs)} and chunks {list(p.actions.shape[1:])}")
    obs = cat_obs([p.obs for p in parts])

    def cat(name: str, fill: bool) -> Tensor | None:
        vals = [getattr(p, name) for p in parts]
        if all(v is None for v in vals) or (not fill and any(v is None for v in vals)):
            return None
        return torch.cat([v if v is not None else torch.zeros(len(p), dtype=torch.bool) for v, p in zip(vals, parts)])

    labels = [p.label for p in parts]
    label = None if all(v is None for v in labels) else torch.cat(
        [v if v is not None else torch.full((len(p),), -1, dtype=torch.long) for v, p in zip(labels, parts)])
    source = torch.cat([torch.full((len(p),), i, dtype=torch.long) for i, p in enumerate(parts)])
    return ChunkBatch(obs=obs, actions=torch.cat([p.actions for p in parts]), mask=torch.cat([p.mask for p in parts]),
                      intervention=cat("intervention", True), reward=cat("reward", False),
                      success=cat("success", False), episode_index=cat("episode_index", False), source=source,
                      label=label)


class MixedSource:
    """Draw each batch's rows from several sources by weight: ``MixedSource([(demos, 0.25), (online, 0.75)])``.

    Each :meth:`sample` splits the batch with :func:`split_rows` and draws that many rows from each source
    (in order, all on the caller's generator), so a seed fixes the whole stream. Sources with no rows in a
    batch are not drawn from. The returned batch's ``source`` tells which source each row came from.

    Raises:
        ValueError: for no sources, a negative weight, all-zero weights, or an empty source with weight > 0.
    """

    def __init__(self, sources: Sequence[tuple[ChunkSource, float]]) -> None:
        if not sources:
            raise ValueError("MixedSource needs at least one (source, weight) pair")
        self.sources = [s for s, _ in sources]
        self.weights = [float(w) for _, w in sources]
        split_rows(0, self.weights, torch.Generator())  # validates the weights
        empty = [i for i, (s, w) in enumerate(zip(self.sources, self.weights)) if w > 0 and len(s) == 0]
        if empty:
            raise ValueError(f"MixedSource: source(s) {empty} are empty but have a positive weight")

    def __len__(self) -> int:
        return sum(len(s) for s, w in zip(self.sources, self.weights) if w > 0)

    def sample(self, batch_size: int, generator: torch.Generator) -> ChunkBatch:
        """``batch_size`` rows: ``split_rows`` of them from each source (rows grouped by source, in order)."""
        counts = split_rows(batch_size, self.weights, generator)
        parts = []
        for i, (src, n) in enumerate(zip(self.sources, counts)):
            if n:
                part = src.sample(n, generator)
                part.source = None
                parts.append((i, part))
        batch = concat_batches([p for _, p in parts])
        batch.source = torch.cat([torch.full((len(p),), i, dtype=torch.long) for i, p in parts])
        return batch
