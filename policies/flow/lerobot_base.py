"""Adapters that run LeRobot's pi0, pi0.5 and SmolVLA through our flow sampler loop.

An adapter wraps three LeRobot objects: the policy (``PI0Policy``,
``PI05Policy`` or ``SmolVLAPolicy``) and its pre/post-processor pipelines
(normalization, tokenization, pi0.5's state-in-prompt, device). It reuses the
model's own prefix embedding, KV-cache prefill and ``denoise_step``; only the
denoising loop is ours (:mod:`policies.flow.sampler`), so the ODE sampler
reproduces LeRobot's ``sample_actions`` exactly while Flow-SDE / Flow-Noise add
tractable log-probs. Action-expert features for the Flow-Noise net and the
expert-placed critic are read with a forward hook on ``action_out_proj``.

Checkpoint folder = a LeRobot checkpoint plus our files, so LeRobot's own
``PI0Policy`` / ``PI05Policy`` / ``SmolVLAPolicy.from_pretrained`` and
``make_pre_post_processors(..., pretrained_path=...)`` load it as is (see
docs/policies.md, "Loading a vla-rl checkpoint in LeRobot"):

- ``config.json``, ``model.safetensors``: LeRobot's (``"type"`` is ``pi0`` /
  ``pi05`` / ``smolvla``, which are also our registry names);
- ``policy_preprocessor*.json|safetensors``, ``policy_postprocessor*``: LeRobot's processors;
- ``tokenizer/``: the language tokenizer, so the folder reloads offline;
- ``vla_rl_policy.json``: our adapter config; ``vla_rl_heads.safetensors``:
  value head, Flow-Noise net and latent-noise actor.

:meth:`LeRobotFlowPolicy.from_pretrained` loads such a folder, a plain LeRobot
checkpoint folder, or a Hub id (``lerobot/pi0_base``, ``lerobot/pi05_base``,
``lerobot/smolvla_base``; from the local cache when ``HF_HUB_OFFLINE=1``).
LeRobot is imported lazily: importing this module is cheap.
"""

from __future__ import annotations

import abc
import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from policies.base import LogProbLevel
from policies.flow.policy import SAMPLER_HEADS, FlowContext, FlowHeadDims, FlowPolicy
from policies.flow.sampler import SamplerConfig, VelocityOutput
from policies.flow.tokenizer import TOKENIZER_DIR, local_hub_tokenizer, saved_tokenizer, tokenizer_repo_id
from policies.flow.value import ValuePlacement
from policies.io import (
    OBS_IMAGE_PREFIX,
    OBS_STATE,
    TASK,
    CheckpointError,
    atomic_directory,
    check_observation,
    config_from_dict,
    config_to_dict,
    save_tensors,
)

ADAPTER_FILE = "vla_rl_policy.json"
HEADS_FILE = "vla_rl_heads.safetensors"
LEROBOT_CONFIG = "config.json"
LEROBOT_WEIGHTS = "model.safetensors"
PREPROCESSOR_FILE = "policy_preprocessor.json"


@dataclass
class LeRobotFlowConfig:
    """Settings of a LeRobot flow-policy adapter (the LeRobot model keeps its own config)."""

    pretrained: str = ""
    """Hub id or local folder of a LeRobot (or vla-rl) checkpoint to load."""
    sampler: SamplerConfig = field(default_factory=lambda: SamplerConfig(num_steps=10))
    """Exploration sampler; K = num_steps is ours (LeRobot's default is also 10)."""
    logp_level: LogProbLevel = LogProbLevel.CHUNK
    """Granularity of log-probs: token (per action dim), action, or chunk."""
    value_placement: ValuePlacement = ValuePlacement.EXPERT
    """Critic input: ``expert`` (pi_RL's pi0 choice), ``prefix`` (pi0.5 choice), ``state`` (privileged robot +
    env state, an asymmetric critic for simulation) or ``none``."""
    env_state_dim: int = 0
    """P, the size of the env's ``observation.env_state`` (read only by the ``state`` critic; 0 = none)."""
    value_hidden: int = 256
    """Hidden width of the value head."""
    noise_hidden: int = 128
    """Hidden width of the Flow-Noise std network."""

    def __post_init__(self) -> None:
        if isinstance(self.sampler, dict):
            self.sampler = SamplerConfig(**self.sampler)
        self.logp_level = LogProbLevel(self.logp_level)
        self.value_placement = ValuePlacement(self.value_placement)


@dataclass
class LeRobotParts:
    """The LeRobot objects an adapter wraps.

    Attributes:
        policy: a LeRobot ``PI0Policy`` / ``PI05Policy`` / ``SmolVLAPolicy``.
        preprocessor: its ``policy_preprocessor`` pipeline (normalize, tokenize, device).
        postprocessor: its ``policy_postprocessor`` pipeline (unnormalize).
        heads: a ``vla_rl_heads.safetensors`` file to load into the RL heads, or None.
    """

    policy: nn.Module
    preprocessor: Any
    postprocessor: Any
    heads: Path | None = None


@dataclass
class _Prefix:
    """The encoded prefix of one observation batch (model-specific contents)."""

    pad_masks: Tensor
    past_key_values: Any
    features: Tensor
    state: Tensor | None


_HEADS = ("value_head.", *SAMPLER_HEADS)
"""State-dict prefixes of our RL heads, saved in ``vla_rl_heads.safetensors``."""


def _state_dim(lr_cfg: Any) -> int:
    """Size of the robot state the LeRobot model reads (0 if it reads none)."""
    feature = lr_cfg.input_features.get(OBS_STATE)
    return int(feature.shape[0]) if feature is not None else 0


class LeRobotFlowPolicy(FlowPolicy):
    """Base adapter; subclasses bind one LeRobot model class (see module doc).

    Args:
        config: adapter settings; ``config.pretrained`` is loaded when ``parts`` is None
            (so ``cls(config)`` works like every registered policy).
        parts: already built LeRobot objects (e.g. tiny test models).

    Raises:
        CheckpointError: see :meth:`load_parts`; or ``parts`` holding another model type.
    """

    NAME: ClassVar[str]
    CONFIG: ClassVar[type[LeRobotFlowConfig]]

    def __init__(self, config: LeRobotFlowConfig, parts: LeRobotParts | None = None) -> None:
        if parts is None:
            if not config.pretrained:
                raise CheckpointError(f"{self.NAME}: set 'pretrained' to a Hub id or checkpoint folder")
            parts = self.load_parts(config.pretrained)
        lerobot_policy, preprocessor = parts.policy, parts.preprocessor
        lr_cfg = lerobot_policy.config
        if lr_cfg.type != self.NAME:
            raise CheckpointError(f"{type(self).__name__} wraps LeRobot '{self.NAME}' models, got '{lr_cfg.type}'")
        model = lerobot_policy.model
        dims = FlowHeadDims(
            expert_dim=model.action_out_proj.in_features,
            prefix_dim=self._prefix_width(lerobot_policy),
            model_action_dim=lr_cfg.max_action_dim,
            action_dim=lr_cfg.output_features["action"].shape[0],
            horizon=lr_cfg.chunk_size,
            value_hidden=config.value_hidden,
            noise_hidden=config.noise_hidden,
            critic_state_dim=_state_dim(lr_cfg) + config.env_state_dim if config.env_state_dim else 0,
            state_dim=_state_dim(lr_cfg),
        )
        super().__init__(config.sampler, config.logp_level, config.value_placement, dims)
        self.config = config
        self.lerobot = lerobot_policy
        self.preprocessor = preprocessor
        self.postprocessor = parts.postprocessor
        self._features: Tensor | None = None
        model.action_out_proj.register_forward_hook(self._capture_features)
        rename = next((s.rename_map for s in preprocessor.steps if hasattr(s, "rename_map")), {})
        inverse = {v: k for k, v in rename.items()}
        keys = [inverse.get(k, k) for k in lr_cfg.image_features]
        if any(not k.startswith(OBS_IMAGE_PREFIX) for k in keys):
            raise CheckpointError(f"{self.NAME}: image features {keys} must be named {OBS_IMAGE_PREFIX}<camera>")
        self.cameras = tuple(k[len(OBS_IMAGE_PREFIX):] for k in keys)
        shapes = {tuple(f.shape[1:]) for f in lr_cfg.image_features.values()}
        self.image_size = shapes.pop() if len(shapes) == 1 else None
        self.state_dim = lr_cfg.robot_state_feature.shape[0]
        if self.value_head is not None or self.noise_net is not None or self.latent_actor is not None:
            self.to(next(lerobot_policy.parameters()).device)
        if parts.heads is not None:
            self._load_heads(parts.heads)

    # -- model-specific hooks -----------------------------------------------------------------
    @classmethod
    @abc.abstractmethod
    def lerobot_class(cls) -> type:
        """The LeRobot policy class (imported lazily)."""

    @staticmethod
    @abc.abstractmethod
    def _prefix_width(lerobot_policy: nn.Module) -> int:
        """Width of the VLM prefix features."""

    @abc.abstractmethod
    def _encode_prefix(self, batch: dict[str, Any]) -> _Prefix:
        """Embed images + language (+ state) and prefill the KV cache, as LeRobot's ``sample_actions`` does."""

    @abc.abstractmethod
    def _denoise(self, prefix: _Prefix, x_t: Tensor, t: Tensor) -> Tensor:
        """One call of LeRobot's ``denoise_step``: velocity ``[B, H, A_model]``."""

    # -- shared -------------------------------------------------------------------------------
    def _capture_features(self, module: nn.Module, inputs: tuple[Tensor, ...], output: Tensor) -> None:
        self._features = inputs[0]

    def to_lerobot_batch(self, obs: dict[str, Any]) -> tuple[dict[str, Any], int]:
        """Check ``obs`` and convert it to a LeRobot batch (images float ``[B, 3, H, W]`` in [0, 1]).

        Raises:
            ObservationError: naming the expected keys and shapes.
        """
        b = check_observation(obs, self.cameras, self.image_size, self.state_dim, self.NAME)
        batch: dict[str, Any] = {OBS_STATE: obs[OBS_STATE].float(), TASK: list(obs[TASK])}
        for cam in self.cameras:
            key = OBS_IMAGE_PREFIX + cam
            batch[key] = obs[key].permute(0, 3, 1, 2).float() / 255.0
        return batch, b

    def _preprocess(self, batch: dict[str, Any]) -> dict[str, Any]:
        """LeRobot's pre-processor, its tensors then on this policy's device: its device step keeps the device
        the pipeline was built or loaded with, while the policy may have moved since (``.to("cuda")``)."""
        processed = self.preprocessor(batch)
        return {k: v.to(self.device) if isinstance(v, Tensor) else v for k, v in processed.items()}

    def encode(self, obs: dict[str, Any]) -> FlowContext:
        """Preprocess with LeRobot's pipeline, encode the prefix once, return the velocity function."""
        batch, b = self.to_lerobot_batch(obs)
        processed = self._preprocess(batch)
        prefix = self._encode_prefix(processed)
        state = processed.get(OBS_STATE)  # normalized by LeRobot's processor; the latent-noise actor reads it

        def velocity(x_t: Tensor, t: Tensor) -> VelocityOutput:
            self._features = None
            v = self._denoise(prefix, x_t, t)
            return VelocityOutput(velocity=v, features=self._features)

        return FlowContext(velocity=velocity, batch_size=b, prefix_features=prefix.features,
                           prefix_mask=prefix.pad_masks, state=None if state is None else state.float())

    def actions_to_env(self, actions: Tensor) -> Tensor:
        """Unnormalize model-space actions ``[B, H, A]`` with LeRobot's postprocessor."""
        return self.postprocessor(actions).to(actions.device)

    def set_normalization(self, stats: dict[str, dict[str, Any]]) -> None:
        """Replace the normalization statistics of both processors (LeRobot's ``hotswap_stats``).

        Args:
            stats: LeRobot-style ``{"observation.state": {"mean": ..., "std": ..., "q01": ...}, "action": {...}}``.
        """
        from lerobot.processor.normalize_processor import hotswap_stats

        self.preprocessor = hotswap_stats(self.preprocessor, stats)
        self.postprocessor = hotswap_stats(self.postprocessor, stats)

    def fit_normalization(self, states: Tensor, actions: Tensor) -> None:
        """Fit state / action statistics (mean, std, min, max, quantiles) on demo data with LeRobot's
        ``get_feature_stats``: ``states [N, S]``, ``actions [N, A]`` (or ``[N, H, A]``)."""
        from lerobot.datasets.compute_stats import get_feature_stats

        def fit(x: Tensor) -> dict[str, Any]:
            array = x.detach().reshape(-1, x.shape[-1]).double().cpu().numpy()
            return {k: torch.as_tensor(v, dtype=torch.float32) for k, v in get_feature_stats(array, 0, False).items()}

        self.set_normalization({OBS_STATE: fit(states), "action": fit(actions)})

    def sft_loss(self, obs: dict[str, Any], actions: Tensor, action_mask: Tensor | None = None) -> Tensor:
        """LeRobot's own supervised flow-matching loss (its ``forward``) on demo chunks.

        Args:
            obs: observation batch.
            actions: ``[B, H, A]`` demo action chunks in env space (normalized by the preprocessor).
            action_mask: optional ``[B, H]`` bool, False for padded steps (SmolVLA masks them; pi0 /
                pi0.5 ignore it, as in LeRobot).

        Raises:
            ObservationError: for a bad observation; ValueError for a wrong action shape.
        """
        batch, b = self.to_lerobot_batch(obs)
        want = (b, self.dims.horizon, self.dims.action_dim)
        if tuple(actions.shape) != want:
            raise ValueError(f"{self.NAME}: sft actions must be [B, H, A] = {list(want)}, got {list(actions.shape)}")
        batch["action"] = actions.float()
        if action_mask is not None:
            batch["action_is_pad"] = ~action_mask.bool()
        loss, _ = self.lerobot.forward(self._preprocess(batch))
        return loss

    def reference_actions(self, obs: dict[str, Any], noise: Tensor) -> Tensor:
        """LeRobot's own ``predict_action_chunk`` (its Euler loop) from ``noise``, in env space.

        Used to verify that our ODE sampler reproduces LeRobot exactly.
        """
        batch, _ = self.to_lerobot_batch(obs)
        with torch.no_grad():
            actions = self.lerobot.predict_action_chunk(self._preprocess(batch), noise=noise.to(self.device))
        return self.actions_to_env(actions)

    # -- checkpoints --------------------------------------------------------------------------
    def _tokenizer(self) -> Any | None:
        step = next((s for s in self.preprocessor.steps if hasattr(s, "input_tokenizer")), None)
        return None if step is None else step.input_tokenizer

    def save_pretrained(self, directory: str | Path) -> None:
        """Atomically write a LeRobot checkpoint plus tokenizer, adapter config and RL heads (module doc)."""
        heads = {k: v for k, v in self.state_dict().items() if k.startswith(_HEADS)}
        config = replace(self.config, sampler=replace(self.sampler))
        with atomic_directory(directory) as tmp:
            self.lerobot.save_pretrained(tmp)
            self.preprocessor.save_pretrained(tmp)
            self.postprocessor.save_pretrained(tmp)
            tokenizer = self._tokenizer()
            if tokenizer is not None:
                tokenizer.save_pretrained(tmp / TOKENIZER_DIR)
            (tmp / ADAPTER_FILE).write_text(json.dumps(config_to_dict(config, self.NAME), indent=2) + "\n")
            save_tensors(tmp / HEADS_FILE, heads)

    @classmethod
    def from_config(cls, config: LeRobotFlowConfig) -> LeRobotFlowPolicy:
        """Load ``config.pretrained`` with the adapter settings of ``config`` (same as ``cls(config)``)."""
        return cls(config)

    @classmethod
    def from_pretrained(
        cls,
        path_or_id: str | Path,
        config: LeRobotFlowConfig | None = None,
        tokenizer: Any | None = None,
        dataset_stats: dict[str, dict[str, Tensor]] | None = None,
        device: str | None = None,
        lerobot_overrides: dict[str, Any] | None = None,
        **overrides: Any,
    ) -> LeRobotFlowPolicy:
        """Load a vla-rl or LeRobot checkpoint folder, or a Hub id, through LeRobot's loaders.

        Args:
            path_or_id: local folder or Hub repo id.
            config: adapter settings (default: the folder's ``vla_rl_policy.json``, else defaults).
            tokenizer, dataset_stats, device, lerobot_overrides: see :meth:`load_parts`.
            overrides: adapter config fields to replace (e.g. ``sampler=SamplerConfig(...)``).

        Raises:
            CheckpointError: see :meth:`load_parts`; or an unreadable ``vla_rl_policy.json``.
        """
        where = str(path_or_id)
        if config is None:
            adapter = Path(where) / ADAPTER_FILE
            raw = json.loads(adapter.read_text()) if adapter.is_file() else {"type": cls.NAME}
            if raw.get("type") != cls.NAME:
                raise CheckpointError(f"{where}: holds a '{raw.get('type')}' policy; load it as '{raw.get('type')}'")
            config = config_from_dict(cls.CONFIG, raw, cls.NAME, where)
        config = replace(config, pretrained=where, **overrides)
        parts = cls.load_parts(where, tokenizer, dataset_stats, device, lerobot_overrides)
        return cls(config, parts)

    @classmethod
    def load_parts(
        cls,
        path_or_id: str | Path,
        tokenizer: Any | None = None,
        dataset_stats: dict[str, dict[str, Tensor]] | None = None,
        device: str | None = None,
        lerobot_overrides: dict[str, Any] | None = None,
    ) -> LeRobotParts:
        """Load LeRobot's policy and processors (and our heads file, if any) from a folder or Hub id.

        Args:
            path_or_id: local folder or Hub repo id.
            tokenizer: language tokenizer to use instead of the checkpoint's (e.g. offline).
            dataset_stats: normalization statistics replacing the checkpoint's (fine-tuning
                on a new robot / env).
            device: torch device for model and processors (default: LeRobot config's).
            lerobot_overrides: LeRobot config fields to replace before building, e.g.
                ``{"input_features": {...}}`` to match an env's cameras and image sizes
                (pi0 / pi0.5 resize-with-pad to their ``image_resolution``), or
                ``{"n_action_steps": 5}``.

        Raises:
            CheckpointError: the folder / Hub entry lacks LeRobot's config or weights, holds
                another model type, or an override names no LeRobot config field.
        """
        from lerobot.configs.policies import PreTrainedConfig

        where = str(path_or_id)
        local = Path(where).is_dir()
        cls._check_weights(where, local)
        try:
            lr_cfg = PreTrainedConfig.from_pretrained(where)
        except Exception as e:
            raise CheckpointError(f"{where}: cannot read LeRobot's {LEROBOT_CONFIG}: {e}") from e
        if lr_cfg.type != cls.NAME:
            raise CheckpointError(f"{where}: holds a LeRobot '{lr_cfg.type}' model; load it as '{lr_cfg.type}'")
        if device is not None:
            lr_cfg.device = device
        for key, value in (lerobot_overrides or {}).items():
            if not hasattr(lr_cfg, key):
                raise CheckpointError(f"{where}: LeRobot {lr_cfg.type} config has no field {key!r}")
            setattr(lr_cfg, key, value)
        lerobot_policy = cls.lerobot_class().from_pretrained(where, config=lr_cfg)
        if tokenizer is None and local:
            tokenizer = saved_tokenizer(where)
        pre, post = cls._processors(where, local, lr_cfg, tokenizer, dataset_stats)
        heads = Path(where) / HEADS_FILE
        return LeRobotParts(lerobot_policy, pre, post, heads if local and heads.is_file() else None)

    @staticmethod
    def _check_weights(where: str, local: bool) -> None:
        """Fail early and clearly (LeRobot's pi0 loader falls back to random weights on errors)."""
        if local:
            missing = [f for f in (LEROBOT_CONFIG, LEROBOT_WEIGHTS) if not (Path(where) / f).is_file()]
            if missing:
                raise CheckpointError(f"{where}: no {', '.join(missing)}; is this a LeRobot / vla-rl checkpoint?")
            return
        from huggingface_hub import hf_hub_download

        try:
            for name in (LEROBOT_CONFIG, LEROBOT_WEIGHTS):
                hf_hub_download(where, name)
        except Exception as e:
            offline = " (HF_HUB_OFFLINE=1: the files must already be in the local Hub cache)" if os.environ.get(
                "HF_HUB_OFFLINE") else ""
            raise CheckpointError(f"{where}: not a local folder and not available from the Hub{offline}: {e}") from e

    @classmethod
    def _processors(
        cls, where: str, local: bool, lr_cfg: Any, tokenizer: Any | None, dataset_stats: dict | None
    ) -> tuple[Any, Any]:
        """LeRobot's processor pipelines: the checkpoint's if it has them, else built for ``lr_cfg``."""
        from lerobot.policies.factory import make_pre_post_processors

        has_files = (Path(where) / PREPROCESSOR_FILE).is_file() if local else cls._hub_has(where, PREPROCESSOR_FILE)
        if not has_files:
            if tokenizer is not None:
                with local_hub_tokenizer(tokenizer, tokenizer_repo_id(lr_cfg)):
                    return make_pre_post_processors(lr_cfg, dataset_stats=dataset_stats)
            return make_pre_post_processors(lr_cfg, dataset_stats=dataset_stats)
        pre_over: dict[str, Any] = {"device_processor": {"device": lr_cfg.device or "cpu"}}
        post_over: dict[str, Any] = {}
        if tokenizer is not None:
            pre_over["tokenizer_processor"] = {"tokenizer": tokenizer}
        if dataset_stats is not None:
            pre_over["normalizer_processor"] = {"stats": dataset_stats}
            post_over["unnormalizer_processor"] = {"stats": dataset_stats}
        return make_pre_post_processors(
            lr_cfg, pretrained_path=where, preprocessor_overrides=pre_over, postprocessor_overrides=post_over
        )

    @staticmethod
    def _hub_has(repo_id: str, filename: str) -> bool:
        from huggingface_hub import hf_hub_download

        try:
            hf_hub_download(repo_id, filename)
            return True
        except Exception:
            return False

    def _load_heads(self, path: Path) -> None:
        from safetensors.torch import load_file

        tensors = load_file(str(path), device=str(self.device))
        self.build_saved_sampler_heads(tensors, str(path))
        own = {k for k in self.state_dict() if k.startswith(_HEADS)}
        fresh = {k for k in own - set(tensors) if k.startswith(SAMPLER_HEADS)}  # a new sampler's head starts fresh
        if set(tensors) != own - fresh:
            raise CheckpointError(
                f"{path}: RL heads {sorted(set(tensors) ^ own)[:4]} do not match the adapter config "
                f"(value_placement={self.value_placement.value}); pass the config the checkpoint was saved with"
            )
        self.load_state_dict(tensors, strict=False)
