"""Control-loop latency and jitter of ``vla-rl deploy`` over ROS 2 loopback, at several rates.

Starts the simulated SO-101 arm node (``hardware.ros2.sim_node``, a separate
process) in a private ROS domain, then for each rate runs the deployment
runner (tiny policy, async inference, safety envelope on, one 64x64 camera
over ``sensor_msgs/Image``) and publishes a markdown table per rate (``benchmarks/harness.py``).

Series (ms): ``lateness`` = wake-up minus scheduled tick (jitter);
``period`` = time between ticks; ``compute`` = work per tick (observe,
schedule, envelope, publish); ``obs_age`` = age of the joint state used;
``send`` = publish call; ``policy`` = one policy call; ``transport`` =
command header stamp to arrival in the arm node (same clock, loopback).

Run::

    OMP_NUM_THREADS=1 ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST python benchmarks/control_loop.py --seconds 10
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import harness
import torch

from hardware.ros2.bridge import Ros2Adapter
from hardware.ros2.config import Ros2RobotConfig, RosCameraConfig
from hardware.runner import DeployRunner
from hardware.safety import SafetyConfig
from hardware.scheduling import ChunkConfig
from hardware.testing import TinyJointPolicy
from hardware.timing import TABLE_HEADER, LatencySummary

JOINTS = ["shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper"]


def start_arm(tmp: Path, domain: int, camera: bool) -> tuple[subprocess.Popen, Path, dict]:
    """Start the simulated arm node; return (process, command log, limits)."""
    ready, log = tmp / "ready.json", tmp / "commands.jsonl"
    cmd = [
        sys.executable,
        "-m",
        "hardware.ros2.sim_node",
        "--model",
        "so101",
        "--domain-id",
        str(domain),
        "--command-log",
        str(log),
        "--ready-file",
        str(ready),
        "--state-hz",
        "100",
        "--camera-hz",
        "15",
    ]
    if camera:
        cmd += ["--camera", "front"]
    env = dict(os.environ, PYTHONPATH=str(harness.ROOT))
    proc = subprocess.Popen(cmd, cwd=harness.ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 90
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("the simulated arm node did not start")
        time.sleep(0.05)
    return proc, log, json.loads(ready.read_text())


def run_rate(hz: float, seconds: float, domain: int, limits: dict, camera: bool) -> tuple[dict, float]:
    """One runner episode at ``hz``; returns (timing summaries, wall time when it started)."""
    cams = {"front": RosCameraConfig(topic="/front/image_raw", width=64, height=64)} if camera else {}
    cfg = Ros2RobotConfig(
        joint_names=JOINTS,
        domain_id=domain,
        cameras=cams,
        position_lower=limits["lower"],
        position_upper=limits["upper"],
    )
    robot = Ros2Adapter(cfg)
    robot.connect()
    try:
        policy = TinyJointPolicy.build(6, 6, chunk_size=10, max_step=0.3 / hz)
        runner = DeployRunner(
            robot,
            policy,
            hz,
            seconds,
            safety=SafetyConfig(max_velocity=[1.0], obs_timeout_s=0.5, camera_timeout_s=1.0),
            chunk=ChunkConfig(replan_every=5, async_inference=True),
        )
        started = time.time()
        report = runner.run()
    finally:
        robot.disconnect()
    if report.stop_reason:
        raise RuntimeError(f"{hz} Hz run stopped: {report.stop_reason}")
    out = dict(report.timing)
    out["_overruns"] = report.overruns  # type: ignore[assignment]
    out["_sent"] = report.commands_sent + report.holds_sent  # type: ignore[assignment]
    return out, started


def transport_latency(log: Path, since_wall: float, until_wall: float) -> LatencySummary:
    """Header stamp -> arrival in the arm node, for commands received in the window."""
    lat = []
    for line in log.read_text().splitlines():
        entry = json.loads(line)
        if since_wall <= entry["recv"] <= until_wall and entry.get("stamp"):
            lat.append(entry["recv"] - entry["stamp"])
    return LatencySummary.of(lat)


def main() -> None:
    """Run the benchmark and print the markdown section."""
    p = argparse.ArgumentParser(description="control-loop latency / jitter over ROS 2 loopback")
    p.add_argument("--rates", type=float, nargs="+", default=[10.0, 30.0, 50.0])
    p.add_argument("--seconds", type=float, default=10.0, help="episode length per rate")
    p.add_argument("--domain-id", type=int, default=int(os.environ.get("ROS_DOMAIN_ID", "0")) or 87)
    p.add_argument("--no-camera", action="store_true", help="joint states only")
    args = harness.add_output_args(p).parse_args()
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    os.environ.setdefault("ROS_LOG_DIR", str(Path(tempfile.gettempdir()) / "vla-rl-bench-roslog"))
    torch.set_num_threads(1)
    camera = not args.no_camera
    sections = []
    for hz in args.rates:  # a fresh arm per rate: every run starts from the home pose
        tmp = Path(tempfile.mkdtemp(prefix=f"control_loop_{hz:g}hz_"))
        proc, log, limits = start_arm(tmp, args.domain_id, camera)
        try:
            timing, started = run_rate(hz, args.seconds, args.domain_id, limits, camera)
            time.sleep(0.3)
            timing["transport"] = transport_latency(log, started, time.time())
            sections.append((hz, timing))
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    md = [
        (
            "Deployment runner -> simulated SO-101 node "
            f"(separate process, MuJoCo, JointState at 100 Hz{', one 64x64 rgb8 camera at 15 Hz' if camera else ''}), "
            "tiny policy with async inference, safety envelope on, FastDDS, "
            f"`ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST`. {platform.processor() or platform.machine()}, "
            f"{os.cpu_count()} CPUs, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, "
            f"load average {os.getloadavg()[0]:.1f} at the end. Times in ms."
        ),
        "",
    ]
    rows = []
    for hz, timing in sections:
        overruns, sent = timing.pop("_overruns"), timing.pop("_sent")
        rows.append({"hz": hz, "missed_ticks": overruns, "commands_sent": sent,
                     **{name: asdict(s) for name, s in timing.items()}})
        period_ms = 1e3 / hz
        got = timing["transport"].n
        md += [
            f"### {hz:g} Hz (period {period_ms:.1f} ms, {overruns} missed ticks, {got}/{sent} commands arrived)",
            "",
            TABLE_HEADER,
        ]
        md += [s.row(name) for name, s in timing.items()]
        md.append("")
    text = "\n".join(md)
    print(text)
    harness.publish("control_loop", args, text, rows=rows)


if __name__ == "__main__":
    main()
