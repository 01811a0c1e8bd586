"""Supervised learning (imitation): flow matching / token cross-entropy on a dataset's action chunks.

One config, :class:`SFTConfig`, and three layers:

- :class:`SFTUpdater`: one gradient step on a :class:`~vla_rl.data.ChunkBatch` (AdamW, warm-up and cosine schedule,
  gradient clipping, random-shift augmentation, an optional weight EMA, :class:`vla_rl.ema.WeightEMA`), with
  ``state_dict`` for checkpoints; what ``filtered_bc`` and ``rac`` train with too;
- :class:`SFTLearner`, registered as ``sft``: ``steps_per_iter`` updater steps per iteration on minibatches of the
  loop's dataset (``vla-rl train --algo.type sft --data.path DATASET``; any LeRobotDataset, features matched by
  name: :func:`vla_rl.data.load_chunks`), evaluated, logged, checkpointed and resumed as any run;
- :func:`save_sft_policy` / :func:`pretraining_dataset`: the policy folder pre-training writes (``sft.json`` names
  the dataset). ``vla-rl sft`` and the quickstart's pre-training run the learner through the same trainer, one
  gradient step per iteration (:func:`vla_rl.commands.sft.pretrain`).

Frames are loaded into memory once (demo sets are small) and turned into action chunks: the target of frame ``i``
is ``actions[i : i + H]`` of its episode, padded with the last action and masked past the episode's end.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from policies.base import Policy
from vla_core.keys import OBS_IMAGE_PREFIX
from vla_core.manifest import fsync_dir, write_manifest
from vla_rl.algorithms.base import (
    IterationInputs,
    Learner,
    LearnerConfig,
    Needs,
    SmokeLimits,
    freeze_encoder,
    register_learner,
)
from vla_rl.data.chunks import ChunkBatch, ChunkDataset
from vla_rl.ema import WeightEMA

SFT_RECORD = "sft.json"
"""The statistics file of a policy folder written by :func:`save_sft_policy`."""


@dataclass
class SFTConfig(LearnerConfig):
    """Supervised learning settings: ``--algo.*`` of ``vla-rl train --algo.type sft`` (and of the learners built on
    it, ``filtered_bc`` and ``rac``), the top-level flags of ``vla-rl sft``, the quickstart's ``--sft.*``."""

    steps: int = 0
    """Length of the learning-rate schedule in gradient steps; 0 = the run's ``iterations x steps_per_iter``
    (after it the learning rate stays at 10%). Pre-training (``vla-rl sft``) runs this many steps."""
    steps_per_iter: int = 100
    """Gradient steps per training iteration (between evaluations and checkpoints; pre-training: 1)."""
    batch_size: int = 32
    """Frames per step (over all ranks)."""
    lr: float = 1e-3
    """AdamW learning rate (cosine-decayed to 10%)."""
    warmup_steps: int = 0
    """Raise the learning rate linearly from ``lr / warmup_steps`` to ``lr`` over the first this many steps, then
    decay it along the cosine over the rest; 0: no warm-up (the cosine from the first step). For fine-tuning a
    trained policy: a fresh AdamW's first steps move every weight by about ``lr`` whatever the gradient's size."""
    weight_decay: float = 1e-4
    """AdamW weight decay."""
    episodes: int = 0
    """Pre-training: use only the first this many episodes of the dataset (few-shot); 0 = all. (``vla-rl train``
    reads ``--data.episodes``.)"""
    grad_clip: float = 1.0
    """Gradient-norm clip."""
    image_shift: int = 4
    """Random-shift augmentation: pad camera images by this many pixels (edge) and crop back at a random offset."""
    ema: float = 0.0
    """Decay of an exponential moving average of the weights per gradient step (0: none), from the weights after
    the first step (:class:`vla_rl.ema.WeightEMA`). With it, every iteration ends with the averaged weights in the
    policy: the evaluation, the checkpoint's policy (the pre-trained policy) and the next collection (RaC's rounds)
    use them, while the gradient steps go on from the raw iterate, which the learner's state keeps (as Diffusion
    Policy trains and evaluates)."""
    freeze_encoder: bool = False
    """Keep the policy's observation encoder (:meth:`policies.Policy.encoder_parameters`: the camera CNNs, the
    prefix transformer, the instruction embedding) as it is and train the rest: a gradient step then skips the
    encoder's backward pass and its optimizer state (the quickstart's RL stage: 211 -> 94 ms a step of 64 rows,
    but seed 0 ends at 0.59 instead of 0.72; docs/results.md, "Training throughput"). Its forward still runs on
    every row, augmented images included."""
    stop_at_success: float = 0.0
    """Pre-training: stop early once a success check (episodes on seeds of their own, apart from evaluation and
    training) reaches this rate; 0 = train all ``steps``. For a deliberately weak start: the policy succeeds
    sometimes but not reliably. (``vla-rl train`` runs its iterations: ``vla-rl sft`` has the success-based stop.)"""
    check_every: int = 100
    """Steps between success checks (with ``stop_at_success``)."""
    check_from: int = 300
    """First step of a success check."""
    check_episodes: int = 64
    """Episodes per success check."""

    def __post_init__(self) -> None:
        # the fields are --algo.<name> in vla-rl train, --sft.<name> in the quickstart, --<name> in vla-rl sft
        if not 0.0 <= self.ema < 1.0:
            raise ValueError(f"SFT ema must lie in [0, 1) (0: no moving average), got {self.ema}")
        if self.warmup_steps < 0:
            raise ValueError(f"SFT warmup_steps must be >= 0 (0: no warm-up), got {self.warmup_steps}")
        if not 0.0 <= self.stop_at_success <= 1.0:
            raise ValueError(f"SFT stop_at_success={self.stop_at_success} must lie in [0, 1]")
        if self.check_every < 1 or self.check_episodes < 1 or self.check_from < 1:
            raise ValueError("SFT check_every, check_from and check_episodes must be >= 1")
        if self.steps_per_iter < 1:
            raise ValueError(f"SFT steps_per_iter must be >= 1, got {self.steps_per_iter}")
        if self.steps < 0:
            raise ValueError(f"SFT steps must be >= 0 (0 = iterations x steps_per_iter), got {self.steps}")

    def for_run(self, iterations: int) -> LearnerConfig:
        if self.steps:
            return self
        return dataclasses.replace(self, steps=max(1, iterations * self.steps_per_iter))

    def smoke(self, limits: SmokeLimits, num_envs: int) -> tuple[LearnerConfig, int]:
        small = dataclasses.replace(self, steps_per_iter=min(self.steps_per_iter, 4),
                                    batch_size=min(self.batch_size, limits.max_minibatch))
        return small, min(num_envs, limits.max_envs)


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
    gradient-norm clipping at ``cfg.grad_clip``, random-shift augmentation of every camera image by up to
    ``cfg.image_shift`` pixels (offsets drawn from ``generator``), and with ``cfg.ema > 0`` the moving average of
    the weights after every step (:attr:`ema`, which :meth:`vla_rl.ema.WeightEMA.apply` shows in the policy).

    Build it after ``policy.fit_normalization``.

    Args:
        policy: the policy to train (any with ``sft_loss``).
        cfg: the SFT settings (``steps`` is the schedule's length unless ``total_steps`` is given).
        generator: the RNG of the augmentation; a fresh one seeded with ``seed`` when None.
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
        self.ema = WeightEMA(policy, cfg.ema, from_first_update=True) if cfg.ema else None
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
            self.ema.update()
        self.steps += 1
        return {"sft/loss": float(loss.detach()), "sft/lr": self.scheduler.get_last_lr()[0],
                "sft/grad_norm": float(grad_norm)}

    def state_dict(self) -> dict[str, Any]:
        """Optimizer, schedule, EMA (average and raw weights), augmentation RNG and step count (the policy's weights
        are not in it)."""
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "ema": self.ema.state_dict() if self.ema is not None else None,
                "generator": self.generator.get_state(), "steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (the EMA's raw weights go into the policy, unapplied).

        Raises:
            ValueError: when ``state`` has EMA weights and this updater has no EMA, or the reverse.
        """
        if (state["ema"] is None) != (self.ema is None):
            raise ValueError(f"SFT state {'has' if state['ema'] is not None else 'lacks'} EMA weights but "
                             f"ema={self.cfg.ema}")
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


@register_learner("sft", SFTConfig, help="supervised fine-tuning on a LeRobotDataset (--data.path)")
class SFTLearner(Learner):
    """``steps_per_iter`` :class:`SFTUpdater` steps per iteration on the loop's offline data.

    A fresh run (first iteration, nothing resumed) first fits the policy's normalization on the data (action and
    state statistics, and its input statistics: ``fit_input_normalization``); ``freeze_encoder`` trains all but the
    observation encoder; with ``ema`` the policy shows the average between iterations.
    """

    needs = Needs.DATASET
    uses_critic = False
    cfg: SFTConfig

    def __init__(self, cfg: SFTConfig, policy: Policy) -> None:
        super().__init__(cfg, policy)
        if cfg.freeze_encoder:  # before the updater collects the trainable parameters
            freeze_encoder(policy)
        self.updater: SFTUpdater | None = None
        self._pending_state: dict[str, Any] | None = None
        self._pending_rank_state: dict[str, Any] | None = None

    def _load(self, path: str) -> ChunkDataset:
        """The LeRobotDataset at ``path`` as chunks of this policy's inputs and horizon (demos, extra data)."""
        from vla_rl.data.dataset import load_policy_chunks

        return load_policy_chunks(path, self.policy)

    def _start(self, data: Any) -> SFTUpdater:
        """Fit the normalization on the data (first run only; ``data`` None: keep the policy's) and build the
        updater after it; a resumed run's updater shows its average again, as when it was saved."""
        if data is not None and self.iteration == 0 and self._pending_state is None:
            self.policy.fit_normalization(*data.normalization_data())
            self.policy.fit_input_normalization(data.obs)
        if self.cfg.steps < 1:
            raise ValueError(f"algo.steps={self.cfg.steps}: resolve the schedule's length with "
                             "cfg.for_run(iterations) before building the learner (the trainer does)")
        updater = SFTUpdater(self.policy, self.cfg, seed=torch.initial_seed() % (2**63))
        if self._pending_state is not None:
            updater.load_state_dict(self._pending_state)
            if updater.ema is not None:
                updater.ema.apply()
            self._pending_state = None
        if self._pending_rank_state is not None:  # this rank's own minibatch stream (rank 0's came with the state)
            updater.generator.set_state(self._pending_rank_state["generator"])
            self._pending_rank_state = None
        updater.call = self.call
        return updater

    def collect(self, inputs: IterationInputs) -> list[ChunkBatch]:
        if inputs.data is None:
            raise ValueError("algo.type=sft trains on offline data: pass --data.path DATASET")
        if self.updater is None:
            self.updater = self._start(inputs.data)
        gen = self.updater.generator
        bs = self.dist.shard(min(self.cfg.batch_size, len(inputs.data)), "algo.batch_size")  # over all ranks
        return [inputs.data.sample(bs, gen) for _ in range(self.cfg.steps_per_iter)]

    def update(self, batches: list[ChunkBatch]) -> dict[str, float]:
        sums: dict[str, float] = {}
        ema = self.updater.ema if self.updater is not None else None
        if ema is not None:  # the gradient steps go on from the raw iterate
            ema.restore()
        self._train_steps(batches, sums)
        if ema is not None:  # evaluation, checkpoint and the next collection see the average
            ema.apply()
        self.iteration += 1
        return self._averages(sums)

    def _train_steps(self, batches: list[ChunkBatch], into: dict[str, float]) -> None:
        """One gradient step per batch, adding each step's statistics and the step count (``steps``) to ``into``."""
        assert self.updater is not None
        for batch in batches:
            for k, v in self.updater.step(batch).items():
                into[k] = into.get(k, 0.0) + v
            into["steps"] = into.get("steps", 0.0) + 1.0

    @staticmethod
    def _averages(sums: dict[str, float]) -> dict[str, float]:
        """``update/<name>`` means per step of what :meth:`_train_steps` summed (nothing for no step)."""
        steps = sums.pop("steps", 0.0)
        return {f"update/{k.removeprefix('sft/')}": v / steps for k, v in sums.items()} if steps else {}

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.updater.optimizer] if self.updater is not None else []

    def state_dict(self) -> dict[str, Any]:
        return {"iteration": self.iteration, "sft": self.updater.state_dict() if self.updater is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.iteration = state["iteration"]
        self._pending_state = state.get("sft")

    def rank_state(self) -> dict[str, Any]:
        """The minibatch / augmentation generator: each rank samples its own rows."""
        return {"generator": self.updater.generator.get_state()} if self.updater is not None else {}

    def load_rank_state(self, state: dict[str, Any]) -> None:
        if state.get("generator") is not None:
            self._pending_rank_state = state


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
