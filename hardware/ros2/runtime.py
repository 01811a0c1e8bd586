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

    rclpy does not support destroying a node, its executor or its context while
    another thread is inside the executor (waiting on the node's handles or
    running one of its callbacks): that can crash the process. So the spin
    thread is the only user of the executor, and :meth:`close` first stops it
    (a stop flag plus a guard condition that ends the executor's wait), joins
    it, and only then shuts the executor down, destroys the node and shuts the
    context down.

    Args:
        name: node name.
        namespace: node namespace ("" for none).
        domain_id: ROS domain, or -1 for ``ROS_DOMAIN_ID``.

    Raises:
        ImportError: when rclpy is not installed (with the install command).
    """

    #: How long :meth:`close` waits for a running callback to return before leaving the teardown to the spin thread.
    STOP_TIMEOUT_S = 5.0

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
            # Triggered by close(): the executor's wait returns, spin_once runs this no-op, the loop sees the stop flag.
            self._wake = self.node.create_guard_condition(lambda: None)
        except BaseException:
            self.context.try_shutdown()
            raise
        self._stopping = threading.Event()
        self._state_lock = threading.Lock()
        self._closed = False
        self._spin_exited = False
        self._teardown_on_exit = False  # set by close() when the spin thread has to release the node itself
        self._torn_down = False
        self._thread = threading.Thread(target=self._spin, name=f"ros-{name}", daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        try:
            while not self._stopping.is_set():
                self.executor.spin_once()  # blocks until one callback ran (the wake guard's, at the latest)
        except Exception as e:  # noqa: BLE001  (a callback raised, or the context was shut down from outside)
            if not self._stopping.is_set():
                log.error("ROS executor of %s stopped: %s", self.node.get_name(), e)
        finally:
            with self._state_lock:
                self._spin_exited = True
                teardown = self._teardown_on_exit
            if teardown:
                self._teardown()

    def now_msg(self) -> Any:
        """The node clock's current time as a ``builtin_interfaces/Time``."""
        return self.node.get_clock().now().to_msg()

    def close(self) -> None:
        """Stop the spin thread, then shut the executor down, destroy the node and shut the context down.

        Idempotent, and safe to call from one of the node's own callbacks (the
        spin thread then releases everything once that callback returned). If a
        callback is still running after :attr:`STOP_TIMEOUT_S`, the release is
        left to the spin thread too: nothing is destroyed under a running callback.
        """
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
        self._stopping.set()  # before the trigger: the woken loop must see it
        try:
            self._wake.trigger()
        except Exception as e:  # noqa: BLE001  (the spin thread may be gone already; it then needs no waking)
            log.debug("wake guard: %s", e)
        in_callback = threading.current_thread() is self._thread
        if not in_callback:
            self._thread.join(timeout=self.STOP_TIMEOUT_S)
        with self._state_lock:
            exited = self._spin_exited
            if not exited:
                self._teardown_on_exit = True
        if exited:
            self._teardown()
        elif not in_callback:
            log.warning(
                "ROS node %s: a callback is still running after %.1f s; the node is released when it returns",
                self.node.get_name(),
                self.STOP_TIMEOUT_S,
            )

    def _teardown(self) -> None:
        """Release the executor, node and context; only once the spin thread has exited."""
        with self._state_lock:
            if self._torn_down:
                return
            self._torn_down = True
        try:
            self.executor.shutdown()
        except Exception as e:  # noqa: BLE001  (best-effort shutdown)
            log.debug("executor shutdown: %s", e)
        try:
            self.node.destroy_node()
        except Exception as e:  # noqa: BLE001  (best-effort shutdown)
            log.debug("destroy_node: %s", e)
        try:
            self.context.try_shutdown()
        except Exception as e:  # noqa: BLE001  (best-effort shutdown)
            log.debug("context shutdown: %s", e)
