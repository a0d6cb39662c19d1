"""No import cycles inside `summarize/`, found by reading the sources (nothing is imported).

Every import counts, at any depth (a function-level import still ties the modules together),
except those under `if TYPE_CHECKING:`, which never run.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "summarize"


def module_names(package: Path) -> dict[str, Path]:
    """Dotted name of every module under `package` (a package is named by its __init__)."""
    names = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(node: ast.AST):
    """Every Import and ImportFrom under `node`, at any depth, outside `if TYPE_CHECKING:` bodies."""
    skips_body = isinstance(node, ast.If) and _is_type_checking(node.test)
    for child in node.orelse if skips_body else ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        yield from _imports(child)


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute name `from ... import` reads from, relative levels resolved."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph(package: Path) -> dict[str, set[str]]:
    """module -> the modules of the same package it imports."""
    modules = module_names(package)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for module, path in modules.items():
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                source = _resolve(module, path, node)
                # `from pkg import name` reads module pkg.name when there is one, else pkg itself
                targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source for a in node.names]
            for target in targets:
                while target and target not in modules:  # `import pkg.mod.attr`-like names
                    target = target.rpartition(".")[0]
                if target and target != module:
                    graph[module].add(target)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (a path back to its start) per strongly connected component of two or more
    modules, found with Tarjan's algorithm."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_cycle_in(component, graph) for component in components]


def _cycle_in(component: set[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest path from the component's first module back to itself, inside the component."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for succ in sorted(graph[node] & component):
                if succ == start:
                    return paths[node]
                if succ not in paths:
                    paths[succ] = paths[node] + [succ]
                    following.append(succ)
        frontier = following
    raise AssertionError(f"no cycle through {start}")  # a strongly connected component has one


def _shown(cycles: list[list[str]]) -> str:
    return "\n".join(" -> ".join(cycle + cycle[:1]) for cycle in cycles)


def test_summarize_has_no_import_cycles():
    cycles = find_cycles(import_graph(PACKAGE))
    assert not cycles, "import cycles:\n" + _shown(cycles)


def test_the_finder_finds_a_cycle_through_a_function_level_import(tmp_path: Path):
    package = tmp_path / "tiny"
    package.mkdir()
    files = {
        "__init__.py": "",
        "a.py": "import tiny.b\n",
        "b.py": """
            def later():
                from tiny import a  # function level: still an edge
            """,
        "c.py": """
            from typing import TYPE_CHECKING
            from . import d
            if TYPE_CHECKING:
                from tiny.a import something  # never runs: no edge
            """,
        "d.py": """
            import typing
            if typing.TYPE_CHECKING:
                from .c import C  # never runs: no edge
            else:
                from tiny import a
            """,
    }
    for name, text in files.items():
        (package / name).write_text(textwrap.dedent(text))
    graph = import_graph(package)
    assert graph == {"tiny": set(), "tiny.a": {"tiny.b"}, "tiny.b": {"tiny.a"}, "tiny.c": {"tiny.d"},
                     "tiny.d": {"tiny.a"}}
    assert find_cycles(graph) == [["tiny.a", "tiny.b"]]
    assert _shown(find_cycles(graph)) == "tiny.a -> tiny.b -> tiny.a"
