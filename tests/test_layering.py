"""The package's layers import one way: no circle among semiring_ops/'s folders and top-level modules (each import
statement counted, those inside functions too). A lower layer reaches a higher one only through a hooks.Hook the
higher one installs."""

from __future__ import annotations

import ast
import itertools
from collections import defaultdict
from pathlib import Path

import semiring_ops

PACKAGE = Path(semiring_ops.__file__).parent


def _unit(module: str) -> str:
    """The folder or top-level module of semiring_ops a dotted module name belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def import_edges() -> dict[tuple[str, str], list[str]]:
    """(importing unit, imported unit) -> the file:line of each import statement between two different units."""
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        module = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    names = [".".join(base + ([node.module] if node.module else []))]
                else:
                    names = [node.module or ""]
                if names[0] == "semiring_ops":  # from semiring_ops import x: the unit is x
                    names = [f"semiring_ops.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                if name.startswith("semiring_ops."):
                    src, dst = _unit(module), _unit(name)
                    if src and dst and src != dst:
                        edges[(src, dst)].append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    return edges


def find_circle(edges: dict[tuple[str, str], list[str]]) -> list[str]:
    """One circle of units (first == last), or [] when the graph has none."""
    graph: dict[str, set[str]] = defaultdict(set)
    for src, dst in edges:
        graph[src].add(dst)
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(unit: str) -> list[str]:
        state[unit] = 1
        path.append(unit)
        for nxt in sorted(graph[unit]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[unit] = 2
        return []

    for unit in sorted(graph):
        if unit not in state and (found := visit(unit)):
            return found
    return []


def test_the_checker_finds_a_circle():
    edges = {("ops", "build"): ["a"], ("build", "semirings"): ["b"], ("semirings", "ops"): ["c"], ("x", "ops"): ["d"]}
    assert find_circle(edges) == ["build", "semirings", "ops", "build"]
    assert find_circle({("ops", "build"): ["a"], ("x", "ops"): ["d"]}) == []


def test_no_import_circle_among_the_packages_folders():
    edges = import_edges()
    assert ("blocks", "lazy") in edges and ("structures", "ops") in edges, "the walk sees imports"
    circle = find_circle(edges)
    where = [f"{a} -> {b}: {', '.join(edges[(a, b)][:3])}" for a, b in itertools.pairwise(circle)]
    assert not circle, "import circle:\n" + "\n".join(where)


def test_a_hook_calls_what_was_installed_and_names_its_provider_before():
    from semiring_ops.hooks import Hook

    hook = Hook("the double backward of x", "semiring_ops.higher")
    try:
        hook(1)
    except RuntimeError as exc:
        assert "the double backward of x needs semiring_ops.higher" in str(exc)
    else:
        raise AssertionError("an empty hook must raise")
    assert hook.install(lambda v: v + 1)(1) == 2 and hook(2) == 3
