"""Loading a benchmark script (``benchmarks/<name>.py``) as a module, and reading a section of the published
``docs/benchmarks.md``, for tests that hold a script's functions or its rendered tables to account."""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as a module (the scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(f"{name}_bench", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def docs_section(title: str, text: str | None = None) -> str:
    """The body of the ``title`` section (``## ...``) of ``text`` (default: ``docs/benchmarks.md``), up to the next
    ``## `` heading, without surrounding blank lines."""
    text = (ROOT / "docs" / "benchmarks.md").read_text() if text is None else text
    body = text.split(f"\n{title}\n", 1)[1]
    return body.split("\n## ", 1)[0].strip("\n")
