"""Autoregressive (OpenVLA-style) VLAs: action tokenizer, batched KV-cache decoding, value head.

Importing this package registers the ``"openvla-style"`` policy in
:data:`policies.registry.POLICIES`.
"""

from policies.autoregressive.action_tokenizer import NUM_BINS, ActionTokenizer, BinScheme
from policies.autoregressive.backbones import BACKBONES, PROMPT_TEMPLATE, TINY_BACKBONE, BackboneError, VLMBackbone
from policies.autoregressive.config import AutoregressiveVLAConfig
from policies.autoregressive.decoding import Decoded, decode, score, token_logp_entropy
from policies.autoregressive.local_vlm import TinyVLMConfig
from policies.autoregressive.normalization import ActionNormalizer, NormalizationStats
from policies.autoregressive.policy import ACTION_TOKENS, POLICY_TYPE, PROMPT_IDS, PROMPT_MASK, AutoregressiveVLAPolicy

__all__ = [
    "ACTION_TOKENS",
    "BACKBONES",
    "NUM_BINS",
    "POLICY_TYPE",
    "PROMPT_IDS",
    "PROMPT_MASK",
    "PROMPT_TEMPLATE",
    "TINY_BACKBONE",
    "ActionNormalizer",
    "ActionTokenizer",
    "AutoregressiveVLAConfig",
    "AutoregressiveVLAPolicy",
    "BackboneError",
    "BinScheme",
    "Decoded",
    "NormalizationStats",
    "TinyVLMConfig",
    "VLMBackbone",
    "decode",
    "score",
    "token_logp_entropy",
]
