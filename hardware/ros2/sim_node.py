"""A simulated arm behind real ROS 2 topics: MuJoCo physics that speaks like a ros2_control arm.

Publishes ``sensor_msgs/JointState`` on ``--joint-state-topic`` and, per
camera, ``sensor_msgs/Image`` (rgb8) on ``/<camera>/image_raw`` and
``sensor_msgs/CompressedImage`` (JPEG) on ``/<camera>/image_raw/compressed``.
Subscribes ``trajectory_msgs/JointTrajectory`` (interpolated from the current
target through the points, like joint_trajectory_controller) and
``std_msgs/Float64MultiArray`` (immediate targets, like a forward position
controller). Physics advances to wall-clock time on a timer. Camera frames
render from a snapshot of the simulation in a thread of their own (which
owns the GL context), so a slow software renderer does not delay commands or
joint states.

``--command-log FILE`` appends every received command (one JSON line, flushed
at once, so the log survives a kill) — the ground truth of "what reached the
arm" for the fault tests and the benchmark's transport latency.

``--parent-pid PID`` stops the node once process ``PID`` is no longer its
parent (test harnesses: an arm left running by a crashed test session would
otherwise keep publishing on its ROS domain and answer the next session's
runner in place of that session's own arm).

Run::

    python -m hardware.ros2.sim_node --model so101 --camera front --domain-id 7
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import IO

import numpy as np

from hardware.ros2.convert import MessageError, encode_compressed, stamp_to_seconds, trajectory_points
from hardware.ros2.qos import QosConfig, Reliability
from hardware.sim_arm import MujocoArm

log = logging.getLogger(__name__)


class SimArmNode:
    """MuJoCo arm + ROS 2 node (see the module docstring).

    Args:
        arm: the simulated arm.
        domain_id: ROS domain (-1: ``ROS_DOMAIN_ID``).
        joint_state_topic, trajectory_topic, position_topic: topic names.
        cameras: model cameras to publish.
        state_hz, camera_hz, physics_hz: publishing and physics-update rates.
        command_log: optional JSONL file of received commands.
    """

    def __init__(
        self,
        arm: MujocoArm,
        domain_id: int = -1,
        joint_state_topic: str = "/joint_states",
        trajectory_topic: str = "/arm_controller/joint_trajectory",
        position_topic: str = "/position_controller/commands",
        cameras: tuple[str, ...] = (),
        state_hz: float = 100.0,
        camera_hz: float = 10.0,
        physics_hz: float = 250.0,
        command_log: Path | None = None,
        node_name: str = "sim_arm",
    ) -> None:
        from sensor_msgs.msg import CompressedImage, Image, JointState
        from std_msgs.msg import Float64MultiArray
        from trajectory_msgs.msg import JointTrajectory

        from hardware.ros2.runtime import RosNode, make_qos

        self.arm = arm
        for cam in cameras:
            if cam not in arm.camera_names:
                raise ValueError(f"--camera {cam!r}: model cameras are {arm.camera_names}")
        self._lock = threading.Lock()
        self._t0 = time.monotonic()
        self._traj: tuple[float, np.ndarray, np.ndarray, np.ndarray] | None = None  # t_recv, start, times, points
        self._log: IO[str] | None = open(command_log, "a", buffering=1) if command_log else None  # noqa: SIM115
        self.commands_received = 0
        self._ros = RosNode(node_name, "", domain_id)
        node = self._ros.node
        import mujoco

        self._mj = mujoco
        self._snapshot = mujoco.MjData(arm.model)
        reliable = make_qos(QosConfig())
        commands_qos = make_qos(QosConfig(depth=200))  # a stalled simulator must not drop queued commands
        self._js_pub = node.create_publisher(JointState, joint_state_topic, reliable)
        self._cam_pubs = {
            cam: (
                node.create_publisher(Image, f"/{cam}/image_raw", make_qos(QosConfig(Reliability.BEST_EFFORT))),
                node.create_publisher(
                    CompressedImage, f"/{cam}/image_raw/compressed", make_qos(QosConfig(Reliability.BEST_EFFORT))
                ),
            )
            for cam in cameras
        }
        self._msg = {"JointState": JointState, "Image": Image, "CompressedImage": CompressedImage}
        node.create_subscription(JointTrajectory, trajectory_topic, self._on_trajectory, commands_qos)
        node.create_subscription(Float64MultiArray, position_topic, self._on_position, commands_qos)
        node.create_timer(1.0 / physics_hz, self._physics)
        node.create_timer(1.0 / state_hz, self._publish_state)
        self._stop = threading.Event()
        self._camera_thread: threading.Thread | None = None
        if cameras:
            self._camera_thread = threading.Thread(
                target=self._camera_loop, args=(1.0 / camera_hz,), name="sim-arm-cameras", daemon=True
            )
            self._camera_thread.start()

    # -- commands -------------------------------------------------------------------------------------

    def _write_log(self, entry: dict) -> None:
        if self._log is not None:
            self._log.write(json.dumps(entry) + "\n")

    def _on_trajectory(self, msg: object) -> None:
        recv_wall, recv = time.time(), time.monotonic()
        stamp = stamp_to_seconds(msg.header.stamp)  # type: ignore[attr-defined]
        try:
            times, points = trajectory_points(msg, self.arm.joint_names)
            if points.shape[0] == 0:
                raise MessageError("trajectory has no points")
            if not np.isfinite(points).all():
                raise MessageError("trajectory has non-finite positions")
        except MessageError as e:
            log.error("sim_arm: rejected trajectory: %s", e)
            self._write_log({"recv": recv_wall, "stamp": stamp, "type": "trajectory", "rejected": str(e)})
            return
        with self._lock:
            start = self.arm.targets.copy()
            self._traj = (recv, start, times, points)
            self.commands_received += 1
        self._write_log(
            {
                "recv": recv_wall,
                "stamp": stamp,
                "type": "trajectory",
                "times": times.tolist(),
                "positions": points.tolist(),
            }
        )

    def _on_position(self, msg: object) -> None:
        recv_wall = time.time()
        q = np.asarray(msg.data, dtype=np.float64)  # type: ignore[attr-defined]
        if q.shape != (self.arm.num_joints,) or not np.isfinite(q).all():
            reason = f"expected {self.arm.num_joints} finite positions, got {q.tolist()}"
            log.error("sim_arm: rejected position command: %s", reason)
            self._write_log({"recv": recv_wall, "stamp": 0.0, "type": "position", "rejected": reason})
            return
        with self._lock:
            self._traj = None
            self.arm.set_targets(q)
            self.commands_received += 1
        self._write_log(
            {"recv": recv_wall, "stamp": 0.0, "type": "position", "times": [0.0], "positions": [q.tolist()]}
        )

    def _target_at(self, now: float) -> np.ndarray | None:
        if self._traj is None:
            return None
        recv, start, times, points = self._traj
        t = now - recv
        prev_t, prev_q = 0.0, start
        for ti, qi in zip(times, points, strict=True):
            if t <= ti:
                a = 1.0 if ti <= prev_t else (t - prev_t) / (ti - prev_t)
                return prev_q + a * (qi - prev_q)
            prev_t, prev_q = ti, qi
        return points[-1]

    # -- timers ---------------------------------------------------------------------------------------

    def _physics(self) -> None:
        now = time.monotonic()
        with self._lock:
            target = self._target_at(now)
            if target is not None:
                self.arm.set_targets(target)
            behind = (now - self._t0) - self.arm.time
            if behind > 0:
                self.arm.advance(min(behind, 0.1))

    def _publish_state(self) -> None:
        msg = self._msg["JointState"]()
        msg.header.stamp = self._ros.now_msg()
        with self._lock:
            msg.name = list(self.arm.joint_names)
            msg.position = self.arm.positions().tolist()
            msg.velocity = self.arm.velocities().tolist()
            msg.effort = self.arm.efforts().tolist()
        self._js_pub.publish(msg)

    def _camera_loop(self, period: float) -> None:
        next_t = time.monotonic()
        while not self._stop.is_set():
            self._publish_cameras()
            next_t += period
            self._stop.wait(max(0.0, next_t - time.monotonic()))
        self.arm.close()  # the renderer belongs to this thread's GL context

    def _publish_cameras(self) -> None:
        with self._lock:  # copy the state, render outside the lock
            self._mj.mj_copyData(self._snapshot, self.arm.model, self.arm.data)
        for cam, (raw_pub, jpeg_pub) in self._cam_pubs.items():
            img = self.arm.render(cam, self._snapshot)
            stamp = self._ros.now_msg()
            raw = self._msg["Image"]()
            raw.header.stamp, raw.header.frame_id = stamp, cam
            raw.height, raw.width, raw.encoding, raw.step = img.shape[0], img.shape[1], "rgb8", img.shape[1] * 3
            raw.data = img.tobytes()
            raw_pub.publish(raw)
            comp = self._msg["CompressedImage"]()
            comp.header.stamp, comp.header.frame_id, comp.format = stamp, cam, "jpeg"
            comp.data = encode_compressed(img, "jpeg")
            jpeg_pub.publish(comp)

    def close(self) -> None:
        """Shut the node down, free the renderer, close the log."""
        self._stop.set()
        if self._camera_thread is not None:
            self._camera_thread.join(timeout=5)
        self._ros.close()
        if self._log is not None:
            self._log.close()
            self._log = None


def _stop_when_orphaned(parent: int, done: threading.Event, period: float = 0.2) -> None:
    """Set ``done`` once this process's parent is no longer ``parent`` (it exited; we were re-parented)."""
    while os.getppid() == parent:
        if done.wait(period):
            return
    log.warning("parent process %d is gone: stopping", parent)
    done.set()


def main(argv: list[str] | None = None) -> None:
    """Run a simulated arm node until SIGINT / SIGTERM (or ``--duration``, or ``--parent-pid``'s exit)."""
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="so101", help="packaged model (so101, panda) or MJCF path")
    p.add_argument("--domain-id", type=int, default=-1, help="ROS domain (-1: ROS_DOMAIN_ID)")
    p.add_argument("--joint-state-topic", default="/joint_states")
    p.add_argument("--trajectory-topic", default="/arm_controller/joint_trajectory")
    p.add_argument("--position-topic", default="/position_controller/commands")
    p.add_argument("--camera", action="append", default=[], help="model camera to publish (repeatable)")
    p.add_argument("--image-size", type=int, default=64, help="rendered frame height and width")
    p.add_argument("--state-hz", type=float, default=100.0)
    p.add_argument("--camera-hz", type=float, default=10.0)
    p.add_argument("--command-log", type=Path, default=None, help="append received commands here (JSON lines)")
    p.add_argument("--ready-file", type=Path, default=None, help="touched once the node is up")
    p.add_argument("--duration", type=float, default=0.0, help="exit after this many seconds (0: run until signalled)")
    p.add_argument(
        "--parent-pid", type=int, default=0, help="exit once this process is no longer our parent (0: never)"
    )
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s sim_arm %(levelname)s %(message)s")
    arm = MujocoArm(args.model, image_size=(args.image_size, args.image_size))
    node = SimArmNode(
        arm,
        args.domain_id,
        args.joint_state_topic,
        args.trajectory_topic,
        args.position_topic,
        tuple(args.camera),
        args.state_hz,
        args.camera_hz,
        command_log=args.command_log,
    )
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    if args.parent_pid > 0:
        threading.Thread(
            target=_stop_when_orphaned, args=(args.parent_pid, done), name="sim-arm-parent", daemon=True
        ).start()
    log.info(
        "simulated %s up: joints %s, limits %s..%s",
        args.model,
        arm.joint_names,
        arm.lower.round(4).tolist(),
        arm.upper.round(4).tolist(),
    )
    if args.ready_file is not None:  # written atomically: readers never see half a file
        info = {"joints": arm.joint_names, "lower": arm.lower.tolist(), "upper": arm.upper.tolist()}
        tmp = args.ready_file.with_name(args.ready_file.name + ".tmp")
        tmp.write_text(json.dumps(info))
        os.replace(tmp, args.ready_file)
    done.wait(args.duration if args.duration > 0 else None)
    node.close()
    log.info("simulated arm stopped after %d commands", node.commands_received)


if __name__ == "__main__":
    main()
