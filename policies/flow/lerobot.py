"""pi0, pi0.5 and SmolVLA from LeRobot behind the RL interface (registry names ``pi0``, ``pi05``, ``smolvla``).

The shared adapter (preprocessing, our sampler loop, checkpoints, loading of
Hub ids and folders) is :class:`policies.flow.lerobot_base.LeRobotFlowPolicy`.
Each subclass reproduces the prefix half of its model's ``sample_actions``
(LeRobot's own ``embed_prefix``, attention-mask helpers and KV-cache prefill)
and calls the model's ``denoise_step`` for every velocity; registry names
``pi0``, ``pi05`` and ``smolvla`` equal LeRobot's config types.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from policies.flow.lerobot_base import LeRobotFlowConfig, LeRobotFlowPolicy, LeRobotParts, _Prefix
from policies.flow.value import ValuePlacement
from policies.registry import POLICIES


def _tokens(batch: dict[str, Any]) -> tuple[Tensor, Tensor]:
    from lerobot.utils.constants import OBS_LANGUAGE_ATTENTION_MASK, OBS_LANGUAGE_TOKENS

    return batch[OBS_LANGUAGE_TOKENS], batch[OBS_LANGUAGE_ATTENTION_MASK]


def _paligemma_prefill(model: nn.Module, embs: Tensor, pad_masks: Tensor, att_masks: Tensor) -> tuple[Tensor, Any]:
    """pi0 / pi0.5 prefix prefill exactly as their ``sample_actions``: returns (prefix features, KV cache)."""
    from lerobot.policies.common.vla_utils import make_att_2d_masks, prepare_attention_masks_4d

    att_2d = make_att_2d_masks(pad_masks, att_masks)
    position_ids = torch.cumsum(pad_masks, dim=1) - 1
    model.paligemma_with_expert.paligemma.model.language_model.config._attn_implementation = "eager"  # noqa: SLF001
    (features, _), past_key_values = model.paligemma_with_expert.forward(
        attention_mask=prepare_attention_masks_4d(att_2d),
        position_ids=position_ids,
        past_key_values=None,
        inputs_embeds=[embs, None],
        use_cache=True,
    )
    return features, past_key_values


class _PaliGemmaAdapter(LeRobotFlowPolicy):
    """Shared by pi0 and pi0.5 (PaliGemma prefix + Gemma action expert); they differ only in where the state goes."""

    @staticmethod
    def _prefix_width(lerobot_policy: nn.Module) -> int:
        return lerobot_policy.model.paligemma_with_expert.paligemma.config.text_config.hidden_size

    def _state(self, batch: dict[str, Any]) -> Tensor | None:
        """The state tensor the action expert takes, or None when the processor tokenized it into the prompt."""
        return None

    def encoder_parameters(self) -> list[nn.Parameter]:
        """The PaliGemma VLM (SigLIP vision tower + Gemma language model); the Gemma action expert is not in it."""
        return list(self.lerobot.model.paligemma_with_expert.paligemma.parameters())

    def _encode_prefix(self, batch: dict[str, Any]) -> _Prefix:
        lp = self.lerobot
        images, img_masks = lp._preprocess_images(batch)
        tokens, masks = _tokens(batch)
        embs, pad_masks, att_masks = lp.model.embed_prefix(images, img_masks, tokens, masks)
        features, cache = _paligemma_prefill(lp.model, embs, pad_masks, att_masks)
        return _Prefix(pad_masks=pad_masks, past_key_values=cache, features=features, state=self._state(batch))

    def _denoise(self, prefix: _Prefix, x_t: Tensor, t: Tensor) -> Tensor:
        state = {} if prefix.state is None else {"state": prefix.state}
        return self.lerobot.model.denoise_step(
            **state, prefix_pad_masks=prefix.pad_masks, past_key_values=prefix.past_key_values, x_t=x_t, timestep=t
        )


@dataclass
class PI0AdapterConfig(LeRobotFlowConfig):
    """pi0 through LeRobot; critic on the action-expert output (pi_RL's choice for pi0)."""

    pretrained: str = "lerobot/pi0_base"
    """Hub id or local folder of a LeRobot / vla-rl pi0 checkpoint."""
    value_placement: ValuePlacement = ValuePlacement.EXPERT
    """Critic features: ``expert`` (default for pi0), ``prefix`` or ``none``."""


@POLICIES.register("pi0", config=PI0AdapterConfig, help="pi0 (LeRobot PI0Policy) with Flow-SDE / Flow-Noise samplers")
class LeRobotPI0Policy(_PaliGemmaAdapter):
    """LeRobot ``PI0Policy`` behind the RL interface (state enters the action expert)."""

    NAME = "pi0"
    CONFIG = PI0AdapterConfig

    @classmethod
    def lerobot_class(cls) -> type:
        from lerobot.policies.pi0 import PI0Policy

        return PI0Policy

    def _state(self, batch: dict[str, Any]) -> Tensor | None:
        return self.lerobot.prepare_state(batch)


@dataclass
class PI05AdapterConfig(LeRobotFlowConfig):
    """pi0.5 through LeRobot; critic on the VLM prefix (pi_RL's choice for pi0.5)."""

    pretrained: str = "lerobot/pi05_base"
    """Hub id or local folder of a LeRobot / vla-rl pi0.5 checkpoint."""
    value_placement: ValuePlacement = ValuePlacement.PREFIX
    """Critic features: ``prefix`` (default for pi0.5), ``expert`` or ``none``."""


@POLICIES.register("pi05", config=PI05AdapterConfig, help="pi0.5 (LeRobot PI05Policy) with Flow-SDE / Flow-Noise")
class LeRobotPI05Policy(_PaliGemmaAdapter):
    """LeRobot ``PI05Policy`` behind the RL interface (state is tokenized into the prompt by its processor)."""

    NAME = "pi05"
    CONFIG = PI05AdapterConfig

    @classmethod
    def lerobot_class(cls) -> type:
        from lerobot.policies.pi05 import PI05Policy

        return PI05Policy


@dataclass
class SmolVLAAdapterConfig(LeRobotFlowConfig):
    """SmolVLA through LeRobot; critic on the action-expert output by default."""

    pretrained: str = "lerobot/smolvla_base"
    """Hub id or local folder of a LeRobot / vla-rl SmolVLA checkpoint."""
    value_placement: ValuePlacement = ValuePlacement.EXPERT
    """Critic features: ``expert`` (default), ``prefix`` or ``none``."""


@POLICIES.register(
    "smolvla", config=SmolVLAAdapterConfig, help="SmolVLA (LeRobot SmolVLAPolicy) with Flow-SDE / Flow-Noise"
)
class LeRobotSmolVLAPolicy(LeRobotFlowPolicy):
    """LeRobot ``SmolVLAPolicy`` behind the RL interface (state is the last prefix token)."""

    NAME = "smolvla"
    CONFIG = SmolVLAAdapterConfig

    @classmethod
    def lerobot_class(cls) -> type:
        from lerobot.policies.smolvla import SmolVLAPolicy

        return SmolVLAPolicy

    @staticmethod
    def _prefix_width(lerobot_policy: nn.Module) -> int:
        return lerobot_policy.model.vlm_with_expert.config.text_config.hidden_size

    def encoder_parameters(self) -> list[nn.Parameter]:
        """The SmolVLM backbone (vision encoder + language model; LeRobot freezes it by default); not the action expert."""
        return list(self.lerobot.model.vlm_with_expert.vlm.parameters())

    def _encode_prefix(self, batch: dict[str, Any]) -> _Prefix:
        from lerobot.policies.common.vla_utils import make_att_2d_masks

        lp = self.lerobot
        if not lp.config.use_cache:
            raise ValueError("smolvla: sampling needs the prefix KV cache; set the LeRobot config's use_cache=True")
        batch = lp._prepare_batch(dict(batch))
        images, img_masks = lp.prepare_images(batch)
        state = lp.prepare_state(batch)
        tokens, masks = _tokens(batch)
        embs, pad_masks, att_masks = lp.model.embed_prefix(images, img_masks, tokens, masks, state=state)
        (features, _), cache = lp.model.vlm_with_expert.forward(
            attention_mask=make_att_2d_masks(pad_masks, att_masks),
            position_ids=torch.cumsum(pad_masks, dim=1) - 1,
            past_key_values=None,
            inputs_embeds=[embs, None],
            use_cache=True,
        )
        return _Prefix(pad_masks=pad_masks, past_key_values=cache, features=features, state=state)

    def _denoise(self, prefix: _Prefix, x_t: Tensor, t: Tensor) -> Tensor:
        return self.lerobot.model.denoise_step(
            prefix_pad_masks=prefix.pad_masks, past_key_values=prefix.past_key_values, x_t=x_t, timestep=t
        )

    def actions_to_env(self, actions: Tensor) -> Tensor:
        """Unnormalize (and apply SmolVLA's Aloha action encoding when its config asks for it)."""
        if self.lerobot.config.adapt_to_pi_aloha:
            actions = self.lerobot._pi_aloha_encode_actions(actions.clone())
        return super().actions_to_env(actions)


__all__ = [
    "LeRobotFlowConfig", "LeRobotFlowPolicy", "LeRobotPI05Policy", "LeRobotPI0Policy", "LeRobotParts",
    "LeRobotSmolVLAPolicy", "PI05AdapterConfig", "PI0AdapterConfig", "SmolVLAAdapterConfig",
]
