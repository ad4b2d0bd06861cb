"""Where a change of float rounding is amplified: the values from which a rounding-sized difference
reaches an op that turns it into a large one.

A rewrite that may change rounding (simplify's fusions, the ReduceLogSumExp decomposition) changes
its result by about an ulp. Most ops carry such a difference on at its size; some turn it into a
whole step where their input crosses a threshold: a quantizer's rounding (and, for
``DynamicQuantizeLinear``, a scale and zero point from the tensor's min and max, which move every
quantized value), a Cast to an integer, a comparison, an index of the largest value. There a 1e-7
change becomes a wrong quantization step, a flipped mask, another class: a difference no tolerance
can accept, found by the check only if its one draw happens to cross a threshold (see
docs/exactness.md, "Where a rounding change is amplified", for the set and the measurements).

:class:`Amplified` answers, for a value, which such op (if any) a change of it reaches. It is
computed once per pass run, on first use, by one walk over every scope (to find the amplifying ops,
the owners of subgraphs and the calls of model-local functions) and one backward walk from the
amplifying ops' inputs through the producers of what they read: through every op but those whose
output does not depend on the values of their inputs (``Shape``, ``Size``...), into and out of
If/Loop/Scan bodies (an op with subgraphs: all of its inputs and all of its bodies' outputs; a body's
input: all of its owner's inputs and its body's outputs, a Loop's carried values), and through
model-local functions (a call's output is its function's output; a function's input is that input
of every call). It is conservative: a value it cannot rule out counts as amplified. A value made
after the walk (by an earlier rewrite of the same run) is looked up by a walk forward through the
new nodes to the values the walk knew.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Iterable, Iterator

import onnx_ir as ir

from passes.ir.walk import iter_scopes, normalize_domain

__all__ = ["AMPLIFIERS", "Amplified", "amplifying_inputs"]

#: Default-domain ops whose result jumps where a float input crosses a threshold (every input is
#: read so): quantizers, rounding to integers, comparisons, the position of the largest value, the
#: elements kept or counted by a test, a size from float arithmetic. ``TopK`` and ``MaxPool`` amplify
#: only when their indices are used, ``Cast``/``CastLike`` only to a type that is not a float of
#: more than 8 bits, ``Resize``/``Upsample`` through their roi, scales and sizes alone (see
#: :func:`amplifying_inputs`).
AMPLIFIERS = frozenset({
    "QuantizeLinear", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul",
    "Round", "Floor", "Ceil", "Sign", "Mod",
    "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual",
    "ArgMax", "ArgMin", "Hardmax", "NonZero", "Unique", "NonMaxSuppression", "Multinomial",
    "ThresholdedRelu", "Shrink", "OneHot", "Range",
})  # fmt: skip

#: ``ai.onnx.ml`` ops that compare features with thresholds or match them exactly (tree splits,
#: predicted labels, binarisation, category lookups, replaced values).
_ML_AMPLIFIERS = frozenset({
    "TreeEnsembleClassifier", "TreeEnsembleRegressor", "TreeEnsemble", "LinearClassifier", "SVMClassifier",
    "Binarizer", "LabelEncoder", "OneHotEncoder", "Imputer",
})  # fmt: skip

#: Ops of other domains that quantize (onnxruntime's ``com.microsoft`` contrib ops: QLinear*, QGemm,
#: QAttention, DynamicQuantizeMatMul, MatMulIntegerToFloat, ...). Other ops of unknown domains carry
#: a difference on, as an elementwise op would.
_QUANTIZING = re.compile(r"Quant|Integer|^QLinear|^QGemm|^QAttention|^QOrdered|^QEmbed")

#: Ops whose outputs do not depend on the values of their inputs (shapes, sizes, random draws of a shape).
_BLIND = frozenset({"Shape", "Size", "EyeLike", "RandomNormalLike", "RandomUniformLike"})


def _used(value: ir.Value | None) -> bool:
    return value is not None and (bool(value.uses()) or value.is_graph_output())


def _coarse(dtype: ir.DataType | None) -> bool:
    """Whether a Cast to ``dtype`` rounds to steps no tolerance covers: not a float of more than 8 bits
    (an integer, bool, string, float8 or float4; an unknown type counts)."""
    return dtype is None or not dtype.is_floating_point() or dtype.bitwidth <= 8


def amplifying_inputs(node: ir.Node) -> list[ir.Value]:
    """The inputs of ``node`` whose rounding-sized change may change its result by a whole step."""
    domain, op = normalize_domain(node.domain), node.op_type
    inputs = [v for v in node.inputs if v is not None]
    if domain == "ai.onnx.ml":
        return inputs if op in _ML_AMPLIFIERS else []
    if domain != "":
        return inputs if _QUANTIZING.search(op) else []
    if op in AMPLIFIERS:
        return inputs
    if op in ("TopK", "MaxPool"):
        return inputs[:1] if len(node.outputs) > 1 and _used(node.outputs[1]) else []
    if op == "Cast":
        return inputs[:1] if _coarse(_target(node)) else []
    if op == "CastLike":
        return inputs[:1] if len(inputs) == 2 and _coarse(inputs[1].dtype) else []
    if op == "Resize":
        return [v for v in node.inputs[1:] if v is not None]
    if op == "Upsample":
        return [v for v in node.inputs[1:2] if v is not None]
    return []


def _target(node: ir.Node) -> ir.DataType | None:
    """A Cast's ``to`` type, if it is one."""
    attr = node.attributes.get("to")
    if not isinstance(attr, ir.Attr) or attr.is_ref() or attr.type != ir.AttributeType.INT:
        return None  # a reference to a function's attribute: unknown here
    try:
        return ir.DataType(attr.value) or None
    except ValueError:
        return None


def _label(node: ir.Node) -> str:
    if node.op_type == "Cast" and normalize_domain(node.domain) == "":
        target = _target(node)
        return f"Cast to {target.name.lower() if target else 'an unknown type'}"
    return node.op_type if normalize_domain(node.domain) == "" else f"{node.domain}::{node.op_type}"


class Amplified:
    """Which amplifying op (if any) a change of a value's rounding reaches; see the module docstring.

    Computed on the first :meth:`reason` call, for the model as it is then.
    """

    def __init__(self, model: ir.Model) -> None:
        self.model = model
        self._reached: dict[ir.Value, str] | None = None
        self._known: set[ir.Node] = set()
        self._owners: dict[ir.Graph, ir.Node] = {}
        self._functions: dict[ir.Graph, ir.Function] = {}
        self._calls: dict[tuple[str, str, str], list[ir.Node]] = collections.defaultdict(list)

    @property
    def walked(self) -> bool:
        """Whether the walk ran (then it holds for the model as it was at the first :meth:`reason`)."""
        return self._reached is not None

    def reason(self, value: ir.Value) -> str | None:
        """The amplifying op a change of ``value`` reaches (``"DynamicQuantizeLinear"``), or None."""
        if self._reached is None:
            self._reached = self._walk()
        found = self._reached.get(value)
        if found is not None:
            return found
        producer = value.producer()
        if producer is None or producer in self._known:
            return None
        return self._forward(value)

    # --- the walk --------------------------------------------------------------------------------

    def _walk(self) -> dict[ir.Value, str]:
        """Every value from which an amplifying op is reached, with that op's label."""
        reached: dict[ir.Value, str] = {}
        queue: collections.deque[tuple[ir.Value, str]] = collections.deque()
        for scope in iter_scopes(self.model):
            body = scope.body
            graph = body.graph if isinstance(body, ir.Function) else body
            if scope.owner is not None:
                self._owners[graph] = scope.owner
            if isinstance(body, ir.Function) and scope.owner is None:
                self._functions[graph] = body
            for node in body:
                self._known.add(node)
                if self._callee(node) is not None:
                    self._calls[(node.domain, node.op_type, node.overload)].append(node)
                for value in amplifying_inputs(node):
                    queue.append((value, _label(node)))
        while queue:
            value, label = queue.popleft()
            if value in reached:
                continue
            reached[value] = label
            queue.extend((v, label) for v in self._upstream(value) if v not in reached)
        return reached

    def _callee(self, node: ir.Node) -> ir.Function | None:
        return self.model.functions.get((node.domain, node.op_type, node.overload))

    def _upstream(self, value: ir.Value) -> Iterator[ir.Value]:
        """The values whose change may change ``value``."""
        producer = value.producer()
        if producer is None:
            yield from self._outside(value)
            return
        if producer.op_type in _BLIND and normalize_domain(producer.domain) == "":
            return
        callee = self._callee(producer)
        if callee is not None:
            index = list(producer.outputs).index(value)
            if index < len(callee.outputs):
                yield callee.outputs[index]  # and from the function's inputs, that input of every call
            return
        yield from (v for v in producer.inputs if v is not None)
        for body in _bodies(producer):
            yield from body.outputs

    def _outside(self, value: ir.Value) -> Iterator[ir.Value]:
        """For a body's or a function's input: the values that flow into it."""
        graph = value.graph
        if graph is None or not value.is_graph_input():
            return
        owner = self._owners.get(graph)
        if owner is not None:
            yield from (v for v in owner.inputs if v is not None)
            yield from graph.outputs  # a Loop's or Scan's carried values come back as its inputs
            return
        function = self._functions.get(graph)
        if function is not None:
            index = list(graph.inputs).index(value)
            for call in self._calls.get(function.identifier(), ()):
                if index < len(call.inputs) and call.inputs[index] is not None:
                    yield call.inputs[index]

    def _forward(self, value: ir.Value) -> str | None:
        """For a value made after the walk: the amplifying op reached forward through new nodes."""
        assert self._reached is not None
        seen: set[ir.Value] = set()
        pending = [value]
        while pending:
            current = pending.pop()
            if current in seen:
                continue
            seen.add(current)
            found = self._reached.get(current)
            if found is not None:
                return found
            for use in current.uses():
                node = use.node
                if any(v is current for v in amplifying_inputs(node)):
                    return _label(node)
                if node in self._known:
                    pending.extend(v for v in node.outputs if v in self._reached)
                else:
                    pending.extend(node.outputs)
            if current.is_graph_output():
                pending.extend(self._beyond(current))
        return None

    def _beyond(self, value: ir.Value) -> Iterable[ir.Value]:
        """Where a body's or a function's output goes: its owner's or every call's outputs."""
        graph = value.graph
        owner = self._owners.get(graph) if graph is not None else None
        if owner is not None:
            return list(owner.outputs)
        function = self._functions.get(graph) if graph is not None else None
        if function is not None:
            index = list(graph.outputs).index(value)  # type: ignore[union-attr]
            return [call.outputs[index] for call in self._calls.get(function.identifier(), ())
                    if index < len(call.outputs)]  # fmt: skip
        return []


def _bodies(node: ir.Node) -> Iterator[ir.Graph]:
    for attr in node.attributes.values():
        if isinstance(attr, ir.Attr) and attr.type == ir.AttributeType.GRAPH:
            yield attr.as_graph()
        elif isinstance(attr, ir.Attr) and attr.type == ir.AttributeType.GRAPHS:
            yield from attr.as_graphs()
