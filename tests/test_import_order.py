"""Imports follow the data flow: a step imports only from the steps before it (DESIGN.md sec. 3).

The folders of ``planner/`` in order: artifacts (documents, codec, Layout) < schemas < models <
profiling < graph < cost < schedule < simulation < solve < report, runtime < commands. Every
import of a planner module is checked, those inside functions included (an import deferred
for speed, e.g. of OR-Tools or torch, must still point along the flow, never against it to
dodge a cycle); and the modules' own import graph has no cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

PACKAGE = Path(__file__).resolve().parents[1] / "planner"

#: the flow, earliest first; steps in one tuple are siblings and may not import each other
ORDER: tuple[tuple[str, ...], ...] = (
    ("artifacts",),
    ("schemas",),
    ("models",),
    ("profiling",),
    ("graph",),
    ("cost",),
    ("schedule",),
    ("simulation",),
    ("solve",),
    ("report", "runtime"),
    ("commands",),
)
RANK = {name: i for i, names in enumerate(ORDER) for name in names}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[str, int, bool]]:
    """(imported planner module, line, inside a function) for every import in ``path``."""
    tree = ast.parse(path.read_text())
    inner: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inner.update(id(n) for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom)))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "planner":
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            target = max((n for n in names if _is_module(n)), key=len, default=node.module)
            out.append((target, node.lineno, id(node) in inner))
        elif isinstance(node, ast.Import):
            out += [(a.name, node.lineno, id(node) in inner) for a in node.names if a.name.split(".")[0] == "planner"]
    return out


def _is_module(name: str) -> bool:
    rel = Path(*name.split("."))
    return (PACKAGE.parent / rel).with_suffix(".py").exists() or (PACKAGE.parent / rel / "__init__.py").exists()


def _step(module: str) -> str | None:
    """The flow step (folder) a module belongs to; None for the package root's own modules."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in RANK else None


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_folder_is_a_step_of_the_flow():
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert not loose, f"modules loose at the top of planner/: {loose}"
    folders = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    assert sorted(RANK) == folders, "every folder of planner/ has its place in ORDER, and only those"


def test_imports_point_along_the_flow():
    bad = []
    for path in _modules():
        source = _module_name(path)
        src_step = _step(source)
        for target, line, inner in _imports(path):
            dst_step = _step(target)
            where = f"{path.relative_to(PACKAGE.parent)}:{line} imports {target}{' (inside a function)' if inner else ''}"
            if dst_step is None:  # the package root: only its version string, and the lazy API for __main__
                continue
            if src_step is None:
                continue  # planner/__init__ and __main__ sit above every step
            if RANK[dst_step] > RANK[src_step]:
                bad.append(f"{where}: {src_step} is before {dst_step} in the flow")
            elif RANK[dst_step] == RANK[src_step] and dst_step != src_step:
                bad.append(f"{where}: {src_step} and {dst_step} are siblings")
    assert not bad, "imports against the flow:\n" + "\n".join(bad)


def test_root_imports_are_the_version_only():
    bad = []
    for path in _modules():
        if path.parent == PACKAGE:
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "planner":
                if any(a.name != "__version__" for a in node.names):
                    bad.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert not bad, f"modules importing the lazy public API from inside the package: {bad}"


def test_no_import_cycles():
    graph = nx.DiGraph()
    for path in _modules():
        source = _module_name(path)
        graph.add_node(source)
        for target, _, _ in _imports(path):
            if target != source and target != "planner":
                graph.add_edge(source, target)
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, f"import cycles: {cycles[:5]}"
