"""The package's floors: each folder imports only the floors below it, and no import cycles.

Read from the source with `ast`, so an import inside a function (or under TYPE_CHECKING) counts
as much as one at the top of a module: a function-level import cannot hide a cycle.
"""
import ast
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "pipelab"

# Bottom to top. A floor may import any floor before it; the top-level `checks` module (argument
# checks) may be imported by every floor, and the façade (`__init__`) and CLI (`__main__`) sit on
# top of all of them.
FLOORS = ["checks", "support", "model", "schedules", "sim", "runtime", "techniques", "planner",
          "views", "chapters", "bench", "__init__", "__main__"]
TOP_LEVEL_MODULES = {"__init__.py", "__main__.py", "checks.py"}


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    """{'pipelab.sim.simulate': path, 'pipelab.sim': path of its __init__, ...}"""
    found = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports(root: Path = PACKAGE) -> dict[str, set[str]]:
    """{module: the pipelab modules it imports anywhere in its source}."""
    known = modules(root)
    graph = defaultdict(set)
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
            else:
                continue
            for target in targets:
                while target and target not in known:     # a name imported from a module
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def floor_of(module: str) -> str:
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def floor_edges(graph) -> dict[str, set[str]]:
    edges = defaultdict(set)
    for source, targets in graph.items():
        for target in targets:
            if floor_of(source) != floor_of(target):
                edges[floor_of(source)].add(floor_of(target))
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one node (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in list(edges):
        if node not in index:
            visit(node)
    return found


def test_every_folder_is_a_floor():
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders <= set(FLOORS), f"folders not placed among the floors: {folders - set(FLOORS)}"
    top = {p.name for p in PACKAGE.glob("*.py")}
    assert top <= TOP_LEVEL_MODULES, f"modules at the top beyond façade, CLI and checks: " \
                                     f"{sorted(top - TOP_LEVEL_MODULES)}"


def test_floors_import_only_downward():
    rank = {floor: i for i, floor in enumerate(FLOORS)}
    upward = sorted(f"{source} imports {target}" for source, targets in imports().items()
                    for target in targets
                    if rank[floor_of(target)] > rank[floor_of(source)])
    assert not upward, "imports up a floor:\n" + "\n".join(upward)


def test_no_cycle_between_folders():
    assert cycles(floor_edges(imports())) == []


def test_the_reader_sees_function_level_imports(tmp_path):
    """The reader itself: an import hidden in a function is an edge, and makes a cycle."""
    pkg = tmp_path / "pipelab"
    for folder, source in {"low": "def f():\n    from ..high import thing\n",
                           "high": "from ..low import f\nthing = 1\n"}.items():
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
        (pkg / folder / "mod.py").write_text(source.replace("..high", "..high.mod")
                                             .replace("..low", "..low.mod"))
    (pkg / "__init__.py").write_text("")
    graph = imports(pkg)
    assert "pipelab.high.mod" in graph["pipelab.low.mod"]
    assert cycles(floor_edges(graph)) == [["high", "low"]]


@pytest.mark.parametrize("floor", ["runtime", "sim", "schedules", "model"])
def test_core_floors_know_no_technique_view_or_chapter(floor):
    above = {"techniques", "planner", "views", "chapters", "bench"}
    reached = {floor_of(t) for s, ts in imports().items() if floor_of(s) == floor for t in ts}
    assert not reached & above, f"{floor} imports {sorted(reached & above)}"
