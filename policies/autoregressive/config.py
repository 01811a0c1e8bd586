"""Configuration of the OpenVLA-style autoregressive policy."""

from __future__ import annotations

from dataclasses import dataclass, field

from policies.autoregressive.local_vlm import TinyVLMConfig
from policies.base import LogProbLevel


@dataclass(frozen=True)
class AutoregressiveVLAConfig:
    """An OpenVLA-style policy: a VLM emits ``H * A`` action tokens per env step.

    Validation raises ``ValueError`` naming the field; nothing is rewritten.
    """

    backbone: str = "tiny-llava"
    """``"tiny-llava"`` (a random tiny LLaVA with a local tokenizer, built offline), a checkpoint
    folder, or a hub id whose files are cached (``openvla/openvla-7b`` with ``trust_remote_code``)."""
    trust_remote_code: bool = False
    """Allow the checkpoint's own model code (required for OpenVLA)."""
    dtype: str = "float32"
    """Weight dtype of the backbone (float32, bfloat16, float16); the value head stays float32."""
    tiny: TinyVLMConfig = field(default_factory=TinyVLMConfig)
    """Sizes of the tiny backbone (used only when ``backbone = "tiny-llava"``)."""
    cameras: tuple[str, ...] = ("front",)
    """Cameras read from ``observation.images.<camera>``, in prompt order (OpenVLA: exactly one)."""
    image_size: tuple[int, int] = (64, 64)
    """Expected env image ``(H, W)``; other sizes are rejected (the backbone resizes to its own input)."""
    action_dim: int = 7
    """A, action dimensions per env step."""
    chunk_size: int = 1
    """H, env steps per decision; one turn emits ``H * A`` tokens."""
    state_dim: int = 0
    """S of the stored state statistics (0: none kept; the prompt never reads the state)."""
    max_text_tokens: int = 48
    """Token budget of the prompt text; prompts are left-padded to it (longer ones raise)."""
    lowercase_instruction: bool = False
    """Lower-case instructions before templating (OpenVLA's LIBERO evaluation does)."""
    temperature: float = 1.0
    """Sampling temperature in ``explore`` mode (1.0-1.6 seen in VLA-RL); also applied to log-probs."""
    restrict_to_action_bins: bool = True
    """Log-probs and entropy over the 256 bin ids only (True: the exact sampling distribution) or over
    the whole vocabulary (False: the LM's token probability, lower by the mass on non-action ids).
    Sampling always draws from the bin ids, so every sample decodes to an action."""
    logp_level: LogProbLevel = LogProbLevel.TOKEN
    """Granularity of returned log-probs: TOKEN ``[B, H, A]``, ACTION ``[B, H]``, CHUNK ``[B]``."""
    value_hidden_dim: int = 256
    """Hidden width of the critic MLP on the last prompt token's hidden state."""
    value_stop_gradient: bool = False
    """Detach the critic's input so value loss does not update the shared backbone."""
    unnorm_key: str | None = None
    """Dataset key of the checkpoint's action statistics (OpenVLA ``norm_stats``); None: the only one."""

    def __post_init__(self) -> None:
        checks = {
            "action_dim": self.action_dim >= 1,
            "chunk_size": self.chunk_size >= 1,
            "state_dim": self.state_dim >= 0,
            "max_text_tokens": self.max_text_tokens >= 1,
            "temperature": self.temperature > 0,
            "value_hidden_dim": self.value_hidden_dim >= 1,
            "cameras": len(self.cameras) >= 1 and len(set(self.cameras)) == len(self.cameras),
            "image_size": len(self.image_size) == 2 and min(self.image_size) >= 1,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            values = ", ".join(f"{name}={getattr(self, name)!r}" for name in bad)
            raise ValueError(f"AutoregressiveVLAConfig: invalid {values} (action_dim, chunk_size, "
                             f"max_text_tokens, value_hidden_dim >= 1; temperature > 0; state_dim >= 0; "
                             f"cameras non-empty and distinct; image_size (H, W) positive)")
        object.__setattr__(self, "logp_level", LogProbLevel(self.logp_level))
        object.__setattr__(self, "cameras", tuple(self.cameras))
        object.__setattr__(self, "image_size", tuple(self.image_size))

    @property
    def num_action_tokens(self) -> int:
        """Tokens decoded per turn, ``chunk_size * action_dim``."""
        return self.chunk_size * self.action_dim
