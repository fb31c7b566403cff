"""The imports inside hybridflow and megatron_adapters form no circle and never point up a layer.

A lazy import inside a function, or one under `if TYPE_CHECKING:`, hides a circle from Python but not from
the reader: both modules then depend on each other, so every import statement counts. The graph is read from
the source (AST), so the test needs no megatron-core import. `LAYERS` below is the house's order, lowest
first (docs: DESIGN.md "Resolve once" and the layout card): a module may import its own layer or a lower one.
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


def _imported(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """Every name an import statement in `tree` reaches (absolute; relative imports resolved)."""
    names: set[str] = set()
    pending = [tree]
    while pending:
        node = pending.pop()
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


# The layers, lowest first; a module belongs to the longest prefix listed (a package or a module).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("hybridflow.errors", "hybridflow.registry", "hybridflow.units", "hybridflow.token_kinds",
     "hybridflow.role_records"),
    # records: leaves that take plain values (hybridflow.engines, hybridflow.families, hybridflow.tools)
    ("hybridflow.engines", "hybridflow.families", "hybridflow.tools"),
    ("hybridflow.config",),
    # pure planning and data: no engine runtime, no converter, no torch model code
    ("hybridflow.placement", "hybridflow.algorithms", "hybridflow.data", "hybridflow.rewards"),
    # checkpoint files (GGUF conversion, layer cuts) and process plumbing (ports, lifelines, the local launcher)
    ("hybridflow.convert.packaged_model", "hybridflow.convert.gguf", "hybridflow.launch"),
    # resolve once: compose + convert + every derived value, for the launcher
    ("hybridflow.resolve",),
    ("megatron_adapters",),
    ("hybridflow.rollout",),
    ("hybridflow.roles",),
    ("hybridflow.trainer",),
    # entry points and command-line tools
    ("hybridflow.run", "hybridflow.plan", "hybridflow.sbatch", "hybridflow.check_env", "hybridflow.cli",
     "hybridflow.convert", "hybridflow"),
)


def layer_of(module: str) -> int:
    """The index in LAYERS of the longest listed prefix of `module`; KeyError for a module in no layer."""
    best, index = -1, None
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, index = len(prefix), i
    if index is None:
        raise KeyError(f"{module} is in no layer of LAYERS; add it where it belongs")
    return index


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def arrows_up(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a module from a higher layer, as 'a -> b'."""
    return [f"{module} -> {dep}" for module, deps in sorted(graph.items()) for dep in sorted(deps)
            if layer_of(dep) > layer_of(module)]


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


def test_components_and_layers_see_what_they_should():
    assert strongly_connected({"a": {"b"}, "b": {"a"}, "c": {"a"}, "d": {"e"}, "e": {"d", "c"}}) == [
        ["a", "b"], ["d", "e"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []
    assert layer_of("hybridflow.convert.gguf") < layer_of("hybridflow.convert")
    assert arrows_up({"hybridflow.config.model": {"hybridflow.convert.packaged_model"},
                      "hybridflow.convert.packaged_model": set()}) == [
        "hybridflow.config.model -> hybridflow.convert.packaged_model"]


def test_graph_reads_function_level_relative_and_type_checking_imports():
    tree = ast.parse("from .b import c\ndef f():\n    import x.y\nif TYPE_CHECKING:\n    import z\n")
    assert _imported(tree, "pkg.a", is_package=False) == {"pkg.b", "pkg.b.c", "x.y", "z"}


def test_package_imports_form_no_circle():
    graph = import_graph()
    assert len(graph) > 100 and "hybridflow.placement.planner" in graph
    assert strongly_connected(graph) == []
    assert find_circle(graph) is None, " -> ".join(find_circle(graph))


def test_every_module_has_a_layer_and_no_import_points_up():
    graph = import_graph()
    for module in graph:
        layer_of(module)
    assert arrows_up(graph) == []


def test_engine_records_are_a_leaf_that_config_and_placement_may_import():
    # The records (hybridflow/engines) import only the leaves below them; an engine's builder is an
    # import path the rollout role resolves, so config and placement never reach engine or training code.
    graph = import_graph()
    engines = {m for m in graph if m.startswith("hybridflow.engines")}
    assert {"hybridflow.engines.megatron", "hybridflow.engines.vllm"} <= engines
    for module in engines:
        assert graph[module] <= engines | {"hybridflow.errors", "hybridflow.registry", "hybridflow.units"}, module
    heavy = ("hybridflow.trainer", "hybridflow.roles", "hybridflow.rollout", "megatron_adapters")
    for module, deps in graph.items():
        if module.startswith(("hybridflow.config", "hybridflow.placement", "hybridflow.engines")):
            assert not [d for d in deps if d.startswith(heavy)], module
