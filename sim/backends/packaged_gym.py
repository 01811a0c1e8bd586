"""Options shared by the backends that wrap packaged gymnasium MuJoCo envs (gym-hil, lerobot-env-so101)."""

from __future__ import annotations

from dataclasses import dataclass

from sim.options import SimOptions

REWARD_TYPES = ("sparse", "dense")


@dataclass
class PackagedGymOptions(SimOptions):
    """End-effector position control only; the package's ``sparse`` or ``dense`` reward.

    Attributes:
        random_block_position: draw the block position at every reset.
        reward_type: the package's ``sparse`` (0/1 on success) or ``dense`` reward.
    """

    random_block_position: bool = True
    reward_type: str = "sparse"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.control_mode not in ("", "ee_delta_pos"):
            raise ValueError(f"control_mode must be 'ee_delta_pos' (or empty), got {self.control_mode!r}")
        if self.reward_type not in REWARD_TYPES:
            raise ValueError(f"reward_type must be one of {REWARD_TYPES}, got {self.reward_type!r}")
