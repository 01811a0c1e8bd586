"""Supervised pre-training (imitation) of a policy on a LeRobotDataset.

Three layers, each usable alone:

- :class:`SFTUpdater`: one gradient step on a :class:`~vla_rl.data.ChunkBatch` (AdamW, cosine schedule,
  gradient clipping, random-shift augmentation, optional EMA), with ``state_dict`` for checkpoints: what
  a learner in the RL trainer calls;
- :func:`pretrain`: the loop (seeded minibatches of a :class:`~vla_rl.data.ChunkDataset`, normalization
  fitted first, progress bar, optional success checks with early stop);
- :func:`pretrain_on_dataset` / :func:`save_sft_policy`: a dataset folder in, a policy folder out, as
  ``vla-rl sft`` and the quickstart's pre-training stage run them.

Frames are loaded into memory once (demo sets are small) and turned into action
chunks: the target of frame ``i`` is ``actions[i : i + H]`` of its episode,
padded with the last action and masked past the episode's end.
"""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor
from tqdm import tqdm

from policies.base import Policy
from vla_core.keys import OBS_IMAGE_PREFIX
from vla_core.manifest import fsync_dir, write_manifest
from vla_rl.data.chunks import ChunkBatch, ChunkDataset
from vla_rl.data.dataset import load_policy_chunks

SFT_RECORD = "sft.json"
"""The statistics file of a policy folder written by :func:`save_sft_policy`."""


@dataclass
class SFTConfig:
    """Supervised pre-training settings."""

    flags: ClassVar[str] = "sft."
    """How the command line spells these fields (the quickstart's ``--sft.*``), for error messages."""

    steps: int = 1500
    """Gradient steps."""
    batch_size: int = 32
    """Frames per step."""
    lr: float = 1e-3
    """AdamW learning rate (cosine-decayed to 10%)."""
    warmup_steps: int = 0
    """Raise the learning rate linearly from ``lr / warmup_steps`` to ``lr`` over the first this many steps, then
    decay it along the cosine over the rest; 0: no warm-up (the cosine from the first step). For fine-tuning a
    trained policy: a fresh AdamW's first steps move every weight by about ``lr`` whatever the gradient's size."""
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
        f = self.flags
        if not 0.0 <= self.ema < 1.0:
            raise ValueError(f"{f}ema must lie in [0, 1) (0: no moving average), got {self.ema}")
        if self.warmup_steps < 0:
            raise ValueError(f"{f}warmup_steps must be >= 0 (0: no warm-up), got {self.warmup_steps}")
        if not 0.0 <= self.stop_at_success <= 1.0:
            raise ValueError(f"{f}stop_at_success={self.stop_at_success} must lie in [0, 1]")
        if self.check_every < 1 or self.check_episodes < 1 or self.check_from < 1:
            raise ValueError(f"{f}check_every, {f}check_from and {f}check_episodes must be >= 1")


DemoChunks = ChunkDataset
"""The former name of :class:`~vla_rl.data.ChunkDataset` (kept for callers that build demo rows by hand)."""


def lr_factor(step: int, warmup: int, total: int) -> float:
    """The learning rate at ``step`` as a fraction of ``lr``: ``(step + 1) / warmup`` during the warm-up, then a
    cosine from 1 to 0.1 over the remaining ``total - warmup`` steps (held at 0.1 after ``total``)."""
    if step < warmup:
        return (step + 1) / warmup
    s, n = step - warmup, max(1, total - warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, n) / n))


class SFTUpdater:
    """One supervised step at a time on ``policy`` (its ``sft_loss``), with the optimizer state it carries.

    AdamW over the trainable parameters (``cfg.lr``, ``cfg.weight_decay``), the learning rate (after a linear
    warm-up of ``cfg.warmup_steps``) cosine-decayed from ``cfg.lr`` to 10% of it over the rest of ``total_steps``,
    gradient-norm clipping at ``cfg.grad_clip``, random-shift
    augmentation of every camera image by up to ``cfg.image_shift`` pixels (offsets drawn from ``generator``),
    and with ``cfg.ema > 0`` an exponential moving average of the weights that :meth:`use_ema_weights` copies
    into the policy.

    Build it after ``policy.fit_normalization`` (the EMA copy is taken here).

    Args:
        policy: the policy to train (any with ``sft_loss``).
        cfg: the SFT settings (``steps`` is the schedule's length unless ``total_steps`` is given).
        generator: the RNG of the augmentation; a fresh one seeded with ``seed`` when None. :func:`pretrain`
            passes the one it samples minibatches with, so one seed fixes the whole run.
        total_steps: steps of the cosine schedule; None = ``cfg.steps``.
        seed: seed of the fresh generator.
    """

    def __init__(self, policy: Policy, cfg: SFTConfig, generator: torch.Generator | None = None,
                 total_steps: int | None = None, seed: int = 0) -> None:
        self.policy = policy
        self.cfg = cfg
        self.generator = generator if generator is not None else torch.Generator().manual_seed(seed)
        self.total_steps = cfg.steps if total_steps is None else total_steps
        self.params = [p for p in policy.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, functools.partial(lr_factor, warmup=cfg.warmup_steps, total=self.total_steps))
        self.ema = torch.optim.swa_utils.AveragedModel(
            policy, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(cfg.ema), use_buffers=False,
        ) if cfg.ema else None
        self.steps = 0
        self.call: Callable[..., Any] = lambda method, *args: getattr(policy, method)(*args)
        """How :meth:`step` calls the policy's ``sft_loss``: a learner under DDP routes it through its wrapper
        (:meth:`vla_rl.algorithms.base.Learner.call`) so the gradients are all-reduced."""

    def augment(self, obs: dict[str, Any]) -> dict[str, Any]:
        """``obs`` with every ``observation.images.*`` randomly shifted (:func:`random_shift`), in key order."""
        out = dict(obs)
        for k in out:
            if k.startswith(OBS_IMAGE_PREFIX):
                out[k] = random_shift(out[k], self.cfg.image_shift, self.generator)
        return out

    def step(self, batch: ChunkBatch) -> dict[str, float]:
        """One gradient step on ``batch`` (``actions [B, H, A]``, ``mask [B, H]``; policy put in train mode).

        Returns:
            ``{"sft/loss": ..., "sft/lr": ..., "sft/grad_norm": ...}`` (the learning rate after the step; the
            gradient norm before clipping).
        """
        self.policy.train()
        loss = self.call("sft_loss", self.augment(batch.obs), batch.actions, batch.mask)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        if self.ema is not None:
            self.ema.update_parameters(self.policy)
        self.steps += 1
        return {"sft/loss": float(loss.detach()), "sft/lr": self.scheduler.get_last_lr()[0],
                "sft/grad_norm": float(grad_norm)}

    def use_ema_weights(self) -> None:
        """Copy the EMA weights into the policy's trainable parameters (nothing without ``cfg.ema``)."""
        if self.ema is None:
            return
        with torch.no_grad():
            averaged = [q for q in self.ema.module.parameters() if q.requires_grad]
            for p, avg in zip(self.params, averaged, strict=True):
                p.copy_(avg)

    def state_dict(self) -> dict[str, Any]:
        """Optimizer, schedule, EMA weights, augmentation RNG and step count (the policy's weights are not in it)."""
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "ema": self.ema.state_dict() if self.ema is not None else None,
                "generator": self.generator.get_state(), "steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned.

        Raises:
            ValueError: when ``state`` has EMA weights and this updater has no EMA, or the reverse.
        """
        if (state["ema"] is None) != (self.ema is None):
            raise ValueError(f"SFT state {'has' if state['ema'] is not None else 'lacks'} EMA weights but "
                             f"sft.ema={self.cfg.ema}")
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.ema is not None:
            self.ema.load_state_dict(state["ema"])
        self.generator.set_state(state["generator"])
        self.steps = int(state["steps"])


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


def pretrain(policy: Policy, data: ChunkDataset, cfg: SFTConfig, seed: int = 0, log: Any = None,
             success_check: Callable[[], float] | None = None) -> dict[str, float]:
    """Imitation pre-training with ``policy.sft_loss`` (:class:`SFTUpdater`); normalization is fitted on ``data`` first.

    Each step draws ``min(cfg.batch_size, len(data))`` rows uniformly (with replacement) on a generator seeded
    with ``seed``, which also draws the augmentation's shifts; with ``cfg.ema`` the EMA weights end up in the
    policy.

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
    policy.fit_normalization(*data.normalization_data())
    policy.fit_input_normalization(data.obs)
    updater = SFTUpdater(policy, cfg, generator=gen)
    policy.train()
    losses: list[float] = []
    checked: float | None = None
    bs = min(cfg.batch_size, len(data))
    with tqdm(range(cfg.steps), desc="pre-train (SFT)", unit="step") as bar:
        for step in bar:
            stats = updater.step(data.sample(bs, gen))
            losses.append(stats["sft/loss"])
            if step % 25 == 0:
                bar.set_postfix(loss=f"{losses[-1]:.4f}")
                if log is not None:
                    log(step, {"sft/loss": losses[-1], "sft/lr": stats["sft/lr"]})
            done = step + 1
            if (success_check is not None and cfg.stop_at_success and done < cfg.steps and done >= cfg.check_from
                    and (done - cfg.check_from) % cfg.check_every == 0):
                checked = _checked_success(policy, success_check)
                bar.write(f"pre-train step {done}: success check {checked:.2f} (stop at {cfg.stop_at_success:g})")
                if log is not None:
                    log(step, {"sft/check_success": checked})
                if checked >= cfg.stop_at_success:
                    break
    updater.use_ema_weights()
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


def pretrain_on_dataset(policy: Policy, root: str | Path, cfg: SFTConfig, seed: int = 0, log: Any = None,
                        success_check: Callable[[], float] | None = None) -> dict[str, Any]:
    """:func:`pretrain` ``policy`` on the first ``cfg.episodes`` episodes (0 = all) of the LeRobotDataset at ``root``.

    The features the policy reads are matched by name and checked (:func:`vla_rl.data.load_chunks`).

    Returns:
        :func:`pretrain`'s statistics plus ``frames`` and ``episodes`` trained on and ``dataset``, the absolute path
        of ``root`` (:func:`pretraining_dataset` reads it back from the saved policy folder).

    Raises:
        DatasetError: naming ``root`` and the feature, for a folder that is no LeRobotDataset, a feature the
            policy reads but the dataset lacks, a shape mismatch (both shapes), or too few episodes.
    """
    data = load_policy_chunks(root, policy, cfg.episodes)
    stats = pretrain(policy, data, cfg, seed=seed, log=log, success_check=success_check)
    return {**stats, "frames": len(data), "episodes": data.episodes, "dataset": str(Path(root).resolve())}


def save_sft_policy(policy: Policy, directory: str | Path, stats: dict[str, Any]) -> Path:
    """Write ``policy`` (``save_pretrained``) and ``sft.json`` (``stats``) to ``directory`` atomically: into
    ``.<name>.tmp`` beside it, then renamed, so ``directory`` either holds the whole policy or does not exist.
    Its ``manifest.json`` (:mod:`vla_core.manifest`) is rewritten after ``sft.json`` so that it lists every file.

    Returns:
        ``directory``.

    Raises:
        FileExistsError: when ``directory`` exists.
    """
    out = Path(directory)
    if out.exists():
        raise FileExistsError(f"{out} exists; remove it or choose another output folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    policy.save_pretrained(tmp)
    (tmp / SFT_RECORD).write_text(json.dumps(stats))
    write_manifest(tmp)
    os.replace(tmp, out)
    fsync_dir(out.parent)
    return out


def pretraining_dataset(directory: str | Path) -> str | None:
    """The dataset the policy folder ``directory`` was pre-trained on (the ``dataset`` its ``sft.json`` records), or
    None for a folder without that record (a policy from elsewhere, or saved before the record existed)."""
    record = Path(directory) / SFT_RECORD
    return json.loads(record.read_text()).get("dataset") if record.exists() else None
