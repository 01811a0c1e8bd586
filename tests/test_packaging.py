"""The built wheel ships every preset: ``vla-rl train --preset NAME`` works from a plain (non-editable) install."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


PACKAGES = ("vla_core", "vla_rl", "sim", "policies", "rewards", "hardware")


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory) -> set[str]:
    """The file names inside a wheel built from a copy of the source (offline: the build backend of the venv).

    A copy, because setuptools builds in the source folder: its ``build/`` would be reused by the next build (hiding
    a file the current config no longer ships) and left in the clone.
    """
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    for name in (*PACKAGES, "configs"):
        shutil.copytree(ROOT / name, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", str(out),
         str(src)], capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (wheel,) = out.glob("vla_rl-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        return set(zf.namelist())


def test_wheel_holds_every_preset_and_accelerate_config(wheel_names):
    shipped = sorted(p.relative_to(ROOT / "configs").as_posix() for p in (ROOT / "configs").rglob("*") if p.is_file())
    assert any(name.endswith(".yaml") for name in shipped)
    missing = [name for name in shipped if f"vla_rl/configs/{name}" not in wheel_names]
    assert not missing, f"configs/ files missing from the wheel (pyproject.toml package-data): {missing}"


def test_wheel_holds_the_command_and_every_package(wheel_names):
    assert "vla_rl/cli.py" in wheel_names
    packages = sorted(p.parent.relative_to(ROOT).as_posix() for top in PACKAGES for p in (ROOT / top).rglob("__init__.py"))
    missing = [p for p in packages if f"{p}/__init__.py" not in wheel_names]
    assert not missing, f"packages missing from the wheel: {missing}"
