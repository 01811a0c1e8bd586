"""PPO for VLA policies, read top to bottom: collect a rollout, form advantages, run epochs of minibatch steps.

One learner, two advantage estimators (``algo.advantage``):

- ``gae`` (``--algo.type ppo``): GAE over decisions (action chunks) with the policy's critic, trained by a clipped
  Huber value loss with its own learning rate; the first ``critic_warmup_iters`` iterations train only the critic.
- ``group`` (``--algo.type grpo``, the same learner with this default): critic-free. ``group_size`` rollouts per
  initial state, each episode's advantage ``(R - mean_group) / (std_group + 1e-6)`` broadcast to its decisions;
  dynamic sampling drops groups whose success rate lies outside a band (all-success or all-fail groups carry no
  signal).

The policy loss is the clipped PPO surrogate at the policy's log-prob level (``policy.evaluate`` re-scores what the
rollout recorded: flow chains, token ids...), with asymmetric and dual clip, an entropy bonus, an optional k3 KL to
the starting policy, a target-KL early stop and per-group gradient clipping. The math is in the pure functions of
:mod:`vla_rl.algorithms.advantages` and :mod:`vla_rl.algorithms.losses`. Several processes run the same code: the
collectives of :attr:`Learner.dist` (:mod:`vla_rl.distributed`) are identities with one.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from policies.base import Policy
from sim.core import EnvSpec
from vla_rl.algorithms.advantages import dynamic_sampling_mask, gae, group_relative
from vla_rl.algorithms.base import (IterationInputs, Learner, LearnerConfig, Needs, SmokeLimits, freeze_encoder,
                                    register_learner)
from vla_rl.algorithms.losses import entropy_bonus, kl_k3, ppo_policy_loss, value_loss
from vla_rl.config import ConfigError
from vla_rl.distributed import Distributed
from vla_rl.rollout import Rollout
from vla_rl.timing import StageTimes


class AdvantageEstimator(str, enum.Enum):
    """How :class:`PPOLearner` forms advantages (see the module doc)."""

    GAE = "gae"
    GROUP = "group"


@dataclass
class PPOConfig(LearnerConfig):
    """PPO (``--algo.type ppo``: GAE and a critic by default; ``--algo.type grpo`` for group-relative advantages)."""

    advantage: AdvantageEstimator = AdvantageEstimator.GAE
    """``gae``: GAE with the policy's critic. ``group``: group-relative returns, no critic (GRPO)."""
    decisions_per_iter: int = 8
    """gae: action chunks collected per env per iteration. group: upper bound on an episode's chunks."""
    epochs: int = 4
    """Passes over each rollout."""
    minibatch_size: int = 64
    """Decisions per gradient step (before accumulation)."""
    grad_accum_steps: int = 1
    """Minibatches accumulated per optimizer step."""
    lr_actor: float = 3e-4
    """Learning rate of the policy parameters."""
    clip_low: float = 0.2
    """PPO ratio clip below 1 (``1 - clip_low``)."""
    clip_high: float = 0.28
    """PPO ratio clip above 1 (``1 + clip_high``; 0.28 is "clip-higher")."""
    dual_clip: float = 3.0
    """Dual-clip constant c for negative advantages; 0 disables."""
    ent_coef: float = 0.0
    """Entropy bonus weight (0.005 is used with Flow-Noise)."""
    kl_coef: float = 0.0
    """Weight of the k3 KL to the starting policy; 0 disables (and keeps no reference copy)."""
    max_grad_norm: float = 1.0
    """Gradient-norm clip, applied to the actor's and the critic's parameters separately."""
    freeze_encoder: bool = False
    """Keep the policy's observation encoder (:meth:`policies.Policy.encoder_parameters`: vision and
    language) fixed and train only the action head (and the critic): RL then cannot blur the features
    pre-training learned, and an update skips the encoder's backward pass."""
    normalize_advantages: bool = True
    """Normalize advantages over each rollout."""
    target_kl: float = 0.0
    """Stop an update's epochs early once approx-KL exceeds this; 0 disables."""
    gamma: float = 0.99
    """gae: discount per decision (action chunk)."""
    lam: float = 0.95
    """gae: GAE lambda."""
    lr_critic: float = 1e-3
    """gae: learning rate of the value head."""
    value_clip: float = 0.2
    """gae: value clipping range around the old values; 0 disables."""
    huber_delta: float = 10.0
    """gae: Huber delta of the value loss; 0 = squared error."""
    vf_coef: float = 0.5
    """gae: weight of the value loss."""
    value_grad_to_actor: bool = False
    """gae: let the value loss also update the actor's parameters it flows through (a shared trunk). Off: the
    value loss trains only the critic's own parameters, so critic noise cannot move the policy."""
    critic_warmup_iters: int = 0
    """gae: iterations at the start during which only the critic learns."""
    group_size: int = 8
    """group: rollouts per initial state (``env.num_envs`` must be a multiple)."""
    success_band_low: float = 0.1
    """group, dynamic sampling: keep groups with success rate >= this."""
    success_band_high: float = 0.9
    """group, dynamic sampling: keep groups with success rate <= this."""
    dynamic_sampling: bool = True
    """group: drop groups outside the success band."""

    def __post_init__(self) -> None:
        self.advantage = AdvantageEstimator(self.advantage)
        for name in ("decisions_per_iter", "epochs", "minibatch_size", "grad_accum_steps", "group_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"algo.{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.clip_low < 1 or self.clip_high < 0:
            raise ValueError(f"algo.clip_low must be in [0, 1) and algo.clip_high >= 0, got {self.clip_low}, {self.clip_high}")
        if self.dual_clip and self.dual_clip <= 1:
            raise ValueError(f"algo.dual_clip must be > 1 or 0 (off), got {self.dual_clip}")
        if not 0 <= self.success_band_low <= self.success_band_high <= 1:
            raise ValueError("algo.success_band_low/high must satisfy 0 <= low <= high <= 1")
        if self.grouped and self.critic_warmup_iters:
            raise ValueError("algo.critic_warmup_iters trains a critic, which algo.advantage=group has none of")

    @property
    def grouped(self) -> bool:
        """Whether advantages are group-relative (no critic)."""
        return self.advantage is AdvantageEstimator.GROUP

    def check_run(self, num_envs: int) -> None:
        if self.grouped and num_envs % self.group_size:
            raise ValueError(f"algo.group_size={self.group_size} must divide env.num_envs={num_envs} "
                             "(GRPO plays group_size rollouts from each initial state)")

    def smoke(self, limits: SmokeLimits, num_envs: int) -> tuple[LearnerConfig, int]:
        decisions = max(min(self.decisions_per_iter, limits.max_decisions), limits.episode_decisions)
        small = dataclasses.replace(self, decisions_per_iter=decisions, epochs=1,
                                    minibatch_size=min(self.minibatch_size, limits.max_minibatch), grad_accum_steps=1)
        if not self.grouped:
            return small, min(num_envs, limits.max_envs)
        group = min(self.group_size, limits.max_group)
        return dataclasses.replace(small, group_size=group), group


@dataclass
class GRPOConfig(PPOConfig):
    """GRPO (``--algo.type grpo``): PPO with group-relative advantages, no critic, dynamic sampling."""

    advantage: AdvantageEstimator = AdvantageEstimator.GROUP
    """``group``: group-relative returns, no critic. ``gae``: GAE with the policy's critic (PPO)."""


@register_learner("ppo", PPOConfig, help="PPO: GAE with a critic, clipped policy and value losses")
@register_learner("grpo", GRPOConfig, help="GRPO: PPO with group-relative advantages, no critic, dynamic sampling")
class PPOLearner(Learner):
    """PPO with GAE and a critic, or GRPO's group-relative advantages (see the module doc)."""

    cfg: PPOConfig
    needs = Needs.ON_POLICY  # per instance: Needs.GROUPS with group advantages (both step the training envs)
    uses_critic = True  # per instance: False with group advantages

    def __init__(self, cfg: PPOConfig, policy: Policy) -> None:
        super().__init__(cfg, policy)
        self.uses_critic = not cfg.grouped
        self.needs = Needs.GROUPS if cfg.grouped else Needs.ON_POLICY
        if cfg.freeze_encoder:
            freeze_encoder(policy)
        groups = [{"params": policy.actor_parameters(), "lr": cfg.lr_actor, "name": "actor"}]
        if self.uses_critic:
            critic = policy.critic_parameters()
            if not critic:
                raise ValueError(f"algo.type={cfg.type} needs a critic but the policy has no value head; enable one "
                                 "in the policy config (value_placement) or use --algo.type grpo")
            groups.append({"params": critic, "lr": cfg.lr_critic, "name": "critic"})
        self.optimizer = torch.optim.AdamW(groups, weight_decay=0.0)
        self.reference = None  # the starting policy, for the KL penalty
        if cfg.kl_coef > 0:
            self.reference = copy.deepcopy(policy).eval()
            for p in self.reference.parameters():
                p.requires_grad_(False)

    def check_env(self, spec: EnvSpec, exec_steps: int, reset_every_iteration: bool) -> None:
        """With ``reset_every_iteration``, one iteration must cover a whole episode of ``spec`` (else ConfigError)."""
        horizon = self.cfg.decisions_per_iter * exec_steps
        if reset_every_iteration and horizon < spec.max_episode_steps:
            raise ConfigError(
                f"algo.decisions_per_iter ({self.cfg.decisions_per_iter}) x exec steps ({exec_steps}) = {horizon} "
                f"env steps per iteration is shorter than an episode of {spec.env_id} ({spec.max_episode_steps} "
                "steps): with reset_every_iteration no episode could finish. Raise algo.decisions_per_iter or "
                "lower env.max_episode_steps."
            )

    def collect(self, inputs: IterationInputs) -> Rollout:
        """gae: ``decisions_per_iter`` decisions of every env, from where they are (or reset). group: one episode per
        env, ``group_size`` envs per initial state."""
        cfg, engine = self.cfg, inputs.engine
        assert engine is not None, f"{cfg.type} collects rollouts of the training envs: the loop must pass an engine"
        if cfg.grouped:
            seeds = [inputs.seed_base + g for g in range(max(1, engine.env.num_envs // cfg.group_size))]
            return engine.collect_groups(seeds, cfg.group_size, cfg.decisions_per_iter)
        if inputs.reset:
            engine.reset(seed=inputs.seed_base)
        return engine.collect(cfg.decisions_per_iter)

    def advantages(self, rollout: Rollout) -> tuple[Tensor, Tensor, Tensor]:
        """``(advantages [T, B], returns [T, B], mask [T, B])`` for the update; reads only ``self.cfg``."""
        cfg = self.cfg
        if cfg.grouped:
            return group_advantages(rollout, cfg)
        adv, ret = gae(rollout.rewards, rollout.values, rollout.next_values, rollout.terminated, rollout.truncated,
                       cfg.gamma, cfg.lam)
        return adv, ret, rollout.valid

    def update(self, rollout: Rollout) -> dict[str, float]:
        """Epochs of minibatch steps on ``rollout``; returns mean statistics (``update/<name>``).

        Under several ranks (:meth:`distribute`) ``rollout`` is this rank's shard: advantages are normalized over
        all ranks, every rank runs the same number of gradient steps of ``minibatch_size / world_size`` decisions
        each, and DDP averages the gradients (:mod:`vla_rl.distributed`).
        """
        cfg, dist = self.cfg, self.dist
        stats, timer = _Stats(), StageTimes()
        with timer("advantages"):
            adv, returns, mask = self.advantages(rollout)
        warmup = self.iteration < cfg.critic_warmup_iters  # only the critic learns
        flat, mask, total, weight = _decisions(mask, dist)
        if total == 0:  # e.g. dynamic sampling dropped every group
            self.iteration += 1
            return {"update/skipped": 1.0, **timer.take("time/update_")}
        if cfg.normalize_advantages:
            adv = dist.normalize_advantages(adv, mask)
        self.policy.train()
        batch = _Flat(rollout, adv, returns)
        for idx, step in self._minibatches(flat, total):
            with dist.no_sync(self._caller, step):
                loss = self._backward(batch, idx, warmup, weight, stats, timer)
            with timer("optimizer"):
                if step:
                    self._optimizer_step(warmup, stats)
            stats.add({"loss": loss})
            if cfg.target_kl and not warmup and dist.any(stats.last("approx_kl") > cfg.target_kl):
                break
        self.iteration += 1
        return {**stats.means("update/"), "update/critic_warmup": float(warmup), "update/decisions": float(total),
                **timer.take("time/update_")}  # seconds by stage (vla_rl.timing)

    def _minibatches(self, flat: Tensor, total: int) -> Iterator[tuple[Tensor, bool]]:
        """Each epoch's shuffled minibatches of the decisions ``flat``, each with whether an optimizer step follows
        it (every ``grad_accum_steps`` minibatches and at the end of an epoch). An epoch shuffles when it starts."""
        cfg = self.cfg
        for _ in range(cfg.epochs):
            batches = list(self.dist.minibatches(flat, total, cfg.minibatch_size))
            for j, idx in enumerate(batches):
                yield idx, (j + 1) % cfg.grad_accum_steps == 0 or j == len(batches) - 1

    def _backward(self, b: _Flat, idx: Tensor, warmup: bool, weight: float, stats: _Stats,
                  timer: StageTimes) -> Tensor:
        """Loss of minibatch ``idx``, its gradients added to ``.grad`` (scaled by ``weight``); returns the loss."""
        cfg = self.cfg
        timer.start("forward")
        obs = b.rollout.flat_obs(idx)
        outputs = self.call("evaluate", obs, b.extras(idx))
        logp, entropy, value = outputs
        dev = logp.device  # the policy's (a GPU); the rollout's tensors stay on the CPU
        loss = torch.zeros((), device=dev)
        if not warmup:
            pl, ps = ppo_policy_loss(logp, b.old_logp[idx].to(dev), b.adv[idx].to(dev), cfg.clip_low, cfg.clip_high,
                                     cfg.dual_clip or None)
            loss = loss + pl + entropy_bonus(entropy, cfg.ent_coef)
            stats.add({**ps, "entropy": entropy.mean()})
            if self.reference is not None:
                with torch.no_grad():
                    ref_logp, _, _ = self.reference.evaluate(obs, b.extras(idx))
                kl = kl_k3(logp, ref_logp)
                loss = loss + cfg.kl_coef * kl
                stats.add({"kl_ref": kl})
        critic = None
        if self.uses_critic and value is not None:
            critic = value_loss(value.float(), b.old_values[idx].to(dev), b.returns[idx].to(dev),
                                cfg.value_clip or None, cfg.huber_delta or None)
        timer.stop("forward")
        with timer("backward"):
            if critic is not None:
                vl, vs = critic
                stats.add(vs)
                weighted = cfg.vf_coef * vl
                if cfg.value_grad_to_actor and not warmup:
                    loss = loss + weighted
                else:  # the value loss reaches only the critic's own parameters
                    self._critic_backward(weighted * weight / cfg.grad_accum_steps)
                    loss = loss + weighted.detach()
            backward = self.dist.touch(loss * weight, outputs)
            if backward.requires_grad:
                (backward / cfg.grad_accum_steps).backward()
        return loss

    def _critic_backward(self, loss: Tensor) -> None:
        """Add ``d loss / d critic parameters`` to their ``.grad`` (and nothing to the actor's). The graph is kept:
        the policy loss's backward may go through the same forward."""
        critic = [p for g in self.optimizer.param_groups if g["name"] == "critic" for p in g["params"]]
        grads = torch.autograd.grad(loss, critic, retain_graph=True, allow_unused=True)
        for p, g in zip(critic, grads, strict=True):
            if g is not None:
                p.grad = g if p.grad is None else p.grad + g

    def _optimizer_step(self, warmup: bool, stats: _Stats) -> None:
        """Clip each parameter group's gradient norm and step; in critic warmup the actor's gradients are dropped."""
        for group in self.optimizer.param_groups:
            if warmup and group["name"] == "actor":
                for p in group["params"]:
                    p.grad = None
                continue
            norm = torch.nn.utils.clip_grad_norm_(group["params"], self.cfg.max_grad_norm)
            stats.add({f"grad_norm_{group['name']}": norm})
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def group_advantages(rollout: Rollout, cfg: PPOConfig) -> tuple[Tensor, Tensor, Tensor]:
    """GRPO's ``(advantages, returns, mask)``: each episode's group-relative return on all its decisions; dynamic
    sampling masks the groups whose success rate lies outside ``[success_band_low, success_band_high]``."""
    if rollout.group_ids is None:
        raise ValueError(f"algo.type={cfg.type} with group advantages needs grouped rollouts "
                         "(RolloutEngine.collect_groups)")
    returns = rollout.episode_returns()
    adv_env = group_relative(returns, rollout.group_ids)
    mask = rollout.valid.clone()
    if cfg.dynamic_sampling:
        success = torch.zeros(rollout.valid.shape[1])
        for ep in rollout.episodes:
            success[ep.env] = float(ep.success)
        mask &= dynamic_sampling_mask(success, rollout.group_ids, cfg.success_band_low, cfg.success_band_high)[None, :]
    t = rollout.valid.shape[0]
    return adv_env[None, :].expand(t, -1).clone(), returns[None, :].expand(t, -1).clone(), mask


def _decisions(mask: Tensor, dist: Distributed) -> tuple[Tensor, Tensor, int, float]:
    """``(this rank's valid decisions as flat indices, the mask to normalize over, valid decisions of all ranks,
    loss weight)``. A rank without decisions while others have some still takes part in their all-reduces: it
    steps on all its decisions with a zero-weight loss."""
    flat = mask.flatten().nonzero().flatten()
    total = dist.total(flat.numel())
    if flat.numel() == 0 and total > 0:
        return torch.arange(mask.numel()), torch.ones_like(mask), total, 0.0
    return flat, mask, total, 1.0


class _Flat:
    """The rollout's per-decision tensors flattened to ``[T * B]``, indexed by minibatch."""

    def __init__(self, rollout: Rollout, adv: Tensor, returns: Tensor) -> None:
        self.rollout = rollout
        self.old_logp = rollout.logp.flatten(0, 1)
        self.old_values = rollout.values.flatten()
        self.adv, self.returns = adv.flatten(), returns.flatten()
        self._extras = {k: v.flatten(0, 1) for k, v in rollout.extras.items()}

    def extras(self, idx: Tensor) -> dict[str, Tensor]:
        """The recorded extras (flow chains, token ids...) of decisions ``idx``, a new dict each call."""
        return {k: v[idx] for k, v in self._extras.items()}


class _Stats:
    """Per-minibatch statistics of an update, averaged at its end (non-finite values are skipped)."""

    def __init__(self) -> None:
        self._values: dict[str, list[float]] = {}

    def add(self, new: dict[str, Any]) -> None:
        for k, v in new.items():
            f = float(v.detach()) if isinstance(v, Tensor) else float(v)
            if math.isfinite(f):
                self._values.setdefault(k, []).append(f)

    def last(self, key: str) -> float:
        """The latest value of ``key`` (0 before any)."""
        return self._values.get(key, [0.0])[-1]

    def means(self, prefix: str) -> dict[str, float]:
        return {f"{prefix}{k}": sum(v) / len(v) for k, v in self._values.items()}
