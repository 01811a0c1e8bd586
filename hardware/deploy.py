"""``vla-rl deploy``: run a fine-tuned policy on a robot, safely, and record what happened.

Config: :class:`DeployConfig` (draccus). Examples::

    vla-rl deploy --robot.type so101_follower --robot.port /dev/ttyACM0 \\
        --policy.path outputs/ckpt --safety.position_lower '[-100,-100,-100,-100,-100,0]' \\
        --safety.position_upper '[100,100,100,100,100,100]' --safety.max_delta '[2]' --dry-run

    vla-rl deploy --robot.type ros2 --robot.joint_names '[j1,j2,j3]' \\
        --robot.command_topic /arm_controller/joint_trajectory --policy.path ckpt \\
        --control_hz 30 --dataset.repo_id me/rollouts --dataset.root data/rollouts

Policies load by path: the folder's ``config.json`` must hold the key
``"type"`` naming a policy registered in :data:`policies.registry.POLICIES`
(``--policy.type`` overrides it); the class's ``from_pretrained(path)`` does
the rest.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import draccus
from lerobot.robots import RobotConfig
from lerobot.teleoperators import TeleoperatorConfig

from hardware.adapter import RobotAdapter
from hardware.config_mujoco_robot import MujocoRobotConfig  # noqa: F401  (registers --robot.type mujoco_arm)
from hardware.intervention import KeyboardListener, LeRobotTeleop, OperatorEvents, TeleopSource
from hardware.recording import DatasetConfig, RobotEpisodeRecorder
from hardware.ros2.config import Ros2RobotConfig  # noqa: F401  (registers --robot.type ros2)
from hardware.runner import DeployReport, DeployRunner, RunnerHook
from hardware.safety import SafetyConfig
from hardware.scheduling import ChunkConfig
from hardware.timing import TABLE_HEADER
from hardware.watchdog import EStop
from policies.base import ActMode, Policy
from policies.io import CONFIG_FILE, CheckpointError, checkpoint_type
from policies.loading import load_policy
from vla_core.registry import Registry, RegistryError

log = logging.getLogger(__name__)


@dataclass
class DeployPolicyConfig:
    """Which policy to run on the robot (``--policy.*`` of ``vla-rl deploy``)."""

    path: str = ""
    """Checkpoint folder; its ``config.json`` names the policy under ``"type"``."""
    type: str = ""
    """Registered policy name overriding ``config.json``'s ``"type"`` (empty: use the file's)."""
    device: str = "cpu"
    """Torch device for inference."""
    mode: ActMode = ActMode.EVAL
    """``eval`` (deterministic) or ``explore`` (sampled)."""


@dataclass
class DeployConfig:
    """``vla-rl deploy``: robot, policy, safety envelope, control loop, recording."""

    robot: RobotConfig
    """``--robot.type``: any LeRobot robot type (``so101_follower``, ``koch_follower``, ...), ``ros2`` or ``mujoco_arm``."""
    policy: DeployPolicyConfig = field(default_factory=DeployPolicyConfig)
    """The policy checkpoint."""
    safety: SafetyConfig = field(default_factory=SafetyConfig)
    """Joint limits, step limits, workspace box, watchdog, e-stop."""
    chunk: ChunkConfig = field(default_factory=ChunkConfig)
    """Action-chunk scheduling (execute / blend, re-planning, async inference)."""
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    """Episode recording (off while ``dataset.repo_id`` is empty)."""
    teleop: TeleoperatorConfig | None = None
    """LeRobot teleoperator for takeovers (``--teleop.type so101_leader --teleop.port ...``)."""
    teleop_topic: str = ""
    """ROS 2 ``sensor_msgs/JointState`` topic of takeover targets (alternative to ``teleop``)."""
    ros_domain_id: int = -1
    """ROS domain of the e-stop / teleop topics (-1: ``ROS_DOMAIN_ID``)."""
    control_hz: float = 30.0
    """Control rate (commands per second); also the dataset fps."""
    episode_s: float = 20.0
    """Episode length in seconds."""
    num_episodes: int = 1
    """Episodes to run."""
    task: str = ""
    """Language instruction handed to the policy (``observation['task']``)."""
    dry_run: bool = False
    """Do everything (observe, infer, check, record) except sending commands. ``--dry-run`` works too."""
    keyboard: bool = True
    """Listen for operator keys on the terminal (e-stop, takeover, end episode)."""
    report_path: str = ""
    """Write the run report (JSON) here."""

    def __post_init__(self) -> None:
        if self.control_hz <= 0:
            raise ValueError(f"control_hz must be > 0, got {self.control_hz}")
        if self.episode_s <= 0:
            raise ValueError(f"episode_s must be > 0, got {self.episode_s}")
        if self.num_episodes < 1:
            raise ValueError(f"num_episodes must be >= 1, got {self.num_episodes}")
        if self.teleop is not None and self.teleop_topic:
            raise ValueError("give either teleop (a LeRobot teleoperator) or teleop_topic (ROS 2), not both")


# -- robots ------------------------------------------------------------------------------------------

ADAPTERS: Registry = Registry("robot transport")


@ADAPTERS.register("ros2")
def _make_ros2(cfg: Any) -> RobotAdapter:
    """ROS 2 topics (``--robot.type ros2``)."""
    from hardware.ros2.bridge import Ros2Adapter

    return Ros2Adapter(cfg)


@ADAPTERS.register("lerobot")
def _make_lerobot(cfg: Any) -> RobotAdapter:
    """Any LeRobot robot type (the default transport)."""
    from hardware.lerobot_adapter import LeRobotAdapter

    return LeRobotAdapter(cfg)


def make_adapter(robot: RobotConfig) -> RobotAdapter:
    """The adapter for ``robot``: a registered transport by its type name, else LeRobot's drivers."""
    name = robot.type if robot.type in ADAPTERS else "lerobot"
    return ADAPTERS.get(name).obj(robot)


# -- policies ----------------------------------------------------------------------------------------


def load_deploy_policy(path: str | Path, type_override: str = "", device: str = "cpu") -> Policy:
    """Load the policy to deploy: :func:`policies.loading.load_policy`, on ``device``, in eval mode.

    On top of :func:`policies.loading.load_policy` this registers the bring-up
    policy (:mod:`hardware.testing`'s ``tiny-joint``), moves the policy to
    ``device``, switches it to eval mode, and phrases errors in terms of the
    ``--policy.*`` options.

    Raises:
        FileNotFoundError: naming ``policy.path`` when the folder or its config is missing.
        ValueError: naming the file when ``"type"`` is missing, or the type is unknown (listing the valid ones).
    """
    import hardware.testing  # noqa: F401  (registers the tiny-joint bring-up policy)

    folder = Path(path)
    cfg_file = folder / CONFIG_FILE
    if not cfg_file.is_file():
        raise FileNotFoundError(
            f"policy.path {str(path)!r}: no {CONFIG_FILE} there; pass a folder saved by save_pretrained"
        )
    kind = type_override
    if not kind:
        try:
            kind = checkpoint_type(folder)
        except CheckpointError as exc:  # a ValueError: no string "type" in config.json
            raise ValueError(f"{exc}; set --policy.type") from None
    try:
        policy = load_policy(folder, policy_type=kind)
    except RegistryError as exc:
        raise ValueError(f"policy.type / {cfg_file} 'type': {exc}") from None
    return policy.to(device).eval()


# -- run ---------------------------------------------------------------------------------------------


def run_deploy(
    cfg: DeployConfig,
    policy: Policy | None = None,
    hooks: tuple[RunnerHook, ...] = (),
    teleop: TeleopSource | None = None,
    estop: EStop | None = None,
    events: OperatorEvents | None = None,
) -> DeployReport:
    """Connect the robot, run ``cfg.num_episodes`` episodes, disconnect; return the report.

    Args:
        cfg: the deploy config.
        policy: an already-built policy (default: load ``cfg.policy.path``).
        hooks: per-step / per-episode callbacks (intervention capture).
        teleop: takeover action source (default: from ``cfg.teleop`` / ``cfg.teleop_topic``).
        estop, events: operator inputs to share with other code (e.g. a GUI, a test).

    Raises:
        FileNotFoundError / ValueError: for a bad policy path or type, limits or config values.
        ConnectionError: if the robot cannot be reached.
    """
    if policy is None:
        if not cfg.policy.path:
            raise ValueError("policy.path is required (a checkpoint folder)")
        policy = load_deploy_policy(cfg.policy.path, cfg.policy.type, cfg.policy.device)
    robot = make_adapter(cfg.robot)
    estop = estop or EStop()
    events = events or OperatorEvents(estop, cfg.safety.estop_key, cfg.safety.clear_key)
    closers: list[Any] = []
    keyboard = KeyboardListener(events)
    t0 = time.monotonic()
    try:
        robot.connect()
        closers.append(robot.disconnect)
        log.info("deploy: %s connected in %.2f s", robot.robot_type, time.monotonic() - t0)
        if cfg.keyboard and keyboard.start():
            closers.append(keyboard.close)
        if cfg.safety.estop_topic:
            from hardware.ros2.inputs import RosEStopListener

            listener = RosEStopListener(cfg.safety.estop_topic, estop, cfg.ros_domain_id)
            closers.append(listener.close)
        if teleop is None and cfg.teleop is not None:
            teleop = LeRobotTeleop(cfg.teleop, robot.joint_names)
            closers.append(teleop.close)
        elif teleop is None and cfg.teleop_topic:
            from hardware.ros2.inputs import RosTeleopListener

            teleop = RosTeleopListener(cfg.teleop_topic, robot.joint_names, cfg.ros_domain_id)
            closers.append(teleop.close)
        recorder = None
        if cfg.dataset.repo_id:
            recorder = RobotEpisodeRecorder(
                cfg.dataset,
                round(cfg.control_hz),
                robot.robot_type,
                robot.state_names,
                robot.joint_names,
                robot.cameras,
            )
            log.info("deploy: recording to %s", recorder.root)
        runner = DeployRunner(
            robot,
            policy,
            cfg.control_hz,
            cfg.episode_s,
            cfg.num_episodes,
            cfg.task,
            cfg.safety,
            cfg.chunk,
            cfg.dry_run,
            recorder,
            events,
            estop,
            teleop,
            hooks,
            cfg.policy.mode,
            cfg.policy.device,
        )
        t1 = time.monotonic()
        report = runner.run()
        log.info("deploy: run finished in %.2f s (%s)", time.monotonic() - t1, report.stop_reason or "no fault")
    finally:
        for close in reversed(closers):
            try:
                close()
            except Exception as e:  # noqa: BLE001  (keep closing the rest)
                log.error("deploy: cleanup failed: %s", e)
    if cfg.report_path:
        Path(cfg.report_path).write_text(json.dumps(report.to_dict(), indent=2, default=str))
    return report


def format_report(report: DeployReport) -> str:
    """A short human-readable summary with the timing table (markdown)."""
    lines = [
        f"episodes: {len(report.episodes)} ({', '.join(e.end_reason for e in report.episodes)})",
        f"stop: {report.stop_reason or 'none'}",
        f"commands sent: {report.commands_sent}, holds: {report.holds_sent}{' (dry run)' if report.dry_run else ''}",
        f"violations: {report.violations_by_kind or 'none'}; loop overruns: {report.overruns}",
        "",
        TABLE_HEADER,
    ]
    lines += [s.row(name) for name, s in report.timing.items()]
    if report.dataset_root:
        lines.append(f"\ndataset: {report.dataset_root}")
    return "\n".join(lines)


def normalize_args(argv: list[str]) -> list[str]:
    """Accept ``--dry-run`` (bare or ``=value``) as draccus's ``--dry_run=true``."""
    out = []
    for arg in argv:
        if arg == "--dry-run":
            out.append("--dry_run=true")
        elif arg.startswith("--dry-run="):
            out.append("--dry_run=" + arg.split("=", 1)[1])
        else:
            out.append(arg)
    return out


def parse_config(argv: list[str]) -> DeployConfig:
    """Parse command-line overrides (and ``--config_path file.yaml``) into a :class:`DeployConfig`.

    Raises:
        ValueError: with the validating field's own message (draccus hides it behind "Couldn't instantiate").
        SystemExit: for unknown keys (argparse prints the valid ones).
    """
    from draccus.utils import DraccusException

    from hardware.lerobot_adapter import register_lerobot_devices

    register_lerobot_devices()
    try:
        return draccus.parse(DeployConfig, args=normalize_args(argv))
    except DraccusException as e:
        cause: BaseException | None = e
        while cause is not None and isinstance(cause, DraccusException):
            cause = cause.__cause__ or cause.__context__
        raise ValueError(f"deploy config: {cause if cause is not None else e}") from e


class DeployInputError(ValueError):
    """The deploy command's input cannot work: a config value or file, the policy folder or its type (the
    ``vla-rl`` CLI reports it in one line with exit code 2)."""


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``vla-rl deploy``; returns 0, or 1 when the run stopped on a fault.

    Raises:
        DeployInputError: for a config or policy folder that cannot work (before the robot is touched).
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        cfg = parse_config(sys.argv[1:] if argv is None else argv)
        if not cfg.policy.path:
            raise ValueError("policy.path is required (a checkpoint folder)")
        policy = load_deploy_policy(cfg.policy.path, cfg.policy.type, cfg.policy.device)
    except (ValueError, FileNotFoundError) as exc:  # the user's input, not a failure of the robot
        raise DeployInputError(str(exc)) from exc
    report = run_deploy(cfg, policy=policy)
    print(format_report(report))
    return 1 if report.stop_reason else 0


if __name__ == "__main__":
    sys.exit(main())
