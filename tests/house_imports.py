"""The import graph of ``passes/`` and ``refimpl/``: its cycles, its private reach-ins, its table.

``python tests/house_imports.py`` prints what docs/architecture.md holds between its
``<!-- import-graph -->`` markers (``tests/test_house.py`` checks that they agree): each room's
imports, the cycles and the private reach-ins; it exits 1 when it finds a cycle (one through an
import for annotations too) or a reach-in.

What counts as an import (the rule the house keeps):

* every ``import a.b`` and ``from a import b`` in a module, at its top or inside a function or
  class (a function's import is a cycle waiting for its first call just the same), and every
  ``lazy_module("a.b")`` / ``importlib.import_module("a.b")`` with a literal name (an import at first
  use); and one under ``if TYPE_CHECKING:``, which never runs but still says the lower module
  needs the higher one's type (:func:`house_cycles`);
* relative imports are resolved against the importing module's package (a package's
  ``__init__`` is its own package);
* ``from a import b`` is an import of ``a.b`` when ``a.b`` is a module, else of ``a`` (its
  ``__init__``): so a submodule that takes a name from its own package's ``__init__`` while that
  ``__init__`` imports the submodule is a cycle, and ``from passes.cli import folder`` is not;
* importing ``a.b`` is not counted as importing ``a`` (Python runs ``a/__init__`` first, but a
  package that re-exports from its modules is the intended shape, not a cycle).

A private reach-in is ``from x import _y`` or ``x._y`` (``x`` bound to another module of ours, by
an import or ``lazy_module``) where ``_y`` is not a dunder name, imports for annotations
included: what one module gives another gets a public name and a docstring. A module whose own
name starts with ``_`` (``refimpl._registry``) is its package's, imported by its siblings.

Imports under ``TYPE_CHECKING`` make no cycle that runs, but a cycle through one is a cycle of the
house all the same: the lower module reaches up for a type. A type two modules share belongs in
the lower one (or in a module below both, or the lower one names what it needs as a ``Protocol``),
so the check counts those imports too (:attr:`Graph.typing_edges`); the room table shows the
imports that run (:attr:`Graph.edges`).
"""

from __future__ import annotations

import ast
import pathlib
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

REPO = pathlib.Path(__file__).resolve().parent.parent
ROOTS = ("passes", "refimpl")
LAZY_CALLS = ("lazy_module", "importlib.import_module")


@dataclass
class Graph:
    """Modules (dotted names) with the modules each imports and the private names each takes."""

    packages: set[str] = field(default_factory=set)
    edges: dict[str, set[str]] = field(default_factory=dict)  # the imports that run
    typing_edges: dict[str, set[str]] = field(default_factory=dict)  # those and the ones for annotations
    private: list[str] = field(default_factory=list)  # "a.b takes c._d" lines


def module_files(root: pathlib.Path, tops: Iterable[str] = ROOTS) -> dict[str, pathlib.Path]:
    """Every module under ``root/<top>`` for each top, by dotted name (a package by its own name)."""
    found = {}
    for top in tops:
        for path in sorted((root / top).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _typing_only(tree: ast.AST) -> set[int]:
    """The ids of nodes under ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``) blocks."""
    skipped: set[int] = set()
    for block in ast.walk(tree):
        if isinstance(block, ast.If) and ast.unparse(block.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            for statement in block.body:
                skipped.update(id(n) for n in ast.walk(statement))
    return skipped


def _absolute(module: str, is_package: bool, level: int, name: str | None) -> str:
    if level == 0:
        return name or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, name] if name else base)


def _imports(module: str, path: pathlib.Path, known: set[str], graph: Graph) -> tuple[set[str], set[str]]:
    """The modules of ``known`` that ``module`` imports when it runs, and those it imports under
    ``TYPE_CHECKING`` only; records its private reach-ins (those too) in ``graph``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = _typing_only(tree)
    is_package = module in graph.packages
    found: set[str] = set()
    typing: set[str] = set()
    bound: dict[str, str] = {}  # a local name (or dotted chain) -> the module of ours it stands for

    def nearest(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    for node in ast.walk(tree):
        into = typing if id(node) in skipped else found
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = nearest(alias.name)
                if target:
                    into.add(target)
                    bound[alias.asname or alias.name] = target
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, is_package, node.level, node.module)
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                if sub in known:
                    into.add(sub)
                    bound[alias.asname or alias.name] = sub
                elif (target := nearest(source)) is not None:
                    into.add(target)
                    if _private(alias.name) and target != module:
                        graph.private.append(f"{module} imports {target}.{alias.name}")
        elif (isinstance(node, ast.Call) and ast.unparse(node.func) in LAZY_CALLS and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):  # fmt: skip
            target = nearest(node.args[0].value)
            if target:
                into.add(target)
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            call = node.value
            if (ast.unparse(call.func) in LAZY_CALLS and call.args and isinstance(call.args[0], ast.Constant)
                    and call.args[0].value in known):  # fmt: skip
                for target_node in node.targets:
                    if isinstance(target_node, ast.Name):
                        bound[target_node.id] = call.args[0].value
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            owner = bound.get(ast.unparse(node.value))
            if owner is None and ast.unparse(node.value) in known:
                owner = ast.unparse(node.value)  # `import a.b` then `a.b._c`
            if owner is not None and owner != module:
                graph.private.append(f"{module} uses {owner}.{node.attr}")
    found.discard(module)
    return found, typing - found - {module}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def build(root: pathlib.Path = REPO, tops: Iterable[str] = ROOTS) -> Graph:
    """The import graph of the modules under ``root/<top>`` for each of ``tops``."""
    files = module_files(root, tops)
    graph = Graph(packages={m for m, p in files.items() if p.name == "__init__.py"})
    known = set(files)
    for module, path in files.items():
        graph.edges[module], typing = _imports(module, path, known, graph)
        graph.typing_edges[module] = graph.edges[module] | typing
    graph.private = sorted(set(graph.private))
    return graph


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted, sorted;
    a module that imports itself is one too."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:  # iterative: a long chain must not hit the recursion limit
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(edges.get(successor, ())))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1 or node in edges.get(node, ()):
                        found.append(sorted(component))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return sorted(found)


def house_cycles(graph: Graph) -> list[list[str]]:
    """The cycles the house refuses: through any import, those for annotations only included."""
    return cycles(graph.typing_edges)


def room(module: str) -> str:
    """The room of the house a module belongs to: ``refimpl``, or ``passes.<x>`` (a package or a
    top-level module of ``passes``), or ``passes`` (the package's face)."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "passes" else parts[0]


def table(graph: Graph) -> str:
    """Markdown: each room and the rooms it imports (generated; docs/architecture.md holds it)."""
    rooms: dict[str, set[str]] = {}
    for module, targets in graph.edges.items():
        rooms.setdefault(room(module), set()).update(room(t) for t in targets)
    lines = ["| room | imports |", "|---|---|"]
    for name in sorted(rooms):
        others = sorted(rooms[name] - {name})
        lines.append(f"| `{name}` | {', '.join(f'`{o}`' for o in others) or '(nothing of ours)'} |")
    return "\n".join(lines)


def _listed(groups: list[list[str]]) -> str:
    return "; ".join(" ↔ ".join(f"`{m}`" for m in group) for group in groups) or "none"


def summary(graph: Graph) -> str:
    """The table, then the cycles (imports for annotations counted) and the reach-ins."""
    return "\n".join([
        table(graph),
        "",
        "Import cycles between modules (imports under `if TYPE_CHECKING:` counted too): "
        f"{_listed(house_cycles(graph))}.",
        f"Private names a module takes from another: {', '.join(graph.private) or 'none'}.",
    ])  # fmt: skip


def main(root: pathlib.Path = REPO, tops: Iterable[str] = ROOTS) -> int:
    """Prints :func:`summary` of the modules under ``root/<top>``; 1 when they hold a cycle or a reach-in."""
    graph = build(root, tops)
    print(summary(graph))
    return 1 if house_cycles(graph) or graph.private else 0


if __name__ == "__main__":
    sys.exit(main())
