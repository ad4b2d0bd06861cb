"""What onnxruntime 1.32's Attention kernel does, which ``passes/simplify/fusions/attention.py`` rests on,
and the fusion on tiny transformers exports (random perturbed weights, configs only).

The probes compare the kernel with the primitive chain on the same inputs: a fully masked row (every
mask entry -inf or the lowest float) is 0 in the kernel, NaN or the mean of V in the chain; a ``Div``
by √8 rounds the scores otherwise than the kernel's multiplication, beyond the check's tolerance once
the Softmax amplifies it, where ``Mul`` by the scale is bit for bit.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest
from onnx import helper

import helpers
from test_simplify_attention import D, H, L, LOGGER, LOWEST, S, Net, chain, model, same_values, value_info

# --- what onnxruntime's kernel does (the module's conditions rest on these) ----------------------------


def test_a_div_by_sqrt_8_rounds_otherwise_and_the_softmax_amplifies_it() -> None:
    """Why only a Div by a power of two is taken: on ``x · 30 + 5`` the kernel (scores times 1/√8) is
    beyond the check's float tolerance of the primitive ``Div`` by √8 in some trials, where the ``Mul`` by
    1/√8 form is bit for bit."""
    shape = (2, 4, 16, 8)
    net = Net()
    chain(net, scale="div")
    io = [value_info(n, shape) for n in "qkv"]
    divided = helper.make_model(helper.make_graph(net.nodes, "d", io, [value_info("y", shape)], initializer=net.initializers),
                                opset_imports=[helper.make_opsetid("", 23)])  # fmt: skip
    net = Net()
    chain(net, scale="mul")
    multiplied = helper.make_model(helper.make_graph(net.nodes, "m", io, [value_info("y", shape)],
                                                     initializer=net.initializers),
                                   opset_imports=[helper.make_opsetid("", 23)])  # fmt: skip
    kernel = helper.make_model(helper.make_graph([helper.make_node("Attention", ["q", "k", "v"], ["y"],
                                                                   scale=float(np.float32(8**-0.5)))],
                                                 "k", io, [value_info("y", shape)]),
                               opset_imports=[helper.make_opsetid("", 23)])  # fmt: skip
    rng = np.random.default_rng(5)
    beyond = 0
    for _ in range(20):
        feeds = {n: (rng.standard_normal(shape) * 30 + 5).astype(np.float32) for n in "qkv"}
        fused = helpers.ort_run(kernel, feeds)[0]
        assert helpers.ort_run(multiplied, feeds)[0].tobytes() == fused.tobytes()
        expected = helpers.ort_run(divided, feeds)[0]
        beyond += int(not np.allclose(fused, expected, rtol=1e-4, atol=1e-5))
    assert beyond > 0


def _pair() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """The primitive chain with a mask input ``m`` [1, 1, S, L] and Attention on the same inputs."""
    primitive = model(mask="input", batch=1)
    primitive.graph.input[3].type.tensor_type.shape.dim[0].dim_value = 1
    kernel = helper.make_graph([helper.make_node("Attention", ["q", "k", "v", "m"], ["y"], scale=D**-0.5)], "k",
                               list(primitive.graph.input), list(primitive.graph.output))  # fmt: skip
    return primitive, helper.make_model(kernel, opset_imports=[helper.make_opsetid("", 23)])


@pytest.mark.parametrize("fill", [LOWEST, -np.inf])
def test_the_kernel_zeroes_a_fully_masked_row(fill: float) -> None:
    """A row whose every mask entry is the lowest float or -inf: the kernel gives 0 whatever the scores,
    the primitive ops the mean of V (equal scores) or NaN. Other rows, partly masked ones included, agree."""
    primitive, kernel = _pair()
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal((1, H, S if n == "q" else L, D)).astype(np.float32) for n in "qkv"}
    mask = np.zeros((1, 1, S, L), np.float32)
    mask[0, 0, 0] = fill
    mask[0, 0, 1, :3] = fill
    feeds["m"] = mask
    expected, actual = helpers.ort_run(primitive, feeds)[0], helpers.ort_run(kernel, feeds)[0]
    assert np.all(actual[:, :, 0] == 0)
    if fill == LOWEST:
        np.testing.assert_allclose(expected[:, :, 0], np.broadcast_to(feeds["v"].mean(axis=2), expected[:, :, 0].shape),
                                   rtol=1e-5, atol=1e-6)  # fmt: skip
    else:
        assert np.all(np.isnan(expected[:, :, 0]))
    same_values(expected[:, :, 1:], actual[:, :, 1:])


def test_the_kernel_hides_nan_scores_in_a_fully_masked_row() -> None:
    primitive, kernel = _pair()
    feeds = {n: np.ones((1, H, S if n == "q" else L, D), np.float32) for n in "qkv"}
    feeds["q"][0, 0, 0, 0] = np.nan
    feeds["m"] = np.full((1, 1, S, L), LOWEST, np.float32)
    expected, actual = helpers.ort_run(primitive, feeds)[0], helpers.ort_run(kernel, feeds)[0]
    assert np.isnan(expected[0, 0, 0, 0]) and actual[0, 0, 0, 0] == 0


def test_just_above_the_lowest_float_the_kernel_agrees() -> None:
    """-3.4e38 in every entry of a row is not fully masked for the kernel: the mean of V in both."""
    primitive, kernel = _pair()
    rng = np.random.default_rng(1)
    feeds = {n: rng.standard_normal((1, H, S if n == "q" else L, D)).astype(np.float32) for n in "qkv"}
    feeds["m"] = np.full((1, 1, S, L), -3.4e38, np.float32)
    same_values(helpers.ort_run(primitive, feeds)[0], helpers.ort_run(kernel, feeds)[0])


# --- tiny transformers exports (random perturbed weights, configs only) ---------------------------------


def _export(arch: str, with_mask: bool) -> onnx.ModelProto:
    """A 2-layer ``arch`` (bert, gpt2, llama) exported by torch's TorchScript exporter at opset 18."""
    import io
    import warnings

    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if arch == "bert":
        config = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=64, max_position_embeddings=32, attn_implementation="eager")
        net = transformers.BertModel(config, add_pooling_layer=False)
    elif arch == "gpt2":
        config = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                                         use_cache=False, attn_implementation="sdpa")
        net = transformers.GPT2Model(config)
    else:
        config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                          use_cache=False, attn_implementation="eager")
        net = transformers.LlamaModel(config)
    with torch.no_grad():
        for tensor in net.parameters():
            tensor.add_(torch.empty_like(tensor).uniform_(0.01, 0.1))
    net.eval()

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def forward(self, *args):
            named = dict(zip(("input_ids", "attention_mask"), args))
            return self.net(**named, return_dict=True).last_hidden_state

    ids = torch.randint(0, 64, (2, 6))
    args = (ids, torch.ones_like(ids)) if with_mask else (ids,)
    names = ["input_ids", "attention_mask"][: len(args)]
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Wrapped(), args, buffer, dynamo=False, opset_version=18, input_names=names,
                          output_names=["hidden"], dynamic_axes={n: {0: "batch", 1: "seq"} for n in names})
    return onnx.load_from_string(buffer.getvalue())


def _optimized(original: onnx.ModelProto, target: int, caplog) -> list[str]:
    """The optimised model's ops (the run's own check compares it with the original in onnxruntime)."""
    from passes import optimize

    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        result = optimize(original, target_opset=target)
    return helpers.ops_recursive(result)


def test_bert_without_a_mask_fuses_one_attention_per_layer_at_23_not_at_18(caplog) -> None:
    original = _export("bert", with_mask=False)
    ops = _optimized(original, 23, caplog)
    assert ops.count("Attention") == 2 and "Softmax" not in ops, ops
    rng = np.random.default_rng(0)
    from passes import optimize

    result = optimize(original, target_opset=23, check=False)
    for batch, seq in ((1, 3), (2, 6), (3, 17)):
        feeds = {"input_ids": rng.integers(0, 64, (batch, seq))}
        same_values(helpers.ort_run(original, feeds)[0], helpers.ort_run(result, feeds)[0])
    ops = _optimized(original, 18, caplog)
    assert "Attention" not in ops and ops.count("Softmax") == 2, ops


@pytest.mark.parametrize("arch", ["bert", "gpt2", "llama"])
def test_exports_with_an_attention_mask_are_declined(arch: str, caplog) -> None:
    """The exporters' masks are ``Where(attention_mask ..., 0, finfo.min)`` (or -inf) of the input: a padded
    sequence fully masks a row, where onnxruntime's kernel gives 0 and the primitive ops do not. GPT-2's
    sdpa export zeroes NaN probabilities (``Where(IsNaN(p), 0, p)``), which the kernel does not: no chain."""
    ops = _optimized(_export(arch, with_mask=True), 23, caplog)
    assert "Attention" not in ops and ops.count("Softmax") == 2, ops
    if arch != "gpt2":
        assert "the mask may fully mask a row" in caplog.text
