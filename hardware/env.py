"""A robot as a one-env :class:`sim.core.VecEnv`, for code written against the sim contract.

``RobotEnv`` lets the rollout engine, evaluation or intervention collection
drive a real arm exactly as they drive a simulator: ``reset()`` returns the
observation dict, ``step(actions [1, A])`` sends one joint-target action
through the safety envelope (and the watchdog), waits for the next control
tick, and returns the next observation. Rewards are 0 and ``success`` is
False (a real arm has no reward oracle); an episode ends by truncation after
``max_episode_steps`` or when the safety layer stops the robot, which also
sets ``info["safety_stop"]`` with the reason. Ended episodes "auto-reset"
by re-referencing the envelope at the arm's pose (nothing moves the scene).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from hardware.adapter import RobotAdapter, RobotObservation
from hardware.guard import GuardedRobot
from hardware.safety import SafetyConfig, SafetyEnvelope, Violation
from hardware.timing import LoopTimer
from hardware.watchdog import Watchdog, WatchState
from sim.core import EnvError, Obs, VecEnv

log = logging.getLogger(__name__)


class RobotEnv(VecEnv):
    """See the module docstring.

    Args:
        robot: a connected adapter.
        control_hz: step rate (``step`` returns at the next tick).
        max_episode_steps: truncation length.
        task: the instruction in ``obs["task"]``.
        safety: envelope and watchdog settings.
        dry_run: never hand commands to the robot.
    """

    def __init__(
        self,
        robot: RobotAdapter,
        control_hz: float,
        max_episode_steps: int,
        task: str = "",
        safety: SafetyConfig | None = None,
        dry_run: bool = False,
    ) -> None:
        self.robot = robot
        self.num_envs = 1
        self.spec = robot.spec(control_hz, max_episode_steps)
        self.safety = safety or SafetyConfig()
        dt = 1.0 / control_hz
        envelope = SafetyEnvelope.from_config(self.safety, robot.joint_names, dt, robot.default_limits())
        self.guard = GuardedRobot(robot, envelope, dt, dry_run)
        s = self.safety
        self.watchdog = Watchdog(s.obs_timeout_s, s.camera_timeout_s, s.policy_timeout_s, s.hold_s)
        self.timer = LoopTimer(dt)
        self._instructions = [task]
        self._step = 0
        self._return = 0.0
        self._closed = False

    def _observe(self) -> RobotObservation:
        return self.robot.observe()

    def _begin_episode(self) -> RobotObservation:
        deadline = time.monotonic() + max(1.0, 4 * self.safety.obs_timeout_s)
        obs = self._observe()
        while obs.state_age() > self.safety.obs_timeout_s:
            if time.monotonic() > deadline:
                raise EnvError(f"{self.spec.env_id}: no fresh observation (joint state {obs.state_age():.3f} s old)")
            time.sleep(0.005)
            obs = self._observe()
        self.guard.start(obs.position)
        self.watchdog.reset()
        self.timer.start()
        self._step, self._return = 0, 0.0
        return obs

    def reset(self, seed: int | None = None, env_ids: Sequence[int] | torch.Tensor | None = None) -> Obs:
        """Start an episode at the arm's current pose; ``seed`` is ignored (the world is not seedable)."""
        obs = self._begin_episode()
        self._last_obs = obs.to_obs(self._instructions[0])
        return self._last_obs

    def step(self, actions: torch.Tensor) -> tuple[Obs, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        """Send ``actions [1, A]`` (joint targets) through the envelope; return at the next control tick.

        Raises:
            EnvError: for a wrongly shaped action (naming the expected shape).
        """
        action = self.check_actions(actions).numpy().astype(np.float64)
        obs = self._observe()
        now = time.monotonic()
        verdict = self.watchdog.check(now, obs.state_age(now), obs.camera_age(now), 0.0)
        info: dict[str, Any] = {}
        violations: list[Violation] = []
        if verdict.state is WatchState.OK:
            result = self.guard.command(action, self._step, obs.position)
            violations = result.violations
        else:
            self.guard.hold()
            if verdict.state is WatchState.STOP:
                self.guard.envelope.latch_stop(f"watchdog: {verdict.fault}: {verdict.detail}")
        self.timer.wait_next()
        self._step += 1
        nxt = self._observe()
        stop = self.guard.envelope.stop_reason
        truncated = self._step >= self.spec.max_episode_steps or stop is not None
        info["success"] = torch.zeros(1, dtype=torch.bool)
        info["safety_violations"] = violations
        obs_dict = nxt.to_obs(self._instructions[0])
        if truncated:
            info["final_obs"] = obs_dict
            info["episode"] = {
                "return": torch.tensor([self._return]),
                "length": torch.tensor([self._step]),
                "success": torch.zeros(1, dtype=torch.bool),
            }
            if stop is not None:
                info["safety_stop"] = stop
            else:  # auto-reset: a new episode from wherever the arm is
                obs_dict = self._begin_episode().to_obs(self._instructions[0])
        self._last_obs = obs_dict
        return obs_dict, torch.zeros(1), torch.zeros(1, dtype=torch.bool), torch.tensor([truncated]), info

    def still_actions(self) -> np.ndarray:
        """The hold command ``[1, A]`` (the last accepted joint target) as the action of a held step.

        A chunk run on the robot (:meth:`sim.core.VecEnv.step_chunk`, as training and evaluation run
        chunks) holds it there for the rest of a chunk in which its episode ended, through the envelope
        and watchdog like any action; a zero action would be a joint target at zero.
        """
        return self.guard.envelope.hold().astype(np.float32)

    def close(self) -> None:
        """Hold position (if the robot is still there); the adapter stays connected (its owner closes it)."""
        if self._closed:
            return
        self._closed = True
        if self.guard.envelope.reference is not None and self.robot.is_connected:
            try:
                self.guard.hold()
            except Exception as e:  # noqa: BLE001  (the robot may be gone at interpreter exit)
                log.debug("RobotEnv.close: hold failed: %s", e)
