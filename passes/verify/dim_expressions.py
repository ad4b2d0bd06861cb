"""Dim names that are integer arithmetic of other dim names (``past_sequence_length + 1``, ``s0 + s1``).

The check's size plan (:mod:`passes.verify.plan`) computes such a dim from the
sizes of the names it uses. A model's names are not trusted: only ``+ - * //``
of names and integer literals are read, and nothing long or deeply nested.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping

__all__ = ["evaluate", "expression"]

_ARITHMETIC = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
               ast.FloorDiv: lambda a, b: a // b if b else None}  # fmt: skip


#: Longest dim name read as an expression (a model's dim names are not trusted: no deep parse).
_MAX_EXPRESSION = 200


def expression(name: str, names: set[str]) -> ast.expr | None:
    """``name`` parsed as integer arithmetic of other dim names (``past + 1``, ``s0 + s1``), or None."""
    if name.isidentifier() or len(name) > _MAX_EXPRESSION:
        return None
    try:
        tree = ast.parse(name, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            if node.id not in names:
                return None
        elif isinstance(node, ast.BinOp):
            if type(node.op) not in _ARITHMETIC:
                return None
        elif isinstance(node, ast.Constant):
            if not isinstance(node.value, int) or isinstance(node.value, bool):
                return None
        elif not isinstance(node, (ast.operator, ast.expr_context)):
            return None
    return tree


def evaluate(tree: ast.expr, sizes: Mapping[str, int]) -> int | None:
    if isinstance(tree, ast.Constant):
        return tree.value
    if isinstance(tree, ast.Name):
        return sizes.get(tree.id)
    assert isinstance(tree, ast.BinOp)
    a, b = evaluate(tree.left, sizes), evaluate(tree.right, sizes)
    return None if a is None or b is None else _ARITHMETIC[type(tree.op)](a, b)
