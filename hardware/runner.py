"""The deployment runner: a policy driving a robot at a fixed control rate.

Each tick (``1 / control_hz`` s): read the newest observation, apply operator
events (e-stop, takeover, end of episode), collect finished policy calls into
the chunk scheduler, ask the watchdog, start the next policy call when due,
pick the command (policy chunk, teleop target, or hold) and send it through
the :class:`hardware.guard.GuardedRobot` (the safety envelope). Every tick is
timed; episodes can be recorded to a LeRobotDataset.

Faults and what the runner does:

- stale observation / policy past its deadline: hold position; if the fault
  lasts ``safety.hold_s``, send a last hold and stop the run;
- the envelope latches a stop (a ``stop`` response to a violation): hold and stop the run;
- e-stop: one hold, then nothing is sent until the e-stop is cleared
  (the episode clock keeps running; the run ends if it is still latched at
  the end of the episode);
- the policy raises, or the transport fails: hold (if possible) and stop the run.

Why chunks are executed tick by tick here, not with the chunk runner that
training and evaluation share (:meth:`sim.core.VecEnv.step_chunk`,
:mod:`sim.chunk`): on a real arm each target must pass the watchdog and the
e-stop check at its own tick, and the scheduler may re-plan, blend overlapping
chunks and run inference asynchronously, none of which fits executing a chunk
open-loop. The episode semantics are the same as the chunk runner's
hold-after-done: when an episode ends the arm receives the hold command (its
last accepted target) and the rest of the chunk is dropped (each episode starts
with ``scheduler.reset()`` and ``policy.reset()``), so no action of an old
chunk runs in the next episode. Code that drives a robot through the sim
contract (:class:`hardware.env.RobotEnv`) does use ``step_chunk``, with the
hold command as the held steps' action (``RobotEnv.still_actions``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from hardware.adapter import RobotAdapter, RobotObservation
from hardware.guard import GuardedRobot
from hardware.intervention import OperatorEvents, TeleopSource
from vla_core.labels import Label
from hardware.recording import RobotEpisodeRecorder
from hardware.safety import SafetyConfig, SafetyEnvelope, Violation
from hardware.scheduling import ChunkConfig, ChunkScheduler, PolicyWorker
from hardware.timing import LatencySummary, LoopTimer
from hardware.watchdog import EStop, Watchdog, WatchState
from policies.base import ActMode, Policy

log = logging.getLogger(__name__)


@dataclass
class StepRecord:
    """What happened in one control tick (handed to hooks).

    Attributes:
        episode, step: indices.
        obs: the observation used.
        policy_action: ``[A]`` the scheduler's action for this step (None if starved or not used).
        command: ``[A]`` point 0 of what was sent (None if nothing was sent, e.g. e-stopped).
        held: the command was the hold command.
        modified: the envelope clamped / replaced the requested action.
        intervention: a human (teleop) was in control.
        violations: envelope events of this tick.
        label: the RaC label of the tick (:class:`vla_core.labels.Label`).
    """

    episode: int
    step: int
    obs: RobotObservation
    policy_action: np.ndarray | None
    command: np.ndarray | None
    held: bool
    modified: bool
    intervention: bool
    violations: list[Violation]
    label: int = 0


@dataclass
class EpisodeSummary:
    """How one episode went."""

    index: int
    steps: int
    duration_s: float
    end_reason: str
    success: bool | None
    intervention_steps: int
    saved: bool


class RunnerHook(Protocol):
    """Callbacks for intervention capture (RaC) and custom logging."""

    def on_episode_start(self, episode: int) -> None:
        """Called before the first tick of ``episode``."""

    def on_step(self, record: StepRecord) -> None:
        """Called after each tick's command."""

    def on_episode_end(self, summary: EpisodeSummary) -> None:
        """Called after the episode ended (and was saved or discarded)."""


@dataclass
class DeployReport:
    """The outcome of a deployment run.

    Attributes:
        episodes: per-episode summaries.
        stop_reason: why the run stopped early ("" if it ran all episodes).
        commands_sent, holds_sent: command counts (counted, not sent, in a dry run).
        violations_by_kind: count per violation kind.
        violations: the first 100 violations with their values.
        timing: latency summaries (see :class:`hardware.timing.LoopTimer`).
        overruns: control ticks skipped because the loop fell behind.
        dry_run: no command was handed to the robot.
        dataset_root: where episodes were recorded ("" if not recorded).
    """

    episodes: list[EpisodeSummary] = field(default_factory=list)
    stop_reason: str = ""
    commands_sent: int = 0
    holds_sent: int = 0
    violations_by_kind: dict[str, int] = field(default_factory=dict)
    violations: list[Violation] = field(default_factory=list)
    timing: dict[str, LatencySummary] = field(default_factory=dict)
    overruns: int = 0
    control_hz: float = 0.0
    dry_run: bool = False
    dataset_root: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)


class _StopRun(Exception):
    """Internal: end the run with a reason."""


class DeployRunner:
    """Runs ``policy`` on a connected ``robot``; see the module docstring.

    Args:
        robot: a connected adapter.
        policy: any :class:`policies.base.Policy` whose actions are joint targets in ``robot``'s order.
        control_hz: control rate.
        episode_s: episode length in seconds.
        num_episodes: episodes to run.
        task: the language instruction handed to the policy.
        safety, chunk: envelope / watchdog and scheduling settings.
        dry_run: do everything except handing commands to the robot.
        recorder: optional dataset recorder.
        events: operator flags (a fresh one wired to ``estop`` if None).
        estop: the e-stop latch (a fresh one if None).
        teleop: the takeover action source.
        hooks: per-step / per-episode callbacks.
        act_mode: ``eval`` (deterministic) or ``explore``.
        device: torch device of the policy.
    """

    def __init__(
        self,
        robot: RobotAdapter,
        policy: Policy,
        control_hz: float,
        episode_s: float,
        num_episodes: int = 1,
        task: str = "",
        safety: SafetyConfig | None = None,
        chunk: ChunkConfig | None = None,
        dry_run: bool = False,
        recorder: RobotEpisodeRecorder | None = None,
        events: OperatorEvents | None = None,
        estop: EStop | None = None,
        teleop: TeleopSource | None = None,
        hooks: Sequence[RunnerHook] = (),
        act_mode: ActMode = ActMode.EVAL,
        device: str = "cpu",
    ) -> None:
        if control_hz <= 0:
            raise ValueError(f"control_hz must be > 0, got {control_hz}")
        if episode_s <= 0:
            raise ValueError(f"episode_s must be > 0, got {episode_s}")
        self.robot, self.policy = robot, policy
        self.dt = 1.0 / control_hz
        self.control_hz, self.episode_s, self.num_episodes, self.task = control_hz, episode_s, num_episodes, task
        self.safety = safety or SafetyConfig()
        self.chunk = chunk or ChunkConfig()
        envelope = SafetyEnvelope.from_config(self.safety, robot.joint_names, self.dt, robot.default_limits())
        self.estop = estop or EStop()
        self.guard = GuardedRobot(robot, envelope, self.dt, dry_run, self.estop)
        self.events = events or OperatorEvents(self.estop, self.safety.estop_key, self.safety.clear_key)
        self.teleop, self.recorder, self.hooks = teleop, recorder, list(hooks)
        self.act_mode, self.device = ActMode(act_mode), device
        s = self.safety
        self.watchdog = Watchdog(s.obs_timeout_s, s.camera_timeout_s, s.policy_timeout_s, s.hold_s)
        self.scheduler = ChunkScheduler(self.chunk.mode, self.chunk.blend_decay)
        self.replan_every = self.chunk.replan_every or policy.chunk_size
        self.timer = LoopTimer(self.dt)
        self.report = DeployReport(control_hz=control_hz, dry_run=dry_run)
        self._epoch = 0

    # -- policy -------------------------------------------------------------------------------------

    def _infer(self, obs: dict) -> np.ndarray:
        batch = {k: (v.to(self.device) if isinstance(v, torch.Tensor) else v) for k, v in obs.items()}
        with torch.inference_mode():
            out = self.policy.act(batch, self.act_mode)
        actions = out.actions.detach().to("cpu", torch.float64).numpy()
        if actions.ndim != 3 or actions.shape[0] != 1 or actions.shape[2] != self.robot.num_joints:
            raise ValueError(
                f"policy returned actions of shape {list(actions.shape)}; expected [1, H, {self.robot.num_joints}] "
                f"(joint targets for {self.robot.joint_names})"
            )
        return actions[0]

    # -- run ----------------------------------------------------------------------------------------

    def run(self) -> DeployReport:
        """Run ``num_episodes`` episodes (a re-recorded one does not count), or until a stop.

        Always returns a report; a fault ends the run with ``report.stop_reason`` set.
        """
        worker = PolicyWorker(self._infer, threaded=self.chunk.async_inference)
        try:
            done, ep = 0, 0
            while done < self.num_episodes:
                summary = self._episode(ep, worker)
                self.report.episodes.append(summary)
                ep += 1
                done += summary.end_reason != "rerecord"
                if self.report.stop_reason or self.events.quit:
                    break
        finally:
            worker.close()
            self.report.commands_sent = self.guard.commands_sent
            self.report.holds_sent = self.guard.holds_sent
            self.report.violations_by_kind = dict(self.guard.envelope.violation_counts)
            self.report.violations = self.guard.envelope.violations[:100]
            self.report.timing = self.timer.summaries()
            self.report.overruns = self.timer.overruns
            if self.recorder is not None:
                self.recorder.finalize()
                self.report.dataset_root = str(self.recorder.root)
        return self.report

    def _episode(self, ep: int, worker: PolicyWorker) -> EpisodeSummary:
        self._epoch += 1
        self.policy.reset()
        self.scheduler.reset()
        self.watchdog.reset()
        self.events.new_episode()
        for hook in self.hooks:
            hook.on_episode_start(ep)
        steps, interventions, reason = 0, 0, "time"
        last_request = -(10**9)
        estopped = False
        t_start = time.perf_counter()
        try:
            try:
                obs = self._fresh_observation()
                self.guard.start(obs.position)
            except (ValueError, ConnectionError) as e:  # stale data or a pose outside the envelope
                raise _StopRun(f"cannot start episode {ep}: {e}") from e
            self.timer.start()
            while True:
                k = self.timer.wait_next()
                if self.timer.elapsed() >= self.episode_s:
                    if estopped:
                        raise _StopRun(f"e-stop still latched at the end of episode {ep} ({self.estop.reason})")
                    break
                if self.events.end_episode:
                    reason = "rerecord" if self.events.rerecord else ("quit" if self.events.quit else "operator")
                    break
                t_wake = self.timer.elapsed()
                try:
                    obs = self.robot.observe()
                except Exception as e:
                    raise _StopRun(f"transport: observation failed: {e}") from e
                now = time.monotonic()
                if self.estop.is_set:
                    if not estopped:
                        self._hold_quietly()
                        estopped = True
                        self.guard.envelope.add_violation(Violation("estop", k, -1, (), (), self.estop.reason, "held"))
                        self.scheduler.reset()
                    continue
                if estopped:  # cleared: resume from the held reference with a fresh policy state
                    estopped = False
                    self.policy.reset()
                    self._epoch += 1
                    last_request = -(10**9)
                self._collect(worker)
                verdict = self.watchdog.check(now, obs.state_age(now), obs.camera_age(now), worker.busy_s(now))
                if verdict.state is WatchState.STOP:
                    self._hold_quietly()
                    self.guard.envelope.add_violation(
                        Violation(verdict.fault, k, -1, (), (), verdict.detail, "stopped")
                    )
                    self.guard.envelope.latch_stop(f"watchdog: {verdict.fault}: {verdict.detail}")
                    raise _StopRun(f"watchdog: {verdict.fault}: {verdict.detail}")
                due = k - last_request >= self.replan_every or self.scheduler.covered_until() - k <= self._lead_steps()
                if verdict.state is WatchState.OK and worker.idle and due:
                    worker.submit(obs.to_obs(self.task), k, self._epoch)
                    last_request = k
                    self._collect(worker)  # inline (sync) inference finishes here
                record = self._command(ep, k, obs, verdict.state)
                interventions += record.intervention
                if self.recorder is not None and record.command is not None:
                    self.recorder.add(
                        obs, record.command, self.task, record.intervention, record.modified or record.held,
                        label=Label(record.label),
                    )
                for hook in self.hooks:
                    hook.on_step(record)
                self.timer.series["obs_age"].append(obs.state_age())
                self.timer.series["compute"].append(self.timer.elapsed() - t_wake)
                if not self.guard.dry_run:
                    self.timer.series["send"].append(self.guard.last_send_s)
                steps += 1
                if self.guard.envelope.stopped:
                    raise _StopRun(f"safety: {self.guard.envelope.stop_reason}")
        except _StopRun as stop:
            self.report.stop_reason = str(stop)
            reason = "stopped"
            log.error("deploy: run stopped: %s", stop)
            if self.guard.envelope.reference is not None and not estopped:
                self._hold_quietly()  # whatever stopped the run, the arm's last word is "stay here"
        else:
            if not estopped:
                self._hold_quietly()  # freeze the arm between episodes (drops any look-ahead points)
        saved = self._finish_recording(reason)
        duration = time.perf_counter() - t_start
        summary = EpisodeSummary(ep, steps, duration, reason, self.events.success, interventions, saved)
        for hook in self.hooks:
            hook.on_episode_end(summary)
        late = self.timer.series["lateness"]
        log.info(
            "episode %d: %s after %d steps (%d with intervention); tick lateness p50 %.2f ms, max %.2f ms; %d overruns",
            ep,
            reason,
            steps,
            interventions,
            1e3 * float(np.median(late)) if late else 0.0,
            1e3 * max(late, default=0.0),
            self.timer.overruns,
        )
        return summary

    def _fresh_observation(self) -> RobotObservation:
        """Wait (briefly) for an observation younger than ``safety.obs_timeout_s`` to start an episode from.

        Raises:
            ValueError: if none arrives within ``max(1 s, 4 * obs_timeout_s)`` (the run cannot start safely).
        """
        limit = self.safety.obs_timeout_s
        deadline = time.monotonic() + max(1.0, 4 * limit)
        while True:
            obs = self.robot.observe()
            if obs.state_age() <= limit:
                return obs
            if time.monotonic() > deadline:
                raise ValueError(
                    f"no fresh observation to start from: joint state is {obs.state_age():.3f} s old "
                    f"(safety.obs_timeout_s={limit})"
                )
            time.sleep(0.005)

    def _collect(self, worker: PolicyWorker) -> None:
        """Move finished policy calls of the current epoch into the scheduler."""
        for done in worker.poll():
            if done.tag != self._epoch:  # started before an e-stop or in an earlier episode
                continue
            if done.error is not None:
                raise _StopRun(f"policy raised {type(done.error).__name__}: {done.error}")
            self.scheduler.add(done.actions, done.start_step)
            self.timer.series["policy"].append(done.latency_s)

    def _lead_steps(self) -> int:
        """Steps ahead of running out at which to call the policy (hides its latency when async)."""
        recent = self.timer.series["policy"][-5:]
        if not self.chunk.async_inference or not recent:
            return 0
        return math.ceil(max(recent) / self.dt)

    def _command(self, ep: int, k: int, obs: RobotObservation, state: WatchState) -> StepRecord:
        """Pick and send this tick's command."""
        intervention = self.events.takeover
        label = int(self.events.label()) if intervention else 0
        policy_action = None
        targets: np.ndarray | None = None
        if state is not WatchState.OK:
            pass  # watchdog fault: hold, whoever is in control
        elif intervention:
            teleop = self.teleop.action() if self.teleop is not None else None
            targets = None if teleop is None else teleop[None]
        else:
            targets = self.scheduler.lookahead(k, self.chunk.command_horizon)
            policy_action = None if targets is None else targets[0].copy()
        if targets is None:  # watchdog hold, starved scheduler, or takeover without a target
            try:
                command = self.guard.hold()
            except Exception as e:
                raise _StopRun(f"transport: sending hold failed: {e}") from e
            return StepRecord(ep, k, obs, policy_action, command[0], True, False, intervention, [], label)
        try:
            result = self.guard.command(targets, k, obs.position)
        except Exception as e:
            raise _StopRun(f"transport: sending command failed: {e}") from e
        return StepRecord(
            ep, k, obs, policy_action, result.targets[0], result.held, result.modified, intervention, result.violations,
            label,
        )

    def _hold_quietly(self) -> None:
        try:
            self.guard.hold()
        except Exception as e:  # noqa: BLE001  (the robot may be gone; nothing more to do)
            log.error("deploy: could not send the hold command: %s", e)

    def _finish_recording(self, reason: str) -> bool:
        if self.recorder is None:
            return False
        if reason == "rerecord":
            self.recorder.discard_episode()
            return False
        return self.recorder.save_episode()
