"""``compact-flow``: the default flow-matching VLA, small enough to train and act on a CPU.

Size and speed with the defaults (1 camera 64x64, S=8, A=7, H=8, width 128,
1 prefix + 2 expert layers, FiLM and global conditioning on, K=4 steps,
Flow-SDE one-step; one torch thread, measured with
``benchmarks/policy_latency.py --only compact-flow`` on a 2-core machine):
1.02 M trainable parameters (the frozen 22.7 M MiniLM encoder ships with its
package and is not in the checkpoint); for a batch of 16 envs ``act`` costs
about 20 ms, an RL update step (``evaluate`` + backward + Adam) about 46 ms,
an SFT step about 36 ms.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from policies.compact.config import CompactFlowConfig, TextEncoderKind
from policies.compact.modules import ActionExpert, PrefixEncoder, flow_matching_loss
from policies.compact.text import MINILM_DIM, HashedBagOfWords, MiniLMTextEncoder
from policies.flow.policy import SAMPLER_HEADS, FlowContext, FlowHeadDims, FlowPolicy
from policies.flow.sampler import VelocityOutput
from policies.io import (
    OBS_ENV_STATE,
    OBS_STATE,
    TASK,
    check_observation,
    config_to_dict,
    image_key,
    load_weights,
    read_env_state,
    read_policy_checkpoint,
    write_checkpoint,
)
from policies.registry import POLICIES

NAME = "compact-flow"
_STD_EPS = 1e-6


@POLICIES.register(NAME, config=CompactFlowConfig)
class CompactFlowPolicy(FlowPolicy):
    """Small pi0-layout flow VLA: per-camera CNN + instruction token prefix, transformer action expert.

    Normalization statistics (``state_mean/std``, ``action_mean/std``, identity
    until :meth:`set_normalization` is called) are buffers saved with the weights.

    Args:
        config: the architecture, sampler and critic settings.
    """

    def __init__(self, config: CompactFlowConfig) -> None:
        c = config
        dims = FlowHeadDims(
            expert_dim=c.width, prefix_dim=c.width, model_action_dim=c.action_dim, action_dim=c.action_dim,
            horizon=c.chunk_size, value_hidden=c.value_hidden, noise_hidden=c.noise_hidden,
            critic_state_dim=c.state_dim + c.env_state_dim if c.env_state_dim else 0, state_dim=c.state_dim,
        )
        super().__init__(c.sampler, c.logp_level, c.value_placement, dims)
        if c.actor_env_state and c.env_state_dim < 1:
            raise ValueError(
                f"{NAME}: actor_env_state needs env_state_dim >= 1 (the size of {OBS_ENV_STATE}, set from an env "
                "that provides it, e.g. mujoco/pick-any); this env or config has none"
            )
        self.config = c
        self.minilm: MiniLMTextEncoder | None = None
        self.hashed_text: HashedBagOfWords | None = None
        if c.text_encoder is TextEncoderKind.MINILM:
            self.minilm = MiniLMTextEncoder()
            text_dim = MINILM_DIM
        else:
            self.hashed_text = HashedBagOfWords(c.text_buckets, c.width)
            text_dim = c.width
        self.prefix = PrefixEncoder(
            len(c.cameras), c.cnn_channels, c.image_tokens, text_dim, c.width, c.heads, c.prefix_layers, c.keypoints,
            c.film,
        )
        self.expert = ActionExpert(
            c.state_dim + (c.env_state_dim if c.actor_env_state else 0), c.action_dim, c.chunk_size, c.width,
            c.heads, c.expert_layers, c.global_cond,
        )
        self.register_buffer("state_mean", torch.zeros(c.state_dim))
        self.register_buffer("state_std", torch.ones(c.state_dim))
        self.register_buffer("action_mean", torch.zeros(c.action_dim))
        self.register_buffer("action_std", torch.ones(c.action_dim))
        if c.actor_env_state:  # only then: checkpoints of actors that do not read env_state keep their keys
            self.register_buffer("env_state_mean", torch.zeros(c.env_state_dim))
            self.register_buffer("env_state_std", torch.ones(c.env_state_dim))

    @property
    def reads_env_state(self) -> bool:  # type: ignore[override]
        """True with ``actor_env_state`` (the action expert then reads ``observation.env_state``)."""
        return self.config.actor_env_state

    # -- normalization ------------------------------------------------------------------------
    def set_normalization(self, state_mean: Tensor, state_std: Tensor, action_mean: Tensor, action_std: Tensor) -> None:
        """Set the state / action statistics (shapes ``[S]``, ``[S]``, ``[A]``, ``[A]``).

        Raises:
            ValueError: naming the statistic whose shape is wrong.
        """
        for name, value, n in (
            ("state_mean", state_mean, self.config.state_dim), ("state_std", state_std, self.config.state_dim),
            ("action_mean", action_mean, self.config.action_dim), ("action_std", action_std, self.config.action_dim),
        ):
            value = torch.as_tensor(value, dtype=torch.float32)
            if value.shape != (n,):
                raise ValueError(f"{NAME}: {name} must have shape [{n}], got {list(value.shape)}")
            getattr(self, name).copy_(value)

    def fit_normalization(self, states: Tensor, actions: Tensor) -> None:
        """Set statistics from demo data: ``states [N, S]``, ``actions [N, A]`` (or ``[N, H, A]``)."""
        actions = actions.reshape(-1, actions.shape[-1])
        self.set_normalization(states.mean(0), states.std(0), actions.mean(0), actions.std(0))

    def fit_input_normalization(self, obs: dict[str, Any]) -> None:
        """With ``actor_env_state``: mean / std of the demos' ``observation.env_state`` (std floored at 0.01, so a
        dim the demos barely move is scaled at most 100x). Raw, cube positions centimetres apart are inputs 0.01
        apart, and cloning on privileged state alone stays near 0-10% success."""
        if not self.config.actor_env_state:
            return
        x = self._actor_env_state(obs, len(obs[OBS_ENV_STATE]))
        self.env_state_mean.copy_(x.mean(0))
        self.env_state_std.copy_(x.std(0).clamp_min(0.01))

    def _norm_state(self, state: Tensor) -> Tensor:
        return (state.float().to(self.device) - self.state_mean) / (self.state_std + _STD_EPS)

    def normalize_actions(self, actions: Tensor) -> Tensor:
        """Env-space actions ``[..., A]`` -> model space."""
        return (actions.float().to(self.device) - self.action_mean) / (self.action_std + _STD_EPS)

    def actions_to_env(self, actions: Tensor) -> Tensor:
        """Model-space actions ``[..., A]`` -> env space."""
        return actions * (self.action_std + _STD_EPS) + self.action_mean

    # -- model --------------------------------------------------------------------------------
    def _text(self, tasks: list[str]) -> Tensor:
        if self.minilm is not None:
            return self.minilm(list(tasks), self.device)
        assert self.hashed_text is not None
        return self.hashed_text(list(tasks), self.device)

    def encoder_parameters(self) -> list[torch.nn.Parameter]:
        """The camera CNNs, the prefix transformer and the instruction embedding (the MiniLM encoder is always frozen)."""
        modules = [self.prefix] + ([self.hashed_text] if self.hashed_text is not None else [])
        return [p for m in modules for p in m.parameters()]

    def _actor_env_state(self, obs: dict[str, Any], b: int) -> Tensor:
        """``observation.env_state`` ``[B, P]`` for the actor (``actor_env_state``), before normalization."""
        return read_env_state(obs, b, self.config.env_state_dim, NAME, "use an env that provides it (e.g. "
                              "mujoco/pick-any) or actor_env_state false").to(self.device)

    def encode(self, obs: dict[str, Any]) -> FlowContext:
        """Check ``obs`` and encode its prefix once; the returned velocity function reuses it.

        Raises:
            ObservationError: naming expected keys (``observation.images.<cam>``,
                ``observation.state``, ``task``, with ``actor_env_state`` ``observation.env_state``) and shapes.
        """
        c = self.config
        b = check_observation(obs, c.cameras, c.image_size, c.state_dim, NAME)
        images = [obs[image_key(cam)].to(self.device) for cam in c.cameras]
        prefix = self.prefix(images, self._text(obs[TASK]))
        state = self._norm_state(obs[OBS_STATE])
        if c.actor_env_state:
            env_state = (self._actor_env_state(obs, b) - self.env_state_mean) / (self.env_state_std + _STD_EPS)
            state = torch.cat([state, env_state], dim=-1)
        memory = self.expert.memory(prefix)  # shared by all denoising steps

        def velocity(x_t: Tensor, t: Tensor) -> VelocityOutput:
            v, features = self.expert(state, x_t, t, memory)
            return VelocityOutput(velocity=v, features=features)

        return FlowContext(velocity=velocity, batch_size=b, prefix_features=prefix, state=state)

    def sft_loss(self, obs: dict[str, Any], actions: Tensor, action_mask: Tensor | None = None) -> Tensor:
        """Supervised flow-matching loss on demonstrations (pre-training, SFT).

        Args:
            obs: observation batch of B envs / dataset frames.
            actions: ``[B, H, A]`` demo action chunks in env space.
            action_mask: optional ``[B, H]`` bool, False for padded steps past an episode's end.

        Returns:
            Scalar loss (differentiable).

        Raises:
            ObservationError: for a bad observation; ValueError for a wrong action shape.
        """
        c = self.config
        ctx = self.encode(obs)
        want = (ctx.batch_size, c.chunk_size, c.action_dim)
        if tuple(actions.shape) != want:
            raise ValueError(f"{NAME}: sft actions must be [B, H, A] = {list(want)}, got {list(actions.shape)}")
        target = self.normalize_actions(actions)
        noise = torch.randn_like(target)
        a, b = c.time_beta
        beta = torch.distributions.Beta(torch.tensor(float(a)), torch.tensor(float(b)))
        t = (beta.sample((ctx.batch_size,)) * 0.999 + 0.001).to(self.device)
        x_t = t[:, None, None] * noise + (1.0 - t[:, None, None]) * target
        v = ctx.velocity(x_t, t).velocity
        mask = action_mask.to(self.device) if action_mask is not None else None
        return flow_matching_loss(v, noise, target, mask)

    # -- checkpoints --------------------------------------------------------------------------
    @classmethod
    def from_config(cls, config: CompactFlowConfig) -> CompactFlowPolicy:
        """A fresh, randomly initialized policy (the registry's uniform constructor)."""
        return cls(config)

    def save_pretrained(self, directory: str | Path) -> None:
        """Atomically write ``config.json`` (``"type": "compact-flow"``) and ``model.safetensors``.

        The weights include the normalization statistics and, if built, the
        Flow-Noise net and the latent-noise actor; the frozen MiniLM encoder is not saved (it ships with its package).
        """
        config = replace(self.config, sampler=replace(self.sampler))
        write_checkpoint(directory, config_to_dict(config, NAME), self.state_dict())

    @classmethod
    def from_pretrained(cls, path_or_id: str | Path, **overrides: Any) -> CompactFlowPolicy:
        """Load a folder written by :meth:`save_pretrained`.

        Args:
            path_or_id: the checkpoint folder.
            overrides: config fields to replace (e.g. ``sampler=SamplerConfig(...)``); fields
                that change parameter shapes make loading fail.

        Raises:
            CheckpointError: for a missing file, another policy type, or weights that do not fit.
        """
        config, tensors = read_policy_checkpoint(CompactFlowConfig, path_or_id, NAME, overrides)
        policy = cls(config)
        policy.build_saved_sampler_heads(tensors, str(path_or_id))
        load_weights(policy, tensors, NAME, str(path_or_id), fresh_ok=SAMPLER_HEADS)
        return policy


def build_compact_policy(**config: Any) -> CompactFlowPolicy:
    """Build a fresh ``compact-flow`` policy from keyword config values (see :class:`CompactFlowConfig`)."""
    return CompactFlowPolicy(POLICIES.make_config(NAME, **config))


__all__ = ["CompactFlowConfig", "CompactFlowPolicy", "build_compact_policy"]
