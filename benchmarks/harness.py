"""The harness every benchmark script shares: run a command per seed, then publish what it measured.

A script measures, then calls :func:`publish`, which

- writes ``benchmarks/results/NAME.json`` (overwritten by a re-run) with the benchmark's name, the command that
  produced it, the commit (``git rev-parse --short HEAD``), the machine, the date and the rows / summary;
- replaces the script's table in ``docs/results.md``: the block between ``<!-- results:NAME -->`` and
  ``<!-- /results:NAME -->``, added once at the end of the page when the markers are missing.

Every script takes ``--results-dir`` and ``--page`` (:func:`add_output_args`), so a smoke run writes to a
temporary folder instead of the published files, and ``--name``, the name a run of another recipe of the same
measurement (a second PRM recipe, say) publishes under, so it replaces its own table rather than the default's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the scripts import the project's packages from the checkout
    sys.path.insert(0, str(ROOT))

from vla_core.manifest import write_text_atomic  # noqa: E402

__all__ = ["ROOT", "SeedRun", "add_output_args", "command_line", "commit", "eval_curve", "machine", "markdown_table",
           "metric_rows", "publish", "replace_block", "run_seeds", "split_passthrough"]

RESULTS_DIR = ROOT / "benchmarks" / "results"
RESULTS_PAGE = ROOT / "docs" / "results.md"


def add_output_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``--results-dir``, ``--page`` and ``--name``: where :func:`publish` writes (default: the published
    files) and under which name (default: the benchmark's)."""
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR, help="folder of NAME.json")
    parser.add_argument("--page", type=Path, default=RESULTS_PAGE, help="markdown page whose results block to replace")
    parser.add_argument("--name", default=None, help="publish as NAME.json and the NAME block of the page "
                        "(default: the benchmark's own name; another recipe of the same measurement takes its own)")
    return parser


def commit() -> str:
    """The checkout's short commit hash, ``+dirty`` when tracked files changed; ``unknown`` outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):  # not a git checkout, or no git
        return "unknown"
    return head + ("+dirty" if dirty else "")


def machine() -> str:
    """Platform, CPU count and GPU (when torch sees one), e.g. ``Linux x86_64, 2 CPUs, no GPU``."""
    gpu = "no GPU"
    try:
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs, {gpu}"


def command_line(argv: Sequence[str] | None = None) -> str:
    """``python benchmarks/SCRIPT.py ARGS`` as the user typed it (``argv`` default: ``sys.argv[1:]``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    return shlex.join(["python", f"benchmarks/{Path(sys.argv[0]).name}", *args])


def split_passthrough(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """``(own arguments, arguments after --)``: what a script parses and what it passes to the command it runs."""
    argv = list(argv)
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1:]


@dataclass(frozen=True)
class SeedRun:
    """One seed's run of a command."""

    seed: int
    returncode: int
    wall_s: float


def run_seeds(command: Sequence[str], seeds: Sequence[int], *, env: dict[str, str] | None = None,
              check: bool = True, cwd: Path = ROOT) -> list[SeedRun]:
    """Run ``command`` once per seed, one after the other, each alone in a subprocess from ``cwd`` (default: the
    repository root) with ``OMP_NUM_THREADS=1`` unless set; ``{seed}`` in any argument is replaced by the seed.
    ``env``: variables added to this process's environment. With ``check``, raises ``RuntimeError`` naming the
    seed and the command when one exits non-zero; without, its :class:`SeedRun` records the exit status."""
    runs = []
    for seed in seeds:
        cmd = [part.replace("{seed}", str(seed)) for part in command]
        print(f"[seed {seed}] $ {shlex.join(cmd)}", flush=True)
        start = time.perf_counter()
        done = subprocess.run(cmd, cwd=cwd, env={"OMP_NUM_THREADS": "1", **os.environ, **(env or {})})
        runs.append(SeedRun(seed, done.returncode, time.perf_counter() - start))
        if check and done.returncode:
            raise RuntimeError(f"seed {seed}: `{shlex.join(cmd)}` exited with {done.returncode}")
    return runs


def metric_rows(run: Path) -> list[dict[str, Any]]:
    """The rows of a run folder's ``metrics.jsonl`` (one per iteration, plus the evaluation before the first)."""
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def eval_curve(rows: Sequence[dict[str, Any]]) -> list[dict[str, float]]:
    """The evaluations among a run's metric rows: ``[{env_steps, success, lo, hi}]`` (95% Wilson interval)."""
    return [{"env_steps": r["step"], "success": r["eval/success"], "lo": r["eval/success_ci_low"],
             "hi": r["eval/success_ci_high"]} for r in rows if "eval/success" in r]


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]], align: str = "") -> str:
    """A markdown table; ``align`` is one character per column (``l`` or ``r``, default: first left, rest right)."""
    align = align or "l" + "r" * (len(header) - 1)
    if len(align) != len(header):
        raise ValueError(f"markdown_table: {len(align)} alignments for {len(header)} columns")
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" if a == "l" else "---:" for a in align) + "|"]
    for row in rows:
        if len(row) != len(header):
            raise ValueError(f"markdown_table: a row of {len(row)} cells under {len(header)} columns: {row!r}")
        lines.append("| " + " | ".join(str(cell) for cell in row) + " |")
    return "\n".join(lines)


def replace_block(page: Path, name: str, body: str) -> None:
    """Replace the text between ``<!-- results:NAME -->`` and ``<!-- /results:NAME -->`` of ``page`` with
    ``body``; add the block at the end of the page when the markers are missing. Raises ``ValueError`` naming
    the page when only one marker is there, or either is there twice."""
    start, end = f"<!-- results:{name} -->", f"<!-- /results:{name} -->"
    text = page.read_text() if page.exists() else ""
    counts = text.count(start), text.count(end)
    block = f"{start}\n{body.strip(chr(10))}\n{end}"
    if counts == (0, 0):
        text = (text.rstrip("\n") + "\n\n" if text.strip() else "") + block + "\n"
    elif counts == (1, 1) and text.index(start) < text.index(end):
        head, rest = text.split(start, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        raise ValueError(f"{page}: expected one {start} before one {end}, found {counts[0]} and {counts[1]}")
    page.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(page, text)


def publish(name: str, args: argparse.Namespace, table: str, *, rows: Any = None, summary: Any = None,
            command: str | None = None) -> Path:
    """Write ``args.results_dir/NAME.json`` and replace the ``NAME`` block of ``args.page`` with ``table`` and a
    line saying how it was made (``NAME``: ``args.name`` when given, else ``name``); returns the results file.
    ``rows`` / ``summary``: anything JSON can hold (values it cannot, such as paths, are written as their
    ``str``). ``command``: the command line, when the script parsed other arguments than ``sys.argv``'s."""
    command = command or command_line()
    name = getattr(args, "name", None) or name
    record = {"benchmark": name, "command": command, "commit": commit(), "machine": machine(),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": rows, "summary": summary}
    path = Path(args.results_dir) / f"{name}.json"
    where = path.resolve().relative_to(ROOT) if path.resolve().is_relative_to(ROOT) else path
    made = f"`{command}` at {record['commit']} on {record['machine']}, {record['date']}; results: `{where}`."
    replace_block(Path(args.page), name, f"{table.strip(chr(10))}\n\n{made}")  # first: a broken page writes nothing
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(record, indent=1, default=str) + "\n")
    return path
