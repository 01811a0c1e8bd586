"""Flow-SDE transition math against hand-computed values (docs/training.md, "Samplers")."""

from __future__ import annotations

import math

import pytest
import torch

from policies.flow.sde import (
    euler_step,
    flow_sde_step,
    gaussian_entropy,
    gaussian_logp,
    sde_sigma,
    standard_normal_logp,
    uniform_schedule,
)


def test_flow_sde_step_matches_hand_computed_interior_step() -> None:
    # t = 0.75, delta = 0.25, a = 0.5: sigma = 0.5 * sqrt(3), sigma^2 = 0.75
    # x0_hat = [0.625, -2.75], x1_hat = [1.125, -1.75]
    # mean = x0_hat * 0.5 + x1_hat * (0.5 - 0.75 * 0.25 / 1.5) = [0.734375, -2.03125]
    x = torch.tensor([[1.0, -2.0]])
    v = torch.tensor([[0.5, 1.0]])
    mean, std = flow_sde_step(x, v, 0.75, 0.25, 0.5)
    torch.testing.assert_close(mean, torch.tensor([[0.734375, -2.03125]]))
    torch.testing.assert_close(std.expand_as(mean), torch.full((1, 2), 0.5 * 0.5 * math.sqrt(3.0)))


def test_flow_sde_step_at_t_equal_one_uses_next_time_in_ratio() -> None:
    # t = 1, delta = 0.25: the ratio uses t_1 = 0.75 -> sigma = 0.5 * sqrt(3).
    # x0_hat = 0.2 + 0.4 = 0.6, x1_hat = 0.2; mean = 0.6 * 0.25 + 0.2 * (0.75 - 0.75 * 0.25 / 2) = 0.28125
    x = torch.tensor([[0.2]])
    v = torch.tensor([[-0.4]])
    mean, std = flow_sde_step(x, v, 1.0, 0.25, 0.5)
    assert torch.isfinite(mean).all() and torch.isfinite(std).all()
    torch.testing.assert_close(mean, torch.tensor([[0.28125]]))
    torch.testing.assert_close(std.reshape(()), torch.tensor(0.25 * math.sqrt(3.0)))
    torch.testing.assert_close(sde_sigma(1.0, 0.25, 0.5), torch.tensor(0.5 * math.sqrt(3.0)))


def test_zero_noise_level_is_the_euler_step() -> None:
    x, v = torch.randn(3, 4, 2), torch.randn(3, 4, 2)
    for t in (1.0, 0.5, 0.25):
        mean, std = flow_sde_step(x, v, t, 0.25, 0.0)
        torch.testing.assert_close(mean, euler_step(x, v, 0.25))
        assert float(std.abs().max()) == 0.0


def test_per_row_times_match_scalar_times() -> None:
    x, v = torch.randn(3, 5, 2), torch.randn(3, 5, 2)
    t = torch.tensor([1.0, 0.6, 0.2])
    mean, std = flow_sde_step(x, v, t, 0.2, 0.7)
    for i in range(3):
        m_i, s_i = flow_sde_step(x[i : i + 1], v[i : i + 1], float(t[i]), 0.2, 0.7)
        torch.testing.assert_close(mean[i : i + 1], m_i)
        torch.testing.assert_close(std[i : i + 1].expand_as(m_i), s_i.expand_as(m_i))


def test_bad_shapes_raise_with_the_shapes_in_the_message() -> None:
    with pytest.raises(ValueError, match=r"velocity shape \[2, 3\] must equal x_t shape \[2, 4\]"):
        flow_sde_step(torch.zeros(2, 4), torch.zeros(2, 3), 0.5, 0.1, 0.5)
    with pytest.raises(ValueError, match="t of shape"):
        flow_sde_step(torch.zeros(2, 4), torch.zeros(2, 4), torch.ones(3), 0.1, 0.5)


def test_gaussian_logp_matches_torch_and_zero_std_contributes_nothing() -> None:
    x, mean = torch.randn(4, 3), torch.randn(4, 3)
    std = torch.rand(4, 3) + 0.1
    expected = torch.distributions.Normal(mean, std).log_prob(x)
    torch.testing.assert_close(gaussian_logp(x, mean, std), expected)
    std[:, 1] = 0.0
    out = gaussian_logp(x, mean, std)
    assert torch.all(out[:, 1] == 0) and torch.isfinite(out).all()
    torch.testing.assert_close(out[:, 0], expected[:, 0])
    torch.testing.assert_close(gaussian_entropy(torch.tensor([0.5, 0.0])),
                               torch.tensor([torch.distributions.Normal(0.0, 0.5).entropy().item(), 0.0]))
    torch.testing.assert_close(standard_normal_logp(x), torch.distributions.Normal(0.0, 1.0).log_prob(x))


def test_uniform_schedule_matches_lerobot_times() -> None:
    times, delta = uniform_schedule(3)
    assert times == [1.0 + i * (-1.0 / 3) for i in range(3)] and delta == 1.0 / 3
    with pytest.raises(ValueError):
        uniform_schedule(0)


def _gaussian_velocity(x: torch.Tensor, t: float, mu: float, s: float) -> torch.Tensor:
    """Exact marginal velocity E[noise - a | x_t = x] for data a ~ N(mu, s^2), x_t = t noise + (1 - t) a."""
    m = (1 - t) * mu
    var = t**2 + (1 - t) ** 2 * s**2
    return t * (x - m) / var - mu - (1 - t) * s**2 * (x - m) / var


@pytest.mark.parametrize("noise_level", [0.0, 0.5, 0.9])
def test_flow_sde_preserves_the_data_marginal(noise_level: float) -> None:
    """With the exact velocity of a Gaussian target, the SDE chain must end at that target."""
    gen = torch.Generator().manual_seed(0)
    mu, s, k = 1.5, 0.3, 100
    times, delta = uniform_schedule(k)
    x = torch.randn(20000, generator=gen, dtype=torch.float64)
    for t in times:
        mean, std = flow_sde_step(x, _gaussian_velocity(x, t, mu, s), t, delta, noise_level)
        x = mean + std * torch.randn(x.shape, generator=gen, dtype=torch.float64)
    assert abs(float(x.mean()) - mu) < 0.03
    assert abs(float(x.std()) - s) < 0.03
