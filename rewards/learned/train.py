"""Fit a :class:`~rewards.learned.model.RewardModel` on labelled episodes and measure it on held-out episodes.

Episodes (not frames) are split into training and held-out sets, so the held-out metrics say how the model
does on episodes it never saw. Frames are fitted with binary cross-entropy on soft targets (0/1 success
labels for the classifier, progress fractions for the process reward model); for the classifier the positive
frames are up-weighted by the negative/positive ratio, since success frames are few. The learning rate decays
to 0 along a cosine by default: with a constant rate the last epoch's model is one draw from a trajectory whose
calibration swings from epoch to epoch (docs/results.md, "Learned rewards"). When the
training episodes carry more than one instruction the model also reads the instruction (``FitConfig.instruction``):
its words scale and shift the CNN's channels (``FitConfig.film``), and successful episodes relabelled with another
instruction can be added as failures (``FitConfig.counterfactual``), which is what teaches it to tell the named
object from another one (docs/results.md, "Learned rewards").

Metrics (:func:`classifier_metrics`, :func:`progress_metrics`) on the held-out episodes:

- classifier, per frame: precision, recall, accuracy at the threshold; per episode (``episode_accuracy``): the
  episode is called successful when the model says success on its last frame (the state it ended in), compared
  with whether it succeeded; ``first_verdict_accuracy``: the episode is called successful when the model says
  success on any of its frames, which is what a terminating ``classifier`` reward asked after every step would
  conclude (a verdict ends the episode as a success), so failures it fires on anywhere count as errors;
- progress: mean absolute error of the predicted progress, and the rank correlation of prediction and label.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from tqdm import tqdm

from rewards.learned.labels import Episode, swap_instruction
from rewards.learned.model import INSTRUCTION_IDS, RewardModel, RewardModelConfig, instruction_words
from sim.tasks import TASK_INDEX as TASK_INDEX_KEY
from vla_core.keys import OBS_STATE

INSTRUCTION_MODES = ("auto", "yes", "no")
LR_SCHEDULES = ("cosine", "constant")


@dataclass
class FitConfig:
    """Training of a reward model."""

    epochs: int = 20
    """Passes over the training frames."""
    batch_size: int = 128
    """Frames per gradient step."""
    lr: float = 1e-3
    """Adam learning rate."""
    width: int = 32
    """Channels of the CNN and width of the MLPs (:class:`~rewards.learned.model.RewardModelConfig`)."""
    holdout: float = 0.2
    """Fraction of the episodes held out for the reported metrics."""
    threshold: float = 0.5
    """Classifier: P(success) at or above which a frame counts as success in the metrics."""
    seed: int = 0
    """Seed of the episode split, the initial weights and the batch order."""
    keys: list[str] = field(default_factory=list)
    """Observation keys the model reads; empty = every camera and ``observation.state`` of the data."""
    instruction: str = "auto"
    """Read the episode's instruction too: ``auto`` (when the training episodes have more than one), ``yes``,
    ``no``."""
    lr_schedule: str = "cosine"
    """``cosine`` (decay to 0 over the epochs) or ``constant``."""
    film: bool = True
    """When the model reads the instruction, let it also scale and shift the cameras' CNN channels (FiLM,
    :attr:`~rewards.learned.model.RewardModelConfig.film`); False only concatenates the words' embedding."""
    counterfactual: bool = False
    """A model reading the instruction also trains on episodes under another of the training instructions
    (seeded pick; :func:`instruction_swaps`). Classifier: every successful episode, every frame labelled failure:
    it shows what an RL policy finds first, the task done on the wrong object. Valid when succeeding at one
    instruction means failing the others (pick the red cube / pick the blue cube); leave it off for instructions
    one episode can satisfy together. Progress (``stages`` labels): every episode, relabelled for the new
    instruction, so lifting the wrong cube is worth no progress."""

    def __post_init__(self) -> None:
        for name, choices in (("instruction", INSTRUCTION_MODES), ("lr_schedule", LR_SCHEDULES)):
            if getattr(self, name) not in choices:
                raise ValueError(f"fit.{name} must be one of {choices}, got {getattr(self, name)!r}")


def split_episodes(n: int, holdout: float, seed: int) -> tuple[list[int], list[int]]:
    """``(train, held_out)`` episode indices: a seeded shuffle, ``max(1, round(holdout * n))`` held out
    (none when ``holdout`` is 0 or ``n < 2``)."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    k = 0 if holdout <= 0 or n < 2 else min(n - 1, max(1, round(holdout * n)))
    return sorted(order[k:]), sorted(order[:k])


def stack_frames(episodes: list[Episode], keys: list[str]) -> dict[str, Tensor]:
    """Every frame of ``episodes`` as one batch: key -> ``[N, ...]``."""
    return {k: torch.cat([e.obs[k] for e in episodes]) for k in keys}


def model_batch(model: RewardModel, episodes: list[Episode], frames: dict[str, Tensor] | None = None
                ) -> dict[str, Tensor]:
    """Every frame of ``episodes`` as the batch ``model`` reads: its input keys (``frames`` when already
    stacked), and, when it reads the instruction, each frame's episode instruction as word ids
    (:data:`~rewards.learned.model.INSTRUCTION_IDS`, tokenized once per episode)."""
    batch = dict(frames) if frames is not None else stack_frames(episodes, list(model.config.inputs))
    if model.reads_instruction:
        lengths = torch.tensor([e.length for e in episodes])
        batch[INSTRUCTION_IDS] = model.instruction_ids([e.task for e in episodes]).repeat_interleave(lengths, 0)
    return batch


def vocabulary(episodes: list[Episode], mode: str) -> list[str]:
    """The words of the episodes' instructions when the model should read them (``mode``, see
    :attr:`FitConfig.instruction`), else ``[]``."""
    tasks = {e.task for e in episodes if e.task}
    if mode == "no" or (mode == "auto" and len(tasks) < 2):
        return []
    if not tasks:
        raise ValueError("fit.instruction yes: the episodes carry no instruction (task) to read")
    return sorted({w for t in tasks for w in instruction_words(t)})


def instruction_swaps(episodes: list[Episode], seed: int, successes_only: bool = True) -> list[Episode]:
    """Episodes again under another instruction of ``episodes`` (a seeded pick), labelled failure on every frame
    (:attr:`FitConfig.counterfactual`; :func:`~rewards.learned.labels.swap_instruction`): the successful ones
    (``successes_only``: a success at one instruction is a failure at the others) or all of them (for stage
    labels, which are recomputed for the new instruction). Where the episodes carry a privileged task index, the
    copies carry the new instruction's. The copies share the originals' frames."""
    tasks = sorted({e.task for e in episodes if e.task})
    if len(tasks) < 2:
        return []
    index = {e.task: int(e.obs[TASK_INDEX_KEY].reshape(-1)[0]) for e in episodes if TASK_INDEX_KEY in e.obs}
    rng = random.Random(seed)
    out = []
    for e in episodes:
        if e.task not in tasks or (successes_only and not e.succeeded):
            continue
        other = rng.choice([t for t in tasks if t != e.task])
        out.append(swap_instruction(e, other, index.get(other)))
    return out


def default_keys(episode: Episode) -> list[str]:
    """The camera keys and ``observation.state`` of an episode (privileged ``observation.env_state`` excluded:
    a reward model must read what the policy and a real robot have)."""
    return [k for k in episode.obs if k.startswith("observation.images.")] + (
        [OBS_STATE] if OBS_STATE in episode.obs else [])


def fit_reward_model(kind: str, episodes: list[Episode], targets: list[Tensor], cfg: FitConfig,
                     desc: str = "fit", relabel: Callable[[Episode], Tensor] | None = None
                     ) -> tuple[RewardModel, list[int], list[int]]:
    """Train a reward model of ``kind`` on the training split of ``episodes``.

    Args:
        kind: ``classifier`` or ``progress``.
        episodes: labelled episodes; ``targets[i]`` is ``float32 [T_i]`` in ``[0, 1]`` for episode ``i``.
        cfg: training settings.
        relabel: progress with ``cfg.counterfactual``: the labeller of an episode swapped to another instruction
            (:func:`~rewards.learned.labels.stage_targets`); every training episode is added swapped.

    Returns:
        ``(model, train_idx, held_out_idx)``.

    Raises:
        ValueError: for no episodes, a key the episodes lack, or (classifier) training frames of one class only.
    """
    if not episodes:
        raise ValueError("no episodes to train a reward model on")
    keys = list(cfg.keys) or default_keys(episodes[0])
    for k in keys:
        if k not in episodes[0].obs:
            raise ValueError(f"the episodes have no {k!r} (they have {sorted(episodes[0].obs)})")
    train_idx, held_idx = split_episodes(len(episodes), cfg.holdout, cfg.seed)
    train_eps = [episodes[i] for i in train_idx]
    train_targets = [targets[i] for i in train_idx]
    words = vocabulary(train_eps, cfg.instruction)
    if cfg.counterfactual:
        if not words:
            raise ValueError("fit.counterfactual needs a model that reads the instruction: the training episodes "
                             "carry fewer than two instructions, or fit.instruction is 'no'")
        if kind == "progress" and relabel is None:
            raise ValueError("fit.counterfactual for a progress model needs labels that can be recomputed for "
                             "another instruction (--labels stages)")
        swaps = instruction_swaps(train_eps, cfg.seed, successes_only=kind == "classifier")
        train_targets = train_targets + [relabel(e) if kind == "progress" else e.success.float()  # type: ignore[misc]
                                         for e in swaps]
        train_eps = train_eps + swaps
    obs = stack_frames(train_eps, keys)
    y = torch.cat(train_targets).float()
    pos_weight = 1.0
    if kind == "classifier":
        pos = float((y > 0.5).sum())
        if pos == 0 or pos == len(y):
            raise ValueError(f"the training episodes have {'no' if pos == 0 else 'only'} success frames: a success "
                             "classifier needs both (record failures too, e.g. `--only_success false`)")
        pos_weight = (len(y) - pos) / pos
    torch.manual_seed(cfg.seed)
    state = obs.get(OBS_STATE)
    config = RewardModelConfig(
        kind=kind, inputs={k: list(obs[k].shape[1:]) for k in keys}, width=cfg.width,
        state_mean=state.float().mean(0).tolist() if state is not None else [],
        state_std=state.float().std(0).tolist() if state is not None else [],
        vocabulary=words, film=cfg.film,
    )
    model = RewardModel(config)
    obs = model_batch(model, train_eps, obs)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    gen = torch.Generator().manual_seed(cfg.seed)
    n = len(y)
    steps = cfg.epochs * ((n + cfg.batch_size - 1) // cfg.batch_size)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda k: 0.5 * (1 + math.cos(math.pi * k / steps)) if cfg.lr_schedule == "cosine" else 1.0)
    weights = torch.where(y > 0.5, torch.tensor(pos_weight), torch.tensor(1.0))
    model.train()
    with tqdm(range(cfg.epochs), desc=desc, unit="epoch") as bar:
        for _ in bar:
            order = torch.randperm(n, generator=gen)
            total = 0.0
            for i in range(0, n, cfg.batch_size):
                idx = order[i:i + cfg.batch_size]
                logits = model({k: v[idx] for k, v in obs.items()})
                loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, y[idx], weight=weights[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
                sched.step()
                total += float(loss.detach()) * len(idx)
            bar.set_postfix(loss=f"{total / n:.4f}")
    return model.eval(), train_idx, held_idx


def classifier_metrics(model: RewardModel, episodes: list[Episode], threshold: float = 0.5) -> dict[str, Any]:
    """Frame precision / recall / accuracy and episode accuracy of a success classifier (module doc)."""
    if not episodes:
        return {}
    prob = model.predict(model_batch(model, episodes), where="held-out frames")
    label = torch.cat([e.success for e in episodes])
    pred = prob >= threshold
    tp, fp = int((pred & label).sum()), int((pred & ~label).sum())
    fn, tn = int((~pred & label).sum()), int((~pred & ~label).sum())
    lengths = torch.tensor([e.length for e in episodes])
    last = torch.cumsum(lengths, 0) - 1
    ep_pred, ep_true = pred[last], torch.tensor([e.succeeded for e in episodes])
    episode_of_frame = torch.repeat_interleave(torch.arange(len(episodes)), lengths)
    ep_any = torch.zeros(len(episodes), dtype=torch.long).index_add_(0, episode_of_frame, pred.long()) > 0
    return {
        "episodes": len(episodes), "frames": int(label.numel()), "positive_frames": int(label.sum()),
        "precision": tp / (tp + fp) if tp + fp else float("nan"), "recall": tp / (tp + fn) if tp + fn else float("nan"),
        "accuracy": (tp + tn) / label.numel(), "episode_accuracy": float((ep_pred == ep_true).float().mean()),
        "first_verdict_accuracy": float((ep_any == ep_true).float().mean()),
        "failures_called_success": int((ep_any & ~ep_true).sum()),
        "successful_episodes": int(ep_true.sum()), "threshold": threshold,
    }


def progress_metrics(model: RewardModel, episodes: list[Episode], targets: list[Tensor]) -> dict[str, Any]:
    """Mean absolute error and Spearman rank correlation of predicted vs labelled progress on ``episodes``, and
    ``max_excess``: the mean over episodes of (the highest progress predicted in the episode - the highest
    labelled), what the ``milestone`` form (:class:`rewards.learned.terms.ProgressTerm`) would pay an episode beyond
    its true milestones (``max_excess_failed``: over the episodes that did not succeed, where over-paying teaches a
    policy to fail; absent when every episode succeeded)."""
    if not episodes:
        return {}
    pred = model.predict(model_batch(model, episodes), where="held-out frames")
    y = torch.cat(targets).float()
    excess = torch.stack([p.max() - t.float().max() for p, t in
                          zip(pred.split([len(t) for t in targets]), targets)])
    failed = torch.tensor([not e.succeeded for e in episodes])

    def ranks(x: Tensor) -> Tensor:
        return torch.argsort(torch.argsort(x)).float()

    rp, ry = ranks(pred), ranks(y)
    rp, ry = rp - rp.mean(), ry - ry.mean()
    corr = float((rp * ry).sum() / (rp.norm() * ry.norm()).clamp_min(1e-9))
    out = {"episodes": len(episodes), "frames": int(y.numel()), "mae": float((pred - y).abs().mean()),
           "spearman": corr, "max_excess": float(excess.mean())}
    if failed.any():
        out["max_excess_failed"] = float(excess[failed].mean())
    return out
