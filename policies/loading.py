"""Load any registered policy from its checkpoint folder: :func:`load_policy`.

This module sits above every policy kind: importing it imports (and so
registers in :data:`policies.registry.POLICIES`) each built-in policy module,
then :func:`load_policy` dispatches on the ``"type"`` saved in the folder's
``config.json``. Policy modules import :mod:`policies.io` and
:mod:`policies.registry`, never this module, so loading adds no import cycle.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from policies import autoregressive, compact  # noqa: F401  (registers the autoregressive and compact policies)
from policies.base import Policy
from policies.flow import lerobot  # noqa: F401  (registers pi0 / pi0.5 / SmolVLA)
from policies.io import checkpoint_type
from policies.registry import POLICIES


def load_policy(directory: str | Path, *, policy_type: str = "", **overrides: Any) -> Policy:
    """Load a policy checkpoint folder, dispatching on ``config.json["type"]``.

    Args:
        directory: a folder written by the policy's ``save_pretrained``.
        policy_type: a registered policy name to use instead of the saved ``"type"``
            (empty: the saved one).
        **overrides: passed to the policy class's ``from_pretrained`` (e.g. ``tokenizer=``).

    Raises:
        CheckpointError: for a folder without ``config.json`` or without a string ``"type"``
            (only read when ``policy_type`` is empty).
        RegistryError: for a type no policy registered (the message lists the valid ones).
    """
    kind = policy_type or checkpoint_type(directory)
    return POLICIES.get(kind).obj.from_pretrained(directory, **overrides)
