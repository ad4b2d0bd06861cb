"""The refimpl registry and its error conventions.

* ``register(op_type, since, until=None, *, domain="", needs_num_outputs=False)`` resolves its
  range to the schema versions ``onnx.defs`` defines; a kernel runs only for those versions.
* Kernels raise RefImplError (invalid inputs) or UndefinedResultError (no defined result);
  ``run`` turns anything else into KernelBugError, which is not a RefImplError.
* Kernels that need the node's output count get it as an argument, not as an attribute.

Test kernels live in a test-only domain whose schemas the tests register with ``onnx.defs``
and deregister afterwards; each test uses its own op name, so the kernels left in refimpl's
registry never meet another test (nor a lookup: their schemas are gone).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx
import onnx.defs
import pytest

import refimpl
from refimpl import KernelBugError, RefImplError, UndefinedResultError, UnsupportedOpError

DOMAIN = "test.refimpl"
_names = itertools.count()


def _schema(name: str, version: int, *, outputs: int = 1) -> onnx.defs.OpSchema:
    param = onnx.defs.OpSchema.FormalParameter
    variadic = onnx.defs.OpSchema.FormalParameterOption.Variadic
    return onnx.defs.OpSchema(
        name,
        DOMAIN,
        version,
        inputs=[param("X", "T")],
        outputs=[param("Y", "T", param_option=variadic, min_arity=1)]
        if outputs > 1
        else [param("Y", "T")],
        type_constraints=[("T", ["tensor(float)", "tensor(int64)"], "")],
        attributes=[
            onnx.defs.OpSchema.Attribute(
                "mode", onnx.defs.OpSchema.AttrType.STRING, "", required=False
            )
        ],
    )


@pytest.fixture()
def test_op() -> Iterator[Any]:
    """Registers schemas of a fresh test op with onnx.defs: ``make(*versions)`` -> op name."""
    registered: list[tuple[str, int]] = []

    def make(*versions: int, outputs: int = 1) -> str:
        name = f"RefimplTestOp{next(_names)}"
        for version in versions:
            onnx.defs.register_schema(_schema(name, version, outputs=outputs))
            registered.append((name, version))
        return name

    yield make
    for name, version in reversed(registered):
        onnx.defs.deregister_schema(name, version, DOMAIN)


def _run(
    op: str, inputs: list[Any], attrs: dict[str, Any] | None = None, opset: int = 1, **kw: Any
) -> Any:
    return refimpl.run(op, inputs, attrs or {}, opset=opset, domain=DOMAIN, **kw)


# --- errors ------------------------------------------------------------------------------------


def test_a_broken_kernel_surfaces_as_kernel_bug_error(test_op: Any) -> None:
    op = test_op(1)

    @refimpl.register(op, 1, domain=DOMAIN)
    def broken(inputs: Any, attrs: Any) -> Any:
        return (inputs[0] + {}["missing"],)  # KeyError: a bug, not a verdict on the inputs

    with pytest.raises(KernelBugError, match=f"^{op}-1 .*kernel bug: KeyError") as info:
        _run(op, [np.zeros(2, np.float32)])
    assert not isinstance(info.value, RefImplError)
    assert isinstance(info.value.__cause__, KeyError)
    assert (info.value.op_type, info.value.version, info.value.domain) == (op, 1, DOMAIN)


@pytest.mark.parametrize(
    "error", [ValueError("bad"), TypeError("bad"), IndexError(0), ZeroDivisionError()]
)
def test_builtin_errors_escaping_a_kernel_are_bugs(test_op: Any, error: Exception) -> None:
    """What run() used to relabel "rejected inputs" is a bug now: kernels must say RefImplError."""
    op = test_op(1)

    @refimpl.register(op, 1, domain=DOMAIN)
    def kernel(inputs: Any, attrs: Any) -> Any:
        raise error

    with pytest.raises(KernelBugError) as info:
        _run(op, [np.zeros(1, np.float32)])
    assert info.value.__cause__ is error


@pytest.mark.parametrize("error", [MemoryError(), KeyboardInterrupt()])
def test_memory_error_and_interrupts_propagate(test_op: Any, error: BaseException) -> None:
    op = test_op(1)

    @refimpl.register(op, 1, domain=DOMAIN)
    def kernel(inputs: Any, attrs: Any) -> Any:
        raise error

    with pytest.raises(type(error)):
        _run(op, [np.zeros(1, np.float32)])


def test_refimpl_errors_of_a_kernel_name_the_op(test_op: Any) -> None:
    op = test_op(1)

    @refimpl.register(op, 1, domain=DOMAIN)
    def kernel(inputs: Any, attrs: Any) -> Any:
        if attrs.get("mode") == "undefined":
            raise UndefinedResultError("no value")
        raise RefImplError("bad input")

    with pytest.raises(RefImplError, match=f"^{op}-1: bad input$") as info:
        _run(op, [np.zeros(1, np.float32)])
    assert not isinstance(info.value, UndefinedResultError)
    assert (info.value.op_type, info.value.version) == (op, 1)
    with pytest.raises(UndefinedResultError, match=f"^{op}-1: no value$"):
        _run(op, [np.zeros(1, np.float32)], {"mode": "undefined"})


def test_inputs_that_break_the_schema_are_a_refimpl_error_not_a_bug(test_op: Any) -> None:
    """A kernel failing on a missing or extra input reports the caller's error, not a bug.

    run() diagnoses only after the kernel failed, so that the common call pays nothing.
    """
    op = test_op(1)

    @refimpl.register(op, 1, domain=DOMAIN)
    def kernel(inputs: Any, attrs: Any) -> Any:
        (x,) = inputs  # ValueError for two inputs
        return (x * 2,)  # TypeError for None

    with pytest.raises(RefImplError, match="required input") as info:
        _run(op, [None])
    assert isinstance(info.value.__cause__, TypeError)
    with pytest.raises(RefImplError, match="2 inputs; the schema takes at least 1, at most 1"):
        _run(op, [np.zeros(1), np.zeros(1)])
    with pytest.raises(RefImplError, match="0 inputs"):
        _run(op, [])


@pytest.mark.parametrize(
    ("op", "inputs", "attrs", "opset"),
    [
        ("Div", [np.ones(2, np.int32), np.array([1, 0], np.int32)], {}, 18),
        ("Mod", [np.ones(2, np.int64), np.array([0, 1], np.int64)], {}, 13),
        ("Cast", [np.array([np.nan], np.float32)], {"to": onnx.TensorProto.INT32}, 19),
        ("ReduceSum", [np.array([2**31 - 1, 1], np.int32), np.array([0])], {}, 18),
        ("ReduceMean", [np.zeros((2, 0), np.float32), np.array([1])], {}, 18),
        ("ReduceLogSum", [np.zeros((2, 0), np.int32), np.array([1])], {}, 18),
        ("Pow", [np.array([0], np.int32), np.array([-1], np.int32)], {}, 15),
        (
            "ScatterElements",
            [np.zeros(3, np.float32), np.array([1, 1]), np.array([1.0, 2.0], np.float32)],
            {},
            18,
        ),
        ("Cast", [np.array(["abc"], dtype=object)], {"to": onnx.TensorProto.FLOAT}, 19),
    ],
    ids=[
        "int-div-zero",
        "int-mod-zero",
        "nan-to-int",
        "int-sum-overflow",
        "empty-mean",
        "int-log-of-empty",
        "zero-to-negative-power",
        "duplicate-scatter",
        "text-to-float",
    ],
)
def test_undefined_results_raise_undefined_result_error(
    op: str, inputs: list[Any], attrs: dict[str, Any], opset: int
) -> None:
    with pytest.raises(UndefinedResultError, match=f"^{op}"):
        refimpl.run(op, inputs, attrs, opset=opset)


# --- versions ----------------------------------------------------------------------------------


def test_open_range_reaches_the_newest_schema_onnx_defines(test_op: Any) -> None:
    op = test_op(1, 3, 7)

    @refimpl.register(op, 3, domain=DOMAIN)
    def kernel(inputs: Any, attrs: Any) -> Any:
        return (inputs[0],)

    assert (DOMAIN, op, 3, 7) in refimpl.supported()
    assert [refimpl.lookup(op, opset, DOMAIN).since_version for opset in (3, 6, 7, 99)] == [
        3,
        3,
        7,
        7,
    ]
    with pytest.raises(UnsupportedOpError):  # version 1 has no kernel
        refimpl.lookup(op, 2, DOMAIN)


def test_a_closed_range_never_serves_a_newer_schema(test_op: Any) -> None:
    op = test_op(1, 5)

    @refimpl.register(op, 1, 1, domain=DOMAIN)
    def kernel(inputs: Any, attrs: Any) -> Any:
        return (inputs[0],)

    assert _run(op, [np.ones(1, np.float32)], opset=4)[0] == 1
    with pytest.raises(UnsupportedOpError, match=f"{op}-5"):
        _run(op, [np.ones(1, np.float32)], opset=5)


def test_every_kernel_of_the_default_domain_covers_only_schema_versions() -> None:
    """The first and last version of each kernel in supported() are schema versions of the op."""
    for domain, op, first, last in refimpl.supported():
        if domain:
            continue
        versions = {
            s.since_version
            for s in onnx.defs.get_all_schemas_with_history()
            if s.name == op and s.domain == ""
        }
        assert {first, last} <= versions, (op, first, last)
        assert refimpl.lookup(op, first).since_version == first
        assert refimpl.lookup(op, last).since_version == last


def test_register_refuses_versions_that_are_no_schema(test_op: Any) -> None:
    op = test_op(2, 4)
    with pytest.raises(ValueError, match="no schema version 3"):
        refimpl.register(op, 2, 3, domain=DOMAIN)(lambda inputs, attrs: inputs)
    with pytest.raises(ValueError, match="no schema version 1"):
        refimpl.register(op, 1, domain=DOMAIN)(lambda inputs, attrs: inputs)
    refimpl.register(op, 2, 2, domain=DOMAIN)(lambda inputs, attrs: inputs)
    with pytest.raises(ValueError, match="overlaps"):
        refimpl.register(op, 2, domain=DOMAIN)(lambda inputs, attrs: inputs)


def test_typed_kernels_reject_dtypes_their_version_does_not_allow() -> None:
    """Each schema version gets its own kernel: Relu-13 has no int32, Relu-14 does."""
    with pytest.raises(RefImplError, match="^Relu-13: input dtype int32 is not allowed"):
        refimpl.run("Relu", [np.array([-1, 2], np.int32)], opset=13)
    (out,) = refimpl.run("Relu", [np.array([-1, 2], np.int32)], opset=14)
    assert out.tolist() == [0, 2]


def test_schema_dtypes_is_public() -> None:
    assert np.dtype(np.int32) in refimpl.schema_dtypes("Relu", 14)["T"]
    assert np.dtype(np.int32) not in refimpl.schema_dtypes("Relu", 13)["T"]
    with pytest.raises(ValueError):
        refimpl.schema_dtypes("Relu", 12)


# --- the output count ----------------------------------------------------------------------------


def test_num_outputs_reaches_kernels_that_ask_for_it(test_op: Any) -> None:
    op = test_op(1, outputs=3)
    seen: list[Any] = []

    @refimpl.register(op, 1, domain=DOMAIN, needs_num_outputs=True)
    def kernel(inputs: Any, attrs: Any, num_outputs: int | None) -> Any:
        seen.append((num_outputs, dict(attrs)))
        return tuple(inputs[0] for _ in range(num_outputs or 1))

    assert len(_run(op, [np.zeros(1, np.float32)], num_outputs=3)) == 3
    assert len(_run(op, [np.zeros(1, np.float32)])) == 1
    assert seen == [(3, {}), (None, {})]  # no reserved attribute among the attributes


def test_kernels_that_do_not_ask_ignore_num_outputs(test_op: Any) -> None:
    op = test_op(1)

    @refimpl.register(op, 1, domain=DOMAIN)
    def kernel(inputs: Any, attrs: Any) -> Any:
        assert not attrs
        return (inputs[0],)

    assert len(_run(op, [np.zeros(1, np.float32)], num_outputs=1)) == 1


def test_public_names() -> None:
    """The names callers use come from ``refimpl`` itself, never from a private module."""
    names = "KernelBugError RefImplError UndefinedResultError UnsupportedOpError lookup register"
    for name in [*names.split(), "run", "schema_dtypes", "supported"]:
        assert name in refimpl.__all__ and hasattr(refimpl, name), name
    assert issubclass(UndefinedResultError, RefImplError)
    assert not issubclass(KernelBugError, RefImplError)
    assert issubclass(UnsupportedOpError, LookupError)
