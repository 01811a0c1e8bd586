"""Folders that verify: a ``manifest.json`` of every file's size and sha256, and durable writes.

A folder written by the project (a policy folder, a training checkpoint, ``best/``)
ends with :func:`write_manifest`: every file is fsync'ed, then ``manifest.json``
(relative path, size in bytes and sha256 of every other file, subfolders
included) is written last and fsync'ed with the folder itself. The caller then
renames the folder into place and fsyncs its parent (:func:`fsync_dir`).
:func:`verify_manifest` checks a folder against its manifest and raises
:class:`IntegrityError` naming the first file that differs; a folder without a
manifest (written before manifests existed) is reported as unverified, not as
damaged. :func:`check_safetensors` catches a truncated or empty weights file
from its header alone, for folders without a manifest.

Standard library only: every layer may use it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

MANIFEST = "manifest.json"
"""File name of the manifest inside a folder."""
MANIFEST_VERSION = 1
_CHUNK = 1 << 20


class IntegrityError(ValueError):
    """A file that is missing, truncated or altered compared with its folder's manifest, or unreadable."""


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes (read in 1 MiB blocks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


def fsync_file(path: Path) -> None:
    """Flush a written file's bytes to the disk."""
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    """Flush a folder's entries (created, renamed, removed files) to the disk; a no-op where folders cannot be
    opened (Windows)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_atomic(path: str | Path, write: Callable[[BinaryIO], None]) -> None:
    """Replace the file ``path`` durably and atomically with what ``write`` writes into the open binary file it
    is given: written to ``.<name>.tmp<pid>`` beside it, fsync'ed, renamed over ``path``, the folder fsync'ed. A
    kill leaves the old file or the new one, never a half-written one (a leftover temporary file is removed on
    failure where possible).

    Raises:
        OSError: from the file system (``path`` is then unchanged); whatever ``write`` raises.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_text_atomic(path: str | Path, text: str) -> None:
    """Replace the text file ``path`` durably and atomically (:func:`write_file_atomic`).

    Raises:
        OSError: from the file system (``path`` is then unchanged).
    """
    write_file_atomic(path, lambda f: f.write(text.encode()))


def move_aside(folder: str | Path) -> Path:
    """Rename a damaged file or folder to ``<name>.damaged-<n>`` (the first free n), fsync its parent, and return the
    new path: what the project does instead of deleting something that failed verification (a user may want to
    inspect or repair it)."""
    folder = Path(folder)
    n = 1
    while (aside := folder.with_name(f"{folder.name}.damaged-{n}")).exists():
        n += 1
    os.replace(folder, aside)
    fsync_dir(folder.parent)
    return aside


def _files(folder: Path) -> list[Path]:
    """Every regular file under ``folder`` except its own manifest, sorted by relative path."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.relative_to(folder).as_posix() != MANIFEST)


def _digest(files: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of a manifest's ``files``: the manifest's own checksum, so a damaged
    manifest is named as such rather than blamed on the file whose entry it garbled."""
    return hashlib.sha256(json.dumps(files, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def write_manifest(folder: str | Path) -> dict[str, Any]:
    """fsync every file of ``folder``, then write ``folder/manifest.json`` (last) and fsync it and every subfolder.

    Returns:
        The manifest: ``{"version": 1, "files": {relative path: {"size": bytes, "sha256": hex}}, "digest": hex}``
        (``digest``: the sha256 of ``files`` as canonical JSON, the manifest's own checksum).

    Raises:
        OSError: from the file system (the folder is left without a valid manifest; callers write into a
            temporary folder and rename it only after this returns).
    """
    folder = Path(folder)
    files: dict[str, dict[str, Any]] = {}
    for path in _files(folder):
        fsync_file(path)
        files[path.relative_to(folder).as_posix()] = {"size": path.stat().st_size, "sha256": sha256_file(path)}
    manifest = {"version": MANIFEST_VERSION, "files": files, "digest": _digest(files)}
    tmp = folder / f".{MANIFEST}.tmp"
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, folder / MANIFEST)
    for sub in sorted({p.parent for p in _files(folder)} | {folder}, key=lambda p: -len(p.parts)):
        fsync_dir(sub)
    return manifest


def read_manifest(folder: str | Path) -> dict[str, Any] | None:
    """The manifest of ``folder``, or None when it has none.

    Raises:
        IntegrityError: for a manifest that is not the JSON this module writes (naming the file and line), or
            whose own checksum does not match.
    """
    path = Path(folder) / MANIFEST
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise IntegrityError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise IntegrityError(f"{path}: unreadable ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
        raise IntegrityError(f"{path}: expected a JSON object with a 'files' object (written by write_manifest)")
    if "digest" in data and data["digest"] != _digest(data["files"]):  # manifests before the digest have none
        raise IntegrityError(f"{path} does not match its own checksum (the manifest itself is corrupted)")
    return data


def verify_manifest(folder: str | Path, *, hashes: bool = True) -> bool:
    """Check every file ``folder``'s manifest lists: present, the recorded size, the recorded sha256.

    Files the manifest does not list are ignored (a later note beside a checkpoint does not damage it).

    Args:
        folder: the folder to check.
        hashes: compare sha256 too (False: sizes only, which catches truncation but not altered bytes).

    Returns:
        True when the folder verifies; False when it has no manifest (unverified, e.g. written by an older
        version or by another tool).

    Raises:
        IntegrityError: naming the first file that is missing, has another size, or another sha256, as one
            sentence (``iter_000005/trainer.pt has 1024 bytes, the manifest says 52311``).
    """
    folder = Path(folder)
    manifest = read_manifest(folder)
    if manifest is None:
        return False
    for rel, entry in sorted(manifest["files"].items()):
        path = folder / rel
        if not path.is_file():
            raise IntegrityError(f"{path} is missing (the manifest lists it)")
        size = path.stat().st_size
        if size != entry.get("size"):
            raise IntegrityError(f"{path} has {size} bytes, the manifest says {entry.get('size')}")
        if hashes and sha256_file(path) != entry.get("sha256"):
            raise IntegrityError(f"{path} does not match its sha256 in the manifest (altered or corrupted bytes)")
    return True


def check_safetensors(path: str | Path) -> None:
    """Check that a safetensors file is complete from its header alone (no tensor is read).

    The format is an 8-byte little-endian header length, a JSON header giving each tensor's byte range, then
    the data; the file must be exactly as long as the header says.

    Raises:
        IntegrityError: naming the file for an empty or truncated file, an unreadable header, or a length that
            does not match the header's byte ranges.
    """
    path = Path(path)
    size = path.stat().st_size
    if size < 8:
        raise IntegrityError(f"{path} has {size} bytes: not a safetensors file (empty or truncated)")
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if 8 + n > size:
            raise IntegrityError(f"{path} has {size} bytes but its header alone needs {8 + n}: truncated")
        try:
            header = json.loads(f.read(n))
        except (ValueError, UnicodeDecodeError):
            raise IntegrityError(f"{path}: the safetensors header is not valid JSON (corrupted file)") from None
    if not isinstance(header, dict):
        raise IntegrityError(f"{path}: the safetensors header is not a JSON object (corrupted file)")
    ends = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__" and isinstance(t, dict)
            and isinstance(t.get("data_offsets"), list) and len(t["data_offsets"]) == 2]
    expected = 8 + n + max(ends, default=0)
    if size != expected:
        raise IntegrityError(f"{path} has {size} bytes, its safetensors header says {expected}"
                             f"{': truncated' if size < expected else ''}")


@contextlib.contextmanager
def exclusive(folder: str | Path, what: str) -> Iterator[None]:
    """Hold an exclusive lock on ``<folder>.lock`` (created beside ``folder``) while the block runs.

    Two processes that may both write the same folder (two runs sharing a demo cache) check and write it inside
    this block: the second waits, printing that it does, and then finds the folder the first sealed instead of
    moving the first one's unfinished recording aside. The lock is released when the block ends or the process
    dies (``flock``); the empty lock file stays.
    """
    lock = Path(folder).with_name(Path(folder).name + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"note: another process is writing {what} {folder}; waiting for it to finish")
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
