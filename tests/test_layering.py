"""The import graph of the first-party packages respects the layers and has no cycles.

The layers (see README.md, "Layout"), bottom to top::

    vla_core                      imports no project package
    sim, policies                 vla_core only (and themselves; never each other)
    rewards                       vla_core, sim, policies
    hardware                      vla_core, sim, policies, rewards
    vla_rl                        everything

The test reads every ``.py`` file of these packages with :mod:`ast` (it imports
nothing, so it runs in a fraction of a second without the optional
dependencies) and collects every ``import`` / ``from ... import`` statement,
wherever it sits: at module level, inside functions (lazy imports), inside
``try`` blocks and inside ``if TYPE_CHECKING:`` blocks.

What counts where (decided here, once):

* **Layer rules count every import, type-only ones included.** A
  ``TYPE_CHECKING`` import of an upper layer's type is still a dependency of the
  lower layer on the upper one; the type belongs lower (usually in ``vla_core``).
* **The cycle check skips imports under ``if TYPE_CHECKING:``.** They never run,
  and a type-only back-reference is how two modules annotate each other
  without importing each other at runtime. Every other import counts, lazy
  in-function imports included: a lazy import hides a cycle, it does not break
  it.
* An edge goes to the module that is imported: ``import a.b.c`` and
  ``from a.b import c`` (when ``a/b/c.py`` or ``a/b/c/__init__.py`` exists) both
  give the edge to ``a.b.c``; ``from a.b import name`` (``name`` an attribute)
  gives the edge to ``a.b``. The parent packages that Python initializes on the
  way are not edges (otherwise every re-exporting ``__init__`` would close a
  cycle with its own submodules).
* Relative imports are resolved against the importing module's package.

The check is generic: new modules and packages are discovered from the file
tree; there is no list of modules to keep up to date.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Which first-party packages each package may import (itself always allowed).
ALLOWED: dict[str, frozenset[str]] = {
    "vla_core": frozenset(),
    "sim": frozenset({"vla_core"}),
    "policies": frozenset({"vla_core"}),
    "rewards": frozenset({"vla_core", "sim", "policies"}),
    "hardware": frozenset({"vla_core", "sim", "policies", "rewards"}),
    "vla_rl": frozenset({"vla_core", "sim", "policies", "rewards", "hardware"}),
}
PACKAGES = tuple(ALLOWED)

KNOWN_CYCLE_EDGES_TO_REMOVE: frozenset[tuple[str, str]] = frozenset()
"""Import edges (importer, imported) that close a known cycle being removed elsewhere: none left. The cycle
check ignores these edges, and ``test_known_cycle_exceptions_are_still_needed`` fails once one is gone."""


@dataclass(frozen=True)
class Import:
    """One first-party import statement, resolved to the module it imports."""

    importer: str  # dotted module name of the importing file
    target: str  # dotted module name imported (an existing first-party module)
    path: Path  # importing file
    lineno: int
    statement: str  # the source text of the statement, for messages
    type_only: bool  # under ``if TYPE_CHECKING:``

    @property
    def where(self) -> str:
        """``path:line``, relative to the repository root when inside it."""
        path = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path
        return f"{path}:{self.lineno}"

    def __str__(self) -> str:
        return f"{self.where}: {self.statement}"


def discover_modules(root: Path = ROOT) -> dict[str, Path]:
    """Map every module of :data:`PACKAGES` under ``root`` (dotted name) to its file."""
    modules: dict[str, Path] = {}
    for package in PACKAGES:
        base = root / package
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    """True for ``TYPE_CHECKING`` and ``typing.TYPE_CHECKING``."""
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _import_nodes(tree: ast.AST) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import node of ``tree`` and whether it sits under ``if TYPE_CHECKING:``."""

    def visit(node: ast.AST, type_only: bool) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, type_only
            return
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                yield from visit(child, True)
            for child in node.orelse:  # the runtime branch of ``if TYPE_CHECKING: ... else: ...``
                yield from visit(child, type_only)
            return
        for child in ast.iter_child_nodes(node):
            yield from visit(child, type_only)

    yield from visit(tree, False)


def _first_party(name: str) -> bool:
    return name.split(".", 1)[0] in ALLOWED


def collect_imports(modules: dict[str, Path], root: Path = ROOT) -> tuple[list[Import], list[str]]:
    """All first-party imports of ``modules``, and the ones that name no existing module.

    Returns ``(imports, unresolved)``: ``unresolved`` lists, as ``file:line: statement``,
    first-party imports whose module does not exist (a stale lazy import, say).
    """
    imports: list[Import] = []
    unresolved: list[str] = []
    for module, path in modules.items():
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source, filename=str(path))
        is_package = path.name == "__init__.py"
        for node, type_only in _import_nodes(tree):
            statement = " ".join((ast.get_source_segment(source, node) or "").split())
            where = f"{path.relative_to(root)}:{node.lineno}"
            targets: list[str] = []  # dotted names, checked against ``modules`` below
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names if _first_party(alias.name)]
            else:
                if node.level:
                    package_parts = module.split(".") if is_package else module.split(".")[:-1]
                    keep = len(package_parts) - (node.level - 1)
                    if keep < 1:
                        unresolved.append(f"{where}: {statement} (relative import beyond the top package)")
                        continue
                    base = ".".join(package_parts[:keep] + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                if not _first_party(base):
                    continue
                for alias in node.names:
                    submodule = f"{base}.{alias.name}"
                    targets.append(submodule if submodule in modules else base)
            for target in targets:
                if target not in modules:
                    unresolved.append(f"{where}: {statement} ({target} is not a module of this repository)")
                    continue
                imports.append(Import(module, target, path, node.lineno, statement, type_only))
    return imports, unresolved


def layer_violations(imports: list[Import]) -> list[str]:
    """``file:line: statement`` for every import that points up or sideways."""
    problems = []
    for imp in imports:
        src = imp.importer.split(".", 1)[0]
        dst = imp.target.split(".", 1)[0]
        if dst != src and dst not in ALLOWED[src]:
            allowed = ", ".join(sorted(ALLOWED[src])) or "no project package"
            problems.append(f"{imp}  [{src} -> {dst}; {src} may import {allowed}]")
    return problems


def find_cycles(imports: list[Import], ignore: frozenset[tuple[str, str]] = frozenset()) -> list[list[Import]]:
    """One cycle (as the list of import statements along it) per strongly connected component.

    Type-only imports and the ``ignore``d edges are left out of the graph.
    """
    edges: dict[str, dict[str, Import]] = {}
    for imp in imports:
        if imp.type_only or (imp.importer, imp.target) in ignore:
            continue
        edges.setdefault(imp.importer, {}).setdefault(imp.target, imp)

    # Tarjan's strongly connected components, iteratively (no recursion limit).
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    nodes = sorted(set(edges) | {t for targets in edges.values() for t in targets})
    for root in nodes:
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(edges.get(root, {}))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            advanced = False
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = counter
                    counter += 1
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(edges.get(succ, {})))))
                    advanced = True
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(component)

    cycles = []
    for component in components:
        members = set(component)
        start = min(component)
        if len(component) == 1 and start not in edges.get(start, {}):
            continue
        # Shortest path start -> ... -> start inside the component (breadth first).
        previous: dict[str, str] = {}
        frontier = [start]
        found = None
        while frontier and found is None:
            next_frontier = []
            for node in frontier:
                for succ in sorted(edges.get(node, {})):
                    if succ not in members:
                        continue
                    if succ == start:
                        found = node
                        break
                    if succ not in previous:
                        previous[succ] = node
                        next_frontier.append(succ)
                if found is not None:
                    break
            frontier = next_frontier
        assert found is not None
        path = [found]
        while path[-1] != start:
            path.append(previous[path[-1]])
        path.reverse()  # start ... found
        path.append(start)
        cycles.append([edges[a][b] for a, b in itertools.pairwise(path)])
    return cycles


def _format_cycle(cycle: list[Import]) -> str:
    chain = " -> ".join([cycle[0].importer] + [imp.target for imp in cycle])
    steps = "\n".join(f"      {imp}" for imp in cycle)
    return f"  {chain}\n{steps}"


@pytest.fixture(scope="module")
def graph() -> tuple[list[Import], list[str]]:
    """The first-party imports of every module and the unresolvable ones."""
    return collect_imports(discover_modules())


def test_discovers_every_package(graph: tuple[list[Import], list[str]]) -> None:
    modules = discover_modules()
    for package in PACKAGES:
        assert package in modules, f"{package}/__init__.py not found under {ROOT}"


def test_imports_point_down_the_layers(graph: tuple[list[Import], list[str]]) -> None:
    imports, _ = graph
    problems = layer_violations(imports)
    assert not problems, (
        "imports that point up or sideways across layers (see tests/test_layering.py's ALLOWED):\n  "
        + "\n  ".join(problems)
    )


def test_no_import_cycles(graph: tuple[list[Import], list[str]]) -> None:
    imports, _ = graph
    cycles = find_cycles(imports, ignore=KNOWN_CYCLE_EDGES_TO_REMOVE)
    assert not cycles, "import cycles between modules (lazy imports included):\n" + "\n".join(
        _format_cycle(c) for c in cycles
    )


def test_known_cycle_exceptions_are_still_needed(graph: tuple[list[Import], list[str]]) -> None:
    imports, _ = graph
    present = {(imp.importer, imp.target) for imp in imports if not imp.type_only}
    stale = sorted(KNOWN_CYCLE_EDGES_TO_REMOVE - present)
    assert not stale, f"these edges are gone: delete them from KNOWN_CYCLE_EDGES_TO_REMOVE: {stale}"


def test_first_party_imports_name_existing_modules(graph: tuple[list[Import], list[str]]) -> None:
    _, unresolved = graph
    assert not unresolved, "first-party imports of modules that do not exist:\n  " + "\n  ".join(unresolved)


def test_cycle_finder_reports_a_lazy_cycle() -> None:
    """The checker itself: a two-module cycle through a lazy import is found, a type-only one is not."""
    here = ROOT / "tests" / "test_layering.py"
    a_to_b = Import("sim.a", "sim.b", here, 1, "from sim.b import x", False)
    b_to_a = Import("sim.b", "sim.a", here, 9, "from sim.a import y  # in a function", False)
    cycles = find_cycles([a_to_b, b_to_a])
    assert [[imp.importer for imp in c] for c in cycles] == [["sim.a", "sim.b"]]
    assert "sim.a -> sim.b -> sim.a" in _format_cycle(cycles[0])
    type_only = Import("sim.b", "sim.a", here, 9, "from sim.a import y", True)
    assert find_cycles([a_to_b, type_only]) == []
    assert find_cycles([a_to_b, b_to_a], ignore=frozenset({("sim.b", "sim.a")})) == []


def test_layer_check_reports_upward_and_sideways() -> None:
    here = ROOT / "tests" / "test_layering.py"
    up = Import("sim.core", "vla_rl.config", here, 3, "from vla_rl.config import EnvConfig", True)
    sideways = Import("policies.base", "sim.core", here, 4, "from sim.core import VecEnv", False)
    down = Import("hardware.env", "sim.core", here, 5, "from sim.core import VecEnv", False)
    problems = layer_violations([up, sideways, down])
    assert len(problems) == 2
    assert "tests/test_layering.py:3: from vla_rl.config import EnvConfig" in problems[0]
    assert "[policies -> sim;" in problems[1]


def test_collector_resolves_relative_lazy_and_type_only_imports(tmp_path: Path) -> None:
    """The checker itself, on a made-up tree: relative imports, submodule vs attribute, lazy and type-only."""
    files = {
        "sim/__init__.py": "",
        "sim/a.py": "from . import b\nfrom .b import helper\n",
        "sim/b.py": (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from vla_rl.x import T\n"
            "def f():\n    from sim import a\n"
        ),
        "vla_rl/__init__.py": "",
        "vla_rl/x.py": "import sim.a\nfrom sim.nope import z\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    imports, unresolved = collect_imports(discover_modules(tmp_path), tmp_path)
    edges = {(i.importer, i.target, i.type_only) for i in imports}
    assert edges == {
        ("sim.a", "sim.b", False),  # ``from . import b``: b is a module
        ("sim.b", "vla_rl.x", True),
        ("sim.b", "sim.a", False),  # lazy, inside f
        ("vla_rl.x", "sim.a", False),
    }
    assert unresolved == ["vla_rl/x.py:2: from sim.nope import z (sim.nope is not a module of this repository)"]
    assert [[i.importer for i in c] for c in find_cycles(imports)] == [["sim.a", "sim.b"]]
    assert [p.split("  [")[0] for p in layer_violations(imports)] == [f"{tmp_path}/sim/b.py:3: from vla_rl.x import T"]
