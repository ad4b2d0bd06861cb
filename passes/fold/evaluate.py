"""Evaluating one candidate: reading its inputs, calling refimpl, checking what comes back.

A result is kept only if every output the model needs is an array whose dtype
is the one the schema implies and the one the model declares, and whose shape
fits the declared shape. Anything else is an :class:`EvaluationError` that
leaves the node in place. Results larger than the size estimated before
evaluation (``size``) are logged as a warning: the estimate is wrong.

An elementwise op whose input was just read from a file (external data, or a
weight left in the model file) into an array of its own, of the output's
shape and dtype, is evaluated block by block into that array
(:func:`_in_place`): the same kernel on rows of the inputs, so the same
values, without a second full-size array. Folding a 100 MB weight through a
Mul then needs 100 MB, not 200.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from passes.fold import kernels, size
from passes.fold.policy import Candidate
from passes.ir.schemas import expected_dtypes
from passes.lazy import lazy_module

refimpl = lazy_module("refimpl")  # imported on the first fold (a graph with nothing to fold never needs its kernels)

__all__ = ["EvaluationError", "evaluate"]

logger = logging.getLogger(__name__)


class EvaluationError(Exception):
    """The candidate was not folded after all.

    Attributes:
        unsupported: refimpl turned out to have no kernel for it (counted as
            ``unsupported``); otherwise the kernel rejected its inputs or gave
            results that do not fit the node (``failed``).
        kernel_bug: The kernel itself failed (``refimpl.KernelBugError``):
            counted as ``kernel_bugs`` and logged as an error, never as an
            ordinary "did not fold".
        runtime_choice: The value is onnxruntime's choice (``refimpl.RuntimeChoiceError``) or its
            kernel's (:mod:`passes.fold.kernels`): with confirmation on, onnxruntime computes it
            (:mod:`passes.fold.decide`).
    """

    def __init__(self, message: str, *, unsupported: bool = False, kernel_bug: bool = False,
                 runtime_choice: bool = False) -> None:  # fmt: skip
        super().__init__(message)
        self.unsupported = unsupported
        self.kernel_bug = kernel_bug
        self.runtime_choice = runtime_choice


def read_inputs(candidate: Candidate) -> list[np.ndarray | None]:
    """The candidate's constant inputs as arrays (external data is read here).

    Raises:
        InputError: an input's data cannot be read.
    """
    return [None if t is None else candidate.array(i) for i, t in enumerate(candidate.tensors)]


def evaluate(candidate: Candidate, runtime: bool = True) -> list[np.ndarray | None]:
    """The candidate's outputs, None for those the model does not use.

    With ``runtime`` (confirmation on), a node whose onnxruntime kernel approximates
    (:func:`passes.fold.kernels.runtime_valued`) is not evaluated here: its value is onnxruntime's
    (an ``EvaluationError`` with ``runtime_choice``); without, refimpl's correctly rounded value.

    Raises:
        EvaluationError: refimpl cannot or will not evaluate it, or its results
            do not fit the node.
        InputError: an input's data cannot be read.
    """
    node = candidate.node
    op, domain, opset = node.op_type, candidate.domain, candidate.opset
    assert opset is not None and candidate.attrs is not None
    first = candidate.tensors[0] if candidate.tensors else None
    approximated = kernels.runtime_valued(domain, op, None if first is None else _numpy_name(first.dtype))
    if runtime and approximated is not None:
        logger.debug("%s node %r: %s", op, node.name, approximated)
        raise EvaluationError(approximated, runtime_choice=True)
    arrays = read_inputs(candidate)
    try:
        results = _in_place(candidate, arrays) or refimpl.run(
            op, arrays, candidate.attrs, opset=opset, domain=domain, num_outputs=len(node.outputs)
        )
    except refimpl.UnsupportedOpError as e:
        logger.debug("Not folding %s: %s", node.name, e)
        raise EvaluationError(str(e), unsupported=True) from e
    except refimpl.RuntimeChoiceError as e:
        logger.debug("%s node %r: %s", op, node.name, e)
        raise EvaluationError(str(e), runtime_choice=True) from e
    except refimpl.RefImplError as e:
        logger.warning("Not folding %s node %r: %s", op, node.name, e)
        raise EvaluationError(str(e)) from e
    except refimpl.KernelBugError as e:
        logger.error("Not folding %s node %r: a bug of refimpl's kernel: %s", op, node.name, e)
        raise EvaluationError(str(e), kernel_bug=True) from e
    expected = expected_dtypes(op, domain, opset, candidate.tensors, len(node.outputs))
    outputs = check_results(node, results, expected)
    nbytes = sum(a.nbytes for a in outputs if a is not None)
    if nbytes > candidate.estimate.total:  # a bug of the estimate, not of the model
        logger.warning(
            "%s node %r: %d bytes of results, over the %d estimated before evaluation",
            op,
            node.name,
            nbytes,
            candidate.estimate.total,
        )
    return outputs


#: An input array of its own at least this large is overwritten by the result (see the module docstring).
IN_PLACE_OVER = 1 << 20
#: The rows evaluated at a time hold about this many bytes.
BLOCK = 4 << 20


def _in_place(candidate: Candidate, arrays: Sequence[np.ndarray | None]) -> list[np.ndarray] | None:
    """The output of an elementwise op written over an input array of its own, or None (not this case).

    The target is an input the candidate read into a new array (``Candidate.owns``)
    with the output's shape, C-contiguous and writable; the kernel runs on blocks
    of its rows (inputs that broadcast along the first axis are passed whole) and
    each block's result is checked before it is stored. A first block of another
    dtype or shape leaves the target untouched and the whole evaluation decides.

    Raises:
        refimpl errors, as ``refimpl.run`` does.
    """
    if candidate.op_type not in size.ELEMENTWISE or candidate.domain != "" or len(candidate.node.outputs) != 1:
        return None
    present = [a for a in arrays if a is not None]
    try:
        shape = np.broadcast_shapes(*(a.shape for a in present))
    except ValueError:
        return None  # the kernel says what is wrong
    target = next((
        a for i, a in enumerate(arrays)
        if a is not None and candidate.owns(i) and a.shape == shape and a.ndim and a.nbytes >= IN_PLACE_OVER
        and a.flags.c_contiguous and a.flags.writeable and a.dtype.kind not in "OSU"
    ), None)  # fmt: skip
    if target is None:
        return None
    rows = max(1, BLOCK // max(1, target[0].nbytes))
    assert candidate.opset is not None and candidate.attrs is not None
    candidate.forget_arrays()  # the target becomes the result (read again if asked for)
    for start in range(0, len(target), rows):
        stop = min(start + rows, len(target))
        block = [a if a is None or a.ndim < target.ndim or a.shape[0] == 1 else a[start:stop] for a in arrays]
        (result,) = refimpl.run(candidate.op_type, block, candidate.attrs, opset=candidate.opset, domain="",
                                num_outputs=1)  # fmt: skip
        result = np.asarray(result)
        if result.dtype != target.dtype or result.shape != (stop - start, *target.shape[1:]):
            if start == 0:
                return None
            raise refimpl.KernelBugError(f"{candidate.op_type}: a block's result changed dtype or shape")
        target[start:stop] = result
    return [target]


def _numpy_name(dtype: ir.DataType) -> str | None:
    try:
        return dtype.numpy().name
    except (TypeError, ValueError, AttributeError):
        return None


def _needed(value: ir.Value) -> bool:
    return bool(value.uses()) or value.is_graph_output()


def check_results(
    node: ir.Node, results: Sequence[Any], expected: Sequence[ir.DataType | None]
) -> list[np.ndarray | None]:
    """The kernel's outputs by node output (None where unused), if they fit the node.

    Raises:
        EvaluationError: a needed output is missing, not an array, of another
            dtype than ``expected`` or the declared one, or of a shape the
            declared shape excludes.
    """
    outputs: list[np.ndarray | None] = []
    for i, value in enumerate(node.outputs):
        needed = _needed(value)
        if i >= len(results):
            if needed:
                raise _misfit(node, f"kernel returned no output {i}")
            outputs.append(None)
            continue
        array = results[i]
        if array is None and not needed:
            outputs.append(None)
            continue
        if not isinstance(array, (np.ndarray, np.generic)):
            raise _misfit(node, f"output {i} is a {type(array).__name__}")
        array = np.asarray(array)
        dtype = (
            ir.DataType.STRING if array.dtype.kind in "OSU" else ir.DataType.from_numpy(array.dtype)
        )
        for want in (expected[i], value.dtype):
            if want is not None and want != dtype:
                raise _misfit(node, f"kernel gave {dtype} for {want} output {value.name}")
        if value.shape is not None and not _shape_fits(value.shape, array.shape):
            raise _misfit(node, f"kernel gave shape {array.shape} for {value.shape}")
        outputs.append(array if needed else None)
    return outputs


def _misfit(node: ir.Node, message: str) -> EvaluationError:
    logger.warning("Not folding %r: %s", node.name, message)
    return EvaluationError(message)


def _shape_fits(declared: ir.Shape, actual: tuple[int, ...]) -> bool:
    if len(declared) != len(actual):
        return False
    return all(not isinstance(d, int) or d == a for d, a in zip(declared, actual))
