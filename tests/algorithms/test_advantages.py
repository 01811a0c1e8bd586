"""Numeric tests for vla_rl.algorithms.advantages (hand-computed values and plain-loop references)."""

from __future__ import annotations

import math
import random
import statistics

import pytest
import torch

from vla_rl.algorithms.advantages import (
    dynamic_sampling_mask,
    gae,
    group_relative,
    masked_mean,
    normalize_advantages,
)


def t64(values: list) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def col(values: list) -> torch.Tensor:
    """A ``[T, 1]`` float64 column."""
    return t64(values)[:, None]


def bcol(values: list) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.bool)[:, None]


# ----------------------------------------------------------------------------- GAE: hand-computed

GAMMA, LAM = 0.9, 0.5
REWARDS = [1.0, 0.0, 2.0]
VALUES = [0.5, 1.0, 1.5]


@pytest.mark.parametrize(
    ("next_values", "terminated", "truncated", "expected_adv"),
    [
        # Episode ends at the last step. Terminated: no bootstrap.
        #   d2 = 2 - 1.5 = 0.5; d1 = 0 + .9*1.5 - 1 = 0.35; d0 = 1 + .9*1 - .5 = 1.4
        #   A2 = .5; A1 = .35 + .45*.5 = .575; A0 = 1.4 + .45*.575 = 1.65875
        ([1.0, 1.5, 3.0], [0, 0, 1], [0, 0, 0], [1.65875, 0.575, 0.5]),
        # Truncated: bootstrap from the final obs value 3.0. d2 = 2 + .9*3 - 1.5 = 3.2
        #   A1 = .35 + .45*3.2 = 1.79; A0 = 1.4 + .45*1.79 = 2.2055
        ([1.0, 1.5, 3.0], [0, 0, 0], [0, 0, 1], [2.2055, 1.79, 3.2]),
        # Rollout simply stops (no done): the last step bootstraps like truncation.
        ([1.0, 1.5, 3.0], [0, 0, 0], [0, 0, 0], [2.2055, 1.79, 3.2]),
        # Episode ends at t=0; t=1 is a fresh episode whose reset value (1.0) differs from
        # the final-obs value 2.0. Terminated at 0: A0 = d0 = 1 - .5 = 0.5, recursion cut.
        ([2.0, 1.5, 3.0], [1, 0, 0], [0, 0, 0], [0.5, 1.79, 3.2]),
        # Truncated at 0: A0 = d0 = 1 + .9*2.0 - .5 = 2.3 (final obs, not the reset obs), recursion cut.
        ([2.0, 1.5, 3.0], [0, 0, 0], [1, 0, 0], [2.3, 1.79, 3.2]),
        # Both flags at once: terminated wins for the bootstrap.
        ([2.0, 1.5, 3.0], [1, 0, 0], [1, 0, 0], [0.5, 1.79, 3.2]),
    ],
)
def test_gae_hand_computed(next_values: list, terminated: list, truncated: list, expected_adv: list) -> None:
    adv, ret = gae(col(REWARDS), col(VALUES), col(next_values), bcol(terminated), bcol(truncated), GAMMA, LAM)
    torch.testing.assert_close(adv, col(expected_adv))
    torch.testing.assert_close(ret, col([a + v for a, v in zip(expected_adv, VALUES)]))


def test_gae_batch_columns_are_independent() -> None:
    rewards = torch.cat([col(REWARDS), col(REWARDS)], dim=1)
    values = torch.cat([col(VALUES), col(VALUES)], dim=1)
    next_values = torch.cat([col([1.0, 1.5, 3.0]), col([1.0, 1.5, 3.0])], dim=1)
    terminated = torch.tensor([[False, False], [False, False], [True, False]])
    truncated = torch.tensor([[False, False], [False, False], [False, True]])
    adv, _ = gae(rewards, values, next_values, terminated, truncated, GAMMA, LAM)
    torch.testing.assert_close(adv[:, 0], t64([1.65875, 0.575, 0.5]))
    torch.testing.assert_close(adv[:, 1], t64([2.2055, 1.79, 3.2]))


def test_gae_monte_carlo_and_td0_limits() -> None:
    rewards = col([1.0, 2.0, 3.0])
    zeros = col([0.0, 0.0, 0.0])
    term = bcol([0, 0, 1])
    # gamma = lam = 1, V = 0: returns are the undiscounted rewards-to-go 6, 5, 3.
    _, ret = gae(rewards, zeros, zeros, term, bcol([0, 0, 0]), 1.0, 1.0)
    torch.testing.assert_close(ret, col([6.0, 5.0, 3.0]))
    # lam = 0: A_t = delta_t = r + .9 * V' - V with V = 1, V' = 2 (0 at termination).
    ones, twos = col([1.0, 1.0, 1.0]), col([2.0, 2.0, 2.0])
    adv, _ = gae(rewards, ones, twos, term, bcol([0, 0, 0]), 0.9, 0.0)
    torch.testing.assert_close(adv, col([1.8, 2.8, 2.0]))


# ----------------------------------------------------------------------------- GAE: reference loop


def gae_reference(rewards, values, next_values, terminated, truncated, gamma, lam):
    """Plain Python nested loop over envs and steps on lists of floats."""
    T, B = len(rewards), len(rewards[0])
    adv = [[0.0] * B for _ in range(T)]
    for b in range(B):
        carry = 0.0
        for t in reversed(range(T)):
            bootstrap = 0.0 if terminated[t][b] else gamma * next_values[t][b]
            delta = rewards[t][b] + bootstrap - values[t][b]
            if terminated[t][b] or truncated[t][b]:
                carry = 0.0
            carry = delta + gamma * lam * carry
            adv[t][b] = carry
    ret = [[adv[t][b] + values[t][b] for b in range(B)] for t in range(T)]
    return adv, ret


@pytest.mark.parametrize(("T", "B", "seed"), [(1, 1, 0), (5, 3, 1), (17, 4, 2), (64, 8, 3), (33, 2, 4)])
def test_gae_matches_plain_loop_on_random_episodes(T: int, B: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(T, B, generator=g, dtype=torch.float64)
    values = torch.randn(T, B, generator=g, dtype=torch.float64)
    next_values = torch.randn(T, B, generator=g, dtype=torch.float64)
    terminated = torch.rand(T, B, generator=g) < 0.15
    truncated = torch.rand(T, B, generator=g) < 0.15
    gamma, lam = 0.99, 0.95
    adv, ret = gae(rewards, values, next_values, terminated, truncated, gamma, lam)
    ref_adv, ref_ret = gae_reference(
        rewards.tolist(), values.tolist(), next_values.tolist(), terminated.tolist(), truncated.tolist(), gamma, lam
    )
    torch.testing.assert_close(adv, t64(ref_adv).reshape(T, B))
    torch.testing.assert_close(ret, t64(ref_ret).reshape(T, B))


def test_gae_float32_and_detached() -> None:
    values = torch.zeros(4, 2, requires_grad=True)
    adv, ret = gae(torch.ones(4, 2), values, torch.zeros(4, 2), torch.zeros(4, 2, dtype=torch.bool),
                   torch.zeros(4, 2, dtype=torch.bool), 0.5, 1.0)
    assert adv.dtype == torch.float32 and not adv.requires_grad and not ret.requires_grad
    torch.testing.assert_close(adv[:, 0], torch.tensor([1.875, 1.75, 1.5, 1.0]))


def test_gae_rejects_bad_inputs() -> None:
    f, b = torch.zeros(3, 2), torch.zeros(3, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"rewards must be \[T, B\]"):
        gae(torch.zeros(3), torch.zeros(3), torch.zeros(3), b[:, 0], b[:, 0], 0.9, 0.9)
    with pytest.raises(ValueError, match=r"next_values shape \(3, 1\)"):
        gae(f, f, torch.zeros(3, 1), b, b, 0.9, 0.9)
    with pytest.raises(ValueError, match="terminated must be a bool tensor"):
        gae(f, f, f, f, b, 0.9, 0.9)
    with pytest.raises(ValueError, match="values must be a floating-point tensor"):
        gae(f, b, f, b, b, 0.9, 0.9)
    with pytest.raises(ValueError, match="gamma"):
        gae(f, f, f, b, b, 1.5, 0.9)
    with pytest.raises(ValueError, match="lam"):
        gae(f, f, f, b, b, 0.9, -0.1)


# ----------------------------------------------------------------------------- group_relative


def test_group_relative_hand_computed() -> None:
    returns = t64([1.0, 0.0, 1.0, 1.0, 5.0, 0.0, 1.0, 2.0])
    group_ids = torch.tensor([3, 3, 9, 9, -2, 4, 4, 4])
    adv = group_relative(returns, group_ids)
    # group 3: mean .5, population std .5 -> +-.5 / (.5 + 1e-6)
    # group 9: all equal -> 0; group -2: singleton -> 0
    # group 4: [0, 1, 2], mean 1, population std sqrt(2/3) -> [-1, 0, 1] / (sqrt(2/3) + 1e-6)
    s = math.sqrt(2.0 / 3.0) + 1e-6
    expected = [0.5 / 0.500001, -0.5 / 0.500001, 0.0, 0.0, 0.0, -1.0 / s, 0.0, 1.0 / s]
    torch.testing.assert_close(adv, t64(expected))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_group_relative_matches_plain_loop(seed: int) -> None:
    rng = random.Random(seed)
    n = 40
    ids = [rng.choice([0, 5, 7, 11, 100]) for _ in range(n)]
    rets = [rng.uniform(-3, 3) for _ in range(n)]
    expected = []
    for i in range(n):
        members = [rets[j] for j in range(n) if ids[j] == ids[i]]
        mean = sum(members) / len(members)
        expected.append((rets[i] - mean) / (statistics.pstdev(members) + 1e-6))
    adv = group_relative(t64(rets), torch.tensor(ids))
    torch.testing.assert_close(adv, t64(expected))


def test_group_relative_rejects_bad_inputs() -> None:
    with pytest.raises(ValueError, match=r"returns must be \[N\]"):
        group_relative(torch.zeros(2, 2), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"group_ids shape \(3,\) must be \[N\] = \(4,\)"):
        group_relative(torch.zeros(4), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="group_ids must be an integer tensor"):
        group_relative(torch.zeros(4), torch.zeros(4))


# ----------------------------------------------------------------------------- dynamic sampling


def test_dynamic_sampling_mask_drops_all_success_and_all_fail_groups() -> None:
    successes = torch.tensor([1, 1, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0], dtype=torch.bool)
    ids = torch.tensor([0] * 4 + [1] * 4 + [2] * 4)
    keep = dynamic_sampling_mask(successes, ids)
    assert keep.dtype == torch.bool
    assert keep.tolist() == [False] * 8 + [True] * 4
    # Configurable band: rate .25 < .3 drops group 2 too.
    assert not dynamic_sampling_mask(successes, ids, low=0.3, high=0.9).any()
    # A band that admits everything.
    assert dynamic_sampling_mask(successes, ids, low=0.0, high=1.0).all()


def test_dynamic_sampling_mask_band_is_inclusive() -> None:
    # Groups of 10 with 1, 9 and 0 successes: rates .1 and .9 sit exactly on the bounds.
    successes = torch.tensor([1] + [0] * 9 + [1] * 9 + [0] + [0] * 10, dtype=torch.float32)
    ids = torch.tensor([0] * 10 + [1] * 10 + [2] * 10)
    keep = dynamic_sampling_mask(successes, ids, 0.1, 0.9)
    assert keep.tolist() == [True] * 20 + [False] * 10


def test_dynamic_sampling_mask_rejects_bad_inputs() -> None:
    s, ids = torch.ones(4, dtype=torch.bool), torch.zeros(4, dtype=torch.long)
    with pytest.raises(ValueError, match="low"):
        dynamic_sampling_mask(s, ids, low=0.8, high=0.2)
    with pytest.raises(ValueError, match="high"):
        dynamic_sampling_mask(s, ids, low=0.1, high=1.2)
    with pytest.raises(ValueError, match=r"successes must be \[N\]"):
        dynamic_sampling_mask(s[None], ids)
    with pytest.raises(ValueError, match=r"group_ids shape \(2,\)"):
        dynamic_sampling_mask(s, ids[:2])
    with pytest.raises(ValueError, match=r"successes must lie in \[0, 1\]"):
        dynamic_sampling_mask(torch.tensor([0.0, 2.0, 1.0, 0.0]), ids)


# ----------------------------------------------------------------------------- normalization and masked mean


def test_normalize_advantages_hand_computed() -> None:
    out = normalize_advantages(t64([1.0, 2.0, 3.0]))
    s = math.sqrt(2.0 / 3.0) + 1e-8  # population std of [1, 2, 3]
    torch.testing.assert_close(out, t64([-1.0 / s, 0.0, 1.0 / s]))


def test_normalize_advantages_masked_ignores_padding() -> None:
    adv = t64([[1.0, 3.0], [100.0, float("nan")]])
    mask = torch.tensor([True, False])  # leading-dim mask: row 1 is padding
    out = normalize_advantages(adv, mask)
    # valid [1, 3]: mean 2, population std 1
    torch.testing.assert_close(out, t64([[-1.0 / (1 + 1e-8), 1.0 / (1 + 1e-8)], [0.0, 0.0]]))
    # one valid element -> 0
    torch.testing.assert_close(normalize_advantages(t64([5.0, 7.0]), torch.tensor([False, True])), t64([0.0, 0.0]))


def test_normalize_advantages_rejects_bad_inputs() -> None:
    with pytest.raises(ValueError, match="mask of shape"):
        normalize_advantages(torch.ones(3), torch.zeros(3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"mask shape \(2,\)"):
        normalize_advantages(torch.ones(3), torch.ones(2, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask must be a bool tensor"):
        normalize_advantages(torch.ones(3), torch.ones(3))
    with pytest.raises(ValueError, match="adv must be a floating-point tensor"):
        normalize_advantages(torch.ones(3, dtype=torch.long))


def test_masked_mean_hand_computed() -> None:
    x = t64([[1.0, 2.0], [3.0, float("inf")]])
    torch.testing.assert_close(masked_mean(x[:1], None), t64(1.5))
    torch.testing.assert_close(masked_mean(x, torch.tensor([[True, True], [True, False]])), t64(2.0))
    torch.testing.assert_close(masked_mean(x, torch.tensor([True, False])), t64(1.5))
    with pytest.raises(ValueError, match="empty"):
        masked_mean(torch.zeros(0), None)
