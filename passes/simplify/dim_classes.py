"""Dims known equal (a union-find), with the dims of each main-graph value: what :mod:`passes.simplify.dims` derives into.

A class's representative is an int, else a declared symbol, else a clamp
(:class:`Clamped`) or an expression (:mod:`dim_exprs`), else a symbol onnx
inference made up; clamps and expressions are rebuilt over the
representatives of what they are made of, so equal dims compare equal.
Dims marked positive (a Conv's output length) are ``>= 1`` in every run that
succeeds. The broadcast rule is here too (see :mod:`passes.simplify.dims`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

import onnx_ir as ir

from passes.simplify import dim_exprs
from passes.simplify.dim_exprs import Expr, Product

__all__ = ["Clamped", "SymbolicDims", "broadcast_dim", "broadcast_shapes", "clamp"]

_MAX_DEPTH = 8


@dataclasses.dataclass(frozen=True)
class Clamped:
    """``min(symbol, bound)``: the length of a slice of ``bound`` elements up to a dim ``symbol``."""

    symbol: object
    bound: int

    def __str__(self) -> str:
        return f"min({self.symbol}, {self.bound})"


def _rank(dim: object) -> int:
    """Which dim of an equal class names it: an int, a declared symbol, a clamp or expression, then inference's."""
    if isinstance(dim, int):
        return 0
    if isinstance(dim, (Clamped, Expr, Product)):
        return 2
    return 3 if isinstance(dim, str) and dim.startswith("unk__") else 1


class SymbolicDims:
    """Equal dims (a union-find) and the main graph's shapes with each dim's representative."""

    def __init__(self) -> None:
        self._parent: dict[object, object] = {}
        self._shapes: dict[ir.Value, tuple[object, ...]] = {}
        self._marked: dict[str, set[object]] = {"positive": set(), "nonnegative": set()}
        self._marked_roots: dict[str, set[object]] | None = None  # their representatives; None after a union
        self._base: SymbolicDims | None = None  # what a fork extends (its own entries come first)
        self._branches: dict[ir.Graph, SymbolicDims] = {}  # shared by the main graph's dims and every fork

    def fork(self, branch: ir.Graph) -> SymbolicDims:
        """These facts, extended by ``branch``'s (an If's) in the fork alone; what :meth:`in_graph` gives for it.

        What a branch's nodes require holds only in runs that take the branch. The fork
        reads these facts through (nothing is copied: a model with many Ifs would copy the
        whole graph's dims for each) and writes its own; these must not change after.
        Path compression here only shortens paths, so the fork's classes stay the same.
        """
        fork = SymbolicDims()
        fork._base = self
        fork._branches = self._branches  # one registry for the main graph's and every nested fork
        self._branches[branch] = fork
        return fork

    def _up(self, dim: object) -> object:
        """``dim``'s parent in the union-find: this fork's entry, else its base's."""
        found: SymbolicDims | None = self
        while found is not None:
            parent = found._parent.get(dim)
            if parent is not None:
                return parent
            found = found._base
        return None

    def _marks(self, kind: str) -> Iterable[object]:
        found: SymbolicDims | None = self
        while found is not None:
            yield from found._marked[kind]
            found = found._base

    def in_graph(self, graph: ir.Graph) -> SymbolicDims:
        """The facts that hold where ``graph``'s nodes run: its fork (see :meth:`fork`, nested too), else these."""
        return self._branches.get(graph, self)

    def mark_positive(self, dim: object) -> None:
        """Records that ``dim`` is ``>= 1`` in every run that succeeds (a Conv's output length)."""
        self._mark("positive", dim)

    def mark_nonnegative(self, dim: object) -> None:
        """Records that ``dim`` is ``>= 0`` in every run that succeeds (a Conv's ``n + pads - kernel``)."""
        self._mark("nonnegative", dim)

    def _mark(self, kind: str, dim: object) -> None:
        if dim is not None and not isinstance(dim, int) and dim not in self._marked[kind]:
            self._marked[kind].add(dim)
            self._marked_roots = None

    def _is_marked_root(self, kind: str, root: object) -> bool:
        if self._marked_roots is None:
            self._marked_roots = {k: {self.find(d) for d in self._marks(k)} for k in self._marked}
        return root in self._marked_roots[kind]

    def nonnegative(self, dim: object) -> bool:
        """Whether ``dim`` is ``>= 0``: by its form (:func:`dim_exprs.is_nonnegative`), or equal to a dim marked
        positive or nonnegative."""
        root = self.find(dim)
        if root is None:
            return False
        return (dim_exprs.is_nonnegative(root) or self._is_marked_root("positive", root)
                or self._is_marked_root("nonnegative", root))

    def positive(self, dim: object) -> bool:
        """Whether ``dim`` is ``>= 1``: an int, or equal to a dim marked positive."""
        root = self.find(dim)
        return root >= 1 if isinstance(root, int) else root is not None and self._is_marked_root("positive", root)

    def find(self, dim: object, depth: int = 0) -> object:
        """The representative of ``dim``'s class (``dim`` itself if nothing is known).

        A clamp is canonical in its symbol too (``min(unk__1, 8)`` is ``min(seq, 8)``
        once ``unk__1`` is ``seq``); ``depth`` bounds that recursion (each step is an
        equality, so stopping early is still exact, only less simplified).
        """
        if dim is None or type(dim) is int:  # an int is its class's representative (see union)
            return dim
        if depth < _MAX_DEPTH:
            dim = self._in_representatives(dim, depth)
        root = dim
        while (parent := self._up(root)) is not None and parent != root:
            root = parent
        while dim != root:  # path compression
            self._parent[dim], dim = root, self._up(dim)
        if depth < _MAX_DEPTH:
            canonical = self._in_representatives(root, depth)
            if canonical != root:
                return self.find(canonical, depth + 1)
        return root

    def _in_representatives(self, dim: object, depth: int) -> object:
        """A clamp, expression or product rebuilt over the representatives of the dims it is made of."""
        if isinstance(dim, Clamped):
            return clamp(self.find(dim.symbol, depth + 1), dim.bound)
        if isinstance(dim, (Expr, Product)):
            return dim_exprs.substitute(dim, lambda atom: self.find(atom, depth + 1))
        return dim

    def union(self, a: object, b: object) -> None:
        """Records that ``a`` and ``b`` are the same size (unless that contradicts two ints)."""
        ra, rb = self.find(a), self.find(b)
        if ra is None or rb is None or ra == rb or (isinstance(ra, int) and isinstance(rb, int)):
            return
        if (isinstance(ra, Clamped) and ra.symbol == rb) or (isinstance(rb, Clamped) and rb.symbol == ra):
            return  # "s <= K": true, but a class must not hold a clamp of itself
        if (isinstance(ra, (Expr, Product)) and rb in dim_exprs.atoms(ra)) or (
                isinstance(rb, (Expr, Product)) and ra in dim_exprs.atoms(rb)):
            return  # nor an expression of itself (it would not stay canonical)
        if _rank(rb) < _rank(ra):
            ra, rb = rb, ra
        self._parent[rb] = ra
        self._marked_roots = None

    def record(self, value: ir.Value, dims: tuple[object, ...]) -> None:
        """Records ``value``'s dims (as derived, or inference's)."""
        self._shapes[value] = dims

    def shape(self, value: ir.Value) -> tuple[object, ...] | None:
        """The derived shape of a value of the main graph (or of this fork's branch), each dim its representative.

        None if not derived.
        """
        found: SymbolicDims | None = self
        dims = None
        while dims is None and found is not None:
            dims, found = found._shapes.get(value), found._base
        return None if dims is None else tuple(self.find(d) for d in dims)

    def canonical(self, dims: Iterable[object]) -> tuple[object, ...]:
        return tuple(self.find(d) for d in dims)


def clamp(symbol: object, bound: int) -> object:
    """``min(symbol, bound)`` as a dim: an int, a :class:`Clamped` (of the tighter bound), or None."""
    if isinstance(symbol, int):
        return min(symbol, bound)
    if isinstance(symbol, Clamped):
        return Clamped(symbol.symbol, min(symbol.bound, bound))
    return None if symbol is None else Clamped(symbol, bound)


def broadcast_dim(dims: Sequence[object]) -> object:
    """The output dim of broadcasting ``dims`` (representatives) in a run that succeeds, or None if not proved."""
    ints = {d for d in dims if isinstance(d, int) and d != 1}
    if len(ints) > 1 or any(isinstance(d, int) and d < 0 for d in dims):
        return None  # the op always fails
    if ints:
        return ints.pop()
    others = [d for d in dims if d != 1]
    if not others:
        return 1
    if None in others:
        return None
    distinct = set(others)
    if len(distinct) == 1:
        return others[0]
    plain = [d for d in distinct if not isinstance(d, Clamped)]
    if len(plain) == 1 and all(isinstance(d, Clamped) and d.symbol == plain[0] and d.bound >= 1
                               for d in distinct if d is not plain[0]):  # fmt: skip
        return plain[0]
    return None


def broadcast_shapes(shapes: Sequence[Sequence[object]]) -> tuple[object, ...]:
    rank = max(len(s) for s in shapes)
    padded = [(1,) * (rank - len(s)) + tuple(s) for s in shapes]
    return tuple(broadcast_dim([s[i] for s in padded]) for i in range(rank))
