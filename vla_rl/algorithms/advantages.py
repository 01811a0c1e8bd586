"""Advantage estimators: GAE (critic-based PPO), group-relative (GRPO), and helpers.

All functions are pure: tensors in, tensors out, no hidden state. Advantages
and returns are *targets*, so every estimator here runs under
``torch.no_grad()`` and returns tensors that carry no autograd history.

Masks follow one convention across :mod:`vla_rl.algorithms`: a ``bool`` tensor
where ``True`` marks a valid element, whose shape equals the leading dims of the
tensor it masks (e.g. a ``[B, H]`` mask for a ``[B, H, A]`` tensor); it is
broadcast over the remaining trailing dims.
"""

from __future__ import annotations

import torch

GROUP_STD_EPS = 1e-6
"""Added to the group std in :func:`group_relative`."""


# ----------------------------------------------------------------------------- checks


def _check_float(name: str, x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{name} must be a floating-point tensor, got {got}")


def _check_bool(name: str, x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor) or x.dtype != torch.bool:
        got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{name} must be a bool tensor, got {got}")


def _check_unit_interval(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must lie in [0, 1], got {value}")


def expand_mask(mask: torch.Tensor, like: torch.Tensor, name: str = "mask") -> torch.Tensor:
    """Broadcast a leading-dims ``bool`` mask to the shape of ``like``.

    Args:
        mask: ``bool`` tensor whose shape equals ``like.shape[:mask.dim()]``.
        like: the tensor being masked, any shape ``[*lead, *trail]``.
        name: argument name used in error messages.

    Returns:
        ``bool`` tensor of ``like``'s shape (a view; do not write to it).

    Raises:
        ValueError: if ``mask`` is not bool or its shape is not a leading prefix
            of ``like.shape``.
    """
    _check_bool(name, mask)
    if mask.dim() > like.dim() or tuple(mask.shape) != tuple(like.shape[: mask.dim()]):
        raise ValueError(
            f"{name} shape {tuple(mask.shape)} must equal the leading dims of the masked tensor "
            f"{tuple(like.shape)}"
        )
    return mask.reshape(*mask.shape, *([1] * (like.dim() - mask.dim()))).expand_as(like)


def masked_mean(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Mean of ``x`` over the elements where ``mask`` is True (all elements if None).

    Masked-out elements never reach the result nor its gradient, even if they
    hold ``nan`` or ``inf`` (they are replaced by 0 with ``torch.where``).

    Args:
        x: floating tensor, any shape (at least one element).
        mask: ``bool`` tensor of ``x``'s leading dims (see module docstring), or None.

    Returns:
        0-dim tensor.

    Raises:
        ValueError: if ``x`` is empty, ``mask`` has a wrong shape/dtype, or
            ``mask`` selects no element.
    """
    if x.numel() == 0:
        raise ValueError(f"masked_mean got an empty tensor of shape {tuple(x.shape)}")
    if mask is None:
        return x.mean()
    full = expand_mask(mask, x)
    count = full.sum()
    if int(count) == 0:
        raise ValueError(f"mask of shape {tuple(mask.shape)} selects no element; nothing to average")
    return torch.where(full, x, torch.zeros_like(x)).sum() / count.to(x.dtype)


# ----------------------------------------------------------------------------- GAE


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation with terminated and truncated kept apart.

    For ``t = T-1, ..., 0`` (with ``A_T = 0``)::

        delta_t = r_t + gamma * V'_t * (1 - terminated_t) - V(s_t)
        A_t     = delta_t + gamma * lam * (1 - done_t) * A_{t+1},  done_t = terminated_t | truncated_t
        R_t     = A_t + V(s_t)

    ``V'_t = next_values[t]`` is the value of the true successor of step ``t``:
    the next observation, or the *final* observation where the episode ended
    (not the auto-reset observation). So a truncated step bootstraps from
    ``V'_t`` and then stops the recursion; a terminated step does neither. At
    the last rollout step ``t = T-1`` the recursion stops anyway and an
    unfinished episode bootstraps from ``next_values[T-1]``.

    Implementation: a reverse loop over time, vectorized over the batch.

    Args:
        rewards: ``float [T, B]`` reward of step ``t`` (chunk-level reward for chunked policies).
        values: ``float [T, B]`` critic value ``V(s_t)`` of the observation step ``t`` acted on.
        next_values: ``float [T, B]`` critic value of the true successor of step ``t``.
        terminated: ``bool [T, B]`` the episode reached a terminal state at step ``t``.
        truncated: ``bool [T, B]`` the episode was cut (time limit) at step ``t``.
        gamma: discount in ``[0, 1]``.
        lam: GAE lambda in ``[0, 1]``.

    Returns:
        ``(advantages, returns)``, both ``[T, B]`` in ``rewards``' dtype, detached.

    Raises:
        ValueError: if a tensor is not ``[T, B]``, shapes differ, dtypes are wrong
            (floats for rewards/values, bool for terminated/truncated), or
            ``gamma``/``lam`` lie outside ``[0, 1]``.
    """
    for name, x in (("rewards", rewards), ("values", values), ("next_values", next_values)):
        _check_float(name, x)
    _check_bool("terminated", terminated)
    _check_bool("truncated", truncated)
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [T, B], got shape {tuple(rewards.shape)}")
    for name, x in (("values", values), ("next_values", next_values), ("terminated", terminated),
                    ("truncated", truncated)):
        if x.shape != rewards.shape:
            raise ValueError(f"{name} shape {tuple(x.shape)} must equal rewards shape {tuple(rewards.shape)} ([T, B])")
    _check_unit_interval("gamma", gamma)
    _check_unit_interval("lam", lam)

    with torch.no_grad():
        dtype = rewards.dtype
        not_terminated = (~terminated).to(dtype)
        not_done = (~(terminated | truncated)).to(dtype)
        deltas = rewards + gamma * next_values.to(dtype) * not_terminated - values.to(dtype)
        advantages = torch.empty_like(deltas)
        running = torch.zeros_like(deltas[0])
        for t in range(rewards.shape[0] - 1, -1, -1):
            running = deltas[t] + gamma * lam * not_done[t] * running
            advantages[t] = running
        returns = advantages + values.to(dtype)
    return advantages, returns


# ----------------------------------------------------------------------------- GRPO


def _group_index(group_ids: torch.Tensor, n: int, name: str = "group_ids") -> tuple[torch.Tensor, int]:
    """Map arbitrary integer group ids ``[N]`` to contiguous indices ``[N]`` in ``[0, G)``."""
    is_int = isinstance(group_ids, torch.Tensor) and not (
        group_ids.is_floating_point() or group_ids.is_complex() or group_ids.dtype == torch.bool
    )
    if not is_int:
        got = group_ids.dtype if isinstance(group_ids, torch.Tensor) else type(group_ids).__name__
        raise ValueError(f"{name} must be an integer tensor, got {got}")
    if group_ids.shape != (n,):
        raise ValueError(f"{name} shape {tuple(group_ids.shape)} must be [N] = ({n},)")
    _, index = torch.unique(group_ids, return_inverse=True)
    return index, (int(index.max()) + 1 if n > 0 else 0)


def group_relative(returns: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """GRPO advantages: each return standardized within its group.

    ``A_i = (R_i - mean_g(R)) / (std_g(R) + 1e-6)`` where ``g`` is the group of
    ``i`` (rollouts from the same task and initial state). ``std_g`` is the
    **population** standard deviation (divide by the group size ``n``, not
    ``n - 1``); it is defined for every group size, so a singleton group, and
    any group whose returns are all equal, gets advantage exactly 0. Broadcast
    the result to the steps of each rollout at the call site.

    Args:
        returns: ``float [N]`` one scalar return per rollout.
        group_ids: ``int [N]`` group of each rollout; any integer values (need
            not be contiguous or sorted).

    Returns:
        ``[N]`` advantages in ``returns``' dtype, detached.

    Raises:
        ValueError: if ``returns`` is not a 1-D float tensor or ``group_ids`` is
            not an integer tensor of the same length.
    """
    _check_float("returns", returns)
    if returns.dim() != 1:
        raise ValueError(f"returns must be [N] (one return per rollout), got shape {tuple(returns.shape)}")
    index, num_groups = _group_index(group_ids, returns.shape[0])
    with torch.no_grad():
        r = returns.detach()
        counts = torch.zeros(num_groups, dtype=r.dtype, device=r.device).index_add_(0, index, torch.ones_like(r))
        mean = torch.zeros(num_groups, dtype=r.dtype, device=r.device).index_add_(0, index, r) / counts
        centered = r - mean[index]
        var = torch.zeros(num_groups, dtype=r.dtype, device=r.device).index_add_(0, index, centered**2) / counts
        return centered / (var.sqrt()[index] + GROUP_STD_EPS)


def dynamic_sampling_mask(
    successes: torch.Tensor,
    group_ids: torch.Tensor,
    low: float = 0.1,
    high: float = 0.9,
) -> torch.Tensor:
    """Keep only rollouts whose group success rate lies in ``[low, high]`` (inclusive).

    All-success and all-failure groups carry no GRPO signal (their advantages
    are all 0); DAPO-style dynamic sampling drops them. The success rate of a
    group is the mean of its ``successes``, computed in float64 so that exact
    fractions such as 1/10 compare equal to the literal bound ``0.1``.

    Args:
        successes: ``[N]`` bool, or float in ``[0, 1]``, per rollout.
        group_ids: ``int [N]`` group of each rollout (any integer values).
        low: lowest kept success rate, in ``[0, 1]``.
        high: highest kept success rate, in ``[low, 1]``.

    Returns:
        ``bool [N]``: True for rollouts of kept groups.

    Raises:
        ValueError: on wrong shapes/dtypes, float successes outside ``[0, 1]``,
            or a band with ``low > high`` or bounds outside ``[0, 1]``.
    """
    if not isinstance(successes, torch.Tensor) or not (successes.dtype == torch.bool or successes.is_floating_point()):
        got = successes.dtype if isinstance(successes, torch.Tensor) else type(successes).__name__
        raise ValueError(f"successes must be a bool or float tensor, got {got}")
    if successes.dim() != 1:
        raise ValueError(f"successes must be [N], got shape {tuple(successes.shape)}")
    _check_unit_interval("low", low)
    _check_unit_interval("high", high)
    if low > high:
        raise ValueError(f"low ({low}) must be <= high ({high})")
    s = successes.detach().to(torch.float64)
    if s.numel() and (s.min() < 0 or s.max() > 1):
        raise ValueError("successes must lie in [0, 1]")
    index, num_groups = _group_index(group_ids, s.shape[0])
    counts = torch.zeros(num_groups, dtype=torch.float64, device=s.device).index_add_(0, index, torch.ones_like(s))
    rate = torch.zeros(num_groups, dtype=torch.float64, device=s.device).index_add_(0, index, s) / counts
    keep = (rate >= low) & (rate <= high)
    return keep[index]


def normalize_advantages(adv: torch.Tensor, mask: torch.Tensor | None = None, eps: float = 1e-8) -> torch.Tensor:
    """Standardize advantages over a minibatch: ``(adv - mean) / (std + eps)``.

    ``mean`` and ``std`` (population std, divide by the count) are taken over
    the valid elements only; masked-out elements are returned as 0 so they
    cannot leak into a loss. A single valid element normalizes to 0.

    Args:
        adv: ``float [*]`` advantages, any shape.
        mask: ``bool`` of ``adv``'s leading dims (True = valid), or None.
        eps: added to the std, must be > 0.

    Returns:
        Tensor of ``adv``'s shape and dtype, detached.

    Raises:
        ValueError: if ``adv`` is not float or empty, ``mask`` is malformed or
            selects nothing, or ``eps <= 0``.
    """
    _check_float("adv", adv)
    if eps <= 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    with torch.no_grad():
        a = adv.detach()
        mean = masked_mean(a, mask)
        var = masked_mean((a - mean) ** 2, mask)
        out = (a - mean) / (var.sqrt() + eps)
        if mask is not None:
            out = torch.where(expand_mask(mask, a), out, torch.zeros_like(out))
        return out
