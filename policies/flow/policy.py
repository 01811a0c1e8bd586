"""``FlowPolicy``: the RL interface (act / evaluate / value) shared by every flow VLA.

A subclass owns its model and implements :meth:`FlowPolicy.encode`: validate
and encode an observation batch once (image + language prefix, KV cache...) and
return a :class:`FlowContext` whose velocity function runs one action-expert
pass. Everything RL-specific (samplers, log-probs at the configured level,
value head placement, Flow-Noise net, latent-noise actor) lives here, identical
for the compact policy and the LeRobot adapters.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from policies.base import ActMode, ActOutput, LogProbLevel, Policy, reduce_logp
from policies.io import OBS_ENV_STATE, OBS_STATE, CheckpointError, ObservationError
from policies.flow.latent import EXTRA_LATENT, LatentNoiseActor, latent_noise_log_prob
from policies.flow.sampler import (
    InitialNoise,
    NoiseNet,
    SamplerConfig,
    SamplerKind,
    VelocityFn,
    chain_log_prob,
    sample_chain,
)
from policies.flow.value import StateValueHead, ValueHead, ValuePlacement, mean_pool_tokens


NOISE_NET = "noise_net"
LATENT_ACTOR = "latent_actor"
SAMPLER_HEADS = (f"{NOISE_NET}.", f"{LATENT_ACTOR}.")
"""State-dict prefixes of the sampler heads built on first use: a checkpoint saved before its sampler was switched
lacks them, and loading it with the new sampler starts them fresh (the Flow-Noise net, the latent-noise actor)."""


@dataclass
class FlowContext:
    """An encoded observation batch.

    Attributes:
        velocity: the velocity function for these observations.
        batch_size: B.
        prefix_features: ``[B, N, D_prefix]`` prefix (image + language) features, or None.
        prefix_mask: ``[B, N]`` bool, valid prefix tokens (None: all valid).
        critic_state: ``[B, D]`` ``[observation.state, observation.env_state]`` for the ``state`` critic
            (filled in by :class:`FlowPolicy`, not by ``encode``).
        state: ``[B, S]`` the robot state as the model reads it (normalized), or None; with the pooled prefix
            it conditions the latent-noise actor.
    """

    velocity: VelocityFn
    batch_size: int
    prefix_features: Tensor | None = None
    prefix_mask: Tensor | None = None
    critic_state: Tensor | None = None
    state: Tensor | None = None


@dataclass(frozen=True)
class FlowHeadDims:
    """Sizes the shared heads need from the model.

    Attributes:
        expert_dim: D of the action-expert features.
        prefix_dim: D of the prefix features.
        model_action_dim: action dims the model denoises (may include padding).
        action_dim: the env's action dims A (the first A model dims).
        horizon: H, the chunk length the model denoises.
        value_hidden: hidden width of the value head.
        noise_hidden: hidden width of the Flow-Noise net.
        critic_state_dim: size of ``[observation.state, observation.env_state]`` (the ``state`` critic's input).
        state_dim: S of :attr:`FlowContext.state` (the latent-noise actor's state input; 0: none).
    """

    expert_dim: int
    prefix_dim: int
    model_action_dim: int
    action_dim: int
    horizon: int
    value_hidden: int = 128
    noise_hidden: int = 128
    critic_state_dim: int = 0
    state_dim: int = 0


class FlowPolicy(Policy):
    """Base class of flow-matching policies (see module doc).

    Args:
        sampler: sampler settings for ``act(mode=EXPLORE)``.
        logp_level: granularity of returned log-probs.
        value_placement: where the critic reads its features.
        dims: model sizes for the shared heads.
    """

    def __init__(
        self,
        sampler: SamplerConfig,
        logp_level: LogProbLevel,
        value_placement: ValuePlacement,
        dims: FlowHeadDims,
    ) -> None:
        super().__init__()
        if dims.action_dim > dims.model_action_dim:
            raise ValueError(f"action_dim {dims.action_dim} exceeds the model's {dims.model_action_dim} action dims")
        self.dims = dims
        self.logp_level = LogProbLevel(logp_level)
        self.value_placement = ValuePlacement(value_placement)
        self.sampler = sampler
        self.noise_net: NoiseNet | None = None
        self.latent_actor: LatentNoiseActor | None = None
        self.value_head: ValueHead | StateValueHead | None = None
        if self.value_placement is ValuePlacement.STATE:
            if dims.critic_state_dim < 1:
                raise ValueError(
                    f"{type(self).__name__}: value_placement 'state' needs the size of observation.state + "
                    "observation.env_state (critic_state_dim, set from an env that provides observation.env_state)"
                )
            self.value_head = StateValueHead(dims.critic_state_dim, dims.value_hidden)
        elif self.value_placement is not ValuePlacement.NONE:
            feat = dims.expert_dim if self.value_placement is ValuePlacement.EXPERT else dims.prefix_dim
            self.value_head = ValueHead(feat, dims.value_hidden)
        mask = torch.zeros(dims.model_action_dim)
        mask[: dims.action_dim] = 1.0
        self.register_buffer("action_dim_mask", mask, persistent=False)
        self.configure_sampler(sampler)

    # -- to implement -------------------------------------------------------------------------
    @abc.abstractmethod
    def encode(self, obs: dict[str, Any]) -> FlowContext:
        """Validate ``obs`` (raising errors that name expected keys and shapes) and encode it."""

    @abc.abstractmethod
    def actions_to_env(self, actions: Tensor) -> Tensor:
        """Map model-space actions ``[B, H, A]`` (first A dims) to the env's action space."""

    # -- shared -------------------------------------------------------------------------------
    @property
    def chunk_size(self) -> int:
        """H, the number of actions one ``act`` call returns per env."""
        return self.dims.horizon

    @property
    def device(self) -> torch.device:
        """Device of the policy's parameters."""
        return next(self.parameters()).device

    def configure_sampler(
        self, sampler: SamplerConfig, build_noise_net: bool = False, build_latent_actor: bool = False
    ) -> None:
        """Switch the exploration sampler.

        The Flow-Noise std net is built on first use of ``FLOW_NOISE`` (or when
        ``build_noise_net``, e.g. to load a checkpoint that has one) and kept afterwards;
        its std bounds follow ``sampler``. Likewise the latent-noise actor on first use of
        ``LATENT_NOISE`` (or when ``build_latent_actor``); its mean bound follows ``sampler``.
        Build the policy with the sampler you train with, so that an optimizer created
        afterwards sees the new head's parameters.
        """
        self.sampler = replace(sampler)
        ref = next((p for p in self.parameters() if p is not None), None)
        d = self.dims
        if (build_noise_net or self.sampler.kind is SamplerKind.FLOW_NOISE) and self.noise_net is None:
            self.noise_net = NoiseNet(
                d.expert_dim, d.model_action_dim, d.noise_hidden, self.sampler.noise_min_std, self.sampler.noise_max_std
            )
            if ref is not None:
                self.noise_net.to(ref.device)
        if self.noise_net is not None:
            self.noise_net.set_bounds(self.sampler.noise_min_std, self.sampler.noise_max_std)
        if (build_latent_actor or self.sampler.kind is SamplerKind.LATENT_NOISE) and self.latent_actor is None:
            s = self.sampler
            self.latent_actor = LatentNoiseActor(
                d.prefix_dim, d.state_dim, d.horizon, d.model_action_dim, s.latent_hidden, s.latent_bound,
                s.latent_std_init,
            )
            if ref is not None:
                self.latent_actor.to(ref.device)
        if self.latent_actor is not None:
            self.latent_actor.set_bound(self.sampler.latent_bound)

    def build_saved_sampler_heads(self, tensors: Mapping[str, Tensor], where: str) -> None:
        """Build the sampler heads that checkpoint ``tensors`` hold, so that they load (call before loading).

        Raises:
            CheckpointError: naming ``sampler.latent_hidden`` when the saved latent actor has another width.
        """
        width = tensors.get(f"{LATENT_ACTOR}.net.0.weight")
        if width is not None and width.shape[0] != self.sampler.latent_hidden:
            raise CheckpointError(
                f"{where}: the saved latent-noise actor is {width.shape[0]} wide but sampler.latent_hidden is "
                f"{self.sampler.latent_hidden}; pass the checkpoint's latent_hidden"
            )
        self.configure_sampler(
            self.sampler, build_noise_net=any(k.startswith(f"{NOISE_NET}.") for k in tensors),
            build_latent_actor=width is not None,
        )

    def actor_parameters(self) -> list[torch.nn.Parameter]:
        """Parameters trained by the policy loss.

        With the ``latent_noise`` sampler only the latent-noise actor's: the flow model is frozen (DSRL).
        Otherwise every trainable parameter that is not the critic's (or the unused latent actor's).
        """
        if self.sampler.kind is SamplerKind.LATENT_NOISE:
            assert self.latent_actor is not None  # built by configure_sampler
            return [p for p in self.latent_actor.parameters() if p.requires_grad]
        skip = {id(p) for p in self.critic_parameters()}
        if self.latent_actor is not None:
            skip |= {id(p) for p in self.latent_actor.parameters()}
        return [p for p in self.parameters() if p.requires_grad and id(p) not in skip]

    def _zero_chunk(self, batch: int) -> Tensor:
        """Zeros shaped like one chunk sample ``[B, H, A_model]`` on the policy's device."""
        return torch.zeros(batch, self.dims.horizon, self.dims.model_action_dim, device=self.device)

    def _noise(self, batch: int, generator: torch.Generator | None) -> Tensor:
        shape = (batch, self.dims.horizon, self.dims.model_action_dim)
        return torch.randn(shape, generator=generator, dtype=torch.float32).to(self.device)

    def _context(self, obs: dict[str, Any]) -> FlowContext:
        ctx = self.encode(obs)
        if self.value_placement is ValuePlacement.STATE:
            ctx.critic_state = self._critic_state(obs)
        return ctx

    def _critic_state(self, obs: dict[str, Any]) -> Tensor:
        """``[observation.state, observation.env_state]`` ``[B, D]`` for the privileged critic."""
        missing = [k for k in (OBS_STATE, OBS_ENV_STATE) if k not in obs]
        if missing:
            raise ObservationError(
                f"{type(self).__name__}: value_placement 'state' reads {missing} from the observation; this env "
                "does not provide it (use value_placement 'expert' or 'prefix')"
            )
        x = torch.cat([obs[OBS_STATE].float(), obs[OBS_ENV_STATE].float()], dim=-1).to(self.device)
        if x.ndim != 2 or x.shape[1] != self.dims.critic_state_dim:
            raise ObservationError(
                f"{type(self).__name__}: observation.state + observation.env_state should be "
                f"[B, {self.dims.critic_state_dim}] for the state critic, got {list(x.shape)}"
            )
        return x

    def _value(self, ctx: FlowContext) -> Tensor | None:
        if self.value_head is None:
            return None
        return self.value_head(self._value_input(ctx))

    def _value_input(self, ctx: FlowContext) -> Tensor:
        """What the value head reads for the configured placement, ``[B, D]``."""
        if self.value_placement is ValuePlacement.STATE:
            if ctx.critic_state is None:
                raise ValueError(f"{type(self).__name__}: value placement 'state' needs the critic state")
            return ctx.critic_state
        if self.value_placement is ValuePlacement.PREFIX:
            return self._pooled_prefix(ctx, "value placement 'prefix'")
        x = self._zero_chunk(ctx.batch_size)
        t = torch.ones(ctx.batch_size, device=self.device)
        features = ctx.velocity(x, t).features
        if features is None:
            raise ValueError(f"{type(self).__name__}: value placement 'expert' needs action-expert features")
        return features.float().mean(1)

    def _pooled_prefix(self, ctx: FlowContext, reader: str) -> Tensor:
        """The masked mean of the prefix features ``[B, D_prefix]``; ``reader`` names who needs it in errors."""
        if ctx.prefix_features is None:
            raise ValueError(f"{type(self).__name__}: {reader} needs prefix features")
        return mean_pool_tokens(ctx.prefix_features, ctx.prefix_mask)

    def _latent(self, ctx: FlowContext) -> tuple[Tensor, Tensor]:
        """The latent-noise actor's ``(mean [B, H, A_model], std [H, A_model])`` for encoded observations."""
        assert self.latent_actor is not None  # built by configure_sampler
        cond = self._pooled_prefix(ctx, "the latent_noise sampler").detach()
        state = None if ctx.state is None else ctx.state.detach()
        return self.latent_actor(cond, state)

    def _reduce(self, elementwise: Tensor) -> Tensor:
        return reduce_logp(elementwise[..., : self.dims.action_dim], self.logp_level)

    def act(
        self,
        obs: dict[str, Any],
        mode: ActMode = ActMode.EXPLORE,
        generator: torch.Generator | None = None,
        noise: Tensor | None = None,
    ) -> ActOutput:
        """Sample an action chunk.

        ``EVAL`` runs the pure ODE (logp zeros, no extras, no value: evaluation needs none, and the
        expert-placed critic would cost one more expert pass); ``EXPLORE`` runs the configured sampler and
        returns extras that :meth:`evaluate` re-scores.

        Args:
            obs: observation batch (see :mod:`policies.io`).
            mode: ``ActMode.EVAL`` or ``ActMode.EXPLORE``.
            generator: optional RNG for the initial noise and the sampler.
            noise: optional initial sample ``x_1 [B, H, A_model]`` (default: drawn from ``N(0, I)``, or
                zeros where ``sampler.eval_noise`` (``EVAL``) or ``sampler.explore_noise`` (``EXPLORE``) is
                ``zero``); lets a caller steer a frozen policy through its noise (latent-noise RL) or compare
                against a reference sampler.

        Returns:
            ``ActOutput(actions [B, H, A] env space, logp at logp_level, value [B] (None in ``EVAL`` mode or
            without a critic), extras)``.
        """
        mode = ActMode(mode)
        kind = SamplerKind.ODE if mode is ActMode.EVAL else self.sampler.kind
        if self.sampler.kind is SamplerKind.LATENT_NOISE:
            return self._act_latent(obs, mode, generator, noise)
        with torch.no_grad():
            ctx = self._context(obs)
            start = self.sampler.eval_noise if mode is ActMode.EVAL else self.sampler.explore_noise
            if noise is None and start is InitialNoise.ZERO:
                noise = self._zero_chunk(ctx.batch_size)
            elif noise is None:
                noise = self._noise(ctx.batch_size, generator)
            self._check_noise(noise, ctx)
            sample = sample_chain(
                ctx.velocity,
                noise.to(self.device, torch.float32),
                self.sampler,
                kind,
                noise_net=self.noise_net,
                dim_mask=self.action_dim_mask,
                generator=generator,
            )
            value = None if mode is ActMode.EVAL else self._value(ctx)  # evaluation reads no value: skip the pass
            actions = self.actions_to_env(sample.actions[..., : self.dims.action_dim])
        return ActOutput(actions=actions, logp=self._reduce(sample.logp), value=value, extras=sample.extras)

    def _check_noise(self, noise: Tensor, ctx: FlowContext) -> None:
        want = (ctx.batch_size, self.dims.horizon, self.dims.model_action_dim)
        if tuple(noise.shape) != want:
            raise ValueError(f"noise must be [B, H, A_model] = {list(want)}, got {list(noise.shape)}")

    def _act_latent(
        self, obs: dict[str, Any], mode: ActMode, generator: torch.Generator | None, noise: Tensor | None
    ) -> ActOutput:
        """``act`` with the latent-noise sampler: ``x_1`` from the noise actor, then the frozen model's ODE.

        ``EXPLORE`` draws ``x_1 = mean + std * eps`` with ``eps`` the ``noise`` argument or ``N(0, I)`` (drawn
        as the other samplers draw ``x_1``, so at the actor's start it is the same sample); ``EVAL`` takes
        ``x_1 = mean``.
        """
        with torch.no_grad():
            ctx = self._context(obs)
            mean, std = self._latent(ctx)
            if mode is ActMode.EVAL:
                if noise is not None:
                    raise ValueError("act(EVAL) with the latent_noise sampler starts from the noise actor's mean; "
                                     "it takes no noise")
                x1 = mean
            else:
                eps = self._noise(ctx.batch_size, generator) if noise is None else noise
                self._check_noise(eps, ctx)
                x1 = mean + std * eps.to(self.device, torch.float32)
            sample = sample_chain(ctx.velocity, x1, self.sampler, SamplerKind.ODE, dim_mask=self.action_dim_mask)
            actions = self.actions_to_env(sample.actions[..., : self.dims.action_dim])
            if mode is ActMode.EVAL:
                return ActOutput(actions=actions, logp=self._reduce(sample.logp), value=None, extras={})
            logp, _ = latent_noise_log_prob(x1, mean, std, self.action_dim_mask)
            value = self._value(ctx)
        return ActOutput(actions=actions, logp=self._reduce(logp), value=value, extras={EXTRA_LATENT: x1})

    def evaluate(
        self, obs: dict[str, Any], extras: dict[str, Tensor]
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """Differentiably re-score the chain recorded in ``extras`` by :meth:`act`.

        Returns:
            ``(logp, entropy, value)``: logp and entropy at ``logp_level``, value ``[B]`` or None.

        Raises:
            KeyError: naming missing extras keys; ValueError for a mismatched chain.
        """
        if self.sampler.kind is SamplerKind.LATENT_NOISE:
            return self._evaluate_latent(obs, extras)
        ctx = self._context(obs)
        if self.sampler.kind is SamplerKind.ODE:
            zeros = self._zero_chunk(ctx.batch_size)
            return self._reduce(zeros), self._reduce(zeros), self._value(ctx)
        extras = {k: v.to(self.device) for k, v in extras.items()}
        logp, entropy = chain_log_prob(
            ctx.velocity, extras, self.sampler, self.sampler.kind, noise_net=self.noise_net,
            dim_mask=self.action_dim_mask,
        )
        return self._reduce(logp), self._reduce(entropy), self._value(ctx)

    def _evaluate_latent(
        self, obs: dict[str, Any], extras: dict[str, Tensor]
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """Re-score ``x_1``: the frozen flow model runs without gradient; the latent actor and critic get one."""
        if EXTRA_LATENT not in extras:
            raise KeyError(f"extras lack {EXTRA_LATENT!r} (the latent_noise sampler's x_1); got keys {sorted(extras)}. "
                           "Pass the extras returned by act(mode=EXPLORE) with the same sampler.")
        with torch.no_grad():
            ctx = self._context(obs)
            value_in = None if self.value_head is None else self._value_input(ctx)
        x1 = extras[EXTRA_LATENT].to(self.device, torch.float32)
        self._check_noise(x1, ctx)
        mean, std = self._latent(ctx)
        logp, entropy = latent_noise_log_prob(x1, mean, std, self.action_dim_mask)
        value = None if value_in is None else self.value_head(value_in)
        return self._reduce(logp), self._reduce(entropy), value

    def value(self, obs: dict[str, Any]) -> Tensor:
        """Critic estimate ``[B]``.

        Raises:
            NotImplementedError: if the policy was built with ``value_placement='none'``.
        """
        if self.value_head is None:
            raise NotImplementedError(f"{type(self).__name__} was built without a value head (value_placement=none)")
        if self.value_placement is ValuePlacement.STATE:  # the images are not needed
            return self.value_head(self._critic_state(obs))
        return self._value(self.encode(obs))
