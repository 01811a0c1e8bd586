"""The compact CPU flow-matching VLA (registry name ``compact-flow``)."""

from policies.compact.config import CompactFlowConfig, TextEncoderKind
from policies.compact.policy import CompactFlowPolicy, build_compact_policy

__all__ = ["CompactFlowConfig", "CompactFlowPolicy", "TextEncoderKind", "build_compact_policy"]
