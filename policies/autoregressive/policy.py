"""The OpenVLA-style autoregressive policy (registered as ``"openvla-style"``).

One env step (or one chunk of H steps) is one turn: the prompt is the
camera image(s) plus ``"In: What action should the robot take to
{instruction}?\\nOut:"`` and the response is ``H * A`` action tokens, decoded
for all envs together with a KV cache (:mod:`.decoding`). Tokens map to bin
centers in ``[-1, 1]`` (:mod:`.action_tokenizer`) and then to env actions
with the stored dataset bounds (:mod:`.normalization`). A value head (MLP)
reads the last-layer hidden state of the last prompt token.

``act`` records in ``extras`` the prompt ids and mask and the action token
ids; ``evaluate(obs, extras)`` re-scores those tokens with one teacher-forced
pass, reproducing ``act``'s log-probs. Supervised fine-tuning uses the same
path: ``evaluate(obs, {..., "action_tokens": policy.action_tokens(demo)})``.

Checkpoint folder (written atomically): ``config.json`` (``"type":
"openvla-style"`` + the config), ``model.safetensors`` (value head and
normalization statistics) and ``vlm/`` (the backbone's own
``save_pretrained`` output: config, weights, tokenizer, image processor).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import Tensor, nn

from policies.autoregressive.action_tokenizer import ActionTokenizer
from policies.autoregressive.backbones import BackboneError, Prompts, VLMBackbone, load_backbone
from policies.autoregressive.config import AutoregressiveVLAConfig
from policies.autoregressive.decoding import Decoded, decode, score
from policies.autoregressive.normalization import ActionNormalizer, NormalizationStats
from policies.base import ActMode, ActOutput, LogProbLevel, Policy, masked_step_mean, reduce_logp
from policies.io import (
    CONFIG_FILE,
    TASK,
    WEIGHTS_FILE,
    CheckpointError,
    ObservationError,
    atomic_directory,
    config_from_dict,
    config_to_dict,
    image_key,
    save_tensors,
)
from policies.registry import POLICIES

POLICY_TYPE = "openvla-style"
VLM_DIR = "vlm"
PROMPT_IDS = "prompt_ids"
PROMPT_MASK = "prompt_mask"
ACTION_TOKENS = "action_tokens"
EXTRAS_KEYS = (PROMPT_IDS, PROMPT_MASK, ACTION_TOKENS)


@POLICIES.register(POLICY_TYPE, config=AutoregressiveVLAConfig)
class AutoregressiveVLAPolicy(Policy):
    """An OpenVLA-style VLA: batched KV-cache decoding of action tokens, token log-probs, a critic.

    Args:
        config: the policy configuration.
        backbone: an already built backbone (used by :meth:`from_pretrained`);
            None builds or loads ``config.backbone``.

    Raises:
        ValueError: if the backbone's vocabulary cannot hold the action ids.
        BackboneError: for more cameras than the backbone accepts.
    """

    def __init__(self, config: AutoregressiveVLAConfig, backbone: VLMBackbone | None = None) -> None:
        super().__init__()
        self.config = config
        self.logp_level = LogProbLevel(config.logp_level)
        if backbone is None:
            backbone = load_backbone(config.backbone, config.dtype, config.trust_remote_code, config.tiny)
        if backbone.max_cameras is not None and len(config.cameras) > backbone.max_cameras:
            raise BackboneError(f"{config.backbone}: {type(backbone).__name__} takes at most {backbone.max_cameras} "
                                f"camera(s), config.cameras is {list(config.cameras)}")
        self.backbone = backbone
        self.action_tokenizer = ActionTokenizer(backbone.text_vocab_size, scheme=backbone.bin_scheme)
        embed_rows = backbone.input_embeddings().weight.shape[0]
        if backbone.text_vocab_size > embed_rows:
            raise ValueError(f"{config.backbone}: tokenizer vocabulary ({backbone.text_vocab_size}) exceeds the "
                             f"model's embedding table ({embed_rows}); action ids would be out of range")
        width = config.value_hidden_dim
        self.value_head = nn.Sequential(
            nn.Linear(backbone.hidden_size, width), nn.GELU(), nn.Linear(width, width), nn.GELU(), nn.Linear(width, 1)
        )
        self.normalizer = ActionNormalizer(config.action_dim, config.state_dim)
        bounds = backbone.action_norm_bounds(config.unnorm_key)
        if bounds is not None:
            low, high = bounds
            if low.shape[0] != config.action_dim:
                raise ValueError(f"{config.backbone}: checkpoint statistics have {low.shape[0]} action dims, "
                                 f"config.action_dim is {config.action_dim}")
            self.normalizer.set_stats(NormalizationStats(action_low=low, action_high=high))

    # ----------------------------------------------------------------- properties

    @property
    def chunk_size(self) -> int:
        """H, actions per env returned by one :meth:`act` call."""
        return self.config.chunk_size

    @property
    def device(self) -> torch.device:
        """Device of the value head (the backbone sits on the same one)."""
        return self.value_head[0].weight.device

    def set_normalization(self, stats: NormalizationStats) -> None:
        """Install dataset statistics (saved with the checkpoint); see :class:`ActionNormalizer`."""
        self.normalizer.set_stats(stats)

    # --------------------------------------------------------------- observations

    def _batch_size(self, obs: dict[str, Any]) -> int:
        """Validate the keys, image shapes and instructions of ``obs``; return B.

        Raises:
            ObservationError: naming the missing keys / the expected shapes and dtypes.
        """
        name = f"policy {POLICY_TYPE!r}"
        expected = [image_key(c) for c in self.config.cameras] + [TASK]
        missing = [k for k in expected if k not in obs]
        if missing:
            raise ObservationError(f"{name}: observation lacks key(s) {missing}; expected keys {expected} "
                                   f"(got {sorted(obs)}). Set the policy's cameras to the env's camera names.")
        tasks = obs[TASK]
        if isinstance(tasks, str) or not all(isinstance(t, str) for t in tasks):
            raise ObservationError(f"{name}: {TASK} must be a list of B instruction strings, got {tasks!r:.80}")
        h, w = self.config.image_size
        for key in expected[:-1]:
            img = obs[key]
            want = f"uint8 [{len(tasks)}, {h}, {w}, 3]"
            if not isinstance(img, Tensor) or tuple(img.shape) != (len(tasks), h, w, 3):
                got = list(img.shape) if isinstance(img, Tensor) else type(img).__name__
                raise ObservationError(f"{name}: {key} must be {want} (B, H, W, RGB; B = len({TASK})), got {got}; "
                                       f"set the policy's image_size to the env's camera resolution")
            if img.dtype != torch.uint8:
                raise ObservationError(f"{name}: {key} must be {want}, got dtype {img.dtype}")
        return len(tasks)

    def encode_observation(self, obs: dict[str, Any]) -> tuple[Prompts, Tensor]:
        """Validate ``obs`` and build the model inputs: left-padded prompts and pixel values.

        Returns:
            ``(Prompts [B, P] on the policy's device, pixel values for the backbone)``.

        Raises:
            ObservationError: for missing keys or wrong image shapes; BackboneError for a
            prompt longer than ``max_text_tokens``.
        """
        self._batch_size(obs)
        images = [obs[image_key(c)].to(self.device) for c in self.config.cameras]
        prompts = self.backbone.build_prompts(list(obs[TASK]), len(self.config.cameras),
                                              self.config.max_text_tokens, self.config.lowercase_instruction)
        prompts = Prompts(prompts.input_ids.to(self.device), prompts.attention_mask.to(self.device))
        return prompts, self.backbone.pixel_values(images)

    # ------------------------------------------------------------------- acting

    def _critic(self, prompt_hidden: Tensor) -> Tensor:
        features = prompt_hidden.float()
        if self.config.value_stop_gradient:
            features = features.detach()
        return self.value_head(features).squeeze(-1)

    def _to_level(self, per_token: Tensor) -> Tensor:
        """``[B, H * A]`` -> ``[B, H, A]`` -> reduced to :attr:`logp_level`."""
        return reduce_logp(per_token.reshape(-1, self.config.chunk_size, self.config.action_dim), self.logp_level)

    def decode_tokens(self, tokens: Tensor) -> Tensor:
        """Action token ids ``[B, H * A]`` -> env actions ``float32 [B, H, A]``."""
        normalized = self.action_tokenizer.decode(tokens)
        return self.normalizer.unnormalize_actions(normalized.reshape(-1, self.config.chunk_size,
                                                                      self.config.action_dim))

    def action_tokens(self, actions: Tensor) -> Tensor:
        """Env actions ``[B, H, A]`` (e.g. demonstrations) -> token ids ``int64 [B, H * A]``.

        Normalizes with the stored bounds, clips to ``[-1, 1]`` and counts the
        clipped elements in ``self.action_tokenizer.num_clipped``.

        Raises:
            ValueError: naming the expected shape.
        """
        expected = (self.config.chunk_size, self.config.action_dim)
        if actions.ndim != 3 or tuple(actions.shape[1:]) != expected:
            raise ValueError(f"action_tokens: actions must be [B, {expected[0]}, {expected[1]}], "
                             f"got {list(actions.shape)}")
        return self.action_tokenizer.encode(self.normalizer.normalize_actions(actions)).flatten(1)

    def _decode(self, obs: dict[str, Any], greedy: bool, generator: torch.Generator | None,
                use_cache: bool) -> tuple[Decoded, Prompts]:
        prompts, pixels = self.encode_observation(obs)
        decoded = decode(
            self.backbone, prompts, pixels, self.config.num_action_tokens, self.action_tokenizer.first_id,
            self.action_tokenizer.num_bins, greedy=greedy, temperature=self.config.temperature,
            restrict=self.config.restrict_to_action_bins, generator=generator, use_cache=use_cache,
        )
        return decoded, prompts

    def act(self, obs: dict[str, Any], mode: ActMode = ActMode.EXPLORE,
            generator: torch.Generator | None = None) -> ActOutput:
        """Decode an action chunk for every env in one batch.

        ``EVAL`` decodes greedily (logp zeros); ``EXPLORE`` samples at
        ``config.temperature`` and returns the tokens' log-probs.

        Args:
            obs: ``observation.images.<camera>`` uint8 ``[B, H, W, 3]`` per configured camera and
                ``task`` (B strings); other keys are ignored.
            mode: ``ActMode.EVAL`` or ``ActMode.EXPLORE``.
            generator: optional RNG for sampling (default: torch's global RNG).

        Returns:
            ``ActOutput(actions [B, H, A] float32 env space, logp at logp_level, value [B], extras)``
            with extras ``prompt_ids`` / ``prompt_mask`` ``int64 [B, P]`` and ``action_tokens``
            ``int64 [B, H * A]`` (also in eval mode, so greedy turns can be re-scored).

        Raises:
            ObservationError: for missing keys or wrong image shapes.
        """
        mode = ActMode(mode)
        with torch.no_grad():
            decoded, prompts = self._decode(obs, mode is ActMode.EVAL, generator, use_cache=True)
            value = self._critic(decoded.prompt_hidden)
        logp = self._to_level(decoded.logp)
        if mode is ActMode.EVAL:
            logp = torch.zeros_like(logp)
        extras = {PROMPT_IDS: prompts.input_ids, PROMPT_MASK: prompts.attention_mask, ACTION_TOKENS: decoded.tokens}
        return ActOutput(actions=self.decode_tokens(decoded.tokens), logp=logp, value=value, extras=extras)

    def evaluate(self, obs: dict[str, Any], extras: dict[str, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        """Differentiably re-score the action tokens recorded by :meth:`act` (one teacher-forced pass).

        Returns:
            ``(logp, entropy, value)``: logp and entropy (per-token entropies summed the same
            way) at ``logp_level``, value ``float32 [B]``.

        Raises:
            KeyError: naming missing extras keys; ValueError for wrong extras shapes or
            non-action token ids; ObservationError for a bad observation.
        """
        missing = [k for k in EXTRAS_KEYS if k not in extras]
        if missing:
            raise KeyError(f"evaluate: extras lack {missing}; expected keys {list(EXTRAS_KEYS)} as returned by act")
        batch = self._batch_size(obs)
        ids, mask, tokens = (extras[k].to(self.device).long() for k in EXTRAS_KEYS)
        expected_tokens = (batch, self.config.num_action_tokens)
        if tuple(tokens.shape) != expected_tokens or ids.shape != mask.shape or ids.shape[0] != batch:
            raise ValueError(f"evaluate: expected {ACTION_TOKENS} [{batch}, {expected_tokens[1]}] and "
                             f"{PROMPT_IDS} / {PROMPT_MASK} [{batch}, P]; got {list(tokens.shape)}, "
                             f"{list(ids.shape)}, {list(mask.shape)}")
        self.action_tokenizer.token_to_bin(tokens)  # raises for non-action ids
        images = [obs[image_key(c)].to(self.device) for c in self.config.cameras]
        scored = score(
            self.backbone, Prompts(ids, mask), self.backbone.pixel_values(images), tokens,
            self.action_tokenizer.first_id, self.action_tokenizer.num_bins, self.config.temperature,
            self.config.restrict_to_action_bins,
        )
        return self._to_level(scored.logp), self._to_level(scored.entropy), self._critic(scored.prompt_hidden)

    def sft_loss(self, obs: dict[str, Any], actions: Tensor, action_mask: Tensor | None = None) -> Tensor:
        """OpenVLA's fine-tuning loss: the cross-entropy of the action tokens of ``actions [B, H, A]`` (normalized,
        binned as :meth:`action_tokens` does), teacher-forced after the prompt, at temperature 1 and over the
        vocabulary :meth:`act` samples from (the action bins with ``restrict_to_action_bins``); the mean over the
        tokens of the steps ``action_mask [B, H]`` marks real.

        Raises:
            ValueError: naming the expected action shape; ObservationError for a bad observation.
        """
        prompts, pixels = self.encode_observation(obs)
        tokens = self.action_tokens(actions.to(self.device))
        scored = score(self.backbone, prompts, pixels, tokens, self.action_tokenizer.first_id,
                       self.action_tokenizer.num_bins, 1.0, self.config.restrict_to_action_bins)
        nll = -scored.logp.reshape(-1, self.config.chunk_size, self.config.action_dim)
        return masked_step_mean(nll, action_mask)

    def value(self, obs: dict[str, Any]) -> Tensor:
        """Critic estimate ``float32 [B]`` from one prompt pass (no decoding)."""
        prompts, pixels = self.encode_observation(obs)
        out = self.backbone(prompts.input_ids, prompts.attention_mask, prompts.position_ids, pixels, keep=1)
        return self._critic(out.hidden[:, -1])

    # --------------------------------------------------------------- checkpoints

    def save_pretrained(self, directory: str | Path) -> None:
        """Atomically write ``config.json``, ``model.safetensors`` and ``vlm/`` to ``directory``.

        The files are written to a temporary sibling folder that then replaces
        ``directory``, so an interrupted save never leaves a partial checkpoint.
        """
        with atomic_directory(directory) as tmp:
            (tmp / CONFIG_FILE).write_text(json.dumps(config_to_dict(self.config, POLICY_TYPE), indent=2) + "\n")
            save_tensors(tmp / WEIGHTS_FILE, {k: v for k, v in self.state_dict().items() if not k.startswith("backbone.")})
            self.backbone.save(tmp / VLM_DIR)

    @classmethod
    def from_pretrained(cls, path_or_id: str | Path, **overrides: Any) -> AutoregressiveVLAPolicy:
        """Load a checkpoint folder written by :meth:`save_pretrained`, or wrap a bare VLM.

        A folder whose ``config.json`` has ``"type": "openvla-style"`` is a
        policy checkpoint; anything else (e.g. ``openvla/openvla-7b`` in the
        local hub cache) becomes the ``backbone`` of a fresh policy configured
        by ``overrides``.

        Args:
            path_or_id: checkpoint folder, VLM folder or cached hub id.
            **overrides: config fields to replace (e.g. ``temperature=1.2``).

        Raises:
            CheckpointError: for a policy of another type, a missing file or an unknown override.
        """
        folder = Path(path_or_id)
        config_path = folder / CONFIG_FILE
        saved = json.loads(config_path.read_text()) if config_path.is_file() else {}
        fields = {f.name for f in dataclasses.fields(AutoregressiveVLAConfig)}
        unknown = sorted(set(overrides) - fields)
        if unknown:
            raise CheckpointError(f"{path_or_id}: unknown override(s) {unknown}; valid: {sorted(fields)}")
        if "type" not in saved:
            return cls(AutoregressiveVLAConfig(**{"backbone": str(path_or_id), **overrides}))
        config = config_from_dict(AutoregressiveVLAConfig, saved, POLICY_TYPE, str(config_path))
        config = dataclasses.replace(config, **overrides)
        for name in (WEIGHTS_FILE, VLM_DIR):
            if not (folder / name).exists():
                raise CheckpointError(f"{folder}: no {name}; was this checkpoint written by save_pretrained?")
        backbone = load_backbone(str(folder / VLM_DIR), config.dtype, config.trust_remote_code, config.tiny)
        policy = cls(config, backbone=backbone)
        state = load_file(str(folder / WEIGHTS_FILE))
        missing, unexpected = policy.load_state_dict(state, strict=False)
        missing = [k for k in missing if not k.startswith("backbone.")]
        if missing or unexpected:
            raise CheckpointError(f"{folder / WEIGHTS_FILE}: missing tensors {missing}, unexpected {unexpected}")
        return policy
