"""Conversions between ROS 2 messages and numpy (images, joint order, trajectories).

The numpy halves are pure functions, testable without rclpy; the message
halves take and return message objects.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# encoding -> (channels, channel order to RGB) for the encodings camera drivers publish
_ENCODINGS: dict[str, tuple[int, tuple[int, ...] | None]] = {
    "rgb8": (3, (0, 1, 2)),
    "bgr8": (3, (2, 1, 0)),
    "rgba8": (4, (0, 1, 2)),
    "bgra8": (4, (2, 1, 0)),
    "mono8": (1, None),
    "8UC1": (1, None),
    "8UC3": (3, (0, 1, 2)),
}


class MessageError(ValueError):
    """A message that cannot be converted (unknown encoding, wrong size, missing joints)."""


def decode_image(height: int, width: int, encoding: str, step: int, data: bytes | Sequence[int]) -> np.ndarray:
    """A raw ``sensor_msgs/Image`` payload -> ``uint8 [H, W, 3]`` RGB.

    Raises:
        MessageError: for an unsupported encoding or a payload of the wrong size.
    """
    if encoding not in _ENCODINGS:
        raise MessageError(f"unsupported image encoding {encoding!r}; supported: {', '.join(_ENCODINGS)}")
    channels, order = _ENCODINGS[encoding]
    buf = np.frombuffer(bytes(data) if not isinstance(data, (bytes, bytearray, memoryview)) else data, dtype=np.uint8)
    row = width * channels
    if step < row or buf.size < step * height:
        raise MessageError(f"image {width}x{height} {encoding}: step {step}, {buf.size} bytes is too small")
    img = buf[: step * height].reshape(height, step)[:, :row].reshape(height, width, channels)
    if order is None:
        return np.repeat(img, 3, axis=2)
    return np.ascontiguousarray(img[:, :, list(order)])


def decode_compressed(fmt: str, data: bytes | Sequence[int]) -> np.ndarray:
    """A ``sensor_msgs/CompressedImage`` payload (JPEG / PNG) -> ``uint8 [H, W, 3]`` RGB.

    Raises:
        MessageError: if the bytes do not decode.
    """
    import cv2

    buf = np.frombuffer(bytes(data) if not isinstance(data, (bytes, bytearray, memoryview)) else data, dtype=np.uint8)
    bgr = cv2.imdecode(buf, cv2.IMREAD_COLOR)
    if bgr is None:
        raise MessageError(f"compressed image (format {fmt!r}, {buf.size} bytes) does not decode")
    return np.ascontiguousarray(bgr[:, :, ::-1])


def encode_compressed(rgb: np.ndarray, fmt: str = "jpeg", quality: int = 90) -> bytes:
    """``uint8 [H, W, 3]`` RGB -> JPEG or PNG bytes (for the simulated camera)."""
    import cv2

    ext = ".png" if fmt == "png" else ".jpg"
    params = [cv2.IMWRITE_JPEG_QUALITY, quality] if ext == ".jpg" else []
    ok, out = cv2.imencode(ext, np.ascontiguousarray(rgb[:, :, ::-1]), params)
    if not ok:
        raise MessageError(f"cannot encode image as {fmt}")
    return out.tobytes()


def resize(img: np.ndarray, height: int, width: int) -> np.ndarray:
    """Resize ``[H, W, 3]`` to ``[height, width, 3]`` (area interpolation); no-op if already that size."""
    if img.shape[0] == height and img.shape[1] == width:
        return img
    import cv2

    return cv2.resize(img, (width, height), interpolation=cv2.INTER_AREA)


def joint_index(msg_names: Sequence[str], wanted: Sequence[str]) -> list[int] | None:
    """Positions of ``wanted`` joints in a message's name list, or None if any is missing."""
    where = {n: i for i, n in enumerate(msg_names)}
    try:
        return [where[n] for n in wanted]
    except KeyError:
        return None


def stamp_to_seconds(stamp: object) -> float:
    """A ``builtin_interfaces/Time`` -> float seconds."""
    return float(stamp.sec) + 1e-9 * float(stamp.nanosec)  # type: ignore[attr-defined]


def seconds_to_duration(seconds: float, msg_type: type) -> object:
    """Float seconds -> a ``builtin_interfaces/Duration`` (or ``Time``) message of ``msg_type``."""
    sec = int(np.floor(seconds))
    return msg_type(sec=sec, nanosec=round((seconds - sec) * 1e9) % 1_000_000_000)


def build_trajectory(
    msg_cls: type, point_cls: type, duration_cls: type, joint_names: Sequence[str], targets: np.ndarray, dt: float
) -> object:
    """A ``trajectory_msgs/JointTrajectory`` with point ``i`` due at ``(i + 1) * dt``."""
    msg = msg_cls()
    msg.joint_names = list(joint_names)
    points = []
    for i, q in enumerate(np.asarray(targets, dtype=np.float64)):
        p = point_cls()
        p.positions = [float(x) for x in q]
        p.time_from_start = seconds_to_duration((i + 1) * dt, duration_cls)
        points.append(p)
    msg.points = points
    return msg


def trajectory_points(msg: object, joint_names: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """``(times [n], positions [n, A])`` of a JointTrajectory, reordered to ``joint_names``.

    Raises:
        MessageError: if the message lacks one of ``joint_names`` or a point has the wrong length.
    """
    idx = joint_index(msg.joint_names, joint_names)  # type: ignore[attr-defined]
    if idx is None:
        missing = sorted(set(joint_names) - set(msg.joint_names))  # type: ignore[attr-defined]
        raise MessageError(f"trajectory lacks joint(s) {missing}")
    times, pos = [], []
    for k, p in enumerate(msg.points):  # type: ignore[attr-defined]
        if len(p.positions) != len(msg.joint_names):  # type: ignore[attr-defined]
            raise MessageError(
                f"trajectory point {k} has {len(p.positions)} positions for {len(msg.joint_names)} joints"
            )  # type: ignore[attr-defined]
        times.append(stamp_to_seconds(p.time_from_start))
        pos.append([p.positions[i] for i in idx])
    return np.asarray(times, dtype=np.float64), np.asarray(pos, dtype=np.float64).reshape(len(times), len(joint_names))
