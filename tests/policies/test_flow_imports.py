"""The import graph of ``policies.flow``: no cycles (imports inside functions count) and no production module
importing the tiny test fixtures."""

from __future__ import annotations

import ast
from pathlib import Path

import policies.flow

FLOW = Path(policies.flow.__file__).parent
FIXTURES = {"policies.flow.tiny"}


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


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as ``[a, b, ..., a]``, or None (depth-first search with an explicit path)."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        for nxt in sorted(graph[node]):
            if nxt in path:
                return path[path.index(nxt):] + [nxt]
            if nxt not in done:
                found = visit(nxt, path + [nxt])
                if found:
                    return found
        done.add(node)
        return None

    for start in sorted(graph):
        found = visit(start, [start])
        if found:
            return found
    return None


def test_find_cycle_detects_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_among_flow_modules() -> None:
    graph = flow_imports()
    assert "policies.flow.lerobot_base" in graph and "policies.flow.tokenizer" in graph
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_production_modules_do_not_import_the_tiny_fixtures() -> None:
    graph = flow_imports()
    offenders = {m: sorted(t & FIXTURES) for m, t in graph.items() if m not in FIXTURES and t & FIXTURES}
    assert not offenders, offenders
    assert graph["policies.flow.tokenizer"] == set()  # the bottom of the LeRobot stack
