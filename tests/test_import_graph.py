"""The imports inside hybridflow and megatron_adapters form no circle (module-level and function-level alike).

A lazy import inside a function hides a circle from Python but not from the reader: both modules then depend
on each other. The graph is read from the source (AST), so the test needs no megatron-core import.
Imports under `if TYPE_CHECKING:` are left out: they never run.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("hybridflow", "megatron_adapters")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imported(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """Every name an import statement in `tree` reaches (absolute; relative imports resolved)."""
    names: set[str] = set()
    pending = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            pending.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, base] if base else anchor)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import submodule`
        pending.extend(ast.iter_child_nodes(node))
    return names


def import_graph() -> dict[str, set[str]]:
    """module -> the package modules it imports (a `from m import name` counts as an import of m)."""
    modules = _modules()
    graph = {}
    for module, path in modules.items():
        reached = _imported(ast.parse(path.read_text()), module, path.name == "__init__.py")
        graph[module] = {name for name in reached if name in modules and name != module}
    return graph


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of the graph as [a, b, ..., a], or None (depth-first search, white/grey/black)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (circle := visit(nxt)):
                return circle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (circle := visit(node)):
            return circle
    return None


def test_finder_sees_a_circle():
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_circle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_graph_reads_function_level_and_relative_imports():
    tree = ast.parse("from .b import c\ndef f():\n    import x.y\nif TYPE_CHECKING:\n    import z\n")
    assert _imported(tree, "pkg.a", is_package=False) == {"pkg.b", "pkg.b.c", "x.y"}


def test_package_imports_form_no_circle():
    graph = import_graph()
    assert len(graph) > 100 and "hybridflow.placement.planner" in graph
    assert find_circle(graph) is None, " -> ".join(find_circle(graph))


def test_engine_records_are_a_leaf_that_config_and_placement_may_import():
    # The records' pure part (hybridflow/engines) imports only hybridflow.errors; an engine's builder is an
    # import path the rollout role resolves, so config and placement never reach engine or training code.
    graph = import_graph()
    engines = {m for m in graph if m.startswith("hybridflow.engines")}
    assert {"hybridflow.engines.megatron", "hybridflow.engines.vllm"} <= engines
    for module in engines:
        assert graph[module] <= engines | {"hybridflow.errors"}, module
    heavy = ("hybridflow.trainer", "hybridflow.roles", "hybridflow.rollout", "megatron_adapters")
    for module, deps in graph.items():
        if module.startswith(("hybridflow.config", "hybridflow.placement", "hybridflow.engines")):
            assert not [d for d in deps if d.startswith(heavy)], module
