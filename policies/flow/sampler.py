"""One denoising loop for every flow-matching policy: ODE, Flow-SDE, Flow-Noise.

A policy supplies a *velocity function* ``(x_t [B, H, A], t [B]) ->
VelocityOutput(velocity [B, H, A], features [B, H, D])`` that closes over the
already-encoded observation (prefix features, KV cache...). The loop below is
the same for the compact policy and the LeRobot adapters:

- ``ODE``: Euler steps ``x <- x - (1/K) v``; deterministic, log-prob 0.
- ``FLOW_SDE`` / ``ONE_STEP``: one step per env (drawn uniformly from the K
  steps) is the Flow-SDE Gaussian transition, the others stay ODE; the
  log-prob is that transition's.
- ``FLOW_SDE`` / ``FULL_CHAIN``: every step is a Flow-SDE transition; the
  log-prob is the mean (or sum) of the K transition log-probs.
- ``FLOW_NOISE``: every step keeps the ODE mean and adds learned noise
  (:class:`NoiseNet` on the action-expert features); the log-prob is
  ``(log N(x_1; 0, I) + sum_k log p_k) / (K + 1)``.
- ``LATENT_NOISE``: the flow model is frozen and the chain is the ODE; a small
  actor (:mod:`policies.flow.latent`, driven by :class:`policies.flow.policy.FlowPolicy`)
  chooses the initial noise ``x_1`` and the log-prob is that of ``x_1``. This
  loop only runs its ODE (call it with ``kind=ODE``).

Log-probs here are elementwise ``[B, H, A]`` (in the model's normalized action
space); policies reduce them with :func:`policies.base.reduce_logp`. What
:func:`chain_log_prob` needs to re-score a sample is returned in ``extras``:
``flow.chain [B, K+1, H, A]`` (``chain[:, 0]`` is the initial noise x_1,
``chain[:, K]`` the action) and, in one-step mode, ``flow.step [B]`` (int64
index of the stochastic step).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from policies.flow.sde import (
    euler_step,
    flow_sde_step,
    gaussian_entropy,
    gaussian_logp,
    standard_normal_logp,
    uniform_schedule,
)

_LATENT_CHAIN = (
    "the latent_noise sampler denoises with the ODE (kind=ode) from the noise actor's x_1 and scores x_1 alone "
    "(policies.flow.latent); there is no chain to sample or score"
)
EXTRA_CHAIN = "flow.chain"
EXTRA_STEP = "flow.step"


class SamplerKind(str, enum.Enum):
    """Which stochastic sampler ``act(mode=EXPLORE)`` uses.

    ``EVAL`` runs the ODE from ``x_1 ~ N(0, I)`` for every kind but ``LATENT_NOISE``, whose ``EVAL`` runs the
    ODE from the noise actor's mean (DSRL's deterministic policy).
    """

    ODE = "ode"
    FLOW_SDE = "flow_sde"
    FLOW_NOISE = "flow_noise"
    LATENT_NOISE = "latent_noise"


class InitialNoise(str, enum.Enum):
    """Where a denoising chain starts: the initial noise ``x_1`` of evaluation's ODE or of exploration's sampler."""

    RANDOM = "random"
    """Drawn from ``N(0, I)``: the chain samples the model's whole action distribution."""
    ZERO = "zero"
    """``x_1 = 0``, the centre of the noise distribution: the ODE gives the same chunk for the same observation,
    and a stochastic sampler spreads only by the noise it injects along the chain."""


class SdeMode(str, enum.Enum):
    """Flow-SDE variant: one random stochastic step per call, or all K steps."""

    ONE_STEP = "one_step"
    FULL_CHAIN = "full_chain"


class ChainReduce(str, enum.Enum):
    """How full-chain Flow-SDE combines the K transition log-probs."""

    MEAN = "mean"
    SUM = "sum"


@dataclass
class SamplerConfig:
    """Denoising-loop settings shared by all flow policies."""

    kind: SamplerKind = SamplerKind.FLOW_SDE
    """Sampler used by ``act(mode=EXPLORE)``: ode, flow_sde, flow_noise, or latent_noise (the flow model
    frozen, a small actor chooses the initial noise x_1; DSRL trained on-policy)."""
    num_steps: int = 4
    """K, the number of denoising steps (uniform schedule from t=1 to t=0)."""
    noise_level: float = 0.5
    """Flow-SDE noise level ``a`` in ``sigma = a * sqrt(t / (1 - t))``."""
    sde_mode: SdeMode = SdeMode.ONE_STEP
    """Flow-SDE: one random stochastic step per call (cheap) or the full chain."""
    chain_reduce: ChainReduce = ChainReduce.MEAN
    """Full-chain Flow-SDE: mean or sum of the K transition log-probs."""
    noise_min_std: float = 0.08
    """Flow-Noise: lower bound of the learned std (log-variance >= log min^2)."""
    noise_max_std: float = 0.16
    """Flow-Noise: upper bound of the learned std (log-variance <= log max^2)."""
    latent_std_init: float = 1.0
    """Latent-noise: initial std of the noise actor's Gaussian over x_1 (used when the actor is built; 1.0 samples
    exactly the base policy's N(0, I) noise, so RL starts from the base policy)."""
    latent_bound: float = 2.0
    """Latent-noise: the noise actor's mean is latent_bound * tanh(.), so x_1 stays near where the flow model was
    trained (DSRL bounds it to about 1-2 standard deviations)."""
    latent_hidden: int = 256
    """Latent-noise: width of the noise actor's two hidden layers (used when the actor is built)."""
    eval_noise: InitialNoise = InitialNoise.ZERO
    """Initial noise of the deterministic ODE policy that evaluation (and deployment) runs: ``random`` (drawn
    from N(0, I)) or ``zero`` (x_1 = 0; docs/results.md, "RL diagnostic ladder"). The ``latent_noise`` sampler
    evaluates from its actor's mean instead."""
    explore_noise: InitialNoise = InitialNoise.RANDOM
    """Initial noise of the exploration sampler (flow_sde, flow_noise): ``random`` (N(0, I), pi_RL) or ``zero``
    (x_1 = 0: the chain follows the deployed zero-noise ODE policy plus the noise the sampler injects, so RL
    improves the policy that evaluation runs; docs/results.md, "Training the deployed policy")."""

    def __post_init__(self) -> None:
        self.kind = SamplerKind(self.kind)
        for name in ("eval_noise", "explore_noise"):
            value = getattr(self, name)
            if value not in {e.value for e in InitialNoise} | set(InitialNoise):
                raise ValueError(f"sampler.{name} must be one of {[e.value for e in InitialNoise]}, got {value!r}")
            setattr(self, name, InitialNoise(value))
        self.sde_mode = SdeMode(self.sde_mode)
        self.chain_reduce = ChainReduce(self.chain_reduce)
        if self.num_steps < 1:
            raise ValueError(f"sampler.num_steps must be >= 1, got {self.num_steps}")
        if self.noise_level < 0:
            raise ValueError(f"sampler.noise_level must be >= 0, got {self.noise_level}")
        if not 0 < self.noise_min_std <= self.noise_max_std:
            raise ValueError(
                f"sampler needs 0 < noise_min_std <= noise_max_std, got {self.noise_min_std}, {self.noise_max_std}"
            )
        if self.latent_std_init <= 0 or self.latent_bound <= 0 or self.latent_hidden < 1:
            raise ValueError(
                "sampler needs latent_std_init > 0, latent_bound > 0 and latent_hidden >= 1, got "
                f"{self.latent_std_init}, {self.latent_bound}, {self.latent_hidden}"
            )


@dataclass
class VelocityOutput:
    """What a velocity function returns for one denoising step.

    Attributes:
        velocity: ``[B, H, A]`` predicted velocity ``v(x_t, t, obs)``.
        features: ``[B, H, D]`` action-expert output features (input of the
            Flow-Noise net and of expert-placed value heads), or None.
    """

    velocity: Tensor
    features: Tensor | None


VelocityFn = Callable[[Tensor, Tensor], VelocityOutput]
"""``(x_t [B, H, A] float32, t [B] float32) -> VelocityOutput``."""


class NoiseNet(nn.Module):
    """Flow-Noise's learned std: a small MLP on action-expert features.

    ``log_var = lo + (hi - lo) * (tanh(h) + 1) / 2`` with ``lo = log min_std^2``,
    ``hi = log max_std^2``; output ``std = exp(log_var / 2)`` per token, per dim.

    Args:
        feature_dim: D of the features ``[B, H, D]``.
        action_dim: A of the model's action space.
        hidden_dim: width of the hidden layer.
        min_std, max_std: the std bounds.
    """

    def __init__(self, feature_dim: int, action_dim: int, hidden_dim: int, min_std: float, max_std: float) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(feature_dim, hidden_dim), nn.SiLU(), nn.Linear(hidden_dim, action_dim))
        self.set_bounds(min_std, max_std)

    def set_bounds(self, min_std: float, max_std: float) -> None:
        """Set the std range ``[min_std, max_std]`` (log-variance ``[log min^2, log max^2]``)."""
        if not 0 < min_std <= max_std:
            raise ValueError(f"NoiseNet needs 0 < min_std <= max_std, got {min_std}, {max_std}")
        self.log_var_low = 2.0 * math.log(min_std)
        self.log_var_high = 2.0 * math.log(max_std)

    def forward(self, features: Tensor) -> Tensor:
        """``features [B, H, D] -> std [B, H, A]`` within ``[min_std, max_std]``."""
        h = torch.tanh(self.net(features.float()))
        log_var = self.log_var_low + (self.log_var_high - self.log_var_low) * (h + 1.0) / 2.0
        return torch.exp(0.5 * log_var)


@dataclass
class ChainSample:
    """The result of one denoising loop.

    Attributes:
        actions: ``[B, H, A]`` final sample ``x_0`` (model space).
        logp: ``[B, H, A]`` elementwise chain log-prob (zeros for the ODE).
        entropy: ``[B, H, A]`` elementwise entropy of the stochastic transitions, reduced like ``logp``.
        extras: what :func:`chain_log_prob` needs (see module doc); empty for the ODE.
    """

    actions: Tensor
    logp: Tensor
    entropy: Tensor
    extras: dict[str, Tensor]


def _noise_std(
    kind: SamplerKind,
    cfg: SamplerConfig,
    x_t: Tensor,
    out: VelocityOutput,
    t: Tensor,
    delta: float,
    noise_net: NoiseNet | None,
) -> tuple[Tensor, Tensor]:
    """Mean and std of the stochastic transition of ``kind`` at one step."""
    if kind is SamplerKind.FLOW_SDE:
        mean, std = flow_sde_step(x_t, out.velocity, t, delta, cfg.noise_level)
        return mean, std.expand_as(mean)
    if noise_net is None:
        raise ValueError("sampler kind flow_noise needs a NoiseNet; build the policy with kind=flow_noise")
    if out.features is None:
        raise ValueError("sampler kind flow_noise needs action-expert features from the velocity function")
    return euler_step(x_t, out.velocity, delta), noise_net(out.features).to(x_t.dtype)


def _check_mask(dim_mask: Tensor | None, x: Tensor) -> Tensor:
    if dim_mask is None:
        return torch.ones(x.shape[-1], dtype=x.dtype, device=x.device)
    if dim_mask.shape != (x.shape[-1],):
        raise ValueError(f"dim_mask must have shape [{x.shape[-1]}] (action dims), got {list(dim_mask.shape)}")
    return dim_mask.to(x.dtype)


def sample_chain(
    velocity_fn: VelocityFn,
    noise: Tensor,
    cfg: SamplerConfig,
    kind: SamplerKind,
    noise_net: NoiseNet | None = None,
    dim_mask: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> ChainSample:
    """Run the K-step denoising loop from ``noise`` (``x_1``) to an action chunk.

    Args:
        velocity_fn: see :data:`VelocityFn`.
        noise: ``[B, H, A]`` initial sample ``x_1 ~ N(0, I)``.
        cfg: number of steps, noise level, Flow-SDE mode, Flow-Noise bounds.
        kind: the sampler to run (``ODE`` for evaluation).
        noise_net: the Flow-Noise std network (required for ``FLOW_NOISE``).
        dim_mask: ``[A]`` 1 for real action dims, 0 for padding dims; padding
            dims are denoised deterministically and add nothing to the log-prob.
        generator: RNG for the step index and the transition noise.

    Returns:
        A :class:`ChainSample`.

    Raises:
        ValueError: for a missing noise net, features, or a wrong ``dim_mask``.
    """
    if kind is SamplerKind.LATENT_NOISE:
        raise ValueError(_LATENT_CHAIN)
    times, delta = uniform_schedule(cfg.num_steps)
    b = noise.shape[0]
    mask = _check_mask(dim_mask, noise)
    x = noise
    chain = [x]
    logps: list[Tensor] = []
    ents: list[Tensor] = []
    step_idx: Tensor | None = None
    if kind is SamplerKind.FLOW_SDE and cfg.sde_mode is SdeMode.ONE_STEP:
        step_idx = torch.randint(0, cfg.num_steps, (b,), generator=generator, device="cpu").to(noise.device)
    for k, time in enumerate(times):
        t = torch.full((b,), time, dtype=torch.float32, device=noise.device)
        out = velocity_fn(x, t)
        if kind is SamplerKind.ODE:
            x = euler_step(x, out.velocity, delta)
        else:
            mean, std = _noise_std(kind, cfg, x, out, t, delta, noise_net)
            std = std * mask
            eps = torch.randn(x.shape, generator=generator, device="cpu", dtype=x.dtype).to(x.device)
            x_next = mean + std * eps
            if step_idx is not None:  # one-step Flow-SDE: only rows whose index is k are stochastic
                here = (step_idx == k).view(-1, *([1] * (x.ndim - 1)))
                x_next = torch.where(here, x_next, euler_step(x, out.velocity, delta))
                std = torch.where(here, std, torch.zeros_like(std))
            logps.append(gaussian_logp(x_next, mean, std))
            ents.append(gaussian_entropy(std))
            x = x_next
        chain.append(x)
    if kind is SamplerKind.ODE:
        zeros = torch.zeros_like(x)
        return ChainSample(actions=x, logp=zeros, entropy=zeros.clone(), extras={})
    logp, entropy = _combine(kind, cfg, noise, logps, ents, mask)
    extras = {EXTRA_CHAIN: torch.stack(chain, dim=1).detach()}
    if step_idx is not None:
        extras[EXTRA_STEP] = step_idx
    return ChainSample(actions=x, logp=logp, entropy=entropy, extras=extras)


def _combine(
    kind: SamplerKind, cfg: SamplerConfig, x1: Tensor, logps: list[Tensor], ents: list[Tensor], mask: Tensor
) -> tuple[Tensor, Tensor]:
    """Combine per-step elementwise log-probs / entropies into the chain's."""
    logp = torch.stack(logps).sum(0)
    ent = torch.stack(ents).sum(0)
    if kind is SamplerKind.FLOW_NOISE:
        k1 = len(logps) + 1
        logp = (logp + standard_normal_logp(x1) * mask) / k1
        ent = (ent + 0.5 * (math.log(2 * math.pi) + 1.0) * mask) / k1
    elif cfg.sde_mode is SdeMode.FULL_CHAIN and cfg.chain_reduce is ChainReduce.MEAN:
        logp = logp / len(logps)
        ent = ent / len(ents)
    return logp, ent


def chain_log_prob(
    velocity_fn: VelocityFn,
    extras: dict[str, Tensor],
    cfg: SamplerConfig,
    kind: SamplerKind,
    noise_net: NoiseNet | None = None,
    dim_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Re-score a recorded chain: the differentiable twin of :func:`sample_chain`.

    In one-step Flow-SDE mode this costs one velocity call (the recorded
    stochastic step of each env); otherwise K calls.

    Args:
        velocity_fn: the policy's velocity function for the same observations.
        extras: ``flow.chain [B, K+1, H, A]`` and, in one-step mode, ``flow.step [B]``.
        cfg, kind, noise_net, dim_mask: as given to :func:`sample_chain`.

    Returns:
        ``(logp, entropy)``, elementwise ``[B, H, A]``.

    Raises:
        KeyError: naming the missing extras keys.
        ValueError: if the chain length does not match ``cfg.num_steps`` or ``kind`` is ``ODE``.
    """
    if kind is SamplerKind.ODE:
        raise ValueError("the ODE sampler is deterministic; there is no chain log-prob to evaluate")
    if kind is SamplerKind.LATENT_NOISE:
        raise ValueError(_LATENT_CHAIN)
    one_step = kind is SamplerKind.FLOW_SDE and cfg.sde_mode is SdeMode.ONE_STEP
    needed = [EXTRA_CHAIN] + ([EXTRA_STEP] if one_step else [])
    missing = [k for k in needed if k not in extras]
    if missing:
        raise KeyError(
            f"extras lack {missing} (sampler {kind.value}, mode {cfg.sde_mode.value} needs {needed}); "
            f"got keys {sorted(extras)}. Pass the extras returned by act(mode=EXPLORE)."
        )
    chain = extras[EXTRA_CHAIN]
    if chain.ndim != 4 or chain.shape[1] != cfg.num_steps + 1:
        raise ValueError(
            f"extras[{EXTRA_CHAIN!r}] must be [B, K+1={cfg.num_steps + 1}, H, A], got {list(chain.shape)}; "
            "was the sample drawn with a different sampler.num_steps?"
        )
    times, delta = uniform_schedule(cfg.num_steps)
    mask = _check_mask(dim_mask, chain[:, 0])
    b = chain.shape[0]
    if one_step:
        step = extras[EXTRA_STEP].long().to(chain.device)
        rows = torch.arange(b, device=chain.device)
        x_t, x_next = chain[rows, step], chain[rows, step + 1]
        t = torch.tensor(times, dtype=torch.float32, device=chain.device)[step]
        out = velocity_fn(x_t, t)
        mean, std = _noise_std(kind, cfg, x_t, out, t, delta, noise_net)
        std = std * mask
        return gaussian_logp(x_next, mean, std), gaussian_entropy(std)
    logps, ents = [], []
    for k, time in enumerate(times):
        x_t = chain[:, k]
        t = torch.full((b,), time, dtype=torch.float32, device=chain.device)
        out = velocity_fn(x_t, t)
        mean, std = _noise_std(kind, cfg, x_t, out, t, delta, noise_net)
        std = std * mask
        logps.append(gaussian_logp(chain[:, k + 1], mean, std))
        ents.append(gaussian_entropy(std))
    return _combine(kind, cfg, chain[:, 0], logps, ents, mask)
