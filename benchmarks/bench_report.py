"""Shared by the benchmarks: replace one ``## Section`` of ``docs/benchmarks.md``, leaving the others intact."""

from __future__ import annotations

from pathlib import Path

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
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(out).rstrip("\n") + "\n")


def split_passthrough(argv: list[str]) -> tuple[list[str], list[str]]:
    """``(own arguments, arguments after --)``: what a benchmark parses and what it passes to the command it runs."""
    if "--" not in argv:
        return list(argv), []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1 :]
