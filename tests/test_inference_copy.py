"""The copy onnx's shape inference reads (``passes.ir.inference``) leaves out what inference never
reads, the nodes' metadata and doc strings (a dynamo export's stack traces are most of its bytes),
and the model keeps them: the same inferred types, and every note back in place, in the main graph
and in a subgraph."""

from __future__ import annotations

import onnx
import onnx_ir as ir
from onnx import TensorProto, helper

from passes.ir import inference


def _model() -> ir.Model:
    relu = helper.make_node("Relu", ["x"], ["t"], doc_string="then doc")
    relu.metadata_props.add(key="namespace", value="layer.0")
    then = helper.make_graph([relu], "then", [], [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("Abs", ["x"], ["a"], doc_string="trace: line 1"),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    nodes[0].metadata_props.add(key="pkg.torch.onnx.stack_trace", value="File x.py, line 3" * 50)
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3]),
                                           helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("a", TensorProto.FLOAT, None)])
    return ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))


def test_the_copy_has_no_notes_and_the_model_keeps_them() -> None:
    model = _model()
    before = onnx.printer.to_text(ir.serde.serialize_model(model))
    copy = inference._serialize_without_weights(model)  # noqa: SLF001 (the function under test)
    for node in [*copy.graph.node, *copy.graph.node[1].attribute[0].g.node]:
        assert not node.metadata_props and not node.doc_string
    after = ir.serde.serialize_model(model)
    assert onnx.printer.to_text(after) == before
    assert after.graph.node[0].doc_string == "trace: line 1"
    assert [(p.key, p.value[:6]) for p in after.graph.node[0].metadata_props] == [
        ("pkg.torch.onnx.stack_trace", "File x")]
    then = next(a.g for a in after.graph.node[1].attribute if a.name == "then_branch")
    assert [(p.key, p.value) for p in then.node[0].metadata_props] == [("namespace", "layer.0")]
    assert then.node[0].doc_string == "then doc"


def test_inference_still_types_the_values() -> None:
    model = _model()
    found = inference.infer_all(model)
    by_name = {value.name: (dtype, shape) for value, (dtype, shape) in found.items()}
    assert by_name["a"][0] == ir.DataType.FLOAT
    assert [d if isinstance(d, int) else str(d) for d in by_name["a"][1]] == ["n", 3]
