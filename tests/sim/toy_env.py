"""A tiny deterministic SingleEnv for testing the vectorization layer itself."""

from __future__ import annotations

import numpy as np
import torch

from sim.core import OBS_STATE, EnvSpec, TensorSpec, image_key
from sim.single import SingleEnv, StepOut


class CounterEnv(SingleEnv):
    """State = [position, steps]; the action adds to position; success when position >= goal."""

    def __init__(self, episode_steps: int = 5, goal: float = 2.0, fail_at: int = -1, extra_term: str = "",
                 signals: bool = False) -> None:
        self.spec = EnvSpec(
            env_id="toy/counter",
            observation={OBS_STATE: TensorSpec((2,), torch.float32), image_key("cam"): TensorSpec((4, 4, 3), torch.uint8)},
            action=TensorSpec((1,), torch.float32, -1.0, 1.0),
            max_episode_steps=episode_steps,
            control_freq=10.0,
            cameras=("cam",),
        )
        self.goal, self.fail_at, self.extra_term, self.signals = goal, fail_at, extra_term, signals
        self.rng = np.random.default_rng(0)
        self.pos, self.t = 0.0, 0

    def _obs(self) -> dict[str, np.ndarray]:
        img = np.full((4, 4, 3), int(self.pos * 10) % 256, dtype=np.uint8)
        return {OBS_STATE: np.array([self.pos, self.t], dtype=np.float32), image_key("cam"): img}

    def reset(self, seed):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.pos, self.t = float(self.rng.integers(0, 3)) / 10, 0
        return self._obs(), f"count to {self.goal}"

    def step(self, action):
        if self.t == self.fail_at:
            raise RuntimeError("simulated crash")
        self.pos += float(action[0])
        self.t += 1
        success = self.pos >= self.goal
        terms = {"success": float(success)}
        if self.extra_term:  # an extra named term (tests envs that report different term names)
            terms[self.extra_term] = self.pos
        signals = {"pos": self.pos, "t": float(self.t)} if self.signals else None  # privileged scalars
        return StepOut(self._obs(), float(success), success, self.t >= self.spec.max_episode_steps, success, terms,
                       signals)

    def expert_action(self):
        return np.array([1.0], dtype=np.float32)


class TwoGoalEnv(SingleEnv):
    """A two-task bandit: ``go right`` succeeds when position + action >= 0.5, ``go left`` when <= -0.5, one step
    per episode; the task is drawn at reset. Reports ``achieved_task`` (1 + the index of the other task when the
    step accomplished it, else 0) as the tabletop's multi-task envs do."""

    TASKS = ("left", "right")
    INSTRUCTIONS = ("go left", "go right")

    def __init__(self) -> None:
        self.spec = EnvSpec(
            env_id="toy/two-goal", observation={OBS_STATE: TensorSpec((2,), torch.float32)},
            action=TensorSpec((1,), torch.float32, -1.0, 1.0), max_episode_steps=1, control_freq=10.0,
            tasks=self.TASKS, instructions=self.INSTRUCTIONS,
        )
        self.rng = np.random.default_rng(0)
        self.pos, self.task = 0.0, 0

    def _obs(self) -> dict[str, np.ndarray]:
        return {OBS_STATE: np.array([self.pos, 2 * self.task - 1], dtype=np.float32)}

    def reset(self, seed):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.pos, self.task = float(self.rng.uniform(-0.1, 0.1)), int(self.rng.integers(0, 2))
        return self._obs(), self.INSTRUCTIONS[self.task]

    def step(self, action):
        self.pos += float(action[0])
        reached = [self.pos <= -0.5, self.pos >= 0.5]
        success = reached[self.task]
        other = 1 - self.task
        signals = {"achieved_task": float(other + 1) if reached[other] else 0.0}
        return StepOut(self._obs(), float(success), success, True, success, {"success": float(success)}, signals)

    def expert_action(self):
        return np.array([1.0 if self.task else -1.0], dtype=np.float32)
