"""Configuration of the Gaussian MLP actor-critic on privileged state (registry name ``gaussian-mlp``)."""

from __future__ import annotations

from dataclasses import dataclass

from policies.base import LogProbLevel


@dataclass
class GaussianMLPConfig:
    """A cleanrl-style Gaussian actor-critic on ``[observation.state, observation.env_state]`` (no camera, no
    language): the ladder's baseline of what our PPO reaches on privileged state, not a VLA."""

    state_dim: int = 8
    """S, the size of ``observation.state`` (filled from the env spec)."""
    env_state_dim: int = 0
    """P, the size of the privileged ``observation.env_state`` (filled from the env spec; must be >= 1: the MLP
    reads it, and on ``mujoco/pick-*`` its last entry is the task index, the only way to know which cube)."""
    action_dim: int = 7
    """A, the env's action size (filled from the env spec)."""
    chunk_size: int = 1
    """H, actions per ``act`` call: the actor outputs ``H x A`` means (1 = cleanrl's one action per step)."""
    hidden: tuple[int, ...] = (256, 256)
    """Hidden widths of the actor MLP and, separately, of the critic MLP."""
    init_log_std: float = -0.5
    """Initial log standard deviation of every action dimension (a learned, state-independent parameter)."""
    normalize_inputs: bool = True
    """SFT fits the input mean / std from the demos' frames (``fit_input_normalization``); false = raw inputs."""
    input_std_min: float = 0.01
    """Floor of the fitted input std (a dim the demos barely move is scaled at most by its inverse)."""
    actor_out_gain: float = 0.01
    """Orthogonal-init gain of the actor's last layer (cleanrl: 0.01, so the first means sit near 0)."""
    critic_out_gain: float = 1.0
    """Orthogonal-init gain of the critic's last layer (cleanrl: 1.0)."""
    logp_level: LogProbLevel = LogProbLevel.CHUNK
    """Granularity of log-probs: token (per action dim), action, or chunk (the flow policies' default)."""

    def __post_init__(self) -> None:
        self.hidden = tuple(int(h) for h in self.hidden)
        self.logp_level = LogProbLevel(self.logp_level)
        for name in ("state_dim", "action_dim", "chunk_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"gaussian-mlp: {name} must be >= 1, got {getattr(self, name)}")
        if self.env_state_dim < 0:
            raise ValueError(f"gaussian-mlp: env_state_dim must be >= 0, got {self.env_state_dim}")
        if any(h < 1 for h in self.hidden):
            raise ValueError(f"gaussian-mlp: hidden widths must be >= 1, got {self.hidden}")

    @property
    def input_dim(self) -> int:
        """``S + P``, the MLPs' input size."""
        return self.state_dim + self.env_state_dim
