"""The policy registry and loading a checkpoint folder by its saved type.

Policies register with ``@POLICIES.register("compact-flow", config=CompactFlowConfig)``.
Every checkpoint folder holds a ``config.json`` whose ``"type"`` key names the
registered policy, so :func:`load_policy` needs nothing but the path.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vla_rl.registry import Registry

POLICIES: Registry = Registry("policy")

CONFIG_FILE = "config.json"
TYPE_KEY = "type"


def load_policy(path: str | Path, **overrides: Any) -> Any:
    """Load the policy saved in ``path`` (a folder written by ``save_pretrained``).

    Raises:
        FileNotFoundError: naming ``path`` when it has no ``config.json``.
        KeyError: when ``config.json`` lacks ``"type"`` or names an unregistered policy.
    """
    import policies  # noqa: F401  (registers every policy module)

    path = Path(path)
    cfg_file = path / CONFIG_FILE
    if not cfg_file.is_file():
        raise FileNotFoundError(f"{path}: not a policy checkpoint (no {CONFIG_FILE}); pass a folder saved by save_pretrained")
    saved = json.loads(cfg_file.read_text())
    if TYPE_KEY not in saved:
        raise KeyError(f"{cfg_file}: missing key {TYPE_KEY!r} naming the policy type ({', '.join(POLICIES.names())})")
    return POLICIES.get(saved[TYPE_KEY]).obj.from_pretrained(path, **overrides)
