"""Fault injection for the fault suite and ``benchmarks/faults.py``: run a function in a forked child and SIGKILL it, or fail its writes with
ENOSPC, at the k-th file-system operation under a folder.

Kill points are Python's audit events (``sys.addaudithook``) that touch a path under ``root``: ``open`` (any
mode), ``os.mkdir``, ``os.rename`` (``os.replace`` too), ``os.remove``, ``os.rmdir``, ``shutil.rmtree``. Between
two consecutive events the code under test has finished one file operation and not begun the next, so killing at
every event index is killing "between every file" of a checkpoint or dataset write (files written by C/Rust code,
``torch.save`` or safetensors, raise no event of their own: the kill lands just before or after them). A forked
child needs no new interpreter (imports, the policy and envs of the parent are already there), so one injection
costs milliseconds plus the work itself; audit hooks cannot be removed, which is why they live in the child only.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EVENTS = frozenset({"open", "os.mkdir", "os.rename", "os.remove", "os.rmdir", "shutil.rmtree", "os.truncate"})
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


@dataclass
class Outcome:
    """What happened in the child."""

    status: str
    """``ok`` (returned), ``killed`` (SIGKILL-ed at the chosen event), ``error`` (raised), ``died`` (other)."""
    events: int = 0
    """Events under ``root`` seen before the child ended (for ``killed``: the index it was killed at)."""
    error: str = ""
    """``Type: message`` of the exception, for ``error``."""
    value: Any = None
    """The function's JSON-able return value, for ``ok``."""
    stdout: str = ""
    """What the child wrote to stdout (when ``capture`` was asked)."""
    stderr: str = ""
    """What the child wrote to stderr (when ``capture`` was asked)."""
    exitcode: int | None = None
    """The child's exit status (negative: killed by that signal)."""
    kinds: list[str] = field(default_factory=list)
    """The event names seen, in order (for ``count``)."""


def _touches(args: tuple, root: str) -> bool:
    for a in args:
        if isinstance(a, bytes):
            a = os.fsdecode(a)
        if isinstance(a, os.PathLike):
            a = os.fspath(a)
        if isinstance(a, str) and os.path.abspath(a).startswith(root):
            return True
    return False


def _is_write(event: str, args: tuple) -> bool:
    if event != "open":
        return event in ("os.mkdir", "os.truncate")
    mode, flags = (args + (None, None))[1:3]
    if isinstance(mode, str):
        return any(c in mode for c in "wax+")
    return isinstance(flags, int) and bool(flags & _WRITE_FLAGS)


def run_forked(fn: Callable[[], Any], root: str | Path, *, kill_at: int = 0, enospc_from: int = 0,
               kill_after_s: float = 0.0, capture: bool = False, timeout_s: float = 300.0) -> Outcome:
    """Run ``fn()`` in a forked child, counting file-system events under ``root``.

    Args:
        fn: the work (its return value must be JSON-able).
        root: the folder whose events count (absolute or relative; resolved here).
        kill_at: SIGKILL the child at event number ``kill_at`` (1-based, before the operation runs); 0 = never.
        enospc_from: from the write event number ``enospc_from`` on (opening a file for writing, making a
            folder), the operation fails with ``OSError(ENOSPC)`` as on a full disk; 0 = never.
        kill_after_s: SIGKILL the child from the parent after this many seconds (a kill at a random point of
            the work, not tied to a file operation); 0 = never.
        capture: collect the child's stdout and stderr into :attr:`Outcome.stdout` / :attr:`Outcome.stderr`.
        timeout_s: SIGKILL and fail after this long.
    """
    root = os.path.abspath(root)
    fd, result_path = tempfile.mkstemp(prefix="fault-result-", suffix=".json")
    os.close(fd)
    out_path, err_path = result_path.replace(".json", ".out"), result_path.replace(".json", ".err")
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        state = {"n": 0, "writes": 0, "armed": True, "kinds": []}

        def hook(event: str, args: tuple) -> None:
            if not state["armed"] or event not in EVENTS or not _touches(args, root):
                return
            state["n"] += 1
            state["kinds"].append(event)
            if kill_at and state["n"] >= kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            if enospc_from and _is_write(event, args):
                state["writes"] += 1
                if state["writes"] >= enospc_from:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(args[0]))

        code = 0
        try:
            if capture:
                for path, target in ((out_path, 1), (err_path, 2)):
                    os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), target)
                # pytest's capture swaps sys.stdout/err for its own files: write through the fds instead
                sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
                sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
            sys.addaudithook(hook)
            value = fn()
            result = {"status": "ok", "value": value}
        except SystemExit as exc:
            result = {"status": "error", "error": f"SystemExit: {exc.code}", "value": exc.code}
            code = 1
        except BaseException as exc:  # noqa: BLE001  reported to the parent
            result = {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
            code = 1
        state["armed"] = False
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            result.update(events=state["n"], kinds=state["kinds"])
            with open(result_path, "w") as f:
                json.dump(result, f, default=str)
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout_s
    killed_by_parent = False
    start = time.monotonic()
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        now = time.monotonic()
        if (kill_after_s and now - start >= kill_after_s) or now > deadline:
            killed_by_parent = now <= deadline
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            if not killed_by_parent:
                raise TimeoutError(f"the forked child ran past {timeout_s} s")
            break
        time.sleep(0.01)
    code = os.waitstatus_to_exitcode(status)
    stdout, stderr = (Path(p).read_text() if capture and Path(p).exists() else "" for p in (out_path, err_path))
    Path(out_path).unlink(missing_ok=True)
    Path(err_path).unlink(missing_ok=True)
    text = Path(result_path).read_text()
    Path(result_path).unlink(missing_ok=True)
    if code == -signal.SIGKILL:
        return Outcome("killed", events=kill_at, stdout=stdout, stderr=stderr, exitcode=code)
    if not text:
        return Outcome("died", stdout=stdout, stderr=stderr, exitcode=code)
    data = json.loads(text)
    return Outcome(data["status"], events=data.get("events", 0), error=data.get("error", ""),
                   value=data.get("value"), stdout=stdout, stderr=stderr, exitcode=code, kinds=data.get("kinds", []))


def count_events(fn: Callable[[], Any], root: str | Path) -> Outcome:
    """Run ``fn`` once in a forked child without faults: :attr:`Outcome.events` is how many kill points it has."""
    out = run_forked(fn, root)
    assert out.status == "ok", out.error or out.stderr
    return out


def flip_bit(path: Path, offset: int | None = None, seed: int = 0) -> int:
    """Flip one bit of ``path`` in place (at byte ``offset``, default a seeded position in the file's middle
    half); returns the byte offset."""
    data = bytearray(path.read_bytes())
    if offset is None:
        import random

        offset = random.Random(seed).randrange(len(data) // 4, max(len(data) // 4 + 1, 3 * len(data) // 4))
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))
    return offset


def truncate(path: Path, size: int | None = None) -> None:
    """Cut ``path`` to ``size`` bytes (default: half of it); 0 empties it."""
    full = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(full // 2 if size is None else size)
