"""``DeployConfig`` parsing, policy loading by path, transport selection, and message conversions."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from hardware.deploy import DeployConfig, load_deploy_policy, make_adapter, normalize_args, parse_config, run_deploy
from hardware.lerobot_adapter import LeRobotAdapter
from hardware.ros2.config import CommandType, Ros2RobotConfig
from hardware.ros2.convert import MessageError, decode_compressed, decode_image, encode_compressed, joint_index, resize
from hardware.safety import OnViolation
from hardware.scheduling import ChunkMode
from hardware.testing import TinyJointPolicy
from policies.base import ActMode
from sim.core import OBS_STATE, TASK


def test_parses_a_ros2_deploy_command_line():
    cfg = parse_config(
        [
            "--robot.type=ros2",
            "--robot.joint_names=[a,b]",
            "--robot.command_type=position",
            "--robot.cameras={wrist: {topic: /wrist/image_raw/compressed, compressed: true, width: 32, height: 24}}",
            "--policy.path=/ckpt",
            "--safety.max_delta=[0.05]",
            "--safety.on_jump=stop",
            "--chunk.mode=blend",
            "--control_hz=50",
            "--dry-run",
        ]
    )
    assert isinstance(cfg.robot, Ros2RobotConfig) and cfg.robot.command_type is CommandType.POSITION
    assert cfg.robot.cameras["wrist"].compressed and cfg.robot.cameras["wrist"].height == 24
    assert cfg.dry_run and cfg.control_hz == 50 and cfg.chunk.mode is ChunkMode.BLEND
    assert cfg.safety.on_jump is OnViolation.STOP and cfg.safety.max_delta == [0.05]


def test_parses_lerobot_robot_and_teleop_types(tmp_path):
    cfg = parse_config(
        [
            "--robot.type=so101_follower",
            "--robot.port=/dev/ttyACM0",
            f"--robot.calibration_dir={tmp_path}",
            "--teleop.type=so101_leader",
            "--teleop.port=/dev/ttyACM1",
            "--policy.path=x",
        ]
    )
    # LeRobot registers one config class for so100/so101 (same driver); its .type reports the first name
    assert cfg.robot.type in ("so100_follower", "so101_follower") and cfg.robot.port == "/dev/ttyACM0"
    assert cfg.teleop.type in ("so100_leader", "so101_leader") and cfg.teleop.port == "/dev/ttyACM1"
    try:
        adapter = make_adapter(cfg.robot)
    except ImportError as e:  # the Feetech SDK is LeRobot's optional extra 'feetech'
        assert "robot.type" in str(e) and "lerobot[feetech]" in str(e)
    else:
        assert isinstance(adapter, LeRobotAdapter) and adapter.joint_names[0] == "shoulder_pan.pos"


def test_unknown_key_and_bad_values_name_the_field():
    with pytest.raises(SystemExit):
        parse_config(["--robot.type=ros2", "--robot.joint_names=[a]", "--robot.bogus=1"])
    with pytest.raises(Exception, match="robot.joint_names is required"):
        parse_config(["--robot.type=ros2"])
    with pytest.raises(Exception, match="control_hz must be > 0"):
        parse_config(["--robot.type=mujoco_arm", "--control_hz=0"])
    with pytest.raises(Exception, match=r"robot.cameras.c: width and height"):
        Ros2RobotConfig(
            joint_names=["a"],
            cameras={"c": __import__("hardware.ros2.config", fromlist=["x"]).RosCameraConfig(topic="/c")},
        )


def test_normalize_args_accepts_dashed_dry_run():
    assert normalize_args(["--dry-run", "--dry-run=false", "--x=1"]) == ["--dry_run=true", "--dry_run=false", "--x=1"]


def test_load_deploy_policy_by_saved_type(tmp_path):
    policy = TinyJointPolicy.build(4, 3, chunk_size=5, seed=3)
    policy.save_pretrained(tmp_path / "ckpt")
    assert json.loads((tmp_path / "ckpt" / "config.json").read_text())["type"] == "tiny-joint"
    loaded = load_deploy_policy(tmp_path / "ckpt")
    obs = {OBS_STATE: torch.randn(2, 4), TASK: ["a", "b"]}
    a = policy.act(obs, ActMode.EVAL).actions
    b = loaded.act(obs, ActMode.EVAL).actions
    assert a.shape == (2, 5, 3) and torch.equal(a, b)
    # explore mode: log-prob recomputed by evaluate matches
    out = loaded.act(obs, ActMode.EXPLORE)
    logp, _, _ = loaded.evaluate(obs, out.extras)
    torch.testing.assert_close(logp, out.logp)


def test_load_deploy_policy_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="policy.path .* no config.json"):
        load_deploy_policy(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="missing the string key 'type'.*--policy.type"):
        load_deploy_policy(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"type": "no-such-policy"}))
    with pytest.raises(ValueError, match="unknown policy 'no-such-policy'.*tiny-joint"):
        load_deploy_policy(tmp_path)


def test_run_deploy_via_config_on_the_simulated_lerobot_arm(tmp_path):
    TinyJointPolicy.build(6, 6, chunk_size=5, max_step=0.005).save_pretrained(tmp_path / "tiny")
    cfg = parse_config(
        [
            "--robot.type=mujoco_arm",
            "--robot.camera_names=[]",
            f"--robot.calibration_dir={tmp_path}/calib",
            f"--policy.path={tmp_path}/tiny",
            "--control_hz=20",
            "--episode_s=0.5",
            "--safety.max_delta=[0.01]",
            "--keyboard=false",
            f"--report_path={tmp_path}/report.json",
        ]
    )
    assert isinstance(cfg, DeployConfig)
    report = run_deploy(cfg)
    assert report.stop_reason == "" and report.commands_sent > 0
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["timing"]["period"]["n"] > 3


def test_image_decoding_covers_driver_encodings():
    rgb = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    np.testing.assert_array_equal(decode_image(2, 3, "rgb8", 9, rgb.tobytes()), rgb)
    np.testing.assert_array_equal(decode_image(2, 3, "bgr8", 9, rgb[:, :, ::-1].tobytes()), rgb)
    padded = np.zeros((2, 16), np.uint8)  # row stride with padding
    padded[:, :12] = np.dstack([rgb, np.full((2, 3, 1), 255, np.uint8)]).reshape(2, 12)
    np.testing.assert_array_equal(decode_image(2, 3, "rgba8", 16, padded.tobytes()), rgb)
    mono = decode_image(2, 3, "mono8", 3, bytes(range(6)))
    assert mono.shape == (2, 3, 3) and (mono[..., 0] == mono[..., 2]).all()
    with pytest.raises(MessageError, match="unsupported image encoding '16UC1'"):
        decode_image(2, 3, "16UC1", 6, bytes(12))
    with pytest.raises(MessageError, match="too small"):
        decode_image(2, 3, "rgb8", 9, bytes(10))


def test_compressed_roundtrip_and_resize():
    img = np.zeros((32, 48, 3), np.uint8)
    img[:, :24, 0] = 255  # red left half
    out = decode_compressed("png", encode_compressed(img, "png"))
    np.testing.assert_array_equal(out, img)
    jpg = decode_compressed("jpeg", encode_compressed(img, "jpeg"))
    assert jpg[16, 5, 0] > 200 and jpg[16, 40, 0] < 50  # channel order survives
    assert resize(img, 16, 24).shape == (16, 24, 3)
    with pytest.raises(MessageError, match="does not decode"):
        decode_compressed("jpeg", b"not an image")


def test_joint_index_reorders_and_detects_missing():
    assert joint_index(["c", "a", "b"], ["a", "b", "c"]) == [1, 2, 0]
    assert joint_index(["a"], ["a", "b"]) is None
