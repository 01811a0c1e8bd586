"""Shared input/output helpers for policies: observation checks and checkpoint files.

Observation keys mirror LeRobot's (and :mod:`sim.core`'s; ``policies`` does not
import ``sim``): ``observation.images.<camera>`` ``uint8 [B, H, W, 3]``,
``observation.state`` ``float32 [B, S]``, ``task`` a list of B strings.

A checkpoint folder holds ``config.json`` (the policy config plus ``"type"``,
the :data:`policies.registry.POLICIES` name) and ``model.safetensors``; it is
written to a temporary sibling folder and renamed into place, so a crash never
leaves a half-written checkpoint. Every folder written through
:func:`atomic_directory` gets a ``manifest.json`` (:mod:`vla_core.manifest`) before
the rename; :func:`verify_policy_folder` checks it (or, for a folder without one,
the JSON and safetensors files alone) and names the damaged file.
:func:`checkpoint_type` reads ``"type"``; :func:`policies.loading.load_policy`
dispatches on it through the registry.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import draccus
import torch
from safetensors.torch import load_file, save_file

from vla_core.keys import OBS_ENV_STATE, OBS_IMAGE_PREFIX, OBS_STATE, TASK  # noqa: F401  (re-exported)
from vla_core.manifest import IntegrityError, check_safetensors, fsync_dir, verify_manifest, write_manifest

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"

C = TypeVar("C")


class ObservationError(ValueError):
    """An observation batch that does not match what the policy was built for."""


class CheckpointError(ValueError):
    """A checkpoint folder that is missing, misses files, holds damaged files or another policy type."""


def image_key(camera: str) -> str:
    """The observation key of camera ``camera``."""
    return OBS_IMAGE_PREFIX + camera


def checkpoint_config(path: str | Path) -> dict[str, Any]:
    """The ``config.json`` of checkpoint folder ``path`` as a dict, without loading weights; empty when the folder
    has no readable JSON object there (loading the checkpoint is what reports that)."""
    try:
        data = json.loads((Path(path) / CONFIG_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def read_json_file(path: str | Path) -> Any:
    """The parsed JSON of file ``path``.

    Raises:
        CheckpointError: naming the file, and the line and column for malformed JSON (one sentence).
    """
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except UnicodeDecodeError:
        raise CheckpointError(f"{path}: not valid JSON (not UTF-8 text; a corrupted file?)") from None
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot be read ({exc.strerror or exc})") from None


def verify_policy_folder(directory: str | Path) -> bool:
    """Check a policy folder before loading it, naming the file at fault.

    A folder with a ``manifest.json`` is checked against it (sizes and sha256 of every file). Without one
    (written before manifests, or by another tool) each ``*.json`` file at its top level must parse and each
    ``*.safetensors`` file must be as long as its header says.

    Returns:
        True when a manifest verified the folder; False when it has none (checked file by file only).

    Raises:
        CheckpointError: for a missing folder, or a file that is missing, truncated, altered or malformed.
    """
    folder = Path(directory)
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: no such policy folder" if not folder.exists() else
                              f"{folder}: not a folder; a policy checkpoint is a folder with {CONFIG_FILE}")
    try:
        verified = verify_manifest(folder)
        if not verified:
            for path in sorted(folder.glob("*.safetensors")):
                check_safetensors(path)
    except IntegrityError as exc:
        raise CheckpointError(str(exc)) from None
    for path in sorted(folder.glob("*.json")):
        read_json_file(path)
    return verified


def checkpoint_cameras(path: str | Path) -> tuple[str, ...] | None:
    """The cameras the policy in checkpoint folder ``path`` reads, from its ``config.json`` (no weights loaded).

    Ours save ``"cameras"``; LeRobot's list ``observation.images.<camera>`` in ``"input_features"``.
    None when the folder has no readable config or it names no cameras.
    """
    data = checkpoint_config(path)
    if isinstance(data.get("cameras"), list):
        return tuple(str(c) for c in data["cameras"])
    features = data.get("input_features")
    if isinstance(features, dict):
        return tuple(k.removeprefix(OBS_IMAGE_PREFIX) for k in features if k.startswith(OBS_IMAGE_PREFIX)) or None
    return None


def check_observation(
    obs: dict[str, Any],
    cameras: Sequence[str],
    image_size: tuple[int, int] | None,
    state_dim: int,
    policy: str,
) -> int:
    """Validate an observation batch and return its batch size B.

    Args:
        obs: the observation dict.
        cameras: camera names the policy expects (keys ``observation.images.<cam>``).
        image_size: expected ``(H, W)``, or None to accept any size.
        state_dim: expected S of ``observation.state``.
        policy: name used in error messages.

    Raises:
        ObservationError: naming the missing keys, the expected keys, and the
            expected vs given shapes / dtypes.
    """
    expected = [image_key(c) for c in cameras] + [OBS_STATE, TASK]
    missing = [k for k in expected if k not in obs]
    if missing:
        raise ObservationError(
            f"{policy}: observation lacks key(s) {missing}; expected keys {expected} "
            f"(got {sorted(obs)}). Configure the policy's cameras to match the env's."
        )
    state = obs[OBS_STATE]
    if not isinstance(state, torch.Tensor) or state.ndim != 2 or state.shape[1] != state_dim:
        got = list(state.shape) if isinstance(state, torch.Tensor) else type(state).__name__
        raise ObservationError(f"{policy}: {OBS_STATE} must be float [B, {state_dim}], got {got}")
    b = state.shape[0]
    tasks = obs[TASK]
    if isinstance(tasks, str) or len(tasks) != b:
        raise ObservationError(f"{policy}: {TASK} must be a list of {b} strings (one per env), got {tasks!r:.80}")
    for cam in cameras:
        key = image_key(cam)
        img = obs[key]
        h, w = image_size if image_size is not None else (None, None)
        shape_ok = isinstance(img, torch.Tensor) and img.ndim == 4 and img.shape[0] == b and img.shape[3] == 3
        if shape_ok and image_size is not None:
            shape_ok = tuple(img.shape[1:3]) == (h, w)
        if not shape_ok:
            got = list(img.shape) if isinstance(img, torch.Tensor) else type(img).__name__
            want = f"[{b}, {h if h else 'H'}, {w if w else 'W'}, 3]"
            raise ObservationError(f"{policy}: {key} must be uint8 {want} (B, H, W, RGB), got {got}")
        if img.dtype != torch.uint8:
            raise ObservationError(f"{policy}: {key} must have dtype uint8 (0-255 RGB), got {img.dtype}")
    return b


def config_to_dict(config: Any, type_name: str) -> dict[str, Any]:
    """Encode a config dataclass as a JSON-ready dict with ``"type": type_name`` first."""
    encoded = json.loads(json.dumps(draccus.encode(config)))
    return {"type": type_name, **encoded}


def config_from_dict(cls: type[C], data: dict[str, Any], type_name: str, where: str) -> C:
    """Decode ``data`` (as written by :func:`config_to_dict`) into ``cls``.

    Raises:
        CheckpointError: if ``data["type"]`` is not ``type_name`` or a key is unknown.
    """
    data = dict(data)
    found = data.pop("type", None)
    if found != type_name:
        raise CheckpointError(f"{where}: config type is {found!r}, expected {type_name!r}")
    try:
        return draccus.decode(cls, data)
    except Exception as e:  # draccus raises its own DecodingError subclasses
        raise CheckpointError(f"{where}: cannot decode {cls.__name__}: {e}") from e


@contextlib.contextmanager
def atomic_directory(directory: str | Path) -> Iterator[Path]:
    """Yield a temporary sibling folder that replaces ``directory`` when the block succeeds.

    An existing ``directory`` is moved aside first and deleted after the swap; if
    the block raises, the temporary folder is removed and ``directory`` is untouched.
    Before the swap the folder gets its ``manifest.json`` (every file fsync'ed, the
    manifest written last, see :func:`vla_core.manifest.write_manifest`); after it the
    parent folder is fsync'ed, so the rename itself survives a power cut.
    """
    target = Path(directory).resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        yield tmp
        write_manifest(tmp)
        old = None
        if target.exists():
            old = target.parent / f".{target.name}.old-{os.getpid()}"
            os.replace(target, old)
        os.replace(tmp, target)
        fsync_dir(target.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def save_tensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Write ``tensors`` (detached, contiguous, on CPU) to a safetensors file."""
    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(path))


def write_checkpoint(directory: str | Path, config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Path:
    """Atomically write ``config.json`` + ``model.safetensors`` to ``directory`` (see :func:`atomic_directory`).

    Returns:
        The checkpoint folder path.
    """
    with atomic_directory(directory) as tmp:
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
        save_tensors(tmp / WEIGHTS_FILE, tensors)
    return Path(directory).resolve()


def read_checkpoint(directory: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Read ``(config dict, tensors)`` from a folder written by :func:`write_checkpoint`.

    Raises:
        CheckpointError: naming the folder and the missing file, or the file that is malformed or truncated.
    """
    folder = Path(directory)
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: no such policy folder")
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (folder / name).is_file():
            raise CheckpointError(f"{folder}: no {name}; is this a vla-rl policy checkpoint folder?")
    config = read_json_file(folder / CONFIG_FILE)
    if not isinstance(config, dict):
        raise CheckpointError(f"{folder / CONFIG_FILE}: expected a JSON object (the policy config)")
    try:
        check_safetensors(folder / WEIGHTS_FILE)
    except IntegrityError as exc:
        raise CheckpointError(str(exc)) from None
    return config, load_file(str(folder / WEIGHTS_FILE))


def read_env_state(obs: dict[str, Any], batch: int, dim: int, policy: str, remedy: str) -> torch.Tensor:
    """The privileged ``observation.env_state`` ``[B, P]`` (float) of an observation batch, for an actor that reads it.

    Raises:
        ObservationError: naming the key when it is absent (with ``remedy``) or not a float ``[batch, dim]`` tensor.
    """
    x = obs.get(OBS_ENV_STATE)
    if x is None:
        raise ObservationError(f"{policy}: observation lacks key {OBS_ENV_STATE!r}, which the actor reads "
                               f"(got {sorted(obs)}); {remedy}")
    if not isinstance(x, torch.Tensor) or tuple(x.shape) != (batch, dim):
        got = list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ObservationError(f"{policy}: {OBS_ENV_STATE} must be float [{batch}, {dim}], got {got}")
    return x.float()


def read_policy_checkpoint(
    config_class: type[C], directory: str | Path, type_name: str, overrides: dict[str, Any]
) -> tuple[C, dict[str, torch.Tensor]]:
    """``(config, tensors)`` of a folder written by :func:`write_checkpoint` for policy type ``type_name``, the
    config decoded into ``config_class`` with ``overrides`` (field values) applied.

    Raises:
        CheckpointError: for a missing or damaged file, or another policy type (see :func:`read_checkpoint`).
    """
    raw, tensors = read_checkpoint(directory)
    config = config_from_dict(config_class, raw, type_name, str(directory))
    return (dataclasses.replace(config, **overrides) if overrides else config), tensors  # type: ignore[type-var]


def load_weights(policy: torch.nn.Module, tensors: dict[str, torch.Tensor], type_name: str, where: str,
                 fresh_ok: tuple[str, ...] = ()) -> None:
    """Load ``tensors`` into ``policy``: every key must fit, except that parameters under a prefix in
    ``fresh_ok`` (a sampler's head new to this checkpoint) may be missing and keep their fresh initialization.

    Raises:
        CheckpointError: naming ``where`` when the weights do not fit the policy built from its config.
    """
    try:
        missing, unexpected = policy.load_state_dict(tensors, strict=False)
        missing = [k for k in missing if not (fresh_ok and k.startswith(fresh_ok))]
        if missing or unexpected:
            raise RuntimeError(f"missing keys {missing[:4]}, unexpected keys {unexpected[:4]}")
    except RuntimeError as e:
        raise CheckpointError(f"{where}: weights do not fit {type_name} built from its config: {e}") from e


def checkpoint_type(directory: str | Path) -> str:
    """The registry name stored under ``"type"`` in ``directory/config.json``.

    Raises:
        CheckpointError: if the folder, the file or the key is missing, or the file is not a JSON object (naming
            its line).
    """
    path = Path(directory) / CONFIG_FILE
    if not Path(directory).is_dir():
        raise CheckpointError(f"{directory}: no such policy folder")
    if not path.is_file():
        raise CheckpointError(f"{directory}: no {CONFIG_FILE}; is this a vla-rl policy checkpoint folder?")
    data = read_json_file(path)
    kind = data.get("type") if isinstance(data, dict) else None
    if not isinstance(kind, str):
        raise CheckpointError(f"{path}: missing the string key 'type' (the policy registry name)")
    return kind
