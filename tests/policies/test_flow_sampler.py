"""The shared denoising loop: ODE, Flow-SDE (one step / full chain), Flow-Noise."""

from __future__ import annotations

import math

import pytest
import torch

from policies.flow.sampler import (
    EXTRA_CHAIN,
    EXTRA_STEP,
    ChainReduce,
    NoiseNet,
    SamplerConfig,
    SamplerKind,
    SdeMode,
    VelocityOutput,
    chain_log_prob,
    sample_chain,
)
from policies.flow.sde import flow_sde_step, uniform_schedule

B, H, A, D = 5, 3, 4, 6


class LinearField(torch.nn.Module):
    """A differentiable toy velocity field v = x W + t b, features = tanh(x U)."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.w = torch.nn.Parameter(torch.randn(A, A, generator=g) * 0.3)
        self.b = torch.nn.Parameter(torch.randn(A, generator=g))
        self.u = torch.nn.Parameter(torch.randn(A, D, generator=g))

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> VelocityOutput:
        assert t.shape == (x.shape[0],) and t.dtype == torch.float32
        return VelocityOutput(velocity=x @ self.w + t[:, None, None] * self.b, features=torch.tanh(x @ self.u))


def _cfg(**kw: object) -> SamplerConfig:
    return SamplerConfig(num_steps=4, **kw)  # type: ignore[arg-type]


MODES = [
    (SamplerKind.FLOW_SDE, SdeMode.ONE_STEP, ChainReduce.MEAN),
    (SamplerKind.FLOW_SDE, SdeMode.FULL_CHAIN, ChainReduce.MEAN),
    (SamplerKind.FLOW_SDE, SdeMode.FULL_CHAIN, ChainReduce.SUM),
    (SamplerKind.FLOW_NOISE, SdeMode.ONE_STEP, ChainReduce.MEAN),
]


def test_ode_is_the_euler_loop() -> None:
    field, noise = LinearField(), torch.randn(B, H, A)
    out = sample_chain(field, noise, _cfg(), SamplerKind.ODE)
    x = noise
    for t in (1.0, 0.75, 0.5, 0.25):
        x = x + (-0.25) * field(x, torch.full((B,), t)).velocity
    torch.testing.assert_close(out.actions, x, rtol=0, atol=0)
    assert out.extras == {} and float(out.logp.abs().max()) == 0.0


@pytest.mark.parametrize(("kind", "sde_mode", "reduce"), MODES)
def test_chain_log_prob_reproduces_the_sampled_log_prob(
    kind: SamplerKind, sde_mode: SdeMode, reduce: ChainReduce
) -> None:
    field = LinearField()
    cfg = _cfg(kind=kind, sde_mode=sde_mode, chain_reduce=reduce)
    net = NoiseNet(D, A, 8, cfg.noise_min_std, cfg.noise_max_std)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        out = sample_chain(field, torch.randn(B, H, A, generator=gen), cfg, kind, noise_net=net, generator=gen)
    chain = out.extras[EXTRA_CHAIN]
    assert chain.shape == (B, 5, H, A)
    torch.testing.assert_close(chain[:, -1], out.actions)
    logp, ent = chain_log_prob(field, out.extras, cfg, kind, noise_net=net)
    torch.testing.assert_close(logp, out.logp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, out.entropy, rtol=1e-5, atol=1e-5)
    logp.sum().backward()
    assert field.w.grad is not None and float(field.w.grad.abs().sum()) > 0
    if kind is SamplerKind.FLOW_NOISE:
        assert all(p.grad is not None and float(p.grad.abs().sum()) > 0 for p in net.parameters())


def test_one_step_mode_has_exactly_one_stochastic_step_per_row() -> None:
    field = LinearField()
    cfg = _cfg(kind=SamplerKind.FLOW_SDE, sde_mode=SdeMode.ONE_STEP)
    with torch.no_grad():
        out = sample_chain(field, torch.randn(64, H, A), cfg, SamplerKind.FLOW_SDE)
        step = out.extras[EXTRA_STEP]
        chain = out.extras[EXTRA_CHAIN]
        times, delta = uniform_schedule(4)
        for k, t in enumerate(times):
            euler = chain[:, k] - delta * field(chain[:, k], torch.full((64,), t)).velocity
            deterministic = (chain[:, k + 1] - euler).abs().amax((1, 2)) < 1e-6
            assert torch.equal(deterministic, step != k)
    assert set(step.tolist()) == {0, 1, 2, 3}  # 64 rows cover all 4 steps


def test_full_chain_log_prob_is_the_mean_of_transition_densities() -> None:
    field = LinearField()
    cfg = _cfg(kind=SamplerKind.FLOW_SDE, sde_mode=SdeMode.FULL_CHAIN, noise_level=0.7)
    with torch.no_grad():
        out = sample_chain(field, torch.randn(B, H, A), cfg, SamplerKind.FLOW_SDE)
        chain = out.extras[EXTRA_CHAIN]
        total = torch.zeros(B, H, A)
        times, delta = uniform_schedule(4)
        for k, t in enumerate(times):
            mean, std = flow_sde_step(chain[:, k], field(chain[:, k], torch.full((B,), t)).velocity, t, delta, 0.7)
            total += torch.distributions.Normal(mean, std.expand_as(mean)).log_prob(chain[:, k + 1])
    torch.testing.assert_close(out.logp, total / 4, rtol=1e-5, atol=1e-5)


def test_flow_noise_std_is_bounded_and_log_prob_includes_the_initial_noise() -> None:
    field = LinearField()
    cfg = _cfg(kind=SamplerKind.FLOW_NOISE)
    net = NoiseNet(D, A, 8, 0.08, 0.16)
    big = net(torch.randn(50, H, D) * 100).detach()
    assert float(big.min()) >= 0.08 - 1e-6 and float(big.max()) <= 0.16 + 1e-6
    with torch.no_grad():
        out = sample_chain(field, torch.randn(B, H, A), cfg, SamplerKind.FLOW_NOISE, noise_net=net)
        chain = out.extras[EXTRA_CHAIN]
        total = torch.distributions.Normal(0.0, 1.0).log_prob(chain[:, 0])
        times, delta = uniform_schedule(4)
        for k, t in enumerate(times):
            o = field(chain[:, k], torch.full((B,), t))
            mean = chain[:, k] - delta * o.velocity
            total += torch.distributions.Normal(mean, net(o.features)).log_prob(chain[:, k + 1])
    torch.testing.assert_close(out.logp, total / 5, rtol=1e-5, atol=1e-5)


def test_masked_dims_are_deterministic_and_add_no_log_prob() -> None:
    field = LinearField()
    mask = torch.tensor([1.0, 1.0, 0.0, 0.0])
    for kind, mode in ((SamplerKind.FLOW_SDE, SdeMode.FULL_CHAIN), (SamplerKind.FLOW_NOISE, SdeMode.ONE_STEP)):
        cfg = _cfg(kind=kind, sde_mode=mode)
        net = NoiseNet(D, A, 8, 0.08, 0.16)
        with torch.no_grad():
            out = sample_chain(field, torch.randn(B, H, A), cfg, kind, noise_net=net, dim_mask=mask)
        assert float(out.logp[..., 2:].abs().max()) == 0.0 and float(out.logp[..., :2].abs().min()) > 0
        assert float(out.entropy[..., 2:].abs().max()) == 0.0


def test_missing_extras_and_wrong_chain_length_raise_helpful_errors() -> None:
    field = LinearField()
    cfg = _cfg(kind=SamplerKind.FLOW_SDE, sde_mode=SdeMode.ONE_STEP)
    with pytest.raises(KeyError, match="flow.step"):
        chain_log_prob(field, {EXTRA_CHAIN: torch.zeros(B, 5, H, A)}, cfg, SamplerKind.FLOW_SDE)
    with pytest.raises(ValueError, match=r"K\+1=5"):
        chain_log_prob(field, {EXTRA_CHAIN: torch.zeros(B, 3, H, A), EXTRA_STEP: torch.zeros(B)}, cfg,
                       SamplerKind.FLOW_SDE)
    with pytest.raises(ValueError, match="NoiseNet"):
        sample_chain(field, torch.zeros(B, H, A), _cfg(kind=SamplerKind.FLOW_NOISE), SamplerKind.FLOW_NOISE)


def test_sampler_config_validates() -> None:
    with pytest.raises(ValueError, match="num_steps"):
        SamplerConfig(num_steps=0)
    with pytest.raises(ValueError, match="noise_min_std"):
        SamplerConfig(noise_min_std=0.2, noise_max_std=0.1)
    assert SamplerConfig(kind="flow_noise").kind is SamplerKind.FLOW_NOISE  # type: ignore[arg-type]
    assert math.isclose(SamplerConfig().noise_level, 0.5)
