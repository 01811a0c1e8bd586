"""No production module of ``policies.flow`` imports the tiny test fixtures (imports inside functions count).

Cycles over the whole project are checked by ``tests/test_layering.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import policies.flow

FLOW = Path(policies.flow.__file__).parent
FIXTURES = {"policies.flow.tiny"}
SMOKE_VARIANTS = {"policies.flow.lerobot_smoke"}
"""Modules whose job is to build the tiny models (the ``--smoke true`` variants of pi0 / pi0.5 / SmolVLA)."""


def module_name(path: Path) -> str:
    """Dotted name of a file under ``policies/flow`` (``__init__.py`` is the package itself)."""
    parts = ("policies", "flow", *path.relative_to(FLOW).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def flow_imports() -> dict[str, set[str]]:
    """For every ``policies.flow`` module, the ``policies.flow`` modules it imports anywhere in its body."""
    modules = {module_name(p): p for p in FLOW.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets.add(node.module)
                targets.update(f"{node.module}.{alias.name}" for alias in node.names)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def test_production_modules_do_not_import_the_tiny_fixtures() -> None:
    graph = flow_imports()
    offenders = {m: sorted(t & FIXTURES) for m, t in graph.items()
                 if m not in FIXTURES | SMOKE_VARIANTS and t & FIXTURES}
    assert not offenders, offenders
    assert "policies.flow.tiny" in graph["policies.flow.lerobot_smoke"]  # the exception is still needed
    assert graph["policies.flow.tokenizer"] == set()  # the bottom of the LeRobot stack
