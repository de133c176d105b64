"""The shape of the package, kept so: at most 7 top-level modules in align/, no file over 500 lines,
no import cycle between align's modules (imports inside functions count: a cycle hidden in a
function-local import is still a cycle), no component importing align.run, no two modules of one file
name, at most 8 imports pointing up the layer order docs/architecture.md declares, and that page's
Layout naming every module of align/ under its package (and nothing that is not there)."""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Iterable

ALIGN = Path(__file__).resolve().parents[2] / "align"
ARCHITECTURE = ALIGN.parent / "docs" / "architecture.md"


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


# ------------------------------------------------------------------------- components and align.run

NOT_COMPONENTS = {"run", "tools", "train", "eval", "preflight", "__main__", "trainer"}
"""Under align/: the door to a run, the tools, the commands a user types and the trainer they drive.
Everything else is a component, the package's own __init__.py included."""


def is_component(module: str) -> bool:
    parts = module.split(".")
    return len(parts) == 1 or parts[1] not in NOT_COMPONENTS


def run_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((m, t) for m, targets in graph.items() if is_component(m)
                  for t in targets if t == "align.run" or t.startswith("align.run."))


def test_no_component_imports_align_run():
    assert run_imports(import_graph()) == []


def test_the_run_import_finder_finds_a_planted_one():
    g = import_graph()
    g["align.data.collate"].add("align.run.cli")
    g["align.tools.inspect"].add("align.run.record")  # a tool is no component
    assert run_imports(g) == [("align.data.collate", "align.run.cli")]


# ------------------------------------------------------------------------------------ file names


def shared_names(paths: Iterable[Path]) -> dict[str, list[str]]:
    """File names that more than one module of align/ has. __init__.py and __main__.py are Python's names
    for a package and for its `python -m` entry, not names a module chooses."""
    by_name: dict[str, list[str]] = defaultdict(list)
    for p in paths:
        if p.name not in ("__init__.py", "__main__.py"):
            by_name[p.name].append(p.relative_to(ALIGN.parent).as_posix())
    return {name: sorted(where) for name, where in by_name.items() if len(where) > 1}


def test_no_two_modules_share_a_file_name():
    assert shared_names(ALIGN.rglob("*.py")) == {}


def test_the_name_check_finds_a_planted_duplicate():
    planted = ALIGN / "data" / "interface.py"  # beside align/objectives/interface.py
    assert shared_names([*ALIGN.rglob("*.py"), planted]) == {
        "interface.py": [planted.relative_to(ALIGN.parent).as_posix(), "align/objectives/interface.py"]}


# ---------------------------------------------------------------------------------- layer order

MAX_UP = 8


def layers() -> list[list[str]]:
    """docs/architecture.md's "## Layers", bottom first: one numbered item per layer, its entries the
    backticked names the item opens with."""
    section = ARCHITECTURE.read_text().split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    items = [re.match(r"\d+\. ((?:`[\w.]+`(?:, )?)+)", line) for line in section.splitlines()]
    return [re.findall(r"`([\w.]+)`", m.group(1)) for m in items if m]


def layer_of(module: str, order: list[list[str]]) -> int:
    """The layer of the longest entry that names `module` or a package holding it."""
    index = {name: i for i, layer in enumerate(order) for name in layer}
    parts = module.removeprefix("align").removeprefix(".").split(".") if module != "align" else ["__init__"]
    for k in range(len(parts), 0, -1):
        if ".".join(parts[:k]) in index:
            return index[".".join(parts[:k])]
    raise KeyError(f"{module}: no layer in {ARCHITECTURE.name}")


def up_imports(graph: dict[str, set[str]], order: list[list[str]]) -> list[tuple[str, str]]:
    return sorted((m, t) for m, targets in graph.items() for t in targets if layer_of(t, order) > layer_of(m, order))


def test_the_layer_order_places_every_module_once():
    order = layers()
    names = [name for layer in order for name in layer]
    assert len(order) > 10 and len(names) == len(set(names)), order
    mods = modules()
    assert [n for n in names if n != "__init__" and f"align.{n}" not in mods] == []  # every entry exists
    for m in mods:
        layer_of(m, order)


def test_at_most_eight_imports_point_up_the_layer_order():
    up = up_imports(import_graph(), layers())
    assert len(up) <= MAX_UP, f"{len(up)} imports point up docs/architecture.md's layer order:\n" + "\n".join(
        f"  {m} -> {t}" for m, t in up)


def test_the_layer_check_finds_a_planted_up_import():
    g, order = import_graph(), layers()
    before = set(up_imports(g, order))
    g["align.core.hashing"].add("align.trainer")
    g["align.trainer"].add("align.core.hashing")  # down: not counted
    assert set(up_imports(g, order)) - before == {("align.core.hashing", "align.trainer")}


# ---------------------------------------------------------------------------------- the layout names every module

LAYOUT_NAME = re.compile(r"( *)((?:\w+\.py|\w+/)(?:, (?:\w+\.py|\w+/))*)(?: |$)")
LAYOUT_COLUMN = 28  # where the description column starts; a line indented this far continues a description


def layout_names(text: str) -> set[str]:
    """The paths under align/ that docs/architecture.md's "## Layout" names: each line's name column
    (one name, or sibling names joined by ", "), placed under the nearest less indented folder line."""
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    names, folders = set(), []  # folders: (indent, path) of the folder lines holding the current line
    for line in section.splitlines():
        m = LAYOUT_NAME.match(line)
        if not m or not m.group(1) or len(m.group(1)) >= LAYOUT_COLUMN:
            continue
        indent = len(m.group(1))
        folders = [(i, f) for i, f in folders if i < indent]
        prefix = "".join(f for _, f in folders)
        for name in m.group(2).split(", "):
            if name.endswith("/"):
                folders.append((indent, name))
            names.add(prefix + name)
    return {n.removeprefix("align/") for n in names if n.startswith("align/") and n != "align/"}


def layout_mismatch(named: set[str]) -> tuple[list[str], list[str]]:
    """(modules of align/ the layout does not name, names in the layout that are no file or folder of align/)."""
    tree = {p.relative_to(ALIGN).as_posix() for p in ALIGN.rglob("*.py") if p.name != "__init__.py"}
    missing = sorted(tree - named)
    extra = sorted(n for n in named if not (ALIGN / n).is_file() and not (ALIGN / n.rstrip("/")).is_dir())
    return missing, extra


def test_the_layout_names_every_module():
    named = layout_names(ARCHITECTURE.read_text())
    assert {"trainer.py", "objectives/sft.py", "objectives/ce.py", "tools/preflight/__main__.py"} <= named
    missing, extra = layout_mismatch(named)
    assert (missing, extra) == ([], []), (
        f"docs/architecture.md's Layout, against align/:\n  not named: {missing}\n  named but absent: {extra}")
