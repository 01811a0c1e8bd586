"""PPO and GRPO learners: wire the pure advantage and loss functions to a policy.

The learners never look at the model type: they call ``policy.evaluate(obs,
extras)`` to re-score what the rollout recorded (flow chains, token ids...)
and form the PPO ratio at the policy's log-prob level.

- ``ppo``: GAE over decisions with a critic; clipped (asymmetric, dual-clip)
  policy loss, clipped Huber value loss, optional entropy bonus and k3 KL to
  the starting policy; separate actor / critic learning rates; critic warmup
  (the first iterations train only the critic).
- ``grpo``: no critic; G rollouts per initial state, advantage
  ``(R - mean_group) / (std_group + 1e-6)`` broadcast to every decision of an
  episode; dynamic sampling drops groups whose success rate lies outside a band.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from policies.base import Policy
from vla_rl.algorithms.advantages import dynamic_sampling_mask, gae, group_relative, normalize_advantages
from vla_rl.algorithms.losses import entropy_bonus, kl_k3, ppo_policy_loss, value_loss
from vla_core.registry import Registry
from vla_rl.rollout import Rollout, RolloutEngine

ALGORITHMS: Registry = Registry("algorithm")


@dataclass
class AlgoConfig:
    """Settings of the RL algorithm (fields unused by an algorithm are ignored by it)."""

    name: str = "ppo"
    """``ppo`` (critic, GAE) or ``grpo`` (critic-free, groups)."""
    decisions_per_iter: int = 8
    """PPO: action chunks collected per env per iteration. GRPO: upper bound on an episode's chunks."""
    gamma: float = 0.99
    """Discount per decision (action chunk)."""
    lam: float = 0.95
    """GAE lambda."""
    epochs: int = 4
    """Passes over each rollout."""
    minibatch_size: int = 64
    """Decisions per gradient step (before accumulation)."""
    grad_accum_steps: int = 1
    """Minibatches accumulated per optimizer step."""
    lr_actor: float = 3e-4
    """Learning rate of the policy parameters."""
    lr_critic: float = 1e-3
    """Learning rate of the value head."""
    clip_low: float = 0.2
    """PPO ratio clip below 1 (``1 - clip_low``)."""
    clip_high: float = 0.28
    """PPO ratio clip above 1 (``1 + clip_high``; 0.28 is "clip-higher")."""
    dual_clip: float = 3.0
    """Dual-clip constant c for negative advantages; 0 disables."""
    value_clip: float = 0.2
    """Value clipping range around the old values; 0 disables."""
    huber_delta: float = 10.0
    """Huber delta of the value loss; 0 = squared error."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    ent_coef: float = 0.0
    """Entropy bonus weight (0.005 is used with Flow-Noise)."""
    kl_coef: float = 0.0
    """Weight of the k3 KL to the starting policy; 0 disables (and keeps no reference copy)."""
    max_grad_norm: float = 1.0
    """Gradient-norm clip, applied to the actor's and the critic's parameters separately."""
    value_grad_to_actor: bool = False
    """Let the value loss also update the actor's parameters it flows through (a shared trunk). Off: the
    value loss trains only the critic's own parameters, so critic noise cannot move the policy."""
    critic_warmup_iters: int = 0
    """Iterations at the start during which only the critic learns."""
    freeze_encoder: bool = False
    """Keep the policy's observation encoder (:meth:`policies.Policy.encoder_parameters`: vision and
    language) fixed and train only the action head (and the critic): RL then cannot blur the features
    pre-training learned, and an update skips the encoder's backward pass."""
    normalize_advantages: bool = True
    """Normalize advantages over each rollout."""
    target_kl: float = 0.0
    """Stop an update's epochs early once approx-KL exceeds this; 0 disables."""
    group_size: int = 8
    """GRPO: rollouts per initial state."""
    success_band_low: float = 0.1
    """GRPO dynamic sampling: keep groups with success rate >= this."""
    success_band_high: float = 0.9
    """GRPO dynamic sampling: keep groups with success rate <= this."""
    dynamic_sampling: bool = True
    """GRPO: drop groups outside the success band."""

    def __post_init__(self) -> None:
        for name in ("decisions_per_iter", "epochs", "minibatch_size", "grad_accum_steps", "group_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"algo.{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.clip_low < 1 or self.clip_high < 0:
            raise ValueError(f"algo.clip_low must be in [0, 1) and algo.clip_high >= 0, got {self.clip_low}, {self.clip_high}")
        if self.dual_clip and self.dual_clip <= 1:
            raise ValueError(f"algo.dual_clip must be > 1 or 0 (off), got {self.dual_clip}")
        if not 0 <= self.success_band_low <= self.success_band_high <= 1:
            raise ValueError("algo.success_band_low/high must satisfy 0 <= low <= high <= 1")


class Learner:
    """Shared PPO-style update; subclasses choose how rollouts are collected and advantages formed."""

    uses_critic: bool = True

    def __init__(self, cfg: AlgoConfig, policy: Policy) -> None:
        self.cfg = cfg
        self.policy = policy
        if cfg.freeze_encoder:
            encoder = policy.encoder_parameters()
            if not encoder:
                raise ValueError(f"algo.freeze_encoder: {type(policy).__name__} does not say which parameters "
                                 "are its observation encoder (encoder_parameters() is empty)")
            for p in encoder:
                p.requires_grad_(False)
        groups = [{"params": policy.actor_parameters(), "lr": cfg.lr_actor, "name": "actor"}]
        critic = policy.critic_parameters() if self.uses_critic else []
        if self.uses_critic and not critic:
            raise ValueError(f"algo.name={cfg.name!r} needs a critic but the policy has no value head; "
                             "enable one in the policy config (value_placement) or use algo.name=grpo")
        if critic:
            groups.append({"params": critic, "lr": cfg.lr_critic, "name": "critic"})
        self.optimizer = torch.optim.AdamW(groups, weight_decay=0.0)
        self.reference = None
        if cfg.kl_coef > 0:
            self.reference = copy.deepcopy(policy).eval()
            for p in self.reference.parameters():
                p.requires_grad_(False)
        self.iteration = 0

    # -- subclass hooks
    def collect(self, engine: RolloutEngine, seeds: list[int]) -> Rollout:
        raise NotImplementedError

    def advantages(self, rollout: Rollout) -> tuple[Tensor, Tensor, Tensor]:
        """``(advantages [T, B], returns [T, B], mask [T, B])`` for the update."""
        raise NotImplementedError

    # -- the update
    def update(self, rollout: Rollout) -> dict[str, float]:
        """Epochs of minibatch updates on ``rollout``; returns mean statistics."""
        cfg = self.cfg
        adv, returns, mask = self.advantages(rollout)
        warmup = self.uses_critic and self.iteration < cfg.critic_warmup_iters
        flat = mask.flatten().nonzero().flatten()
        n = flat.numel()
        stats: dict[str, list[float]] = {}
        if n == 0:  # e.g. dynamic sampling dropped every group
            self.iteration += 1
            return {"update/skipped": 1.0}
        if cfg.normalize_advantages:
            adv = normalize_advantages(adv, mask)
        self.policy.train()
        old_logp = rollout.logp.flatten(0, 1)
        old_values = rollout.values.flatten()
        adv_f, ret_f = adv.flatten(), returns.flatten()
        extras = {k: v.flatten(0, 1) for k, v in rollout.extras.items()}
        mb = min(cfg.minibatch_size, n)
        stop = False
        for _ in range(cfg.epochs):
            perm = flat[torch.randperm(n)]
            batches = [perm[i : i + mb] for i in range(0, n, mb)]
            for j, idx in enumerate(batches):
                obs = rollout.flat_obs(idx)
                logp, entropy, value = self.policy.evaluate(obs, {k: v[idx] for k, v in extras.items()})
                loss = torch.zeros(())
                if not warmup:
                    pl, ps = ppo_policy_loss(logp, old_logp[idx], adv_f[idx], cfg.clip_low, cfg.clip_high, cfg.dual_clip or None)
                    loss = loss + pl + entropy_bonus(entropy, cfg.ent_coef)
                    _add(stats, ps)
                    _add(stats, {"entropy": entropy.mean()})
                    if self.reference is not None:
                        with torch.no_grad():
                            ref_logp, _, _ = self.reference.evaluate(obs, {k: v[idx] for k, v in extras.items()})
                        kl = kl_k3(logp, ref_logp)
                        loss = loss + cfg.kl_coef * kl
                        _add(stats, {"kl_ref": kl})
                if self.uses_critic and value is not None:
                    vl, vs = value_loss(value.float(), old_values[idx], ret_f[idx], cfg.value_clip or None, cfg.huber_delta or None)
                    _add(stats, vs)
                    if cfg.value_grad_to_actor and not warmup:
                        loss = loss + cfg.vf_coef * vl
                    else:  # the value loss reaches only the critic's own parameters
                        self._accumulate(cfg.vf_coef * vl / cfg.grad_accum_steps, retain=loss.requires_grad)
                    loss = loss + (cfg.vf_coef * vl).detach()
                if loss.requires_grad:
                    (loss / cfg.grad_accum_steps).backward()
                if (j + 1) % cfg.grad_accum_steps == 0 or j == len(batches) - 1:
                    for group in self.optimizer.param_groups:
                        if warmup and group["name"] == "actor":  # actor frozen: drop its gradients
                            for p in group["params"]:
                                p.grad = None
                            continue
                        norm = torch.nn.utils.clip_grad_norm_(group["params"], cfg.max_grad_norm)
                        _add(stats, {f"grad_norm_{group['name']}": norm})
                    self.optimizer.step()
                    self.optimizer.zero_grad(set_to_none=True)
                _add(stats, {"loss": loss.detach()})
                if cfg.target_kl and not warmup and stats.get("approx_kl", [0])[-1] > cfg.target_kl:
                    stop = True
                    break
            if stop:
                break
        self.iteration += 1
        out = {f"update/{k}": sum(v) / len(v) for k, v in stats.items()}
        out["update/critic_warmup"] = float(warmup)
        out["update/decisions"] = float(n)
        return out

    def _accumulate(self, loss: Tensor, retain: bool) -> None:
        """Add ``d loss / d critic parameters`` to their ``.grad`` (and nothing to the actor's)."""
        critic = [p for g in self.optimizer.param_groups if g["name"] == "critic" for p in g["params"]]
        grads = torch.autograd.grad(loss, critic, retain_graph=retain, allow_unused=True)
        for p, g in zip(critic, grads, strict=True):
            if g is not None:
                p.grad = g if p.grad is None else p.grad + g

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "iteration": self.iteration}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.iteration = state["iteration"]


def _add(stats: dict[str, list[float]], new: dict[str, Any]) -> None:
    for k, v in new.items():
        f = float(v.detach()) if isinstance(v, Tensor) else float(v)
        if math.isfinite(f):
            stats.setdefault(k, []).append(f)


@ALGORITHMS.register("ppo", config=AlgoConfig)
class PPOLearner(Learner):
    """PPO with GAE and a critic (see module doc)."""

    uses_critic = True

    def collect(self, engine: RolloutEngine, seeds: list[int]) -> Rollout:
        return engine.collect(self.cfg.decisions_per_iter)

    def advantages(self, rollout: Rollout) -> tuple[Tensor, Tensor, Tensor]:
        adv, ret = gae(rollout.rewards, rollout.values, rollout.next_values, rollout.terminated,
                       rollout.truncated, self.cfg.gamma, self.cfg.lam)
        return adv, ret, rollout.valid


@ALGORITHMS.register("grpo", config=AlgoConfig)
class GRPOLearner(Learner):
    """Critic-free group-relative policy optimization (see module doc)."""

    uses_critic = False

    def collect(self, engine: RolloutEngine, seeds: list[int]) -> Rollout:
        return engine.collect_groups(seeds, self.cfg.group_size, self.cfg.decisions_per_iter)

    def advantages(self, rollout: Rollout) -> tuple[Tensor, Tensor, Tensor]:
        if rollout.group_ids is None:
            raise ValueError("grpo needs grouped rollouts (RolloutEngine.collect_groups)")
        returns = rollout.episode_returns()
        adv_env = group_relative(returns, rollout.group_ids)
        mask = rollout.valid.clone()
        if self.cfg.dynamic_sampling:
            success = torch.zeros(rollout.valid.shape[1])
            for ep in rollout.episodes:
                success[ep.env] = float(ep.success)
            keep = dynamic_sampling_mask(success, rollout.group_ids, self.cfg.success_band_low, self.cfg.success_band_high)
            mask &= keep[None, :]
        t = rollout.valid.shape[0]
        return adv_env[None, :].expand(t, -1).clone(), returns[None, :].expand(t, -1).clone(), mask
