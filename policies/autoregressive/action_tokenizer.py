"""Discretize normalized actions into language-model token ids and back.

OpenVLA's recipe: every action dimension, already normalized by the dataset
statistics, is clipped to ``[-1, 1]`` and cut into ``num_bins = 256`` bins;
bin ``k`` is one of the last 256 ids of the language vocabulary (ids
``vocab_size - 256 .. vocab_size - 1``, overwriting the least used tokens).
Decoding maps a token back to its bin center, so a round trip moves an action
by at most half a bin (``1 / 256`` for the uniform scheme).

Two bin layouts are supported (:class:`BinScheme`):

- ``UNIFORM``: 256 equal bins of width ``2 / 256``; bin ``k`` covers
  ``[-1 + k w, -1 + (k + 1) w)`` and decodes to its center. Bin ``k`` is token
  ``vocab_size - 256 + k`` (ascending).
- ``OPENVLA``: the released OpenVLA checkpoints' layout, reproduced so that
  their weights decode correctly: 256 edges ``linspace(-1, 1, 256)`` (255
  intervals), ``np.digitize`` bin index, token ``vocab_size - digitize``
  (descending), and decoding to the centers of the 255 intervals (the two
  topmost tokens share the last center). Round-trip error is at most half an
  interval, ``1 / 255``.
"""

from __future__ import annotations

import enum

import torch
from torch import Tensor

NUM_BINS = 256


class BinScheme(str, enum.Enum):
    """How bins are laid out and ordered on the vocabulary (see module doc)."""

    UNIFORM = "uniform"
    OPENVLA = "openvla"


class ActionTokenizer:
    """Maps normalized actions ``[..., A]`` in ``[-1, 1]`` to token ids and back.

    Out-of-range inputs (outside ``[-1, 1]``, e.g. a dataset action beyond its
    q01/q99 bounds) are clipped; :attr:`num_clipped` counts the clipped
    elements and :attr:`num_encoded` all encoded elements since construction
    or the last :meth:`reset_counters`.

    Args:
        vocab_size: size of the text vocabulary whose last ``num_bins`` ids hold
            the action bins (OpenVLA: the Llama tokenizer's 32000, not the
            model's padded embedding size).
        num_bins: number of bins per dimension (256 for OpenVLA).
        scheme: bin layout and id order.

    Raises:
        ValueError: if the vocabulary cannot hold ``num_bins`` ids.
    """

    def __init__(self, vocab_size: int, num_bins: int = NUM_BINS, scheme: BinScheme = BinScheme.UNIFORM) -> None:
        if num_bins < 2 or vocab_size < num_bins:
            raise ValueError(f"ActionTokenizer: need 2 <= num_bins <= vocab_size, got num_bins={num_bins}, "
                             f"vocab_size={vocab_size}")
        self.vocab_size = int(vocab_size)
        self.num_bins = int(num_bins)
        self.scheme = BinScheme(scheme)
        self.num_clipped = 0
        self.num_encoded = 0
        if self.scheme is BinScheme.UNIFORM:
            width = 2.0 / num_bins
            self._centers = -1.0 + width * (torch.arange(num_bins, dtype=torch.float64) + 0.5)
        else:
            edges = torch.linspace(-1.0, 1.0, num_bins, dtype=torch.float64)
            interval_centers = (edges[:-1] + edges[1:]) / 2  # num_bins - 1 centers
            # bin k (= digitize - 1) decodes to interval k, the top bin to the last interval.
            self._centers = torch.cat([interval_centers, interval_centers[-1:]])
            self._edges = edges

    @property
    def first_id(self) -> int:
        """The smallest action token id, ``vocab_size - num_bins``."""
        return self.vocab_size - self.num_bins

    @property
    def max_error(self) -> float:
        """Largest round-trip error of an in-range value: half a bin."""
        return 1.0 / self.num_bins if self.scheme is BinScheme.UNIFORM else 1.0 / (self.num_bins - 1)

    def reset_counters(self) -> None:
        """Zero :attr:`num_clipped` and :attr:`num_encoded`."""
        self.num_clipped = 0
        self.num_encoded = 0

    def bin_to_token(self, bins: Tensor) -> Tensor:
        """Bin indices ``[...]`` in ``[0, num_bins)`` -> vocabulary ids (int64)."""
        bins = bins.long()
        if self.scheme is BinScheme.UNIFORM:
            return self.first_id + bins
        return self.vocab_size - 1 - bins

    def token_to_bin(self, tokens: Tensor) -> Tensor:
        """Vocabulary ids ``[...]`` -> bin indices in ``[0, num_bins)`` (int64).

        Raises:
            ValueError: if an id is not one of the last ``num_bins`` of the vocabulary.
        """
        tokens = tokens.long()
        outside = (tokens < self.first_id) | (tokens >= self.vocab_size)
        if bool(outside.any()):
            bad = tokens[outside][:5].tolist()
            raise ValueError(f"ActionTokenizer: token ids {bad} are not action tokens; expected ids in "
                             f"[{self.first_id}, {self.vocab_size - 1}]")
        if self.scheme is BinScheme.UNIFORM:
            return tokens - self.first_id
        return self.vocab_size - 1 - tokens

    def bins_of(self, actions: Tensor) -> Tensor:
        """Normalized actions ``[...]`` -> bin indices (int64); clips and counts out-of-range values."""
        if not torch.is_floating_point(actions):
            raise TypeError(f"ActionTokenizer: actions must be a float tensor, got {actions.dtype}")
        values = actions.detach().to(torch.float64)
        finite = torch.isfinite(values)
        if not bool(finite.all()):
            raise ValueError("ActionTokenizer: actions contain NaN or inf; check the normalization statistics")
        self.num_clipped += int(((values < -1.0) | (values > 1.0)).sum())
        self.num_encoded += values.numel()
        values = values.clamp(-1.0, 1.0)
        if self.scheme is BinScheme.UNIFORM:
            bins = torch.floor((values + 1.0) * (self.num_bins / 2.0)).long()
        else:
            bins = torch.bucketize(values, self._edges.to(values.device), right=True) - 1
        return bins.clamp(0, self.num_bins - 1)

    def encode(self, actions: Tensor) -> Tensor:
        """Normalized actions ``float [..., A]`` -> token ids ``int64 [..., A]`` (clipping to ``[-1, 1]``)."""
        return self.bin_to_token(self.bins_of(actions))

    def decode(self, tokens: Tensor) -> Tensor:
        """Token ids ``[..., A]`` -> bin centers ``float32 [..., A]`` in ``[-1, 1]``.

        Raises:
            ValueError: for ids outside the action range.
        """
        bins = self.token_to_bin(tokens)
        return self._centers.to(bins.device)[bins].to(torch.float32)

    def bin_centers(self) -> Tensor:
        """The decoded value of each bin, ``float32 [num_bins]`` (bin order, not id order)."""
        return self._centers.to(torch.float32).clone()
