"""The shape of the package, kept so: at most 7 top-level modules in align/, no file over 500 lines,
no import cycle between align's modules (imports inside functions count: a cycle hidden in a
function-local import is still a cycle)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ALIGN = Path(__file__).resolve().parents[2] / "align"


def modules() -> dict[str, Path]:
    out = {}
    for p in ALIGN.rglob("*.py"):
        parts = p.relative_to(ALIGN.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                targets = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in mods] or [base]
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != name:
                    graph[name].add(t)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    sys.setrecursionlimit(10_000)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_between_align_modules():
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_a_planted_cycle():
    g = import_graph()
    g["align.errors"].add("align.trainer")  # align.trainer imports align.errors: a cycle
    assert any({"align.errors", "align.trainer"} <= set(c) for c in cycles(g))


def test_at_most_seven_top_level_modules():
    top = sorted(p.name for p in ALIGN.glob("*.py"))
    assert len(top) <= 7, top


def test_no_file_in_align_is_over_500_lines():
    long = {str(p.relative_to(ALIGN)): n for p in ALIGN.rglob("*.py") if (n := len(p.read_text().splitlines())) > 500}
    assert not long, long
