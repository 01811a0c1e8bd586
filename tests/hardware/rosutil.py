"""Helpers for the ROS 2 tests: skip markers, the simulated arm subprocess, the envelope check on its log."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from hardware.ros2.runtime import ros_available
from tests.hardware.domains import lock_fd

ROS_OK, ROS_REASON = ros_available()
requires_ros = [pytest.mark.ros, pytest.mark.skipif(not ROS_OK, reason=f"ROS 2 not available: {ROS_REASON}")]

REPO = Path(__file__).resolve().parents[2]
SO101_JOINTS = ["shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper"]


@dataclass
class SimArmProcess:
    """A running ``hardware.ros2.sim_node`` subprocess and its command log."""

    proc: subprocess.Popen
    log_path: Path
    joints: list[str]
    lower: np.ndarray
    upper: np.ndarray
    domain: int

    def commands(self, since: int = 0) -> list[dict]:
        """Logged commands (JSON lines) from line ``since`` on."""
        if not self.log_path.exists():
            return []
        lines = self.log_path.read_text().splitlines()
        return [json.loads(line) for line in lines[since:] if line.strip()]

    def count(self) -> int:
        """Lines logged so far."""
        return len(self.commands())

    def stop(self) -> None:
        """Terminate (continuing it first if it was SIGSTOP-ed)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


def start_sim_arm(tmp: Path, domain: int, cameras: tuple[str, ...] = (), model: str = "so101") -> SimArmProcess:
    """Start the simulated arm node and wait until it is up (not until discovered).

    The node exits with this process, and holds ``domain``'s lock (when this process took
    ``domain`` from a :class:`~tests.hardware.domains.DomainPool`) until it exits.
    """
    tmp.mkdir(parents=True, exist_ok=True)
    ready, log_path = tmp / "ready.json", tmp / "commands.jsonl"
    cmd = [
        sys.executable,
        "-m",
        "hardware.ros2.sim_node",
        "--model",
        model,
        "--domain-id",
        str(domain),
        "--command-log",
        str(log_path),
        "--ready-file",
        str(ready),
        "--state-hz",
        "100",
        "--camera-hz",
        "10",
        "--parent-pid",  # a crashed session leaves no arm behind on its domain
        str(os.getpid()),
    ]
    for cam in cameras:
        cmd += ["--camera", cam]
    env = dict(os.environ, PYTHONPATH=str(REPO), MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"))
    ready.unlink(missing_ok=True)  # only this start's file counts
    lock = lock_fd(domain)  # the arm holds its domain's reservation for as long as it runs
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp / "node.err", "w"),  # noqa: SIM115
        pass_fds=() if lock is None else (lock,),
    )
    deadline = time.monotonic() + 90
    while not ready.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"sim arm node exited: {(tmp / 'node.err').read_text()[-2000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("sim arm node did not come up in 90 s")
        time.sleep(0.05)
    info = json.loads(ready.read_text())
    return SimArmProcess(proc, log_path, info["joints"], np.array(info["lower"]), np.array(info["upper"]), domain)


def assert_commands_within_envelope(
    commands: list[dict], lower: np.ndarray, upper: np.ndarray, max_step: float, tol: float = 1e-9
) -> np.ndarray:
    """Check what reached the arm: finite, inside ``[lower, upper]``, steps of at most ``max_step``.

    Returns the point-0 series ``[N, A]`` of the accepted commands.
    """
    assert not [c for c in commands if "rejected" in c], "the arm rejected commands (non-finite or malformed)"
    firsts = []
    for c in commands:
        pts = np.asarray(c["positions"], dtype=np.float64)
        assert np.isfinite(pts).all(), f"non-finite command reached the arm: {pts}"
        assert (pts >= lower - tol).all() and (pts <= upper + tol).all(), f"command outside the limits: {pts}"
        if len(pts) > 1:
            assert np.abs(np.diff(pts, axis=0)).max() <= max_step + tol
        firsts.append(pts[0])
    series = np.asarray(firsts)
    if len(series) > 1:
        worst = np.abs(np.diff(series, axis=0)).max()
        assert worst <= max_step + tol, f"a command jumped {worst} > max_step {max_step}"
    return series


class AtStep:
    """A runner hook calling ``action()`` once, at control step ``step`` (``fired_at``: its wall-clock time)."""

    def __init__(self, step: int, action) -> None:
        self.step, self.action, self.fired_at = step, action, None

    def on_episode_start(self, episode: int) -> None: ...

    def on_step(self, record) -> None:
        if record.step >= self.step and self.fired_at is None:
            self.fired_at = time.time()
            self.action()

    def on_episode_end(self, summary) -> None: ...


class SentCommands:
    """A runner hook keeping point 0 of every command the runner sent, and the observation it used."""

    def __init__(self) -> None:
        self.commands: list[np.ndarray] = []
        self.positions: list[np.ndarray] = []
        self.steps: list[int] = []
        self.held: list[bool] = []

    def on_episode_start(self, episode: int) -> None: ...

    def on_step(self, record) -> None:
        if record.command is not None:
            self.commands.append(np.asarray(record.command, dtype=np.float64).copy())
            self.positions.append(np.asarray(record.obs.position, dtype=np.float64).copy())
            self.steps.append(record.step)
            self.held.append(bool(record.held))

    def on_episode_end(self, summary) -> None: ...


def assert_received_subsequence(commands: list[dict], sent: list[np.ndarray]) -> None:
    """Every command the arm logged is one the runner sent (same values), in the order it was sent.

    Together with the envelope check of the sent series this proves that nothing outside the
    envelope reached the arm even when the transport dropped messages (a frozen or dying node).
    """
    j = 0
    for c in commands:
        first = np.asarray(c["positions"][0])
        while j < len(sent) and not np.allclose(sent[j], first, atol=1e-12, rtol=0):
            j += 1
        assert j < len(sent), f"the arm received a command the runner never sent: {first}"
