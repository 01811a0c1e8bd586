"""Shared by the benchmarks: replace one ``## Section`` of ``docs/benchmarks.md``, leaving the others intact, and
write a results file atomically (a benchmark stopped mid-write leaves the previous numbers, not half a file)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from vla_core.manifest import write_text_atomic  # noqa: E402

HEADER = "# Benchmarks\n\nMeasured on our machine kind: 2 CPU cores, 24 GiB, no GPU (often shared with other jobs).\n"


def write_section(path: Path, title: str, body: str) -> None:
    """Replace (or append) the section headed ``title`` (e.g. ``## Simulator throughput``) with ``body``."""
    text = path.read_text() if path.exists() else HEADER
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == title), None)
    new = [title, "", *body.strip("\n").splitlines(), ""]
    if start is None:
        out = [*lines, ""] if lines and lines[-1].strip() else list(lines)
        out += new
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        out = lines[:start] + new + lines[end:]
    _replace(path, "\n".join(out).rstrip("\n") + "\n")


def write_json(path: Path, data: Any, indent: int = 1) -> None:
    """Write ``data`` as JSON at ``path`` (``benchmarks/results/<name>.json``) atomically; values JSON does not
    know (paths, numpy scalars) are written as their ``str``."""
    _replace(path, json.dumps(data, indent=indent, default=str) + "\n")


def _replace(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, text)


def split_passthrough(argv: list[str]) -> tuple[list[str], list[str]]:
    """``(own arguments, arguments after --)``: what a benchmark parses and what it passes to the command it runs."""
    if "--" not in argv:
        return list(argv), []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1 :]
