"""Checkpoints written atomically, keep-last-N, best-by-eval, and exact resume.

A checkpoint is a folder ``<run>/checkpoints/iter_<k>/`` with the policy
(``policy/``, via ``save_pretrained``), ``trainer.pt`` (optimizer and scheduler
states, RNG states, iteration, counters) and ``config.json``. It is written
into a temporary sibling folder and renamed into place, so a crash or SIGKILL
never leaves a half-written checkpoint under its final name; ``latest`` is a
small text file replaced atomically after the rename.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

LATEST = "latest"
BEST = "best"


def rng_state() -> dict[str, Any]:
    """Python, numpy and torch RNG states."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def save_checkpoint(
    ckpt_dir: str | Path,
    iteration: int,
    policy: Any,
    trainer_state: dict[str, Any],
    config: dict[str, Any],
    keep_last: int = 3,
) -> Path:
    """Write checkpoint ``iter_<iteration>`` atomically, point ``latest`` at it, prune old ones.

    ``trainer_state`` holds optimizer/scheduler state dicts, counters and the
    RNG states (see :func:`rng_state`). The ``best`` checkpoint (if any) is never pruned.
    """
    ckpt_dir = Path(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    name = f"iter_{iteration:06d}"
    final = ckpt_dir / name
    tmp = ckpt_dir / f".{name}.tmp{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    policy.save_pretrained(tmp / "policy")
    torch.save(trainer_state, tmp / "trainer.pt")
    (tmp / "config.json").write_text(json.dumps(config, indent=2, default=str))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _atomic_write_text(ckpt_dir / LATEST, name)
    _prune(ckpt_dir, keep_last)
    return final


def mark_best(ckpt_dir: str | Path, checkpoint: Path, metric: float) -> None:
    """Copy ``checkpoint`` to ``best/`` (atomically) and record its metric."""
    ckpt_dir = Path(ckpt_dir)
    tmp = ckpt_dir / f".best.tmp{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    shutil.copytree(checkpoint, tmp)
    (tmp / "best.json").write_text(json.dumps({"from": checkpoint.name, "metric": metric}))
    old = ckpt_dir / f".best.old{os.getpid()}"
    if (ckpt_dir / BEST).exists():
        os.replace(ckpt_dir / BEST, old)
    os.replace(tmp, ckpt_dir / BEST)
    shutil.rmtree(old, ignore_errors=True)


def best_metric(ckpt_dir: str | Path) -> float | None:
    """The metric recorded with ``best/``, or None."""
    f = Path(ckpt_dir) / BEST / "best.json"
    return json.loads(f.read_text())["metric"] if f.exists() else None


def latest_checkpoint(ckpt_dir: str | Path) -> Path | None:
    """The last complete checkpoint folder, or None when there is none."""
    ckpt_dir = Path(ckpt_dir)
    pointer = ckpt_dir / LATEST
    if pointer.exists():
        cand = ckpt_dir / pointer.read_text().strip()
        if (cand / "trainer.pt").exists():
            return cand
    done = sorted(p for p in ckpt_dir.glob("iter_*") if (p / "trainer.pt").exists())
    return done[-1] if done else None


def load_trainer_state(checkpoint: str | Path) -> dict[str, Any]:
    """The ``trainer.pt`` of a checkpoint folder.

    Raises:
        FileNotFoundError: naming the folder when it is not a complete checkpoint.
    """
    f = Path(checkpoint) / "trainer.pt"
    if not f.exists():
        raise FileNotFoundError(f"{checkpoint} is not a complete checkpoint (no trainer.pt)")
    return torch.load(f, map_location="cpu", weights_only=False)


def _prune(ckpt_dir: Path, keep_last: int) -> None:
    done = sorted(p for p in ckpt_dir.glob("iter_*") if p.is_dir())
    for old in done[: max(0, len(done) - keep_last)]:
        shutil.rmtree(old, ignore_errors=True)
    for stale in ckpt_dir.glob(".iter_*.tmp*"):
        shutil.rmtree(stale, ignore_errors=True)
