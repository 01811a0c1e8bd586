"""Options every backend accepts; backends subclass :class:`SimOptions` to add their own."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SimOptions:
    """Backend options common to every simulator.

    Attributes:
        obs_mode: ``rgb`` (cameras + proprioception) or ``state`` (proprioception
            and privileged state only, no rendering).
        image_size: camera height and width in pixels; 0 picks the backend's default.
        max_episode_steps: steps before truncation; 0 keeps the task's default.
        num_workers: worker processes; -1 picks the backend's default, 0 steps
            every env in this process.
        control_mode: the backend's controller name; empty keeps the backend's
            default (end-effector delta pose).
        spin_wait: with worker processes, busy-poll (yielding) for replies and
            commands instead of sleeping at once: ``on``, ``off``, or ``auto`` =
            when the workers and this process fit the usable CPUs (see
            :class:`sim.vector_process.ProcessVecEnv`).
        executor: what runs the workers: ``process`` (worker processes on this machine) or ``ray`` (Ray
            actors, local or on a cluster started with ``ray start``; :mod:`sim.vector_ray`).
    """

    obs_mode: str = "rgb"
    image_size: int = 0
    max_episode_steps: int = 0
    num_workers: int = -1
    control_mode: str = ""
    spin_wait: str = "auto"
    executor: str = "process"

    def __post_init__(self) -> None:
        if self.obs_mode not in ("rgb", "state"):
            raise ValueError(f"obs_mode must be 'rgb' or 'state', got {self.obs_mode!r}")
        if self.image_size < 0:
            raise ValueError(f"image_size must be >= 0, got {self.image_size}")
        if self.max_episode_steps < 0:
            raise ValueError(f"max_episode_steps must be >= 0, got {self.max_episode_steps}")
        if self.spin_wait not in ("auto", "on", "off"):
            raise ValueError(f"spin_wait must be 'auto', 'on' or 'off', got {self.spin_wait!r}")
        if self.executor not in ("process", "ray"):
            raise ValueError(f"executor must be 'process' or 'ray', got {self.executor!r}")

    @property
    def spin(self) -> bool | None:
        """``spin_wait`` as :class:`sim.vector_process.ProcessVecEnv` takes it (None = auto)."""
        return None if self.spin_wait == "auto" else self.spin_wait == "on"
