"""The clean-up's removal of unused opset imports: what no node uses goes, what a node uses anywhere stays."""

from __future__ import annotations

import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

from passes.cleanup import RemoveUnusedOpsetImportsPass


def _model(default: str = "", extra: tuple[str, ...] = ("used", "unused"), *, in_branch: bool = False,
           function: bool = True) -> ir.Model:  # fmt: skip
    """x -> used::Op (in the main graph, or in an If branch) -> y; a function importing ``fused`` and
    ``spare`` whose body uses ``fused``; the model also imports ``extra``."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    op = helper.make_node("Op", ["x"], ["y"], domain="used")
    if in_branch:
        then = helper.make_graph([op], "then", [], [y])
        other = helper.make_graph([helper.make_node("Identity", ["x"], ["y2"])], "else", [],
                                 [helper.make_tensor_value_info("y2", TensorProto.FLOAT, [2])])  # fmt: skip
        nodes = [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
        inputs = [x, helper.make_tensor_value_info("c", TensorProto.BOOL, [])]
    else:
        nodes, inputs = [op], [x]
    functions = []
    if function:
        body = [helper.make_node("Fused", ["u"], ["w"], domain="fused")]
        functions.append(helper.make_function("local", "F", ["u"], ["w"], body, [
            helper.make_opsetid("", 18), helper.make_opsetid("fused", 1), helper.make_opsetid("spare", 1)]))  # fmt: skip
    graph = helper.make_graph(nodes, "g", inputs, [y])
    opsets = [helper.make_opsetid(default, 18), *(helper.make_opsetid(d, 1) for d in extra)]
    return ir.serde.deserialize_model(helper.make_model(graph, opset_imports=opsets, functions=functions))


@pytest.mark.parametrize("in_branch", [False, True])
@pytest.mark.parametrize("default", ["", "ai.onnx"])
def test_unused_imports_go_used_ones_and_the_default_domain_stay(in_branch: bool, default: str) -> None:
    model = _model(default, in_branch=in_branch)
    result = RemoveUnusedOpsetImportsPass()(model)
    assert result.modified
    assert dict(model.opset_imports) == {default: 18, "used": 1}
    function = next(iter(model.functions.values()))
    assert dict(function.opset_imports) == {"": 18, "fused": 1}


def test_a_model_importing_the_default_domain_alone_is_left_as_it_is() -> None:
    model = _model(extra=(), function=False)
    result = RemoveUnusedOpsetImportsPass()(model)
    assert not result.modified
    assert dict(model.opset_imports) == {"": 18}


def test_only_a_function_importing_more_than_the_default_domain_is_still_cleaned() -> None:
    model = _model(extra=())  # the model imports the default domain alone; its function imports "spare" too
    result = RemoveUnusedOpsetImportsPass()(model)
    assert result.modified
    assert dict(model.opset_imports) == {"": 18}
    assert dict(next(iter(model.functions.values())).opset_imports) == {"": 18, "fused": 1}
