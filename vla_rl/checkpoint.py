"""Checkpoints that verify: written durably and atomically, keep-last-N, best-by-eval, and exact resume.

A checkpoint is a folder ``<run>/checkpoints/iter_<k>/`` with the policy
(``policy/``, via ``save_pretrained``, with its own manifest), ``trainer.pt``
(learner state, RNG states, iteration, counters), ``config.json`` and, written
last, ``manifest.json``: the relative path, size and sha256 of every other file,
the policy's included (:mod:`vla_core.manifest`). It is written into a temporary
sibling folder, every file and the folder are fsync'ed, the folder is renamed
into place and the parent folder fsync'ed; ``latest`` is a small text file
replaced the same way after the rename. A crash, a SIGKILL or a failed write
never leaves a half-written checkpoint under its final name, nor moves
``latest`` off the previous one.

Resuming (:func:`resume_checkpoint`) takes the newest checkpoint that verifies
and reports every newer one it skips, naming the file and what is wrong with it.
A checkpoint that fails verification is never deleted: keep-last pruning counts
only sound checkpoints as kept and leaves damaged ones where they are, and a new
checkpoint of the same iteration moves a damaged one aside to
``iter_<k>.damaged-<n>`` (remove those by hand once inspected). A checkpoint
written before manifests existed (no ``manifest.json``) is accepted, unverified,
when its ``trainer.pt`` and policy load; resuming says so.

``trainer.pt`` is read with ``torch.load(weights_only=True)``: it holds tensors,
numbers, strings and containers only (the numpy RNG state is stored as a tensor).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from policies.io import CheckpointError, verify_policy_folder
from vla_core.manifest import (
    IntegrityError,
    fsync_dir,
    move_aside,
    verify_manifest,
    write_manifest,
    write_text_atomic,
)

LATEST = "latest"
BEST = "best"
TRAINER_FILE = "trainer.pt"
POLICY_DIR = "policy"
_ITER = re.compile(r"iter_(\d+)")

Report = Callable[[str], None]


def rng_state() -> dict[str, Any]:
    """Python, numpy and torch (and CUDA) RNG states, as tensors, numbers and tuples only (safe to load with
    ``weights_only=True``)."""
    name, key, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {"bit_generator": str(name), "key": torch.from_numpy(np.asarray(key, dtype=np.int64)),
                  "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured (also the numpy tuple that checkpoints before manifests hold)."""
    random.setstate(state["python"])
    npstate = state["numpy"]
    if isinstance(npstate, dict):
        npstate = (npstate["bit_generator"], npstate["key"].numpy().astype(np.uint32), npstate["pos"],
                   npstate["has_gauss"], npstate["cached_gaussian"])
    np.random.set_state(npstate)
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _label(folder: Path) -> str:
    """``checkpoints/iter_000005``: how messages name a checkpoint folder."""
    return f"{folder.parent.name}/{folder.name}"


def _reason(folder: Path, exc: Exception) -> str:
    """The message of ``exc`` with ``folder``'s own path dropped from the file names it gives."""
    return str(exc).replace(f"{folder}{os.sep}", "")


def checkpoints(ckpt_dir: str | Path) -> list[Path]:
    """The ``iter_<k>`` folders of ``ckpt_dir``, newest (highest k) first; moved-aside and temporary ones excluded."""
    found = [p for p in Path(ckpt_dir).glob("iter_*") if p.is_dir() and _ITER.fullmatch(p.name)]
    return sorted(found, key=lambda p: int(_ITER.fullmatch(p.name).group(1)), reverse=True)  # type: ignore[union-attr]


def save_checkpoint(
    ckpt_dir: str | Path,
    iteration: int,
    policy: Any,
    trainer_state: dict[str, Any],
    config: dict[str, Any],
    keep_last: int = 3,
    report: Report = print,
) -> Path:
    """Write checkpoint ``iter_<iteration>`` durably and atomically, point ``latest`` at it, prune old ones.

    ``trainer_state`` holds the learner state, counters and the RNG states (see :func:`rng_state`): tensors,
    numbers, strings and containers only. The ``best`` checkpoint (if any) is never pruned, nor is a damaged
    one (see the module doc); an existing damaged ``iter_<iteration>`` is moved aside (``report`` says so).

    Raises:
        OSError: from the file system (disk full, permissions), with its errno and a message naming the
            checkpoint that failed and the previous one that is kept; the temporary folder is removed, and the
            previous checkpoints and ``latest`` are left as they were.
    """
    ckpt_dir = Path(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    name = f"iter_{iteration:06d}"
    final = ckpt_dir / name
    tmp = ckpt_dir / f".{name}.tmp{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        tmp.mkdir()
        policy.save_pretrained(tmp / POLICY_DIR)
        torch.save(trainer_state, tmp / TRAINER_FILE)
        (tmp / "config.json").write_text(json.dumps(config, indent=2, default=str))
        write_manifest(tmp)
    except OSError as exc:  # disk full, permissions: say what is kept, in the error's one line
        shutil.rmtree(tmp, ignore_errors=True)
        kept = latest_checkpoint(ckpt_dir)
        what = (f"the previous checkpoint {_label(kept)} is kept (resume from it with --resume true)" if kept
                else "there is no earlier checkpoint")
        raise OSError(exc.errno, f"writing checkpoint {_label(final)} failed ({exc.strerror or exc}); nothing was "
                      f"written under its name, {what}") from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.exists():
        if _problem(final) is None:
            _remove(final)  # a sound checkpoint of the same iteration (a rerun): replaced
        else:
            report(f"moved damaged {_label(final)} aside to {move_aside(final).name}")
    os.replace(tmp, final)
    fsync_dir(ckpt_dir)
    try:
        write_text_atomic(ckpt_dir / LATEST, name)
    except OSError as exc:
        raise OSError(exc.errno, f"checkpoint {_label(final)} was written and verifies, but updating {LATEST} "
                      f"failed ({exc.strerror or exc}); --resume true continues from {_label(final)}") from exc
    _prune(ckpt_dir, keep_last, final)
    return final


def mark_best(ckpt_dir: str | Path, checkpoint: Path, metric: float, report: Report = print) -> None:
    """Copy ``checkpoint`` to ``best/`` (with ``best.json`` recording the metric and a new manifest), durably and
    atomically. A damaged ``best/`` is moved aside to ``best.damaged-<n>``, never deleted.

    Raises:
        OSError: from the file system; ``best/`` is then left as it was.
    """
    ckpt_dir = Path(ckpt_dir)
    _recover_best(ckpt_dir, report)
    tmp = ckpt_dir / f".best.tmp{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        shutil.copytree(checkpoint, tmp)
        (tmp / "best.json").write_text(json.dumps({"from": checkpoint.name, "metric": metric}))
        write_manifest(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    best = ckpt_dir / BEST
    old = ckpt_dir / f".best.old{os.getpid()}"
    if best.exists():
        if _problem(best) is None:
            os.replace(best, old)
        else:
            report(f"moved damaged {_label(best)} aside to {move_aside(best).name}")
    os.replace(tmp, best)
    fsync_dir(ckpt_dir)
    shutil.rmtree(old, ignore_errors=True)


def best_metric(ckpt_dir: str | Path, report: Report = print) -> float | None:
    """The metric recorded with ``best/``, or None when there is none or it does not verify (``report`` says
    which file is damaged; the next better evaluation then replaces it, moving it aside)."""
    _recover_best(Path(ckpt_dir), report)
    best = Path(ckpt_dir) / BEST
    if not best.exists():
        return None
    problem = _problem(best)
    if problem is not None:
        report(f"ignoring {_label(best)}: {problem}")
        return None
    try:
        return float(json.loads((best / "best.json").read_text())["metric"])
    except (OSError, ValueError, KeyError, TypeError):
        report(f"ignoring {_label(best)}: best.json holds no metric")
        return None


def verify_checkpoint(checkpoint: str | Path) -> bool:
    """Check a checkpoint folder (``iter_<k>`` or ``best``) before loading it.

    Returns:
        True when its manifest verifies every file; False for a checkpoint without a manifest (written before
        manifests) whose ``trainer.pt`` and policy load.

    Raises:
        CheckpointError: naming the file that is missing, truncated, altered or unreadable.
    """
    folder = Path(checkpoint)
    if not (folder / TRAINER_FILE).is_file():
        raise CheckpointError(f"{folder}: no {TRAINER_FILE}; not a complete checkpoint")
    try:
        verified = verify_manifest(folder)
    except IntegrityError as exc:
        raise CheckpointError(str(exc)) from None
    if not verified:
        load_trainer_state(folder)
        verify_policy_folder(folder / POLICY_DIR)
    return verified


def _problem(folder: Path) -> str | None:
    """Why ``folder`` is not a sound checkpoint (relative file names), or None."""
    try:
        verify_checkpoint(folder)
    except CheckpointError as exc:
        return _reason(folder, exc)
    return None


def resume_checkpoint(ckpt_dir: str | Path, report: Report = print) -> Path | None:
    """The newest checkpoint of ``ckpt_dir`` that verifies, or None when there is none.

    Each newer checkpoint that does not verify is reported as one line (``skipping checkpoints/iter_000005:
    trainer.pt has 1024 bytes, the manifest says 52311``) and left on disk; a checkpoint accepted without a
    manifest is reported as unverified.
    """
    for cand in checkpoints(ckpt_dir):
        try:
            verified = verify_checkpoint(cand)
        except CheckpointError as exc:
            report(f"skipping {_label(cand)}: {_reason(cand, exc)}")
            continue
        if not verified:
            report(f"note: {_label(cand)} has no manifest.json (written before checkpoints were verified); "
                   "its files load, so resuming from it unverified")
        return cand
    return None


def latest_checkpoint(ckpt_dir: str | Path) -> Path | None:
    """The newest checkpoint folder that verifies, or None (:func:`resume_checkpoint` without the report)."""
    return resume_checkpoint(ckpt_dir, report=lambda line: None)


def _legacy_numpy_globals() -> list[Any]:
    """The numpy types a ``trainer.pt`` written before manifests needs (its numpy RNG state is an ndarray)."""
    try:
        from numpy._core.multiarray import _reconstruct  # numpy >= 2
    except ImportError:  # numpy 1.x
        from numpy.core.multiarray import _reconstruct  # type: ignore[no-redef]

    return [(_reconstruct, "numpy.core.multiarray._reconstruct"), _reconstruct, np.ndarray, np.dtype,
            type(np.dtype(np.uint32))]


def load_trainer_state(checkpoint: str | Path) -> dict[str, Any]:
    """The ``trainer.pt`` of a checkpoint folder, read with ``torch.load(weights_only=True)`` (no arbitrary
    code runs; only the numpy array types of older checkpoints' RNG state are allowed besides tensors).

    Raises:
        CheckpointError: naming the folder when it is not a complete checkpoint, or the file when it cannot be
            read (truncated, corrupted, or holding types outside the allowed ones).
    """
    f = Path(checkpoint) / TRAINER_FILE
    if not f.is_file():
        raise CheckpointError(f"{checkpoint}: no {TRAINER_FILE}; not a complete checkpoint")
    try:
        with torch.serialization.safe_globals(_legacy_numpy_globals()):
            state = torch.load(f, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises RuntimeError, UnpicklingError, EOFError... for a damaged file
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{f}: cannot be read as a trainer state ({first})") from None
    if not isinstance(state, dict) or not {"learner", "rng", "iteration"} <= set(state):
        raise CheckpointError(f"{f}: expected a dict with 'learner', 'rng' and 'iteration'")
    return state


def _prune(ckpt_dir: Path, keep_last: int, written: Path) -> None:
    """Keep the newest ``keep_last`` sound checkpoints (``written`` counts as sound), delete older sound ones.

    A damaged checkpoint is neither counted as kept nor deleted: counting it would let pruning delete the
    sound checkpoint a resume needs, deleting it would destroy what a user may want to inspect or repair.
    Stale temporary folders of interrupted writes (never renamed into place) are removed.
    """
    kept = 0
    for cand in checkpoints(ckpt_dir):
        sound = cand == written or _problem(cand) is None
        if not sound:
            continue
        if kept < keep_last:
            kept += 1
        else:
            _remove(cand)
    for stale in [*ckpt_dir.glob(".iter_*.tmp*"), *ckpt_dir.glob(".iter_*.old*"), *ckpt_dir.glob(".best.tmp*")]:
        shutil.rmtree(stale, ignore_errors=True)
    for stale in ckpt_dir.glob(f".{LATEST}.tmp*"):  # a kill between writing and renaming ``latest``
        stale.unlink(missing_ok=True)


def _remove(folder: Path) -> None:
    """Delete a sound checkpoint folder: renamed out of its final name first (``.<name>.old<pid>``), so a kill
    during the deletion leaves no half-deleted folder under a checkpoint's name (:func:`_prune` removes the
    hidden leftover later)."""
    hidden = folder.with_name(f".{folder.name}.old{os.getpid()}")
    os.replace(folder, hidden)
    fsync_dir(folder.parent)
    shutil.rmtree(hidden, ignore_errors=True)


def _recover_best(ckpt_dir: Path, report: Report) -> None:
    """Put back a ``best/`` that :func:`mark_best` had moved to ``.best.old<pid>`` when it was killed before
    renaming the new one into place (the old one is then the only copy); remove older such copies."""
    olds = sorted(ckpt_dir.glob(".best.old*"), key=lambda p: p.stat().st_mtime, reverse=True)
    if olds and not (ckpt_dir / BEST).exists():
        os.replace(olds.pop(0), ckpt_dir / BEST)
        fsync_dir(ckpt_dir)
        report(f"restored {_label(ckpt_dir / BEST)} from an interrupted update")
    for old in olds:
        shutil.rmtree(old, ignore_errors=True)
