"""rclpy plumbing shared by the bridge, the input listeners and the simulated arm.

Each :class:`RosNode` owns its own rclpy ``Context`` (so several can live in
one process and shut down independently), one node, and an executor spinning
in a daemon thread. rclpy's signal handlers are not installed: Ctrl-C stays a
``KeyboardInterrupt`` in the caller, which then shuts the node down cleanly.

Environment: ``ROS_DOMAIN_ID`` (or the ``domain_id`` argument),
``ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST`` to keep traffic on loopback,
``ROS_LOG_DIR`` for rcl's log files (defaults to ``~/.ros/log``),
``RMW_IMPLEMENTATION=rmw_fastrtps_cpp`` (the only RMW the wheels ship).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from hardware.ros2.qos import Durability, QosConfig, Reliability

log = logging.getLogger(__name__)

ROS_INSTALL_HINT = (
    "the ROS 2 transport needs rclpy and the message packages: "
    "pip install 'vla-rl[ros]' (ros-rclpy ros-std-msgs ros-sensor-msgs ros-trajectory-msgs ros-rmw-fastrtps-cpp)"
)


def ros_available() -> tuple[bool, str]:
    """``(True, "")`` if rclpy and the message packages import, else ``(False, reason)``."""
    try:
        import rclpy  # noqa: F401
        import sensor_msgs.msg  # noqa: F401
        import std_msgs.msg  # noqa: F401
        import trajectory_msgs.msg  # noqa: F401
    except Exception as e:  # noqa: BLE001  (ImportError, or OSError for a missing shared library)
        return False, f"{ROS_INSTALL_HINT} ({type(e).__name__}: {e})"
    return True, ""


def require_ros() -> None:
    """Raise ``ImportError`` with install instructions if rclpy is unusable."""
    ok, reason = ros_available()
    if not ok:
        raise ImportError(reason)


def make_qos(cfg: QosConfig) -> Any:
    """An rclpy ``QoSProfile`` from a :class:`QosConfig`."""
    from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

    return QoSProfile(
        history=HistoryPolicy.KEEP_LAST,
        depth=cfg.depth,
        reliability=ReliabilityPolicy.RELIABLE
        if cfg.reliability is Reliability.RELIABLE
        else ReliabilityPolicy.BEST_EFFORT,
        durability=DurabilityPolicy.TRANSIENT_LOCAL
        if cfg.durability is Durability.TRANSIENT_LOCAL
        else DurabilityPolicy.VOLATILE,
    )


class RosNode:
    """One rclpy context + node + executor thread.

    Args:
        name: node name.
        namespace: node namespace ("" for none).
        domain_id: ROS domain, or -1 for ``ROS_DOMAIN_ID``.

    Raises:
        ImportError: when rclpy is not installed (with the install command).
    """

    def __init__(self, name: str, namespace: str = "", domain_id: int = -1) -> None:
        require_ros()
        import rclpy
        from rclpy.context import Context
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.signals import SignalHandlerOptions

        self.context = Context()
        kwargs: dict[str, Any] = {"context": self.context, "signal_handler_options": SignalHandlerOptions.NO}
        if domain_id >= 0:
            kwargs["domain_id"] = domain_id
        rclpy.init(**kwargs)
        try:
            self.node = rclpy.create_node(
                name, context=self.context, namespace=namespace or None, start_parameter_services=False
            )
            self.executor = SingleThreadedExecutor(context=self.context)
            self.executor.add_node(self.node)
        except BaseException:
            self.context.try_shutdown()
            raise
        self._thread = threading.Thread(target=self._spin, name=f"ros-{name}", daemon=True)
        self._closed = False
        self._thread.start()

    def _spin(self) -> None:
        try:
            self.executor.spin()
        except Exception as e:  # noqa: BLE001  (context shut down while spinning)
            if not self._closed:
                log.error("ROS executor of %s stopped: %s", self.node.get_name(), e)

    def now_msg(self) -> Any:
        """The node clock's current time as a ``builtin_interfaces/Time``."""
        return self.node.get_clock().now().to_msg()

    def close(self) -> None:
        """Stop spinning, destroy the node and shut the context down. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self.executor.shutdown(timeout_sec=1.0)
        except Exception as e:  # noqa: BLE001  (best-effort shutdown)
            log.debug("executor shutdown: %s", e)
        try:
            self.node.destroy_node()
        except Exception as e:  # noqa: BLE001  (best-effort shutdown)
            log.debug("destroy_node: %s", e)
        self.context.try_shutdown()
        self._thread.join(timeout=2.0)
