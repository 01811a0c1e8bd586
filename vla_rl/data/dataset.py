"""Any LeRobotDataset on disk as policy training data: features matched to a policy's inputs by name.

A dataset written by ``vla-rl collect`` or by LeRobot's own recording tools
carries LeRobot's feature names; a policy reads ``observation.images.<cam>``
for each of its cameras, ``observation.state``, ``task`` and predicts
``action``. :func:`load_chunks` reads exactly those features (plus
LeRobot's ``intervention`` flag (or its older name ``is_intervention``), our
``intervention_label``, ``next.reward`` and ``next.success`` when the dataset
has them), checks their shapes against the policy's, and chunks the frames
(:func:`vla_rl.data.chunks.make_chunks`). :func:`dataset_spec` reads the
policy-sizing fields from the dataset's ``meta/info.json`` alone, so a fresh
policy can be built for a dataset without an env.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from sim.core import EnvSpec, TensorSpec
from sim.dataset import verify_dataset
from vla_core.keys import (
    ACTION,
    INTERVENTION,
    INTERVENTION_LABEL,
    LEGACY_INTERVENTION,
    OBS_ENV_STATE,
    OBS_IMAGE_PREFIX,
    OBS_STATE,
    REWARD,
    SUCCESS,
    TASK,
    image_key,
)
from vla_rl.config import ConfigError
from vla_rl.data.chunks import ChunkDataset, make_chunks

IMAGE_DTYPES = ("image", "video")
"""LeRobot feature dtypes of camera streams."""


class DatasetError(ConfigError):
    """A dataset that cannot train the policy: not a LeRobotDataset, a missing feature, a shape mismatch.

    The message names the dataset folder, the feature and, for a mismatch, both shapes.
    """


@dataclass(frozen=True)
class DatasetSpec:
    """What a LeRobotDataset holds, from its ``meta/info.json`` (no frame is read)."""

    root: Path
    """The dataset folder."""
    fps: float
    """Frames per second of the recording."""
    episodes: int
    """Episodes in the dataset."""
    frames: int
    """Frames in the dataset."""
    action_dim: int
    """A, the size of ``action``."""
    state_dim: int | None
    """S, the size of ``observation.state``; None when the dataset has none."""
    cameras: tuple[str, ...]
    """Camera names, in feature order (features ``observation.images.<cam>``)."""
    image_sizes: dict[str, tuple[int, int]] = field(default_factory=dict)
    """``(H, W)`` of each camera."""
    extras: tuple[str, ...] = ()
    """Which of ``intervention`` / ``is_intervention``, ``intervention_label``, ``next.reward``, ``next.success``
    the dataset records."""
    env_state_dim: int | None = None
    """P, the size of the privileged ``observation.env_state``; None when the dataset has none (recorded by
    ``vla-rl collect`` since the ``gaussian-mlp`` policy, which reads it)."""

    @property
    def image_size(self) -> tuple[int, int] | None:
        """``(H, W)`` of the first camera (policies take one size for all), None without cameras."""
        return self.image_sizes[self.cameras[0]] if self.cameras else None

    def env_spec(self) -> EnvSpec:
        """An :class:`~sim.core.EnvSpec` with the dataset's observation and action shapes (id: the folder),
        for code that sizes a policy from an env spec (:func:`vla_rl.policy_factory.build_policy`, whose
        :func:`~vla_rl.policy_factory.spec_fields` reads ``action_dim``, ``state_dim``, ``cameras``, ``image_size``)."""
        obs = {image_key(c): TensorSpec((*self.image_sizes[c], 3), torch.uint8) for c in self.cameras}
        if self.state_dim is not None:
            obs[OBS_STATE] = TensorSpec((self.state_dim,), torch.float32)
        if self.env_state_dim is not None:
            obs[OBS_ENV_STATE] = TensorSpec((self.env_state_dim,), torch.float32)
        return EnvSpec(env_id=str(self.root), observation=obs, action=TensorSpec((self.action_dim,), torch.float32),
                       max_episode_steps=0, control_freq=float(self.fps), cameras=self.cameras)


@dataclass(frozen=True)
class PolicyInputs:
    """What a policy reads and predicts; a None field is not checked."""

    cameras: tuple[str, ...]
    """Cameras it reads (``observation.images.<cam>``)."""
    image_size: tuple[int, int] | None
    """``(H, W)`` it expects of every camera."""
    state_dim: int | None
    """S of ``observation.state``."""
    action_dim: int | None
    """A of ``action``."""
    env_state_dim: int | None = None
    """P of ``observation.env_state`` when the policy's actor reads it (``policy.reads_env_state``), else None."""


def policy_inputs(policy: Any) -> PolicyInputs:
    """The inputs of ``policy`` by the conventional field names (``cameras``, ``image_size``, ``state_dim``,
    ``action_dim``): an attribute of the policy itself wins over the field of its ``config``; a name found in
    neither is left unchecked (None)."""
    config = getattr(policy, "config", None)

    def read(name: str) -> Any:
        value = getattr(policy, name, None)
        return getattr(config, name, None) if value is None else value

    cameras, size, state, action = read("cameras"), read("image_size"), read("state_dim"), read("action_dim")
    env_state = read("env_state_dim") if getattr(policy, "reads_env_state", False) else None
    return PolicyInputs(
        cameras=tuple(cameras or ()), image_size=tuple(size) if size else None,  # type: ignore[arg-type]
        state_dim=int(state) if state is not None else None, action_dim=int(action) if action is not None else None,
        env_state_dim=int(env_state) if env_state is not None else None,
    )


def _info(root: Path) -> dict[str, Any]:
    path = root / "meta" / "info.json"
    if not path.is_file():
        raise DatasetError(f"{root} is not a LeRobotDataset (no meta/info.json); record one with `vla-rl collect` "
                           "or LeRobot's tools")
    verify_dataset(root, hashes=False)  # sizes: a truncated or empty file is named here (load_dataset hashes too)
    try:
        info = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except (UnicodeDecodeError, OSError) as exc:
        raise DatasetError(f"{path}: unreadable ({exc})") from None
    if not isinstance(info, dict):
        raise DatasetError(f"{path}: expected a JSON object (LeRobot's dataset info)")
    if not isinstance(info.get("features"), dict):
        raise DatasetError(f"{path} lists no features")
    return info


def _hw(key: str, feature: dict[str, Any]) -> tuple[int, int]:
    """``(H, W)`` of an image feature, whether LeRobot stored its shape channels-last or channels-first."""
    shape = tuple(feature.get("shape") or ())
    names = list(feature.get("names") or [])
    if len(shape) != 3:
        raise DatasetError(f"feature {key!r}: an image shape must be (H, W, 3), got {shape}")
    if (names and names[0] in ("channels", "channel", "c")) or (not names and shape[0] == 3 and shape[-1] != 3):
        return int(shape[1]), int(shape[2])
    return int(shape[0]), int(shape[1])


def _flat_dim(root: Path, key: str, feature: dict[str, Any]) -> int:
    shape = tuple(feature.get("shape") or ())
    if len(shape) != 1:
        raise DatasetError(f"{root}: feature {key!r} must be a vector (D,), got shape {shape}")
    return int(shape[0])


def dataset_spec(root: str | Path) -> DatasetSpec:
    """Read what the LeRobotDataset at ``root`` holds (:class:`DatasetSpec`) from its metadata.

    Raises:
        DatasetError: naming ``root`` when it is not a LeRobotDataset or has no ``action`` feature.
        IntegrityError: naming a file that is missing, truncated or malformed (:func:`sim.dataset.verify_dataset`,
            sizes only).
    """
    root = Path(root)
    info = _info(root)
    feats: dict[str, dict[str, Any]] = info["features"]
    if ACTION not in feats:
        raise DatasetError(f"{root}: the dataset has no feature {ACTION!r}; its features are {sorted(feats)}")
    cams = tuple(k[len(OBS_IMAGE_PREFIX):] for k, f in feats.items()
                 if k.startswith(OBS_IMAGE_PREFIX) and f.get("dtype") in IMAGE_DTYPES)
    return DatasetSpec(
        root=root, fps=float(info.get("fps") or 0), episodes=int(info.get("total_episodes") or 0),
        frames=int(info.get("total_frames") or 0), action_dim=_flat_dim(root, ACTION, feats[ACTION]),
        state_dim=_flat_dim(root, OBS_STATE, feats[OBS_STATE]) if OBS_STATE in feats else None,
        env_state_dim=_flat_dim(root, OBS_ENV_STATE, feats[OBS_ENV_STATE]) if OBS_ENV_STATE in feats else None,
        cameras=cams, image_sizes={c: _hw(image_key(c), feats[image_key(c)]) for c in cams},
        extras=tuple(k for k in (INTERVENTION, LEGACY_INTERVENTION, INTERVENTION_LABEL, REWARD, SUCCESS) if k in feats),
    )


def check_inputs(spec: DatasetSpec, inputs: PolicyInputs) -> None:
    """Check that the dataset has every feature the policy reads, in the policy's shapes.

    Raises:
        DatasetError: one line naming the dataset folder and the missing feature, or the feature with its
            dataset shape and the policy's shape.
    """
    root = spec.root
    wanted = [image_key(c) for c in inputs.cameras] + ([OBS_STATE] if inputs.state_dim is not None else [])
    wanted += [OBS_ENV_STATE] if inputs.env_state_dim is not None else []
    have = set(spec.env_spec().observation)
    for key in wanted:
        if key not in have:
            hint = (" (record the dataset again with `vla-rl collect` from an env that provides it, e.g. "
                    "mujoco/pick-any)" if key == OBS_ENV_STATE else "")
            raise DatasetError(f"{root}: the dataset has no feature {key!r}, which the policy reads "
                               f"(the dataset's observation features: {sorted(have) or 'none'}){hint}")

    def mismatch(key: str, got: tuple[int, ...], want: tuple[int, ...]) -> DatasetError:
        return DatasetError(f"{root}: feature {key!r} has shape {got} in the dataset but the policy expects {want}")

    if inputs.action_dim is not None and spec.action_dim != inputs.action_dim:
        raise mismatch(ACTION, (spec.action_dim,), (inputs.action_dim,))
    if inputs.state_dim is not None and spec.state_dim != inputs.state_dim:
        raise mismatch(OBS_STATE, (spec.state_dim,), (inputs.state_dim,))  # type: ignore[arg-type]
    if inputs.env_state_dim is not None and spec.env_state_dim != inputs.env_state_dim:
        raise mismatch(OBS_ENV_STATE, (spec.env_state_dim,), (inputs.env_state_dim,))  # type: ignore[arg-type]
    for cam in inputs.cameras:
        if inputs.image_size is not None and spec.image_sizes[cam] != tuple(inputs.image_size):
            raise mismatch(image_key(cam), (*spec.image_sizes[cam], 3), (*inputs.image_size, 3))


def load_chunks(root: str | Path, inputs: PolicyInputs, horizon: int, episodes: int = 0,
                split_rule: str = "correction", recovery_steps: int = 5) -> ChunkDataset:
    """Read the frames of the LeRobotDataset at ``root`` that ``inputs`` needs into a :class:`ChunkDataset`.

    Reads the cameras the policy reads (as uint8 ``[N, H, W, 3]``), ``observation.state``, ``task``,
    ``observation.env_state`` when the policy's actor reads it,
    ``action``, and ``intervention`` (or ``is_intervention``) / ``intervention_label`` / ``next.reward`` /
    ``next.success`` when recorded; any other feature is ignored. Step labels (``label``): the dataset's
    ``intervention_label`` when it has one; else, with an intervention flag, policy steps and takeovers split
    by ``split_rule`` (:func:`vla_rl.intervention.labels.labels_from_flags`); else None (plain demos).

    Args:
        root: the dataset folder.
        inputs: what the policy reads (:func:`policy_inputs`); checked first (:func:`check_inputs`).
        horizon: H, the policy's chunk size.
        episodes: use only episodes ``0 .. episodes - 1``; 0 = every frame of the dataset.
        split_rule, recovery_steps: how unlabelled intervention steps become labels.

    Raises:
        DatasetError: for a folder that is no LeRobotDataset, a missing feature or a shape mismatch (naming
            the folder, the feature and both shapes), or fewer episodes than ``episodes``.
    """
    from sim.dataset import load_dataset

    spec = dataset_spec(root)
    check_inputs(spec, inputs)
    if episodes < 0 or (episodes and episodes > spec.episodes):
        raise DatasetError(f"{spec.root}: asked for {episodes} episodes, the dataset has {spec.episodes}")
    keep = episodes or spec.episodes
    images = {image_key(c) for c in inputs.cameras}
    read = images | {OBS_STATE, TASK, ACTION, *spec.extras} | ({OBS_ENV_STATE} if inputs.env_state_dim else set())
    try:
        ds = load_dataset(root)
        items = (ds[i] for i in range(len(ds)))
    except Exception as exc:  # noqa: BLE001  (pyarrow / datasets errors on a damaged file: name the folder)
        raise _read_error(spec.root, exc) from None
    frames: dict[str, list] = {}
    ep_of: list[int] = []
    for item in _checked(items, spec.root):
        ep = int(item["episode_index"])
        if episodes and ep >= keep:
            continue
        ep_of.append(ep)
        for k, v in item.items():
            if k in images:
                v = (v.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0)  # CHW float -> HWC uint8
            elif k not in read:
                continue
            frames.setdefault(k, []).append(v)
    if not ep_of:
        raise DatasetError(f"{spec.root}: no frames in the first {keep} episodes")

    def column(key: str, dtype: torch.dtype) -> torch.Tensor | None:
        return torch.stack([torch.as_tensor(v).reshape(()) for v in frames[key]]).to(dtype) if key in frames else None

    skip = {ACTION, *spec.extras}
    obs: dict[str, Any] = {k: (v if k == TASK else torch.stack(v)) for k, v in frames.items() if k not in skip}
    eps = torch.tensor(ep_of)
    flags = column(INTERVENTION, torch.bool)
    if flags is None:
        flags = column(LEGACY_INTERVENTION, torch.bool)
    labels = column(INTERVENTION_LABEL, torch.long)
    if labels is None and flags is not None:
        from vla_rl.intervention.labels import labels_from_flags

        z = obs[OBS_STATE][:, 2] if split_rule == "retreat" and OBS_STATE in obs else None
        labels = labels_from_flags(flags, eps, split_rule, recovery_steps, z)
    if labels is not None and flags is None:
        flags = labels > 0
    return make_chunks(obs, torch.stack(frames[ACTION]), eps, horizon,
                       intervention=flags, reward=column(REWARD, torch.float32),
                       success=column(SUCCESS, torch.bool), label=labels)


def load_policy_chunks(root: str | Path, policy: Any, episodes: int = 0, split_rule: str = "correction",
                       recovery_steps: int = 5) -> ChunkDataset:
    """:func:`load_chunks` for ``policy``: its inputs (:func:`policy_inputs`) and its chunk size as the horizon."""
    return load_chunks(root, policy_inputs(policy), policy.chunk_size, episodes, split_rule, recovery_steps)


def _checked(items: Any, root: Path) -> Any:
    """``items``, with an error while reading a frame (a truncated data file) raised as :class:`DatasetError`."""
    it = iter(items)
    while True:
        try:
            item = next(it)
        except StopIteration:
            return
        except Exception as exc:  # noqa: BLE001  (pyarrow / datasets errors on a damaged file: name the folder)
            raise _read_error(root, exc) from None
        yield item


def _read_error(root: Path, exc: Exception) -> DatasetError:
    first = str(exc).splitlines()[0] if str(exc) else ""
    return DatasetError(f"{root}: cannot read the dataset's frames ({type(exc).__name__}: {first}); "
                        "is a file truncated?")
