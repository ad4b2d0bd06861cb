"""Whether the MatMul merge onnxsim makes is exact in onnxruntime (the figures in docs/exactness.md).

Several MatMuls sharing their left input A with constant weights W1..Wn become one MatMul with
the weights concatenated, then a Split on the last axis. This runs both forms in onnxruntime
(optimisations off, CPU) on random data, for K in (1, 7, 64, 768), widths N, rows M and float32 /
float64, and prints each configuration whose outputs differ in any bit, then the count.

Usage::

    python benchmarks/matmul_merge.py
"""

import numpy as np
import onnxruntime as ort
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

def sess(m):
    o = ort.SessionOptions(); o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(m.SerializeToString(), o, providers=["CPUExecutionProvider"])
def trial(M, K, Ns, seed, dtype=np.float32, batch=()):
    rng = np.random.default_rng(seed)
    tt = T.FLOAT if dtype == np.float32 else T.DOUBLE
    Ws = [rng.standard_normal((K, n)).astype(dtype) for n in Ns]
    A = rng.standard_normal((*batch, M, K)).astype(dtype)
    x = h.make_tensor_value_info("a", tt, [*batch, M, K])
    sep = h.make_model(h.make_graph([h.make_node("MatMul", ["a", f"w{i}"], [f"y{i}"]) for i in range(len(Ws))], "s", [x],
        [h.make_tensor_value_info(f"y{i}", tt, None) for i in range(len(Ws))], [nh.from_array(w, f"w{i}") for i, w in enumerate(Ws)]),
        opset_imports=[h.make_opsetid("", 18)], ir_version=8)
    cat = np.concatenate(Ws, axis=1)
    split = nh.from_array(np.array(Ns, np.int64), "split")
    mer = h.make_model(h.make_graph([h.make_node("MatMul", ["a", "w"], ["y"]), h.make_node("Split", ["y", "split"], [f"y{i}" for i in range(len(Ws))], axis=-1)], "m", [x],
        [h.make_tensor_value_info(f"y{i}", tt, None) for i in range(len(Ws))], [nh.from_array(cat, "w"), split]),
        opset_imports=[h.make_opsetid("", 18)], ir_version=8)
    a = sess(sep).run(None, {"a": A}); b = sess(mer).run(None, {"a": A})
    return sum(int((x.view(np.uint8) != y.view(np.uint8)).any()) for x, y in zip(a, b)), len(Ws)
bad = 0
total = 0
for K in (1, 7, 64, 768):
    for Ns in ((3, 5), (64, 64, 64), (768, 768, 768), (7, 1, 100), (16, 16, 16, 16)):
        for M in (1, 5, 128):
            for dt in (np.float32, np.float64):
                d, n = trial(M, K, Ns, K * 31 + M, dt)
                if d:
                    print("differs", dict(K=K, Ns=Ns, M=M, dtype=dt.__name__), d, "of", n)
                    bad += 1
                total += 1
print("configs", total, "with any differing output", bad)
