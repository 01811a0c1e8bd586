"""The clipped policy-gradient update that PPO and GRPO share.

:class:`PolicyGradientLearner` wires the pure functions of
:mod:`vla_rl.algorithms.losses` to a policy: epochs of shuffled minibatches,
the PPO ratio at the policy's log-prob level (``policy.evaluate`` re-scores
what the rollout recorded: flow chains, token ids...), asymmetric / dual clip,
entropy bonus, optional k3 KL to the starting policy, target-KL early stop,
per-group gradient clipping. Subclasses decide how rollouts are collected and
how advantages are formed; a learner with a critic adds its value loss through
:meth:`PolicyGradientLearner.value_loss`.
"""

from __future__ import annotations

import abc
import copy
import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from policies.base import Policy
from sim.core import EnvSpec
from vla_rl.algorithms.advantages import normalize_advantages
from vla_rl.algorithms.base import Learner, LearnerConfig, SmokeLimits, freeze_encoder
from vla_rl.algorithms.losses import entropy_bonus, kl_k3, ppo_policy_loss
from vla_rl.config import ConfigError
from vla_rl.rollout import Rollout
from vla_rl.timing import StageTimes


@dataclass
class PolicyGradientConfig(LearnerConfig):
    """Settings shared by the clipped policy-gradient learners (PPO, GRPO)."""

    decisions_per_iter: int = 8
    """PPO: action chunks collected per env per iteration. GRPO: upper bound on an episode's chunks."""
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

    def __post_init__(self) -> None:
        for name in ("decisions_per_iter", "epochs", "minibatch_size", "grad_accum_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"algo.{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.clip_low < 1 or self.clip_high < 0:
            raise ValueError(f"algo.clip_low must be in [0, 1) and algo.clip_high >= 0, got {self.clip_low}, {self.clip_high}")
        if self.dual_clip and self.dual_clip <= 1:
            raise ValueError(f"algo.dual_clip must be > 1 or 0 (off), got {self.dual_clip}")

    def smoke(self, limits: SmokeLimits, num_envs: int) -> tuple[LearnerConfig, int]:
        decisions = max(min(self.decisions_per_iter, limits.max_decisions), limits.episode_decisions)
        small = dataclasses.replace(self, decisions_per_iter=decisions, epochs=1,
                         minibatch_size=min(self.minibatch_size, limits.max_minibatch), grad_accum_steps=1)
        return small, min(num_envs, limits.max_envs)


class PolicyGradientLearner(Learner):
    """The shared clipped update (module doc); subclasses implement ``collect`` and :meth:`advantages`."""

    cfg: PolicyGradientConfig

    def __init__(self, cfg: PolicyGradientConfig, policy: Policy) -> None:
        super().__init__(cfg, policy)
        if cfg.freeze_encoder:
            freeze_encoder(policy)
        groups = [{"params": policy.actor_parameters(), "lr": cfg.lr_actor, "name": "actor"}]
        groups += self.critic_param_groups(policy)
        self.optimizer = torch.optim.AdamW(groups, weight_decay=0.0)
        self.reference = None
        if cfg.kl_coef > 0:
            self.reference = copy.deepcopy(policy).eval()
            for p in self.reference.parameters():
                p.requires_grad_(False)

    # -- hooks
    def critic_param_groups(self, policy: Policy) -> list[dict[str, Any]]:
        """Optimizer groups of the critic (named ``critic``); none without a critic."""
        return []

    @abc.abstractmethod
    def advantages(self, rollout: Rollout) -> tuple[Tensor, Tensor, Tensor]:
        """``(advantages [T, B], returns [T, B], mask [T, B])`` for the update."""

    def actor_frozen(self) -> bool:
        """Whether this update trains only the critic (critic warmup)."""
        return False

    def value_loss(self, value: Tensor | None, old_values: Tensor, returns: Tensor) -> tuple[Tensor, dict[str, Any]] | None:
        """``(loss, stats)`` of the critic on one minibatch, or None without a critic."""
        return None

    def value_to_actor(self) -> bool:
        """Whether the value loss may also update actor parameters it flows through (a shared trunk)."""
        return False

    def value_coef(self) -> float:
        """Weight of the value loss."""
        return 0.0

    def check_env(self, spec: EnvSpec, exec_steps: int, reset_every_iteration: bool) -> None:
        """With ``reset_every_iteration``, one iteration must cover a whole episode of ``spec``.

        Raises:
            ConfigError: naming ``algo.decisions_per_iter`` and the episode length.
        """
        horizon = self.cfg.decisions_per_iter * exec_steps
        if reset_every_iteration and horizon < spec.max_episode_steps:
            raise ConfigError(
                f"algo.decisions_per_iter ({self.cfg.decisions_per_iter}) x exec steps ({exec_steps}) = {horizon} "
                f"env steps per iteration is shorter than an episode of {spec.env_id} ({spec.max_episode_steps} "
                "steps): with reset_every_iteration no episode could finish. Raise algo.decisions_per_iter or "
                "lower env.max_episode_steps."
            )

    # -- the update
    def update(self, rollout: Rollout) -> dict[str, float]:
        """Epochs of minibatch updates on ``rollout``; returns mean statistics.

        Under several ranks (:meth:`distribute`) ``rollout`` is this rank's shard: advantages are normalized over
        all ranks, every rank runs the same number of gradient steps of ``minibatch_size / world_size`` decisions
        each, and DDP averages the gradients (:mod:`vla_rl.distributed`).
        """
        cfg = self.cfg
        dist = self.dist
        timer = StageTimes()
        with timer("advantages"):
            adv, returns, mask = self.advantages(rollout)
        warmup = self.actor_frozen()
        flat = mask.flatten().nonzero().flatten()
        n = flat.numel()
        total = int(dist.sum(torch.tensor(n)).item()) if dist.enabled else n
        stats: dict[str, list[float]] = {}
        if total == 0:  # e.g. dynamic sampling dropped every group
            self.iteration += 1
            return {"update/skipped": 1.0, **timer.take("time/update_")}
        weight = 1.0
        if n == 0:  # another rank has decisions: take part in its all-reduces with a zero-weight loss
            flat, weight = torch.arange(mask.numel()), 0.0
            mask = torch.ones_like(mask)
        if cfg.normalize_advantages:
            adv = dist.normalize_advantages(adv, mask) if dist.enabled else normalize_advantages(adv, mask)
        self.policy.train()
        old_logp = rollout.logp.flatten(0, 1)
        old_values = rollout.values.flatten()
        adv_f, ret_f = adv.flatten(), returns.flatten()
        extras = {k: v.flatten(0, 1) for k, v in rollout.extras.items()}
        mb = min(cfg.minibatch_size, n)
        stop = False
        for _ in range(cfg.epochs):
            if dist.enabled:
                batches = list(dist.minibatches(flat, total, cfg.minibatch_size))
            else:
                perm = flat[torch.randperm(n)]
                batches = [perm[i : i + mb] for i in range(0, n, mb)]
            for j, idx in enumerate(batches):
                step_now = (j + 1) % cfg.grad_accum_steps == 0 or j == len(batches) - 1
                with dist.no_sync(self._caller, step_now):
                    loss = self._minibatch_loss(rollout, idx, extras, old_logp, old_values, adv_f, ret_f, warmup,
                                                weight, stats, timer)
                timer.start("optimizer")
                if step_now:
                    for group in self.optimizer.param_groups:
                        if warmup and group["name"] == "actor":  # actor frozen: drop its gradients
                            for p in group["params"]:
                                p.grad = None
                            continue
                        norm = torch.nn.utils.clip_grad_norm_(group["params"], cfg.max_grad_norm)
                        _add(stats, {f"grad_norm_{group['name']}": norm})
                    self.optimizer.step()
                    self.optimizer.zero_grad(set_to_none=True)
                timer.stop("optimizer")
                _add(stats, {"loss": loss.detach()})
                if cfg.target_kl and not warmup and dist.any(stats.get("approx_kl", [0])[-1] > cfg.target_kl):
                    stop = True
                    break
            if stop:
                break
        self.iteration += 1
        out = {f"update/{k}": sum(v) / len(v) for k, v in stats.items()}
        out["update/critic_warmup"] = float(warmup)
        out["update/decisions"] = float(total)
        out.update(timer.take("time/update_"))  # seconds by stage (vla_rl.timing)
        return out

    def _minibatch_loss(self, rollout: Rollout, idx: Tensor, extras: dict[str, Tensor], old_logp: Tensor,
                        old_values: Tensor, adv_f: Tensor, ret_f: Tensor, warmup: bool, weight: float,
                        stats: dict[str, list[float]], timer: StageTimes) -> Tensor:
        """Forward and backward of one minibatch ``idx`` (gradients added to ``.grad``); returns the loss.

        ``weight`` scales what is backpropagated (0 on a rank without decisions, 1 otherwise).
        """
        cfg = self.cfg
        timer.start("forward")
        obs = rollout.flat_obs(idx)
        outputs = self.call("evaluate", obs, {k: v[idx] for k, v in extras.items()})
        logp, entropy, value = outputs
        dev = logp.device  # the policy's (a GPU); the rollout's tensors stay on the CPU
        loss = torch.zeros((), device=dev)
        if not warmup:
            pl, ps = ppo_policy_loss(logp, old_logp[idx].to(dev), adv_f[idx].to(dev), cfg.clip_low, cfg.clip_high,
                                     cfg.dual_clip or None)
            loss = loss + pl + entropy_bonus(entropy, cfg.ent_coef)
            _add(stats, ps)
            _add(stats, {"entropy": entropy.mean()})
            if self.reference is not None:
                with torch.no_grad():
                    ref_logp, _, _ = self.reference.evaluate(obs, {k: v[idx] for k, v in extras.items()})
                kl = kl_k3(logp, ref_logp)
                loss = loss + cfg.kl_coef * kl
                _add(stats, {"kl_ref": kl})
        critic = self.value_loss(value, old_values[idx].to(dev), ret_f[idx].to(dev))
        timer.stop("forward")
        with timer("backward"):
            if critic is not None:
                vl, vs = critic
                _add(stats, vs)
                weighted = self.value_coef() * vl
                if self.value_to_actor() and not warmup:
                    loss = loss + weighted
                else:  # the value loss reaches only the critic's own parameters
                    scaled = weighted * weight if self.dist.enabled else weighted
                    self._accumulate(scaled / cfg.grad_accum_steps, retain=loss.requires_grad or self.dist.enabled)
                loss = loss + weighted.detach()
            backward = self.dist.touch(loss * weight if self.dist.enabled else loss, outputs)
            if backward.requires_grad:
                (backward / cfg.grad_accum_steps).backward()
        return loss

    def _accumulate(self, loss: Tensor, retain: bool) -> None:
        """Add ``d loss / d critic parameters`` to their ``.grad`` (and nothing to the actor's)."""
        critic = [p for g in self.optimizer.param_groups if g["name"] == "critic" for p in g["params"]]
        grads = torch.autograd.grad(loss, critic, retain_graph=retain, allow_unused=True)
        for p, g in zip(critic, grads, strict=True):
            if g is not None:
                p.grad = g if p.grad is None else p.grad + g


def _add(stats: dict[str, list[float]], new: dict[str, Any]) -> None:
    for k, v in new.items():
        f = float(v.detach()) if isinstance(v, Tensor) else float(v)
        if math.isfinite(f):
            stats.setdefault(k, []).append(f)
