"""Language tokenizers of LeRobot flow checkpoints: which one a model needs, where it is, and how to serve it.

LeRobot's processor factories and its saved ``policy_preprocessor.json`` name
the tokenizer by Hub id (pi0 / pi0.5: the PaliGemma tokenizer; SmolVLA: its
``vlm_model_name``) and load it with ``AutoTokenizer.from_pretrained``. A
vla-rl checkpoint also carries the tokenizer itself in its ``tokenizer/``
subfolder, so it reloads with no Hub access. This module holds that
production logic; it imports no other :mod:`policies.flow` module (the tiny
test fixtures in :mod:`policies.flow.tiny` build on it, never the reverse).
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from policies.io import CheckpointError

PALIGEMMA_TOKENIZER = "google/paligemma-3b-pt-224"
"""Hub id of the tokenizer LeRobot's pi0 / pi0.5 processors load."""
TOKENIZER_DIR = "tokenizer"
"""Subfolder of a vla-rl checkpoint holding the language tokenizer (``save_pretrained`` files)."""


def tokenizer_repo_id(lerobot_config: Any) -> str:
    """The Hub id (or local folder) LeRobot's processor factory loads the tokenizer of ``lerobot_config`` from.

    SmolVLA configs name it in ``vlm_model_name``; pi0 / pi0.5 use :data:`PALIGEMMA_TOKENIZER`.
    """
    return str(getattr(lerobot_config, "vlm_model_name", PALIGEMMA_TOKENIZER))


def saved_tokenizer(folder: str | Path) -> Any | None:
    """The tokenizer stored in ``folder/tokenizer`` (a vla-rl checkpoint), or None when there is none.

    Raises:
        CheckpointError: the subfolder exists but holds no tokenizer transformers can read.
    """
    path = Path(folder) / TOKENIZER_DIR
    if not path.is_dir():
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as e:  # transformers raises OSError, ValueError or its own errors here
        raise CheckpointError(f"{path}: cannot read the checkpoint's tokenizer ({e}); re-save the policy, or pass "
                              f"tokenizer=... to from_pretrained") from e


@contextlib.contextmanager
def local_hub_tokenizer(tokenizer: Any, repo_id: str = PALIGEMMA_TOKENIZER) -> Iterator[Path]:
    """Serve ``tokenizer`` as Hub repo ``repo_id`` from a private, temporary Hub cache.

    Inside the context, ``AutoTokenizer.from_pretrained(repo_id)`` resolves to
    ``tokenizer``'s files (as with ``HF_HUB_OFFLINE=1`` and a populated cache), so
    LeRobot's processor factories run unchanged with a tokenizer we already hold.
    The Hub settings are restored on exit.

    Yields:
        The snapshot folder holding the tokenizer files.
    """
    from huggingface_hub import constants

    with tempfile.TemporaryDirectory(prefix="vla-rl-hub-") as cache:
        repo = Path(cache) / ("models--" + repo_id.replace("/", "--"))
        revision = "0" * 40
        snapshot = repo / "snapshots" / revision
        snapshot.mkdir(parents=True)
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(revision)
        tokenizer.save_pretrained(snapshot)
        # AutoTokenizer reads the repo's model config first; a minimal one is enough.
        (snapshot / "config.json").write_text(json.dumps({"model_type": "gemma"}))
        old_cache, old_offline = constants.HF_HUB_CACHE, constants.HF_HUB_OFFLINE
        constants.HF_HUB_CACHE, constants.HF_HUB_OFFLINE = cache, True
        try:
            yield snapshot
        finally:
            constants.HF_HUB_CACHE, constants.HF_HUB_OFFLINE = old_cache, old_offline


__all__ = ["PALIGEMMA_TOKENIZER", "TOKENIZER_DIR", "local_hub_tokenizer", "saved_tokenizer", "tokenizer_repo_id"]
