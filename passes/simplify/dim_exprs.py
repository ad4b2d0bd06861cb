"""Dims as integer expressions of other dims: sums, int multiples, floor divisions by positive ints, products.

A convolution's output length is ``floor((n + pads - dilation*(k-1) - 1) / stride) + 1``
of its input length ``n``; an exporter computes the same length again from
``Shape(x)`` with its own arithmetic (``n // 20 - 1`` for a stack of three
convs of strides 5, 2, 2). Both are the same integer function of ``n``, and
:func:`floordiv` puts such expressions in one canonical form, so the two
compare equal:

* an :class:`Expr` is ``const + sum(coeff * atom)``, an atom a plain dim
  (a symbol, a ``dims.Clamped``) or a :class:`FloorDiv` of an Expr by an int
  ``k >= 2``; terms are sorted, zero terms dropped, and an Expr that is an int
  or a single plain atom is that int or atom;
* ``floor((k*a*X + c + R) / k) = a*X + q + floor((r + R) / k)`` with
  ``c = q*k + r``, ``0 <= r < k`` (terms with a coefficient divisible by ``k``
  and whole multiples of ``k`` leave the division);
* ``floor((g*A + r) / (g*k)) = floor((A + floor(r/g)) / k)`` for the gcd ``g``
  of the remaining coefficients;
* ``floor((floor(I/m) + r) / k) = floor((I + r*m) / (m*k))``;
* a product of dims (``h * w``, the length of a flattened feature map) is
  its int content times a :class:`Product` of the rest, a plain atom: each
  factor's content (the gcd of its ints) comes out (``(3*s - 3) * t`` is
  ``3 * ((s - 1) * t)``) and the factors are sorted (the product commutes), so
  two products of the same factors compare equal; nothing is expanded over a
  sum (``(a + 1) * b`` is not ``a*b + b``: such pairs stay unproved, never
  wrongly equal). Like sums, products are taken as integers: int64 wrapping
  is out of reach of tensor sizes.

Each identity holds for every integer value of the atoms (floor, not
truncation), so equal canonical forms are equal functions. Which ops compute
floor is for the caller to prove (:mod:`passes.simplify.dims`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import onnx_ir as ir

from passes.simplify.rules import Context
from passes.simplify.shape_values import DimOf, shape_value

__all__ = ["Computed", "Expr", "FloorDiv", "Product", "add", "atoms", "computed", "floordiv", "is_nonnegative",
           "divide_out", "multiply", "scale", "substitute"]


@dataclasses.dataclass(frozen=True)
class FloorDiv:
    """``floor(expr / divisor)``, ``divisor >= 2``, ``expr`` canonical (see the module docstring)."""

    expr: Expr
    divisor: int

    def __str__(self) -> str:
        return f"floor(({self.expr}) / {self.divisor})"


@dataclasses.dataclass(frozen=True)
class Expr:
    """``const + sum(coeff * atom for atom, coeff in terms)``; built by :func:`add`, :func:`scale`, :func:`floordiv`."""

    const: int
    terms: tuple[tuple[object, int], ...]

    def __str__(self) -> str:
        parts = [f"{c}*{a}" if c != 1 else str(a) for a, c in self.terms]
        return " + ".join(parts + ([str(self.const)] if self.const else []))


@dataclasses.dataclass(frozen=True)
class Product:
    """``factors[0] * factors[1] * ...``: two or more dims, none an int, a Product or of int content > 1, sorted.

    Built by :func:`multiply`.
    """

    factors: tuple[object, ...]

    def __str__(self) -> str:
        return " * ".join(f"({f})" for f in self.factors)


def _key(atom: object) -> str:
    return f"{type(atom).__name__}:{atom}"


def _terms(dim: object) -> tuple[int, dict[object, int]]:
    if isinstance(dim, int):
        return dim, {}
    if isinstance(dim, Expr):
        return dim.const, dict(dim.terms)
    return 0, {dim: 1}


def _make(const: int, terms: dict[object, int]) -> object:
    kept = tuple(sorted(((a, c) for a, c in terms.items() if c), key=lambda t: _key(t[0])))
    if not kept:
        return const
    if const == 0 and len(kept) == 1 and kept[0][1] == 1 and not isinstance(kept[0][0], FloorDiv):
        return kept[0][0]
    return Expr(const, kept)


def add(*dims: object) -> object:
    """The sum of ``dims`` (ints, plain dims or Exprs), canonical."""
    const, terms = 0, {}
    for dim in dims:
        c, ts = _terms(dim)
        const += c
        for atom, coeff in ts.items():
            terms[atom] = terms.get(atom, 0) + coeff
    return _make(const, terms)


def scale(dim: object, factor: int) -> object:
    """``factor * dim``, canonical."""
    const, terms = _terms(dim)
    return _make(const * factor, {a: c * factor for a, c in terms.items()})


def _split(dim: object) -> tuple[int, list[object]]:
    """``dim`` as an int coefficient times factors: an Expr's content (the gcd of its ints, signed by its
    first term) comes out (``3*s - 3`` is 3 and ``[s - 1]``); a sum is one factor."""
    if isinstance(dim, int):
        return dim, []
    if isinstance(dim, Product):
        return 1, list(dim.factors)
    if not isinstance(dim, Expr):
        return 1, [dim]
    content = math.gcd(dim.const, *(c for _, c in dim.terms)) * (1 if dim.terms[0][1] > 0 else -1)
    unit = _make(dim.const // content, {a: c // content for a, c in dim.terms})
    return content, list(unit.factors) if isinstance(unit, Product) else [unit]


def _of_factors(coefficient: int, factors: list[object]) -> object:
    if not factors or coefficient == 0:
        return coefficient
    base = factors[0] if len(factors) == 1 else Product(tuple(sorted(factors, key=_key)))
    return scale(base, coefficient)


def multiply(a: object, b: object) -> object:
    """``a * b``, canonical: the int coefficients multiplied out, the other factors a :class:`Product`."""
    (ca, fa), (cb, fb) = _split(a), _split(b)
    return _of_factors(ca * cb, fa + fb)


def floordiv(dim: object, divisor: int) -> object:
    """``floor(dim / divisor)`` for an int ``divisor >= 1``, canonical."""
    if divisor < 1:
        raise ValueError(divisor)
    if divisor == 1:
        return dim
    const, terms = _terms(dim)
    whole, rest = {}, {}
    for atom, coeff in terms.items():
        if coeff % divisor == 0:
            whole[atom] = coeff // divisor
        else:
            rest[atom] = coeff
    quotient, remainder = divmod(const, divisor)
    outside = _make(quotient, whole)
    if not rest:
        return outside  # 0 <= remainder < divisor
    g = math.gcd(divisor, *rest.values())
    if g > 1:
        return add(outside, floordiv(_make(remainder // g, {a: c // g for a, c in rest.items()}), divisor // g))
    if len(rest) == 1:
        ((atom, coeff),) = rest.items()
        if coeff == 1 and isinstance(atom, FloorDiv):
            inner = add(atom.expr, remainder * atom.divisor)
            return add(outside, floordiv(inner, atom.divisor * divisor))
    return add(outside, _make(0, {FloorDiv(_make(remainder, rest), divisor): 1}))  # type: ignore[arg-type]


def atoms(dim: object) -> set[object]:
    """The plain dims ``dim`` is an expression of (itself for a plain dim, nothing for an int)."""
    if isinstance(dim, int):
        return set()
    if isinstance(dim, FloorDiv):
        return atoms(dim.expr)
    if isinstance(dim, Product):
        return set().union(*(atoms(f) for f in dim.factors))
    if not isinstance(dim, Expr):
        return {dim}
    found: set[object] = set()
    for atom, _ in dim.terms:
        found |= atoms(atom)
    return found


def substitute(dim: object, replace: Callable[[object], object]) -> object:
    """``dim`` with each plain dim ``a`` replaced by ``replace(a)``, canonical."""
    if isinstance(dim, int):
        return dim
    if isinstance(dim, FloorDiv):
        return floordiv(substitute(dim.expr, replace), dim.divisor)
    if isinstance(dim, Product):
        product: object = 1
        for factor in dim.factors:
            product = multiply(product, substitute(factor, replace))
        return product
    if not isinstance(dim, Expr):
        return replace(dim)
    return add(dim.const, *(scale(substitute(atom, replace), coeff) for atom, coeff in dim.terms))


def is_nonnegative(dim: object) -> bool:
    """Whether ``dim`` is ``>= 0`` for all dims (a plain dim is a size): no negative coefficient or constant."""
    if isinstance(dim, int):
        return dim >= 0
    if isinstance(dim, FloorDiv):
        return is_nonnegative(dim.expr)
    if isinstance(dim, Product):
        return all(is_nonnegative(f) for f in dim.factors)
    if not isinstance(dim, Expr):
        return True
    return dim.const >= 0 and all(c > 0 and is_nonnegative(a) for a, c in dim.terms)


# --- shape arithmetic as expressions -------------------------------------------------------

Computed = list[tuple[object, bool]]
"""The elements of a small int64 tensor as dims, each with whether it is proved ``>= 0``."""

_MAX_DEPTH = 32
_MAX_FACTOR = 1 << 20


def computed(ctx: Context, value: ir.Value | None, element: Callable[[object], object],
             nonnegative: Callable[[object], bool] = is_nonnegative, depth: int = 0) -> Computed | None:
    """What ``value`` holds, element by element, as dims (see :func:`shape_value`), through integer arithmetic.

    Beyond :func:`shape_value`: ``Add``, ``Sub``, ``Mul`` (by an int, or a :class:`Product`) and ``Div``
    by an int ``k >= 1`` of a dividend proved ``>= 0`` (onnxruntime's integer
    Div truncates, which is floor there) or by factors of the dividend (:func:`divide_out`) on int64 values of one element or
    as many as the other operand; Concat, and Reshape, Squeeze, Unsqueeze,
    Identity of one element. ``element`` turns a :class:`DimOf` into its dim;
    ``nonnegative`` says whether a dim is proved ``>= 0`` by other facts (a size).
    """
    if value is None or depth > _MAX_DEPTH:
        return None
    built = shape_value(ctx, value)
    if built is not None:
        return [(element(e), isinstance(e, DimOf) or e >= 0) for e in built.elements]  # type: ignore[operator]
    node = value.producer()
    if node is None or node.domain not in ("", "ai.onnx") or ctx.dtype(value) != ir.DataType.INT64:
        return None
    parts = [computed(ctx, v, element, nonnegative, depth + 1) for v in node.inputs]
    if not parts or any(p is None for p in parts):
        return None
    if node.op_type == "Concat":
        return [e for p in parts for e in p]  # type: ignore[union-attr]
    if node.op_type in ("Reshape", "Squeeze", "Unsqueeze", "Identity"):
        return parts[0] if len(parts[0]) == 1 else None  # type: ignore[arg-type]
    operation = _ARITHMETIC.get(node.op_type)
    if operation is None or len(parts) != 2:
        return None
    a, b = parts
    n = max(len(a), len(b))  # type: ignore[arg-type]
    if {len(a), len(b)} - {1, n}:  # type: ignore[arg-type]
        return None
    out = [operation(a[i % len(a)], b[i % len(b)]) for i in range(n)]  # type: ignore[index,arg-type]
    if None in out:
        return None
    return [(dim, known or nonnegative(dim)) for dim, known in out]  # type: ignore[misc]


def _add(a: tuple[object, bool], b: tuple[object, bool]) -> tuple[object, bool] | None:
    if a[0] is None or b[0] is None:
        return None
    return add(a[0], b[0]), a[1] and b[1]


def _sub(a: tuple[object, bool], b: tuple[object, bool]) -> tuple[object, bool] | None:
    if a[0] is None or b[0] is None:
        return None
    result = add(a[0], scale(b[0], -1))
    return result, is_nonnegative(result)  # or a size: see computed


def _mul(a: tuple[object, bool], b: tuple[object, bool]) -> tuple[object, bool] | None:
    if isinstance(b[0], int) and not isinstance(a[0], int):
        a, b = b, a
    if a[0] is None or b[0] is None or (isinstance(a[0], int) and abs(a[0]) > _MAX_FACTOR):
        return None
    return multiply(a[0], b[0]), a[1] and b[1]


def _div(a: tuple[object, bool], b: tuple[object, bool]) -> tuple[object, bool] | None:
    if a[0] is not None and b[0] is not None and not isinstance(b[0], int):
        rest = divide_out(a[0], b[0])
        return None if rest is None else (rest, is_nonnegative(rest))
    if a[0] is None or not a[1] or not isinstance(b[0], int) or b[0] < 1:
        return None  # truncation is floor only for a dividend >= 0
    return floordiv(a[0], b[0]), True


def divide_out(dim: object, divisor: object) -> object:
    """``dim / divisor`` where ``divisor``'s factors are factors of ``dim`` and its coefficient divides dim's; else None.

    Exact for any integers where the division runs: a divisor of 0 fails the Div,
    and ``(c*d * f * r) / (d * f)`` is ``c * r`` whatever the signs (nothing is rounded).
    """
    (cd, factors), (cv, remove) = _split(dim), _split(divisor)
    if cv == 0 or cd % cv:
        return None
    for factor in remove:
        if factor not in factors:
            return None
        factors.remove(factor)
    return _of_factors(cd // cv, factors)


_ARITHMETIC = {"Add": _add, "Sub": _sub, "Mul": _mul, "Div": _div}
