"""Losses: PPO policy and value losses, entropy and KL terms, TPO (GRAPE).

Supervised (SFT) losses belong to the policy that owns the model (``Policy.sft_loss``,
e.g. :func:`policies.compact.modules.flow_matching_loss`).

Every function is pure: tensors in, a 0-dim loss (to be *minimized*) and,
where useful, a ``stats`` dict of detached 0-dim tensors out. Optional
``mask`` arguments follow :mod:`vla_rl.algorithms.advantages`: ``bool``, True =
valid, shaped like the leading dims of the masked tensor; masked-out elements
contribute neither to the loss nor to its gradient, even if they hold ``nan``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vla_rl.algorithms.advantages import _check_float, expand_mask, masked_mean


def _check_same_shape(ref_name: str, ref: torch.Tensor, others: tuple[tuple[str, torch.Tensor], ...] = ()) -> None:
    """Check ``ref`` is a non-empty float tensor and every ``(name, tensor)`` in ``others`` matches it."""
    _check_float(ref_name, ref)
    if ref.numel() == 0:
        raise ValueError(f"{ref_name} is empty (shape {tuple(ref.shape)})")
    for name, x in others:
        _check_float(name, x)
        if x.shape != ref.shape:
            raise ValueError(f"{name} shape {tuple(x.shape)} must equal {ref_name} shape {tuple(ref.shape)}")


def _sanitize(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Replace masked-out elements by 0 so that ``nan`` padding cannot poison gradients."""
    if mask is None:
        return x
    return torch.where(expand_mask(mask, x), x, torch.zeros_like(x))


def _k3(log_r: torch.Tensor) -> torch.Tensor:
    """Elementwise k3 estimate of ``KL(p_sample || p_other)`` from samples of ``p_sample``.

    ``k3 = r - 1 - log r`` with ``log_r = log(p_other / p_sample)``; unbiased and ``>= 0``.
    """
    return torch.expm1(log_r) - log_r


# ----------------------------------------------------------------------------- PPO


def ppo_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped PPO surrogate with asymmetric clip range and optional dual clip.

    Per element, with ``ratio = exp(logp - old_logp)``::

        L = -min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A)
        if A < 0 and dual_clip:  L = min(L, -dual_clip * A)      # caps the loss at c * |A|
        loss = mean(L)  (over valid elements)

    ``logp`` may be at any log-prob level (``[B]``, ``[B, H]``, ``[B, H, A]``);
    ``advantages`` may have the same shape or only its leading dims (e.g. a
    per-chunk ``[B]`` advantage for token-level ``[B, H, A]`` ratios), and is
    then broadcast over the trailing dims.

    Args:
        logp: ``float [*S]`` log-probs under the current policy (differentiable).
        old_logp: ``float [*S]`` log-probs recorded at rollout time.
        advantages: ``float [*S]`` or ``float [*S[:k]]`` advantages.
        clip_low: ``eps_low`` in ``[0, 1)``; the ratio is clipped below at ``1 - clip_low``.
        clip_high: ``eps_high >= 0``; the ratio is clipped above at ``1 + clip_high``.
        dual_clip: the constant ``c > 1`` of dual clip (typically 3), or
            None / 0 to disable it.
        mask: optional ``bool`` of ``logp``'s leading dims; True = valid element.

    Returns:
        ``(loss, stats)``: 0-dim loss and detached 0-dim stats ``policy_loss``,
        ``approx_kl`` (k3 estimate of ``KL(old || new)``), ``clip_fraction``
        (fraction of ratios outside ``[1 - clip_low, 1 + clip_high]``),
        ``ratio_mean``, ``ratio_max``, ``dual_clip_fraction`` (fraction of
        elements where the dual-clip cap is the active value).

    Raises:
        ValueError: on shape/dtype mismatches, empty input, a mask selecting
            nothing, or clip constants out of range.
    """
    _check_same_shape("logp", logp, (("old_logp", old_logp),))
    _check_float("advantages", advantages)
    if advantages.dim() > logp.dim() or tuple(advantages.shape) != tuple(logp.shape[: advantages.dim()]):
        raise ValueError(
            f"advantages shape {tuple(advantages.shape)} must equal logp shape {tuple(logp.shape)} "
            "or its leading dims"
        )
    if not 0.0 <= clip_low < 1.0:
        raise ValueError(f"clip_low must lie in [0, 1), got {clip_low}")
    if clip_high < 0.0:
        raise ValueError(f"clip_high must be >= 0, got {clip_high}")
    use_dual = dual_clip is not None and dual_clip != 0
    if use_dual and not dual_clip > 1.0:
        raise ValueError(f"dual_clip must be > 1 (or None / 0 to disable), got {dual_clip}")

    adv = advantages.reshape(*advantages.shape, *([1] * (logp.dim() - advantages.dim()))).expand_as(logp)
    adv = _sanitize(adv.to(logp.dtype), mask)
    log_ratio = _sanitize(logp - old_logp, mask)
    ratio = torch.exp(log_ratio)
    clipped_ratio = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    per_elem = torch.maximum(-ratio * adv, -clipped_ratio * adv)
    dual_active = torch.zeros_like(per_elem, dtype=torch.bool)
    if use_dual:
        cap = -float(dual_clip) * adv
        dual_active = (adv < 0) & (cap < per_elem)
        per_elem = torch.where(dual_active, cap, per_elem)
    loss = masked_mean(per_elem, mask)

    with torch.no_grad():
        r = ratio.detach()
        valid = expand_mask(mask, r) if mask is not None else torch.ones_like(r, dtype=torch.bool)
        outside = (r < 1.0 - clip_low) | (r > 1.0 + clip_high)
        stats = {
            "policy_loss": loss.detach(),
            "approx_kl": masked_mean(_k3(log_ratio.detach()), mask),
            "clip_fraction": masked_mean(outside.to(r.dtype), mask),
            "ratio_mean": masked_mean(r, mask),
            "ratio_max": torch.where(valid, r, torch.full_like(r, -torch.inf)).max(),
            "dual_clip_fraction": masked_mean(dual_active.to(r.dtype), mask),
        }
    return loss, stats


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    clip: float | None,
    huber_delta: float | None,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss, squared or Huber.

    Per element, with ``v_clip = old_values + clamp(values - old_values, -clip, clip)``::

        L = max(err(values - returns), err(v_clip - returns))     (just err(values - returns) if clip is None)
        err(x) = 0.5 * x**2                                        if huber_delta is None
        err(x) = 0.5 * x**2 if |x| <= d else d * (|x| - 0.5 * d)   (Huber, d = huber_delta)
        loss = mean(L)  (over valid elements)

    Both errors carry the factor 0.5, so Huber tends to the squared error as
    ``d -> inf``.

    Args:
        values: ``float [*S]`` current critic predictions (differentiable).
        old_values: ``float [*S]`` critic predictions recorded at rollout time.
        returns: ``float [*S]`` value targets (e.g. GAE returns).
        clip: value clip range ``> 0``, or None to disable clipping.
        huber_delta: Huber threshold ``> 0``, or None for the squared error.
        mask: optional ``bool`` of ``values``' leading dims; True = valid.

    Returns:
        ``(loss, stats)``: 0-dim loss and detached 0-dim stats ``value_loss``,
        ``explained_variance`` (``1 - Var(returns - values) / Var(returns)``
        over valid elements; ``nan`` when the returns have zero variance),
        ``value_clip_fraction`` (fraction with ``|values - old_values| > clip``;
        0 when clipping is off), ``value_mean``.

    Raises:
        ValueError: on shape/dtype mismatches, empty input, a mask selecting
            nothing, or non-positive ``clip`` / ``huber_delta``.
    """
    _check_same_shape("values", values, (("old_values", old_values), ("returns", returns)))
    if clip is not None and not clip > 0:
        raise ValueError(f"clip must be > 0 or None, got {clip}")
    if huber_delta is not None and not huber_delta > 0:
        raise ValueError(f"huber_delta must be > 0 or None, got {huber_delta}")

    v = _sanitize(values, mask)
    v_old = _sanitize(old_values.to(v.dtype), mask)
    target = _sanitize(returns.to(v.dtype), mask)

    def err(x: torch.Tensor) -> torch.Tensor:
        if huber_delta is None:
            return 0.5 * x**2
        return F.huber_loss(x, torch.zeros_like(x), reduction="none", delta=huber_delta)

    per_elem = err(v - target)
    if clip is not None:
        v_clipped = v_old + torch.clamp(v - v_old, -clip, clip)
        per_elem = torch.maximum(per_elem, err(v_clipped - target))
    loss = masked_mean(per_elem, mask)

    with torch.no_grad():
        pred, y = v.detach(), target.detach()
        var_y = masked_mean((y - masked_mean(y, mask)) ** 2, mask)
        resid = y - pred
        var_resid = masked_mean((resid - masked_mean(resid, mask)) ** 2, mask)
        explained = 1.0 - var_resid / var_y if float(var_y) > 0 else torch.full_like(var_y, torch.nan)
        clipped = (pred - v_old.detach()).abs() > clip if clip is not None else torch.zeros_like(pred, dtype=torch.bool)
        stats = {
            "value_loss": loss.detach(),
            "explained_variance": explained,
            "value_clip_fraction": masked_mean(clipped.to(pred.dtype), mask),
            "value_mean": masked_mean(pred, mask),
        }
    return loss, stats


def entropy_bonus(entropy: torch.Tensor, coef: float, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Entropy regularizer as a loss term: ``-coef * mean(entropy)``.

    Adding it to the loss *rewards* entropy (minimizing it raises entropy).

    Args:
        entropy: ``float [*S]`` per-element policy entropy (differentiable).
        coef: coefficient ``>= 0`` (0.005 seen with Flow-Noise).
        mask: optional ``bool`` of ``entropy``'s leading dims; True = valid.

    Returns:
        0-dim tensor.

    Raises:
        ValueError: if ``entropy`` is not a non-empty float tensor, ``coef < 0``,
            or the mask is malformed / selects nothing.
    """
    _check_same_shape("entropy", entropy)
    if coef < 0:
        raise ValueError(f"coef must be >= 0, got {coef}")
    return -coef * masked_mean(_sanitize(entropy, mask), mask)


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """k3 estimate of ``KL(pi || pi_ref)``, averaged over valid elements.

    With samples drawn from ``pi`` and ``r = pi_ref / pi = exp(ref_logp - logp)``::

        k3 = r - 1 - log r     (>= 0 per sample, unbiased, low variance)

    Use it as the optional KL penalty ``beta * kl_k3(logp, ref_logp)``.

    Args:
        logp: ``float [*S]`` log-probs of the sampled actions under ``pi`` (differentiable).
        ref_logp: ``float [*S]`` log-probs of the same actions under the reference policy.
        mask: optional ``bool`` of ``logp``'s leading dims; True = valid.

    Returns:
        0-dim tensor.

    Raises:
        ValueError: on shape/dtype mismatches, empty input, or a malformed mask.
    """
    _check_same_shape("logp", logp, (("ref_logp", ref_logp),))
    return masked_mean(_k3(_sanitize(ref_logp.to(logp.dtype) - logp, mask)), mask)
