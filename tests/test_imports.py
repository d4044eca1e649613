"""The import graph of the product: no cycles, and the layers of docs/architecture.md.

Read from the source with `ast`, every import counted (inside functions and under
TYPE_CHECKING too): a cycle hidden in a function or behind TYPE_CHECKING is still two
modules that cannot be understood, or moved, one without the other.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("gateway", "backends")

# Cycles that are known and owned elsewhere; each entry says why it may stay for now.
KNOWN_CYCLES: set[frozenset[str]] = set()


def modules() -> dict[str, Path]:
    """Every module of the product: its Python sources, and its C extensions (a `.c`
    source each, built by setup.py), which import none of the product's modules."""
    found = {}
    for package in PACKAGES:
        for path in [*(ROOT / package).rglob("*.py"), *(ROOT / package).rglob("*.c")]:
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imported(name: str, path: Path, known: dict[str, Path]) -> Iterator[str]:
    """The product modules `name` imports (`from a import b` counts as a.b when b is a
    module, else as a)."""
    if path.suffix == ".c":
        return
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package[: len(package) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                yield target


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: set(imported(name, path, known)) for name, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.add(frozenset(component))
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert cycles(graph) == {frozenset({"a", "b", "c"})}


def test_no_import_cycles() -> None:
    new = cycles(import_graph()) - KNOWN_CYCLES
    assert not new, f"import cycles: {[sorted(cycle) for cycle in new]}"


def in_package(name: str, package: str) -> bool:
    return name == package or name.startswith(f"{package}.")


ADAPTER = ("gateway.connection", "gateway.server", "gateway.runner", "gateway.flow", "gateway.idle")


def test_layers() -> None:
    """Engines know nothing of the gateway; the RESP protocol knows nothing of the rest;
    handlers and sessions know nothing of the asyncio adapter that runs them."""
    graph = import_graph()
    for name, targets in graph.items():
        if any(in_package(name, inner) for inner in ("gateway.commands", "gateway.session")):
            assert not any(t in ADAPTER for t in targets), (name, targets)
        if in_package(name, "backends"):
            assert not any(in_package(t, "gateway") for t in targets), (name, targets)
        if in_package(name, "gateway.resp"):
            assert all(in_package(t, "gateway.resp") for t in targets), (name, targets)
