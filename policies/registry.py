"""The policy registry: ``@POLICIES.register("compact-flow", config=CompactFlowConfig)``.

Every checkpoint folder holds a ``config.json`` whose ``"type"`` key names the
registered policy, so :func:`policies.loading.load_policy` needs nothing but the path.
"""

from __future__ import annotations

from vla_core.registry import Registry

POLICIES: Registry = Registry("policy")
