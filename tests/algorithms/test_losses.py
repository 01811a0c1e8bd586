"""Numeric tests for vla_rl.algorithms.losses (hand-computed values, gradients, input checks)."""

from __future__ import annotations

import math

import pytest
import torch

from vla_rl.algorithms.losses import (
    entropy_bonus,
    kl_k3,
    ppo_policy_loss,
    value_loss,
)
from vla_rl.grape.tpo import tpo_loss

NAN = float("nan")


def t64(values: list | float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


# ----------------------------------------------------------------------------- PPO policy loss

# old_logp = 0, so ratio = exp(logp) = RATIOS. clip range [0.8, 1.28], dual clip c = 3.
RATIOS = [1.5, 0.5, 0.5, 1.1, 5.0, 5.0]
ADVS = [1.0, 1.0, -1.0, -2.0, -1.0, 1.0]
# Per-element L = max(-r A, -clip(r) A), then for A < 0: min(L, -3 A)
#  1: r 1.5, A +1: max(-1.5, -1.28) = -1.28            (upper clip active)
#  2: r 0.5, A +1: max(-0.5, -0.8)  = -0.5             (pessimistic: unclipped)
#  3: r 0.5, A -1: max(0.5, 0.8)    = 0.8; min(.8, 3)  (lower clip active)
#  4: r 1.1, A -2: max(2.2, 2.2)    = 2.2; min(2.2, 6)
#  5: r 5.0, A -1: max(5, 1.28)     = 5;   min(5, 3) = 3 (dual clip active)
#  6: r 5.0, A +1: max(-5, -1.28)   = -1.28            (no dual clip for A > 0)
PER_ELEM_DUAL = [-1.28, -0.5, 0.8, 2.2, 3.0, -1.28]
PER_ELEM_NO_DUAL = [-1.28, -0.5, 0.8, 2.2, 5.0, -1.28]


def ppo_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    logp = t64([math.log(r) for r in RATIOS]).requires_grad_(True)
    return logp, torch.zeros(6, dtype=torch.float64), t64(ADVS)


def test_ppo_policy_loss_hand_computed_with_dual_clip() -> None:
    logp, old, adv = ppo_inputs()
    loss, stats = ppo_policy_loss(logp, old, adv, 0.2, 0.28, 3.0)
    torch.testing.assert_close(loss, t64(sum(PER_ELEM_DUAL) / 6))  # 2.94 / 6 = 0.49
    loss.backward()
    # d L_i / d logp_i = -r_i A_i where the unclipped branch is active, else 0; divided by N = 6.
    torch.testing.assert_close(logp.grad, t64([0.0, -0.5 / 6, 0.0, 2.2 / 6, 0.0, 0.0]))
    torch.testing.assert_close(stats["dual_clip_fraction"], t64(1 / 6))
    torch.testing.assert_close(stats["clip_fraction"], t64(5 / 6))  # all but r = 1.1
    torch.testing.assert_close(stats["ratio_mean"], t64(13.6 / 6))
    torch.testing.assert_close(stats["ratio_max"], t64(5.0))
    torch.testing.assert_close(stats["approx_kl"], t64(sum(r - 1 - math.log(r) for r in RATIOS) / 6))
    torch.testing.assert_close(stats["policy_loss"], t64(0.49))
    assert all(not v.requires_grad and v.dim() == 0 for v in stats.values())


@pytest.mark.parametrize("dual_clip", [None, 0, 0.0])
def test_ppo_policy_loss_dual_clip_disabled(dual_clip: float | None) -> None:
    logp, old, adv = ppo_inputs()
    loss, stats = ppo_policy_loss(logp, old, adv, 0.2, 0.28, dual_clip)
    torch.testing.assert_close(loss, t64(sum(PER_ELEM_NO_DUAL) / 6))
    torch.testing.assert_close(stats["dual_clip_fraction"], t64(0.0))
    loss.backward()
    torch.testing.assert_close(logp.grad[4], t64(5.0 / 6))  # -r A = 5, unclipped branch


def test_ppo_policy_loss_symmetric_clip_and_identity_ratio() -> None:
    # ratio 1 everywhere: loss = -mean(A), no clipping, kl 0.
    loss, stats = ppo_policy_loss(torch.zeros(3), torch.zeros(3), torch.tensor([1.0, 2.0, -6.0]), 0.2, 0.2, 3.0)
    torch.testing.assert_close(loss, torch.tensor(1.0))
    torch.testing.assert_close(stats["approx_kl"], torch.tensor(0.0))
    torch.testing.assert_close(stats["clip_fraction"], torch.tensor(0.0))
    # symmetric clip: r = 1.5, A = +1 -> -1.2 ; r = 0.5, A = -1 -> 0.8
    loss, _ = ppo_policy_loss(t64([math.log(1.5), math.log(0.5)]), t64([0.0, 0.0]), t64([1.0, -1.0]), 0.2, 0.2, None)
    torch.testing.assert_close(loss, t64((-1.2 + 0.8) / 2))


def test_ppo_policy_loss_broadcasts_leading_dim_advantages() -> None:
    g = torch.Generator().manual_seed(0)
    logp, old = torch.randn(4, 3, 2, generator=g), torch.randn(4, 3, 2, generator=g)
    adv = torch.randn(4, generator=g)
    loss_b, _ = ppo_policy_loss(logp, old, adv, 0.2, 0.28, 3.0)
    loss_full, _ = ppo_policy_loss(logp, old, adv[:, None, None].expand(4, 3, 2), 0.2, 0.28, 3.0)
    torch.testing.assert_close(loss_b, loss_full)


def test_ppo_policy_loss_mask_ignores_padding_even_nan() -> None:
    logp, old, adv = ppo_inputs()
    padded_logp = torch.cat([logp.detach(), t64([NAN, 50.0])]).requires_grad_(True)
    padded_old = torch.cat([old, t64([0.0, NAN])])
    padded_adv = torch.cat([adv, t64([NAN, -7.0])])
    mask = torch.tensor([True] * 6 + [False, False])
    loss, stats = ppo_policy_loss(padded_logp, padded_old, padded_adv, 0.2, 0.28, 3.0, mask=mask)
    torch.testing.assert_close(loss, t64(0.49))
    torch.testing.assert_close(stats["ratio_max"], t64(5.0))
    torch.testing.assert_close(stats["clip_fraction"], t64(5 / 6))
    loss.backward()
    assert torch.isfinite(padded_logp.grad).all()
    torch.testing.assert_close(padded_logp.grad[6:], t64([0.0, 0.0]))


def test_ppo_policy_loss_gradients_finite_on_random_inputs() -> None:
    g = torch.Generator().manual_seed(1)
    logp = (torch.randn(8, 5, generator=g) * 3).requires_grad_(True)
    loss, stats = ppo_policy_loss(logp, torch.randn(8, 5, generator=g) * 3, torch.randn(8, generator=g), 0.2, 0.28, 3.0)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()
    assert all(torch.isfinite(v) for v in stats.values())


def test_ppo_policy_loss_rejects_bad_inputs() -> None:
    x = torch.zeros(4, 3)
    with pytest.raises(ValueError, match=r"old_logp shape \(4,\) must equal logp shape \(4, 3\)"):
        ppo_policy_loss(x, torch.zeros(4), torch.zeros(4), 0.2, 0.2, 3.0)
    with pytest.raises(ValueError, match=r"advantages shape \(3,\)"):
        ppo_policy_loss(x, x, torch.zeros(3), 0.2, 0.2, 3.0)
    with pytest.raises(ValueError, match="clip_low"):
        ppo_policy_loss(x, x, x, 1.0, 0.2, 3.0)
    with pytest.raises(ValueError, match="clip_high"):
        ppo_policy_loss(x, x, x, 0.2, -0.1, 3.0)
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        ppo_policy_loss(x, x, x, 0.2, 0.2, 0.5)
    with pytest.raises(ValueError, match=r"mask shape \(3,\)"):
        ppo_policy_loss(x, x, x, 0.2, 0.2, 3.0, mask=torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="logp must be a floating-point tensor"):
        ppo_policy_loss(x.long(), x, x, 0.2, 0.2, 3.0)


# ----------------------------------------------------------------------------- value loss

VALS, OLD_VALS, RETS = [1.0, 2.0, 0.0], [0.5, 2.1, 0.0], [2.0, 2.0, 3.0]
# clip 0.2: clipped predictions [0.7, 2.0, 0.0]; errors unclipped [-1, 0, -3], clipped [-1.3, 0, -3]


@pytest.mark.parametrize(
    ("clip", "huber_delta", "expected", "expected_grad"),
    [
        # squared: max(.5, .845), max(0, 0), max(4.5, 4.5) -> 5.345 / 3; element 0 takes the clipped branch (grad 0)
        (0.2, None, 5.345 / 3, [0.0, 0.0, -3.0 / 3]),
        # no clip: (.5 + 0 + 4.5) / 3
        (None, None, 5.0 / 3, [-1.0 / 3, 0.0, -3.0 / 3]),
        # Huber d = 1: |1| -> .5 ; |1.3| -> 1.3 - .5 = .8 ; |3| -> 3 - .5 = 2.5 -> (.8 + 0 + 2.5) / 3
        (0.2, 1.0, 3.3 / 3, [0.0, 0.0, -1.0 / 3]),
        # Huber d = 1, no clip: (.5 + 0 + 2.5) / 3
        (None, 1.0, 1.0, [-1.0 / 3, 0.0, -1.0 / 3]),
        # Huber with a huge delta equals the squared error
        (None, 1e6, 5.0 / 3, [-1.0 / 3, 0.0, -3.0 / 3]),
    ],
)
def test_value_loss_hand_computed(
    clip: float | None, huber_delta: float | None, expected: float, expected_grad: list
) -> None:
    values = t64(VALS).requires_grad_(True)
    loss, stats = value_loss(values, t64(OLD_VALS), t64(RETS), clip, huber_delta)
    torch.testing.assert_close(loss, t64(expected))
    loss.backward()
    torch.testing.assert_close(values.grad, t64(expected_grad))
    # Residuals [1, 0, 3]: pop var 14/9; returns [2, 2, 3]: pop var 2/9 -> EV = 1 - 7 = -6.
    torch.testing.assert_close(stats["explained_variance"], t64(-6.0))
    torch.testing.assert_close(stats["value_clip_fraction"], t64(1 / 3 if clip is not None else 0.0))
    torch.testing.assert_close(stats["value_mean"], t64(1.0))
    assert all(not v.requires_grad for v in stats.values())


def test_value_loss_explained_variance_edge_cases() -> None:
    returns = t64([1.0, -2.0, 4.0])
    _, stats = value_loss(returns.clone(), returns.clone(), returns, 0.2, None)
    torch.testing.assert_close(stats["explained_variance"], t64(1.0))  # perfect predictor
    _, stats = value_loss(t64([0.0, 0.0, 0.0]), t64([0.0, 0.0, 0.0]), returns, None, None)
    torch.testing.assert_close(stats["explained_variance"], t64(0.0))  # residual = returns: explains nothing
    _, stats = value_loss(t64([1.0, 2.0]), t64([1.0, 2.0]), t64([3.0, 3.0]), None, None)
    assert math.isnan(float(stats["explained_variance"]))  # constant returns: undefined


def test_value_loss_mask_and_gradients() -> None:
    values = t64([1.0, 2.0, 0.0, NAN]).requires_grad_(True)
    mask = torch.tensor([True, True, True, False])
    loss, stats = value_loss(values, t64(OLD_VALS + [NAN]), t64(RETS + [NAN]), 0.2, None, mask=mask)
    torch.testing.assert_close(loss, t64(5.345 / 3))
    torch.testing.assert_close(stats["explained_variance"], t64(-6.0))
    loss.backward()
    assert torch.isfinite(values.grad).all() and float(values.grad[3]) == 0.0


def test_value_loss_rejects_bad_inputs() -> None:
    x = torch.zeros(5)
    with pytest.raises(ValueError, match=r"returns shape \(4,\) must equal values shape \(5,\)"):
        value_loss(x, x, torch.zeros(4), 0.2, None)
    with pytest.raises(ValueError, match="clip must be > 0"):
        value_loss(x, x, x, 0.0, None)
    with pytest.raises(ValueError, match="huber_delta must be > 0"):
        value_loss(x, x, x, 0.2, -1.0)
    with pytest.raises(ValueError, match="values is empty"):
        value_loss(torch.zeros(0), torch.zeros(0), torch.zeros(0), 0.2, None)


# ----------------------------------------------------------------------------- entropy and KL


def test_entropy_bonus_hand_computed() -> None:
    entropy = t64([1.0, 2.0, 3.0]).requires_grad_(True)
    out = entropy_bonus(entropy, 0.01)
    torch.testing.assert_close(out, t64(-0.02))
    out.backward()
    torch.testing.assert_close(entropy.grad, t64([-0.01 / 3] * 3))
    masked = entropy_bonus(t64([1.0, 2.0, NAN]), 0.01, torch.tensor([True, True, False]))
    torch.testing.assert_close(masked, t64(-0.015))
    with pytest.raises(ValueError, match="coef must be >= 0"):
        entropy_bonus(entropy, -1.0)


def test_kl_k3_hand_computed() -> None:
    # element 1: pi = ref -> 0. element 2: pi = .5, ref = 1 -> r = 2 -> 2 - 1 - log 2
    logp = t64([0.0, math.log(0.5)]).requires_grad_(True)
    out = kl_k3(logp, t64([0.0, 0.0]))
    torch.testing.assert_close(out, t64((1.0 - math.log(2.0)) / 2))
    out.backward()
    # d/dlogp (e^{ref - logp} - 1 - (ref - logp)) = -r + 1; element 2: -1, / 2
    torch.testing.assert_close(logp.grad, t64([0.0, -0.5]))
    masked = kl_k3(t64([0.0, math.log(0.5), NAN]), t64([0.0, 0.0, 1.0]), torch.tensor([True, True, False]))
    torch.testing.assert_close(masked, t64((1.0 - math.log(2.0)) / 2))


def test_kl_k3_is_unbiased_for_exact_categorical_kl() -> None:
    p, q = [0.5, 0.3, 0.2], [0.2, 0.2, 0.6]
    exact = sum(pi * math.log(pi / qi) for pi, qi in zip(p, q))
    expectation = sum(pi * float(kl_k3(t64([math.log(pi)]), t64([math.log(qi)]))) for pi, qi in zip(p, q))
    assert math.isclose(expectation, exact, rel_tol=1e-12)


def test_kl_k3_rejects_bad_inputs() -> None:
    with pytest.raises(ValueError, match=r"ref_logp shape \(3,\) must equal logp shape \(2,\)"):
        kl_k3(torch.zeros(2), torch.zeros(3))


def test_all_losses_have_finite_gradients_on_random_inputs() -> None:
    g = torch.Generator().manual_seed(2)
    v = torch.randn(16, generator=g).requires_grad_(True)
    vl, _ = value_loss(v, torch.randn(16, generator=g), torch.randn(16, generator=g) * 5, 0.2, 1.0)
    lp = torch.randn(6, generator=g).requires_grad_(True)
    tl, _ = tpo_loss(lp, torch.randn(6, generator=g), torch.randn(6, generator=g), torch.randn(6, generator=g), 0.1)
    kl = kl_k3(lp, torch.randn(6, generator=g))
    pv = torch.randn(2, 3, 4, generator=g).requires_grad_(True)
    ent = entropy_bonus(pv.abs(), 0.005)
    (vl + tl + kl + ent).backward()
    for grad in (v.grad, lp.grad, pv.grad):
        assert grad is not None and torch.isfinite(grad).all()
