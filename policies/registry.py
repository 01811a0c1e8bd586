"""The policy registry: ``@POLICIES.register("compact-flow", config=CompactFlowConfig)``."""

from vla_rl.registry import Registry

POLICIES: Registry = Registry("policy")
