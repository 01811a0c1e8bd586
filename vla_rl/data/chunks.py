"""Frames of recorded episodes as action-chunk training rows, with seeded minibatch sampling.

Row ``i`` is one frame: its observation, the action chunk ``actions[i : i + H]``
of its episode (padded with the episode's last action and masked past the
episode's end), and, where the dataset recorded them, the frame's
``intervention`` flag, step label (policy / recovery / correction), ``next.reward``, ``next.success`` and
episode index.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from vla_core.keys import OBS_STATE, TASK


def cat_obs(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Observation batches one after the other (tensors concatenated, the ``task`` string lists joined); the keys
    are the first part's."""
    return {k: ([t for p in parts for t in p[k]] if k == TASK else torch.cat([p[k] for p in parts])) for k in parts[0]}


@dataclass
class ChunkBatch:
    """A minibatch of ``B`` chunk rows (:meth:`ChunkDataset.batch`); absent fields are None."""

    obs: dict[str, Any]
    """Observation dict: ``observation.images.<cam>`` uint8 ``[B, H_img, W_img, 3]``, ``observation.state``
    float32 ``[B, S]``, ``task`` a list of ``B`` strings."""
    actions: Tensor
    """float32 ``[B, H, A]``: the action chunk starting at each row's frame."""
    mask: Tensor
    """bool ``[B, H]``: True where the chunk step lies inside the row's episode."""
    intervention: Tensor | None = None
    """bool ``[B]``: the row's action came from a human intervention (LeRobot's ``intervention``)."""
    reward: Tensor | None = None
    """float32 ``[B]``: the row's ``next.reward``."""
    success: Tensor | None = None
    """bool ``[B]``: the row's ``next.success``."""
    episode_index: Tensor | None = None
    """int64 ``[B]``: the row's episode in its dataset."""
    source: Tensor | None = None
    """int64 ``[B]``: which source of a :class:`~vla_rl.data.mix.MixedSource` the row came from."""
    label: Tensor | None = None
    """int64 ``[B]``: the row's step label (:class:`vla_core.labels.Label`: 0 policy, 1 recovery,
    2 correction; -1 a demo frame, mixed in from a source without labels)."""

    def __len__(self) -> int:
        return self.actions.shape[0]


@dataclass
class ChunkDataset:
    """``N`` frames as chunk rows (module doc), held in memory; optional per-frame fields are None when absent."""

    obs: dict[str, Any]
    """Observations of every frame, batched as in :class:`ChunkBatch` (``N`` rows)."""
    actions: Tensor
    """float32 ``[N, H, A]`` action chunks."""
    mask: Tensor
    """bool ``[N, H]`` chunk masks."""
    episodes: int
    """Episodes the frames come from."""
    intervention: Tensor | None = None
    """bool ``[N]``, from the dataset's ``intervention`` (or ``is_intervention``) feature."""
    reward: Tensor | None = None
    """float32 ``[N]``, from ``next.reward``."""
    success: Tensor | None = None
    """bool ``[N]``, from ``next.success``."""
    episode_index: Tensor | None = None
    """int64 ``[N]``: each frame's episode index in the dataset."""
    label: Tensor | None = None
    """int64 ``[N]`` step labels (see :class:`ChunkBatch`), None for plain demos."""

    def __len__(self) -> int:
        return self.actions.shape[0]

    @property
    def horizon(self) -> int:
        """H, the chunk length."""
        return self.actions.shape[1]

    def batch(self, idx: Tensor) -> ChunkBatch:
        """Rows ``idx`` (int64 ``[B]``, repeats allowed) as a :class:`ChunkBatch`."""
        obs = {k: ([v[i] for i in idx.tolist()] if k == TASK else v[idx]) for k, v in self.obs.items()}
        pick = (lambda t: None if t is None else t[idx])  # noqa: E731
        return ChunkBatch(obs=obs, actions=self.actions[idx], mask=self.mask[idx],
                          intervention=pick(self.intervention), reward=pick(self.reward),
                          success=pick(self.success), episode_index=pick(self.episode_index),
                          label=pick(self.label))

    def sample(self, batch_size: int, generator: torch.Generator) -> ChunkBatch:
        """``batch_size`` rows drawn uniformly with replacement (one ``torch.randint`` on ``generator``)."""
        return self.batch(torch.randint(0, len(self), (batch_size,), generator=generator))

    def normalization_data(self) -> tuple[Tensor, Tensor]:
        """``(states [N, S], actions [M, A])``: what ``Policy.fit_normalization`` fits (every real chunk step).

        Raises:
            KeyError: when the frames have no ``observation.state``.
        """
        return self.obs[OBS_STATE], self.actions[self.mask]


def make_chunks(
    obs: dict[str, Any],
    actions: Tensor,
    episode_index: Tensor,
    horizon: int,
    intervention: Tensor | None = None,
    reward: Tensor | None = None,
    success: Tensor | None = None,
    label: Tensor | None = None,
) -> ChunkDataset:
    """Chunk ``N`` frames stored episode after episode (each episode's frames contiguous, in time order).

    Args:
        obs: per-frame observations (``N`` rows; ``task`` a list).
        actions: float ``[N, A]``, the action taken at each frame.
        episode_index: int ``[N]``, each frame's episode.
        horizon: H, the chunk length.
        intervention, reward, success, label: optional ``[N]`` per-frame fields, kept as they are.

    Returns:
        A :class:`ChunkDataset` whose chunk ``i`` is ``actions[i : i + H]``, with steps past the end of
        frame ``i``'s episode filled with its last action and masked out, except in the last stored
        episode, whose steps past the last frame are its last action unmasked (the index is clamped to the
        last frame, which lies in the same episode; kept as is because the quickstart's measured
        pre-training depends on it).

    Raises:
        ValueError: for ``horizon < 1`` or no frames.
    """
    n = actions.shape[0]
    if horizon < 1 or n == 0:
        raise ValueError(f"make_chunks: need horizon >= 1 and at least one frame, got horizon={horizon}, {n} frames")
    acts = actions.float()
    eps = episode_index.long()
    offsets = torch.arange(horizon)
    idx = torch.arange(n)[:, None] + offsets[None, :]
    idx = idx.clamp(max=n - 1)
    same = eps[idx] == eps[:, None]
    # Past the episode's end: repeat the episode's last action and mask it out.
    last = torch.zeros(n, dtype=torch.long)
    for e in eps.unique():
        rows = (eps == e).nonzero().flatten()
        last[rows] = rows.max()
    idx = torch.where(same, idx, last[:, None].expand(-1, horizon))
    return ChunkDataset(obs=obs, actions=acts[idx], mask=same, episodes=int(eps.unique().numel()),
                        intervention=intervention, reward=reward, success=success, episode_index=eps, label=label)
