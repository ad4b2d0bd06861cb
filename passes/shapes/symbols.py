"""Inference's fresh dim symbols named by what the main graph proves, and kept apart from the model's names.

onnx shape inference gives a dim it cannot compute a fresh symbol (``unk__N``):
the length of a Range, a broadcast of two symbols, every dim of a Slice with
computed ends. :func:`passes.simplify.dims.derive` proves many of them equal to
an input's dim or to an int, from exact facts of the main graph (no second
prover here). :func:`plan` turns that into a renaming of the symbols of one
inference run, which the value_info step applies to what it writes:

* A fresh symbol whose class of proved-equal dims holds an int becomes that
  int; else, if the class holds a symbol of the main graph's inputs, that
  symbol (the first in the inputs' order). A class whose only other members
  are other fresh symbols or a clamp (``min(seq, 32)``) keeps its symbol.
* A fresh symbol kept that is also a name the model states (a declared output
  or value_info dim: inference forgot those and could not avoid them) gets a
  new ``unk__N`` that no dim of the model uses.

Why it is sound. A value_info dim names a size; two dims with one name claim
the same size in a run (symbols are global to the model). The facts
``derive`` records hold in every run in which the model succeeds (every node
of the main graph runs once and its inputs fit it), so replacing a symbol by
one proved equal to it everywhere it occurs is a substitution of equals: no
statement of the written shapes changes its truth in such a run. This needs
the symbol to mean one size per run wherever it is renamed:

* In the main graph every value is computed once per run: a fresh symbol is
  the size of the value inference made it up for, and inference gives it to
  a value only where it proves that value's dim the same size.
* A subgraph value carries a main-graph symbol when inference proves its dim
  equal to a main-graph value's dim (an outer value read in a branch or a
  loop body, or a value computed from one): that is the same size in every
  execution of the body, so the main graph's equality holds for it too
  whenever the body runs in a run that succeeds. A symbol inference made up
  inside a subgraph may stand for a different size at each iteration of a
  Loop or Scan; when it leaves through the node's outputs, a fact of the main
  graph fixes only the size the node returned. Such symbols (those first seen
  in the main graph at the outputs of a node that holds subgraphs) are
  renamed in the main graph only.
* A symbol the model states on a graph input (main graph or subgraph) is the
  model's contract, not made up by inference: it is never renamed, and
  inference avoids it when it makes up symbols. Declared output and
  value_info shapes are forgotten before inference, so a fresh symbol may
  equal one of their names; it is then renamed apart (see above), or two
  unrelated dims would share a name.

Facts come from the main graph only, as in :mod:`passes.simplify.dims`: a
subgraph's node may not run, so what it requires proves nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

import onnx_ir as ir

from passes.ir import walk
from passes.ir.names import Names

__all__ = ["Renaming", "plan"]

_PREFIX = "unk__"


@dataclasses.dataclass
class Renaming:
    """What each fresh symbol of one inference run is written as.

    Attributes:
        main: Symbol -> int or symbol, for values of the main graph.
        sub: The same for values of subgraphs (symbols that mean one size per run only).
        proved: How many symbols ``main`` names by a proved equal dim (an int or an input's symbol).
        apart: How many symbols are renamed apart from a name the model states.
    """

    main: dict[str, int | str] = dataclasses.field(default_factory=dict)
    sub: dict[str, int | str] = dataclasses.field(default_factory=dict)
    proved: int = 0
    apart: int = 0

    def shape(self, shape: ir.Shape | None, *, in_main: bool) -> ir.Shape | None:
        """``shape`` (as inference gave it) with its symbols renamed; the same object if nothing changes."""
        names = self.main if in_main else self.sub
        if shape is None or not names:
            return shape
        dims = [names.get(d.value, d) if isinstance(d, ir.SymbolicDim) and d.value is not None else d for d in shape]
        return shape if all(a is b for a, b in zip(dims, shape)) else ir.Shape(dims)


def _symbols(shape: ir.Shape | None) -> Iterable[str]:
    if shape is not None:
        for d in shape:
            if type(d) is not int and isinstance(d, ir.SymbolicDim) and d.value is not None:  # ints first: the
                yield d.value  # isinstance of an int goes through a runtime protocol check (~8 us)


def _stated(model: ir.Model) -> tuple[set[str], set[str]]:
    """The dim names the model states: on graph inputs (main graph and subgraphs), and anywhere at all.

    "Anywhere" is every shape a value of a graph or function holds before the value_info step
    writes (declared outputs and value_info included).
    """
    inputs: set[str] = set()
    stated: set[str] = set()
    for scope in walk.iter_scopes(model):
        body = scope.body
        for value in body.inputs:
            inputs.update(_symbols(value.shape))
        for value in (*body.inputs, *body.outputs, *(v for node in body for v in node.outputs)):
            stated.update(_symbols(value.shape))
    return inputs, stated


def _main_input_symbols(model: ir.Model) -> list[str]:
    graph = model.graph
    names: dict[str, None] = {}
    for value in graph.inputs:
        if value.name not in graph.initializers:
            names.update(dict.fromkeys(_symbols(value.shape)))
    return list(names)


def _born_in_subgraphs(model: ir.Model, inferred: Mapping[ir.Value, tuple[object, ir.Shape | None]]) -> set[str]:
    """Symbols first seen, in the main graph's order, at the outputs of a node that holds subgraphs."""
    seen: set[str] = set()
    for value in model.graph.inputs:
        seen.update(_symbols(value.shape))
    born: set[str] = set()
    for node in model.graph:
        holds = any(not a.is_ref() and a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
                    for a in node.attributes.values())  # fmt: skip
        for value in node.outputs:
            found = inferred.get(value)
            for symbol in _symbols(found[1] if found else None):
                if symbol not in seen:
                    seen.add(symbol)
                    if holds:
                        born.add(symbol)
    return born


def plan(model: ir.Model, inferred: Mapping[ir.Value, tuple[ir.DataType | None, ir.Shape | None]]) -> Renaming:
    """The renaming of the fresh symbols in ``inferred`` (one run of :func:`passes.ir.inference.infer_all`
    on ``model``, the values to leave out already removed); see the module docstring."""
    made_up = {s for _, shape in inferred.values() for s in _symbols(shape)}
    if not made_up:  # all static: nothing to name (and no walk of every value's stated shape)
        return Renaming()
    inputs, stated = _stated(model)
    fresh = made_up - inputs
    if not fresh:
        return Renaming()
    proved = _proved(model, inferred, fresh)
    born = _born_in_subgraphs(model, inferred)
    taken = stated | made_up
    apart: dict[str, str] = {}
    counter = 0
    for symbol in sorted(fresh & stated):
        while f"{_PREFIX}{counter}" in taken:
            counter += 1
        apart[symbol] = f"{_PREFIX}{counter}"
        taken.add(apart[symbol])
    renaming = Renaming(proved=len(proved), apart=len(apart))
    for symbol in sorted(fresh):
        if symbol in proved:
            renaming.main[symbol] = proved[symbol]
        elif symbol in apart:
            renaming.main[symbol] = apart[symbol]
        if symbol in proved and symbol not in born:
            renaming.sub[symbol] = proved[symbol]
        elif symbol in apart:
            renaming.sub[symbol] = apart[symbol]
    return renaming


def _proved(model: ir.Model, inferred: Mapping[ir.Value, tuple[ir.DataType | None, ir.Shape | None]],
            fresh: set[str]) -> dict[str, int | str]:  # fmt: skip
    """Each symbol of ``fresh`` that the main graph proves equal to an int or to a symbol of its inputs."""
    from passes.simplify.dims import derive  # noqa: PLC0415 (simplify's prover: one for both)
    from passes.simplify.rules import Context  # noqa: PLC0415

    names: Names | None = None

    def lazy_names() -> Names:  # derive creates nothing; the Context asks for an allocator all the same
        nonlocal names
        names = names or Names(model)
        return names

    main = next(walk.iter_scopes(model, functions=False))
    found = derive(model.graph, Context(main, lambda: inferred, lazy_names))
    declared = _main_input_symbols(model)
    order = {s: i for i, s in enumerate(declared)}
    classes: dict[object, list[str]] = {}
    for symbol in sorted(fresh | set(declared)):
        classes.setdefault(found.find(symbol), []).append(symbol)
    proved: dict[str, int | str] = {}
    for root, members in classes.items():
        if isinstance(root, int):
            target: int | str = root
        else:
            named = sorted((s for s in members if s in order), key=order.__getitem__)
            if not named:
                continue
            target = named[0]
        proved.update((s, target) for s in members if s in fresh)
    return proved
