"""Flow-SDE transition math (pi_RL), in the pi0 time convention.

Time runs from ``t = 1`` (pure noise) to ``t = 0`` (the action). A denoising
step from ``t`` to ``t - delta`` with predicted velocity ``v`` is, for the ODE
(Euler) sampler, ``x_{t - delta} = x_t - delta * v``. Flow-SDE replaces it by a
Gaussian transition with the same marginals (docs/training.md, "Samplers")::

    x0_hat  = x_t - t * v                 (predicted action)
    x1_hat  = x_t + (1 - t) * v           (predicted noise)
    sigma   = a * sqrt(t' / (1 - t'))     t' = t, except t' = t - delta at t = 1
    mean    = x0_hat * (1 - (t - delta)) + x1_hat * (t - delta - sigma^2 * delta / (2 t))
    std     = sqrt(delta) * sigma

All functions here are pure and differentiable.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

_LOG_2PI = math.log(2.0 * math.pi)


def _as_time(value: float | Tensor, like: Tensor, name: str) -> Tensor:
    """``value`` as a tensor broadcastable to ``like`` (a ``[B]`` tensor becomes ``[B, 1, ..., 1]``).

    Raises:
        ValueError: if a tensor ``value`` is neither a scalar, ``[B]`` nor broadcastable to ``like``.
    """
    t = torch.as_tensor(value, dtype=like.dtype, device=like.device)
    if t.ndim == 1 and like.ndim > 1 and t.shape[0] == like.shape[0]:
        t = t.view(-1, *([1] * (like.ndim - 1)))
    try:
        torch.broadcast_shapes(t.shape, like.shape)
    except RuntimeError:
        raise ValueError(
            f"{name} of shape {list(t.shape)} is not a scalar, a [B] tensor with B={like.shape[0]}, "
            f"or broadcastable to x_t {list(like.shape)}"
        ) from None
    return t


def sde_sigma(t: float | Tensor, delta: float | Tensor, noise_level: float, like: Tensor | None = None) -> Tensor:
    """The Flow-SDE noise scale ``sigma = a * sqrt(t / (1 - t))``.

    At ``t = 1`` the ratio is infinite; following pi_RL the next timestep
    ``t - delta`` (``t_1`` of the schedule) is used in the ratio instead.

    Args:
        t: current time(s) in ``(0, 1]``: a float, a ``[B]`` tensor, or a tensor
            broadcastable to ``like``.
        delta: step size(s) ``t_i - t_{i+1} > 0``, same forms as ``t``.
        noise_level: ``a >= 0``.
        like: a tensor giving dtype, device and the target rank (default: float32 scalar).

    Returns:
        ``sigma`` broadcastable to ``like``.
    """
    ref = like if like is not None else torch.zeros((), dtype=torch.float32)
    t = _as_time(t, ref, "t")
    delta = _as_time(delta, ref, "delta")
    t_ratio = torch.where(t >= 1.0, t - delta, t)
    return noise_level * torch.sqrt(t_ratio / (1.0 - t_ratio))


def flow_sde_step(
    x_t: Tensor, velocity: Tensor, t: float | Tensor, delta: float | Tensor, noise_level: float
) -> tuple[Tensor, Tensor]:
    """Mean and std of the Flow-SDE transition ``x_t -> x_{t - delta}``.

    Args:
        x_t: current noisy sample ``[B, H, A]`` (any shape with batch first).
        velocity: model velocity ``v(x_t, t)``, same shape as ``x_t``.
        t: current time in ``(0, 1]``: float, ``[B]`` tensor, or broadcastable to ``x_t``.
        delta: step size ``t - t_next`` in ``(0, t]``, same forms as ``t``.
        noise_level: the SDE noise level ``a`` (pi_RL default 0.5); ``a = 0``
            gives the ODE (Euler) step with ``std = 0``.

    Returns:
        ``(mean, std)``: ``mean`` shaped like ``x_t``; ``std = sqrt(delta) * sigma``,
        a tensor broadcastable to ``mean``.

    Raises:
        ValueError: if ``velocity`` and ``x_t`` shapes differ or ``t``/``delta`` do not broadcast.
    """
    if velocity.shape != x_t.shape:
        raise ValueError(f"velocity shape {list(velocity.shape)} must equal x_t shape {list(x_t.shape)}")
    t_ = _as_time(t, x_t, "t")
    d_ = _as_time(delta, x_t, "delta")
    sigma = sde_sigma(t_, d_, noise_level, like=x_t)
    x0_hat = x_t - t_ * velocity
    x1_hat = x_t + (1.0 - t_) * velocity
    t_next = t_ - d_
    mean = x0_hat * (1.0 - t_next) + x1_hat * (t_next - sigma**2 * d_ / (2.0 * t_))
    std = torch.sqrt(d_) * sigma
    return mean, std


def euler_step(x_t: Tensor, velocity: Tensor, delta: float | Tensor) -> Tensor:
    """The deterministic ODE step ``x_t - delta * v`` (``delta`` as in :func:`flow_sde_step`)."""
    return x_t - _as_time(delta, x_t, "delta") * velocity


def gaussian_logp(x: Tensor, mean: Tensor, std: Tensor) -> Tensor:
    """Elementwise diagonal-Gaussian log-density ``log N(x; mean, std^2)``.

    Elements with ``std == 0`` (deterministic dims or steps) contribute 0.

    Returns:
        A tensor of the broadcast shape of ``x``, ``mean`` and ``std``.
    """
    std = torch.broadcast_to(std, torch.broadcast_shapes(std.shape, x.shape, mean.shape))
    positive = std > 0
    safe = torch.where(positive, std, torch.ones_like(std))
    z = (x - mean) / safe
    logp = -0.5 * z**2 - torch.log(safe) - 0.5 * _LOG_2PI
    return torch.where(positive, logp, torch.zeros_like(logp))


def gaussian_entropy(std: Tensor) -> Tensor:
    """Elementwise entropy ``0.5 * log(2 pi e std^2)`` of a Gaussian; 0 where ``std == 0``."""
    positive = std > 0
    safe = torch.where(positive, std, torch.ones_like(std))
    ent = 0.5 * (_LOG_2PI + 1.0) + torch.log(safe)
    return torch.where(positive, ent, torch.zeros_like(ent))


def standard_normal_logp(x: Tensor) -> Tensor:
    """Elementwise ``log N(x; 0, 1)``."""
    return -0.5 * x**2 - 0.5 * _LOG_2PI


def uniform_schedule(num_steps: int) -> tuple[list[float], float]:
    """The uniform schedule ``t_0 = 1 > t_1 > ... > t_{K-1}`` and its step size ``1 / K``.

    Times are ``1 + i * (-1 / K)`` and every step uses ``delta = 1 / K``, which
    reproduces LeRobot's Euler loop (``x + dt * v`` with ``dt = -1 / K``) bit for bit.

    Returns:
        ``(times, delta)``: the K start times of the steps and the step size.

    Raises:
        ValueError: if ``num_steps < 1``.
    """
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    dt = -1.0 / num_steps
    return [1.0 + i * dt for i in range(num_steps)], -dt
