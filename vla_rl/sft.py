"""Supervised pre-training (imitation) of a policy on demonstrations stored as a LeRobotDataset.

Frames are loaded into memory once (few-shot demo sets are small) and turned
into action chunks: the target of frame ``i`` is ``actions[i : i + H]`` of its
episode, padded with the last action and masked past the episode's end.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from tqdm import tqdm

from policies.base import Policy
from sim.core import OBS_IMAGE_PREFIX, OBS_STATE, TASK
from sim.dataset import ACTION, load_dataset


@dataclass
class SFTConfig:
    """Supervised pre-training settings."""

    steps: int = 1500
    """Gradient steps."""
    batch_size: int = 32
    """Frames per step."""
    lr: float = 1e-3
    """AdamW learning rate (cosine-decayed to 10%)."""
    weight_decay: float = 1e-4
    """AdamW weight decay."""
    episodes: int = 0
    """Use only the first this many episodes of the dataset (few-shot); 0 = all."""
    grad_clip: float = 1.0
    """Gradient-norm clip."""
    image_shift: int = 4
    """Random-shift augmentation: pad camera images by this many pixels (edge) and crop back at a random offset."""
    ema: float = 0.0
    """Decay of an exponential moving average of the weights, which become the pre-trained policy (as
    Diffusion Policy evaluates its EMA weights); 0 keeps the last iterate."""
    stop_at_success: float = 0.0
    """Stop early once a success check (``pretrain``'s ``success_check``: episodes on seeds of their own,
    apart from evaluation and training) reaches this rate; 0 = train all ``steps``. For a deliberately
    weak start: the policy succeeds sometimes but not reliably."""
    check_every: int = 100
    """Steps between success checks (with ``stop_at_success``)."""
    check_from: int = 300
    """First step of a success check."""
    check_episodes: int = 64
    """Episodes per success check."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.stop_at_success <= 1.0:
            raise ValueError(f"sft.stop_at_success={self.stop_at_success} must lie in [0, 1]")
        if self.check_every < 1 or self.check_episodes < 1 or self.check_from < 1:
            raise ValueError("sft.check_every, sft.check_from and sft.check_episodes must be >= 1")


@dataclass
class DemoChunks:
    """Demo frames as tensors: observations (images uint8 ``[N, H, W, 3]``), chunks ``[N, H, A]``, masks ``[N, H]``."""

    obs: dict[str, Any]
    actions: Tensor
    mask: Tensor
    episodes: int

    def __len__(self) -> int:
        return self.actions.shape[0]

    def batch(self, idx: Tensor) -> tuple[dict[str, Any], Tensor, Tensor]:
        obs = {k: ([v[i] for i in idx.tolist()] if k == TASK else v[idx]) for k, v in self.obs.items()}
        return obs, self.actions[idx], self.mask[idx]


def load_demo_chunks(root: str | Path, horizon: int, episodes: int = 0) -> DemoChunks:
    """Read a dataset written by ``vla-rl collect`` into :class:`DemoChunks`.

    Raises:
        FileNotFoundError: when ``root`` holds no dataset.
        ValueError: when it holds fewer than ``episodes`` episodes.
    """
    ds = load_dataset(root)
    n_eps = ds.num_episodes
    if episodes and episodes > n_eps:
        raise ValueError(f"{root}: asked for {episodes} demo episodes, the dataset has {n_eps}")
    keep = episodes or n_eps
    frames: dict[str, list] = {}
    ep_of: list[int] = []
    for i in range(len(ds)):
        item = ds[i]
        ep = int(item["episode_index"])
        if ep >= keep:
            continue
        ep_of.append(ep)
        for k, v in item.items():
            if k.startswith(OBS_IMAGE_PREFIX):
                v = (v.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0)  # CHW float -> HWC uint8
            elif k not in (OBS_STATE, ACTION, TASK):
                continue
            frames.setdefault(k, []).append(v)
    obs: dict[str, Any] = {k: (v if k == TASK else torch.stack(v)) for k, v in frames.items() if k != ACTION}
    acts = torch.stack(frames[ACTION]).float()
    eps = torch.tensor(ep_of)
    n = acts.shape[0]
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
    return DemoChunks(obs=obs, actions=acts[idx], mask=same, episodes=keep)


def random_shift(images: Tensor, pad: int, generator: torch.Generator) -> Tensor:
    """Shift each ``uint8 [B, H, W, 3]`` image by up to ``pad`` pixels (edge padding), one offset per image."""
    if pad <= 0:
        return images
    b, h, w, _ = images.shape
    padded = torch.nn.functional.pad(images.permute(0, 3, 1, 2).float(), (pad, pad, pad, pad), mode="replicate")
    dy = torch.randint(0, 2 * pad + 1, (b,), generator=generator)
    dx = torch.randint(0, 2 * pad + 1, (b,), generator=generator)
    rows = (dy[:, None] + torch.arange(h)[None, :])[:, None, :, None].expand(b, 3, h, w + 2 * pad)
    cropped = padded.gather(2, rows)
    cols = (dx[:, None] + torch.arange(w)[None, :])[:, None, None, :].expand(b, 3, h, w)
    return cropped.gather(3, cols).round().to(torch.uint8).permute(0, 2, 3, 1)


def pretrain(policy: Policy, data: DemoChunks, cfg: SFTConfig, seed: int = 0, log: Any = None,
             success_check: Callable[[], float] | None = None) -> dict[str, float]:
    """Imitation pre-training with ``policy.sft_loss``; normalization is fitted on ``data`` first.

    Args:
        log: optional callable ``log(step, scalars)``.
        success_check: with ``cfg.stop_at_success``, called every ``cfg.check_every`` steps from
            ``cfg.check_from`` on (policy in eval mode, RNG state restored afterwards, so training
            continues as without the check); returns the policy's success rate. Training stops at the
            first check that reaches ``cfg.stop_at_success``.

    Returns:
        ``{"sft/loss_first": ..., "sft/loss_last": ..., "sft/steps": ...}`` (loss means over the first /
        last 10% of steps; ``sft/steps`` run) plus ``sft/check_success`` of the last check when checks ran.
    """
    gen = torch.Generator().manual_seed(seed)
    policy.fit_normalization(data.obs[OBS_STATE], data.actions[data.mask])
    params = [p for p in policy.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * s / max(1, cfg.steps))))
    ema = torch.optim.swa_utils.AveragedModel(
        policy, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(cfg.ema), use_buffers=False,
    ) if cfg.ema else None
    policy.train()
    losses: list[float] = []
    checked: float | None = None
    bs = min(cfg.batch_size, len(data))
    with tqdm(range(cfg.steps), desc="pre-train (SFT)", unit="step") as bar:
        for step in bar:
            idx = torch.randint(0, len(data), (bs,), generator=gen)
            obs, actions, mask = data.batch(idx)
            for k in obs:
                if k.startswith(OBS_IMAGE_PREFIX):
                    obs[k] = random_shift(obs[k], cfg.image_shift, gen)
            loss = policy.sft_loss(obs, actions, mask)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            opt.step()
            sched.step()
            if ema is not None:
                ema.update_parameters(policy)
            losses.append(float(loss.detach()))
            if step % 25 == 0:
                bar.set_postfix(loss=f"{losses[-1]:.4f}")
                if log is not None:
                    log(step, {"sft/loss": losses[-1], "sft/lr": sched.get_last_lr()[0]})
            done = step + 1
            if (success_check is not None and cfg.stop_at_success and done < cfg.steps and done >= cfg.check_from
                    and (done - cfg.check_from) % cfg.check_every == 0):
                checked = _checked_success(policy, success_check)
                bar.write(f"pre-train step {done}: success check {checked:.2f} (stop at {cfg.stop_at_success:g})")
                if log is not None:
                    log(step, {"sft/check_success": checked})
                if checked >= cfg.stop_at_success:
                    break
    if ema is not None:
        with torch.no_grad():
            for p, avg in zip(params, [q for q in ema.module.parameters() if q.requires_grad], strict=True):
                p.copy_(avg)
    k = max(1, len(losses) // 10)
    out = {"sft/loss_first": sum(losses[:k]) / k, "sft/loss_last": sum(losses[-k:]) / k, "sft/steps": len(losses)}
    if checked is not None:
        out["sft/check_success"] = checked
    return out


def _checked_success(policy: Policy, success_check: Callable[[], float]) -> float:
    """``success_check()`` with the policy in eval mode and the RNG states restored afterwards."""
    policy.eval()
    try:
        with torch.random.fork_rng(), torch.no_grad():
            return float(success_check())
    finally:
        policy.train()
