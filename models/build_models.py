"""Builds the sample models in this folder: ``python models/build_models.py``.

``demo.onnx`` is an opset-13 model that exercises every pass: ReduceL2,
ReduceLogSum and ReduceLogSumExp with ``axes`` attributes (upgrade), a constant
subgraph computing a scale vector and a reshape target (fold), and the
ReduceLogSumExp itself (decompose). Its batch dimension is dynamic.
"""

from __future__ import annotations

import pathlib

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = pathlib.Path(__file__).parent


def demo_model() -> onnx.ModelProto:
    rng = np.random.default_rng(7)
    base = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "scale_base")
    nodes = [
        # Constant subgraph: scale = |scale_base| * 0.5 + 1, target shape = [-1, 8].
        helper.make_node("Constant", [], ["half"], name="half", value_float=0.5),
        helper.make_node("Constant", [], ["one"], name="one", value=numpy_helper.from_array(np.array(1.0, np.float32))),
        helper.make_node("Abs", ["scale_base"], ["scale_abs"], name="scale_abs"),
        helper.make_node("Mul", ["scale_abs", "half"], ["scale_half"], name="scale_half"),
        helper.make_node("Add", ["scale_half", "one"], ["scale"], name="scale"),
        helper.make_node("Constant", [], ["minus_one"], name="minus_one", value_ints=[-1]),
        helper.make_node("Constant", [], ["eight"], name="eight", value_ints=[8]),
        helper.make_node("Concat", ["minus_one", "eight"], ["target_shape"], name="target_shape", axis=0),
        # The model proper.
        helper.make_node("Mul", ["x", "scale"], ["scaled"], name="scaled"),
        helper.make_node("ReduceL2", ["scaled"], ["norm"], name="norm", axes=[-1], keepdims=1),
        helper.make_node("Div", ["scaled", "norm"], ["normalized"], name="normalized"),
        helper.make_node("ReduceLogSumExp", ["normalized"], ["lse"], name="lse", axes=[1], keepdims=0),
        helper.make_node("Reshape", ["lse", "target_shape"], ["lse_flat"], name="lse_flat"),
        helper.make_node("Abs", ["x"], ["x_abs"], name="x_abs"),
        helper.make_node("Add", ["x_abs", "one"], ["x_pos"], name="x_pos"),
        helper.make_node("ReduceLogSum", ["x_pos"], ["log_sum"], name="log_sum", axes=[2], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "demo",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 8])],
        [
            helper.make_tensor_value_info("lse_flat", TensorProto.FLOAT, ["batch", 8]),
            helper.make_tensor_value_info("log_sum", TensorProto.FLOAT, ["batch", 4]),
        ],
        initializer=[base],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 13)],
        ir_version=7,
        producer_name="onnx-optimize models/build_models.py",
        doc_string="Sample model: opset-13 reductions with axes attributes and a constant subgraph.",
    )
    onnx.checker.check_model(model, full_check=True)
    return model


def main() -> None:
    onnx.save_model(demo_model(), str(HERE / "demo.onnx"))
    print(f"wrote {HERE / 'demo.onnx'}")


if __name__ == "__main__":
    main()
