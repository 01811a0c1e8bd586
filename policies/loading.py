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

from policies import autoregressive, compact, mlp  # noqa: F401  (registers the autoregressive, compact and MLP policies)
from policies.base import Policy
from policies.flow import lerobot  # noqa: F401  (registers pi0 / pi0.5 / SmolVLA)
from policies.io import checkpoint_type, verify_policy_folder
from policies.registry import POLICIES


def load_policy(directory: str | Path, *, policy_type: str = "", verify: bool = True, **overrides: Any) -> Policy:
    """Load a policy checkpoint folder, dispatching on ``config.json["type"]``.

    The folder is verified first (:func:`policies.io.verify_policy_folder`: its ``manifest.json``, or for an
    older folder without one its JSON and safetensors files), so a damaged file is named in one sentence
    instead of failing deep inside a loader. With ``policy_type`` given, a ``directory`` that is no local
    folder (a Hub id) is passed on unverified.

    Args:
        directory: a folder written by the policy's ``save_pretrained``.
        policy_type: a registered policy name to use instead of the saved ``"type"``
            (empty: the saved one).
        verify: False skips the verification (the caller has just verified the folder, e.g. a training
            checkpoint whose own manifest covers its ``policy/``).
        **overrides: passed to the policy class's ``from_pretrained`` (e.g. ``tokenizer=``).

    Raises:
        CheckpointError: for a missing folder, a missing, truncated, altered or malformed file (naming it),
            or a folder without ``config.json`` or without a string ``"type"`` (only read when
            ``policy_type`` is empty).
        RegistryError: for a type no policy registered (the message lists the valid ones).
    """
    if verify and (not policy_type or Path(directory).is_dir()):
        verify_policy_folder(directory)
    kind = policy_type or checkpoint_type(directory)
    return POLICIES.get(kind).obj.from_pretrained(directory, **overrides)
