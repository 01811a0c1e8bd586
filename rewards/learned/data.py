"""Labelled episodes from the two places they come from: an env played by some actor, or a LeRobotDataset.

- :func:`record_episodes` plays ``episodes`` episodes of a :class:`sim.VecEnv` with any chunk actor
  (``obs -> actions [B, H, A]``: the scripted expert, a noisy expert, a policy) and keeps every state each
  episode showed, with the env's success flag of that state (the last one from ``final_obs``). Chunks are
  executed step by step; an env whose episode ends inside a chunk is held still for the rest of it (as
  :mod:`sim.chunk` does) and its next episode is recorded from the next decision on.
- :func:`read_dataset_episodes` reads a LeRobotDataset (ours from ``vla-rl collect``, or a user's with a
  ``next.success`` or ``next.reward`` field). A dataset frame holds the observation *before* its action and
  the success / reward *after* it, so frame ``t`` shows the state frame ``t - 1``'s flag describes: frame ``t``
  is labelled with frame ``t - 1``'s flag (frame 0: not success). The success state of an episode that ended
  on success is never recorded; its last frame, one action away from it, is labelled with its own flag.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from tqdm import tqdm

from rewards.learned.labels import Episode
from sim.core import TASK, Obs, VecEnv
from vla_core.keys import OBS_IMAGE_PREFIX, REWARD, SUCCESS

ChunkActor = Callable[[Obs], Tensor]
"""``obs -> actions [B, H, A]`` (``H = 1`` for step-wise actors)."""


class EpisodeDataError(ValueError):
    """Episodes that cannot be read or labelled: names the dataset folder and the missing field."""


def _row(obs: Obs, i: int, keys: list[str]) -> dict[str, Tensor]:
    return {k: obs[k][i].clone() for k in keys}


def record_episodes(env: VecEnv, actor: ChunkActor, episodes: int, seed: int, keys: list[str] | None = None,
                    desc: str = "record") -> list[Episode]:
    """Play ``episodes`` episodes of ``env`` with ``actor`` and return them (see the module doc).

    Args:
        env: the env (reset here with ``seed``).
        actor: chunk actor.
        episodes: episodes to finish (counted over every env; the first ``episodes`` to end are kept).
        seed: reset seed of the env.
        keys: observation keys to keep (default: every tensor key).
        desc: progress bar label.
    """
    obs = env.reset(seed=seed)
    keys = keys or [k for k in obs if k != TASK]
    b = env.num_envs
    frames: list[list[dict[str, Tensor]]] = [[_row(obs, i, keys)] for i in range(b)]
    flags: list[list[bool]] = [[False] for _ in range(b)]
    tasks = list(obs[TASK])
    out: list[Episode] = []
    still = torch.from_numpy(env.still_actions())
    with tqdm(total=episodes, desc=desc, unit="ep") as bar:
        while len(out) < episodes:
            chunk = actor(obs).detach().cpu().float()
            ended = torch.zeros(b, dtype=torch.bool)
            for h in range(chunk.shape[1]):
                act = torch.where(ended[:, None], still, chunk[:, h])
                obs, _, term, trunc, info = env.step(act)
                done = term | trunc
                for i in range(b):
                    if ended[i]:
                        continue
                    if done[i]:
                        frames[i].append(_row(info["final_obs"], i, keys))
                        flags[i].append(bool(info["success"][i]))
                        if len(out) < episodes:
                            out.append(_episode(frames[i], flags[i], tasks[i]))
                            bar.update(1)
                        ended[i] = True
                    else:
                        frames[i].append(_row(obs, i, keys))
                        flags[i].append(bool(info["success"][i]))
            for i in ended.nonzero().flatten().tolist():  # their next episode starts from this observation
                frames[i], flags[i], tasks[i] = [_row(obs, i, keys)], [False], obs[TASK][i]
            bar.set_postfix(success=f"{sum(e.succeeded for e in out)}/{len(out)}")
    return out


def _episode(frames: list[dict[str, Tensor]], flags: list[bool], task: str) -> Episode:
    return Episode(obs={k: torch.stack([f[k] for f in frames]) for k in frames[0]},
                   success=torch.tensor(flags, dtype=torch.bool), task=task)


def read_dataset_episodes(root: str | Path, keys: list[str] | None = None, max_episodes: int = 0,
                          desc: str = "read") -> list[Episode]:
    """Read a LeRobotDataset's episodes with success labels (see the module doc for the one-frame shift).

    Args:
        root: the dataset folder.
        keys: observation keys to keep (default: every ``observation.*`` feature).
        max_episodes: read only the first this many episodes; 0 = all.

    Raises:
        EpisodeDataError: naming the folder when it is not a LeRobotDataset, lacks a key of ``keys``, or has
            neither ``next.success`` nor ``next.reward`` to label success with.
    """
    from sim.dataset import load_dataset

    root = Path(root)
    try:
        ds = load_dataset(root)
    except FileNotFoundError as exc:
        raise EpisodeDataError(str(exc)) from None
    feats: dict[str, Any] = ds.meta.features
    label = SUCCESS if SUCCESS in feats else REWARD if REWARD in feats else None
    if label is None:
        raise EpisodeDataError(f"{root}: the dataset has neither {SUCCESS!r} nor {REWARD!r}, so no frame says "
                               "whether the task succeeded; record with `vla-rl collect` or add a success field")
    keys = keys or [k for k in feats if k.startswith("observation.")]
    missing = [k for k in keys if k not in feats]
    if missing:
        have = sorted(k for k in feats if k.startswith("observation."))
        raise EpisodeDataError(f"{root}: the dataset has no feature {missing[0]!r}, which the reward model reads "
                               f"(its observation features: {have})")
    per_ep: dict[int, tuple[list[dict[str, Tensor]], list[bool], str]] = {}
    total = ds.meta.total_episodes if not max_episodes else min(max_episodes, ds.meta.total_episodes)
    with tqdm(total=len(ds), desc=desc, unit="frame") as bar:
        for i in range(len(ds)):
            item = ds[i]
            bar.update(1)
            ep = int(item["episode_index"])
            if ep >= total:
                continue
            row = {}
            for k in keys:
                v = item[k]
                if k.startswith(OBS_IMAGE_PREFIX):  # CHW float in [0, 1] -> HWC uint8
                    v = (v.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0)
                row[k] = torch.as_tensor(v)
            flag = float(torch.as_tensor(item[label]).reshape(-1)[0]) > 0
            frames, flags, _ = per_ep.setdefault(ep, ([], [], str(item.get(TASK, ""))))
            frames.append(row)
            flags.append(flag)
    out = []
    for ep in sorted(per_ep):
        frames, flags, task = per_ep[ep]
        shifted = [False] + flags[:-1]
        shifted[-1] = shifted[-1] or flags[-1]
        out.append(_episode(frames, shifted, task))
    if not out:
        raise EpisodeDataError(f"{root}: no episode read")
    return out
