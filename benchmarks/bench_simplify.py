"""Node counts after simplification: ours against onnxsim, onnxslim, onnxscript and onnxruntime.

How far does ``optimize`` simplify the graphs people ship, compared with the
tools they use for it? Per model and tool, each run in a fresh process with a
time limit (``--timeout``, default 300 s): the nodes after (main graph, every
subgraph and every model-local function, counted recursively), whether the
output passes ``onnx.checker.check_model(full_check=True)`` (valid), gives
the same outputs as the original in onnxruntime with every optimisation off
(equal) and keeps the graph inputs callers see (every declared input at its
position, with its type and a shape no narrower; initializer-backed inputs
included: by the IR spec they are defaults a caller may override, though
onnxruntime does not let callers override them below IR 4), and the time of
the tool's work (load + passes + save, after its imports).

Tools (``harness.tool_snippet``, shared with bench_end_to_end):

- ``optimize``: ours, ``python -m passes IN -o OUT --no-check -q`` (default
  passes, target opset 18); its own onnxruntime check is also run once
  (without ``--no-check``) and reported in the "own check" column;
- ``vc+onnxsim``: ``onnx.version_converter`` to 18, then ``onnxsim.simplify``;
- ``onnxscript``: its version converter to 18 (``fallback=True``), then
  ``onnxscript.optimizer.optimize``;
- ``onnxslim``: ``onnxslim.slim`` (keeps the opset);
- ``ort-basic``: onnxruntime's offline optimiser at ``ORT_ENABLE_BASIC``
  (``SessionOptions.optimized_model_filepath``; keeps the opset).

Models: every model the repository ships (``models/real/*.onnx``,
``models/demo.onnx``), the ones installed packages ship (onnx's "light" model
zoo, onnxruntime's datasets), and PyTorch exports built here from configs with
random weights (nothing is downloaded): transformers' BERT (eager attention),
GPT-2 (``attn_implementation="sdpa"``), ViT, wav2vec2 and the Whisper encoder,
a ``torch.nn.LSTM`` and a small hand-written CNN with BatchNorm, each
exported by the TorchScript exporter (``dynamo=False``) at opsets 14 and 17 and
by the dynamo exporter (``dynamo=True``, its default optimisation on) at 18;
and, from a sweep of real-model families, Llama (grouped-query attention), a
T5 encoder, Swin, MobileNetV2 and DETR, at opset 17 (TorchScript) and 18
(dynamo; not Swin and T5, whose views torch 2.13's dynamo exporter cannot
export with a dynamic batch). Batch and sequence (or image) axes are dynamic. Every floating parameter and
buffer gets a random offset in [0.01, 0.1), so none is exactly 0 or 1 (no
multiply-by-one or add-zero a tool could drop because of the random init);
modules are in eval mode. An export that fails is a row "export failed:
<reason>"; the run goes on.

Inputs (the same for the original and every output; never the initializer-backed
inputs of IR < 4 models, which are weights): floats standard normal,
integers in [0, 4) (valid token ids for any vocabulary; inputs named
``*mask*`` in [0, 2)), booleans fair; dynamic dimensions: batch 1, sequence
12, image 48 (the exports' own sizes are in ``ARCHS``), any other 1. Outputs
are compared with rtol 1e-3 / atol 1e-4 (float32, float64), 1e-2 / 1e-3
(float16), exactly otherwise; NaNs must be at the same places.

Cells: ``123`` (valid and equal; the best per model in bold), ``123 (invalid)``,
``123 (differs)``, ``123 (inputs changed)``, ``123 (unverified)`` (the original does not run in
onnxruntime), ``failed``, ``timeout``; the notes under the table give the
reasons. The summary gives per tool the sum of nodes over the models where
every tool's output is valid and equal, the models where ours has more nodes
than the best other tool, the wrong outputs per tool, and for the models with
the most extra nodes against onnxslim the op types that make the difference.

Target opsets (``--targets 18,20,23``, issue #24): every selected model runs once per
target T, as a row ``MODEL@T``: ours with ``--target-opset T`` (its fusions into
LayerNormalization-17, Gelu-20 and RMSNormalization-23 apply from those targets),
onnxsim with its own target opset (``vc+onnxsim`` then means onnxsim 0.8's
``simplify(..., target_opset_version=T)`` (its CLI's ``--target-opset``) where that parameter exists, else
version_converter to T first), onnxscript converted to T; onnxslim and ort-basic
keep the model's opset. A further table gives, per row and tool, the
LayerNormalization / Gelu / RMSNormalization nodes of the output and its opset.

Usage:
    python benchmarks/bench_simplify.py [--quick] [--only NAME,...] [--tools T,...] [--targets T,...]
        [--keep DIR] [--timeout S] [--json FILE] [--list]

``--only`` takes names or shell patterns (``'hf_bert*,demo'``). ``--keep DIR``
keeps the exported models (``DIR/exports``, reused by later runs with the same
DIR) and every tool's output (``DIR/outputs``); without it everything lives in
a temporary folder. Exit status 1 when ours writes an invalid or different
model, else 0.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fnmatch
import json
import os
import pathlib
import pickle
import sys
import tempfile
import time
from typing import Any

import numpy as np
import onnx

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from harness import (  # noqa: E402
    TOOLS, count_nodes, default_opset, load_models_builder, measure, op_counts, tool_installed, tool_snippet,
)

TARGET_OPSET = 18
OURS = "optimize"
SLIM = "onnxslim"
SEED = 0
RTOL, ATOL = 1e-3, 1e-4
RTOL_F16, ATOL_F16 = 1e-2, 1e-3
#: Sizes of dynamic dimensions by (lower-case) name fragment; any other dynamic dimension is 1.
DIM_RULES = (
    (("batch",), 1),
    (("seq", "len", "token", "time", "step", "sent"), 12),
    (("height", "width", "image"), 48),
)


# --- torch exports ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Arch:
    """A module to export: what it is and the sizes of its dynamic dimensions for the comparison."""

    description: str
    dims: dict[str, int]


ARCHS: dict[str, Arch] = {
    "hf_bert": Arch("transformers BertModel, tiny config, eager attention", {"batch": 1, "seq": 12}),
    "hf_gpt2": Arch("transformers GPT2LMHeadModel, tiny config, sdpa attention", {"batch": 1, "seq": 12}),
    "hf_vit": Arch("transformers ViTModel, tiny config, 32x32 images", {"batch": 1}),
    "hf_wav2vec2": Arch("transformers Wav2Vec2Model, tiny config, raw audio", {"batch": 1, "samples": 800}),
    "hf_whisper_enc": Arch("transformers WhisperEncoder, tiny config, 16 mel bins x 32 frames", {"batch": 1}),
    "torch_lstm": Arch("torch.nn.LSTM (2 layers) + Linear", {"batch": 1, "seq": 12}),
    "torch_cnn_bn": Arch("hand-written CNN: Conv-BatchNorm-ReLU blocks, residual, pooling", {
        "batch": 1, "height": 48, "width": 48}),
    "hf_llama": Arch("transformers LlamaForCausalLM, tiny config (grouped-query attention), eager attention",
                     {"batch": 1, "seq": 12}),
    "hf_t5_enc": Arch("transformers T5EncoderModel, tiny config, gated GELU", {"batch": 1, "seq": 12}),
    "hf_swin": Arch("transformers SwinForImageClassification, tiny config, 64x64 images", {"batch": 1}),
    "hf_mobilenet_v2": Arch("transformers MobileNetV2ForImageClassification, depth 0.35, 64x64 images", {"batch": 1}),
    "hf_detr": Arch("transformers DetrForObjectDetection, ResNet backbone, tiny config, 64x64 images", {"batch": 1}),
}

#: The architectures added from the real-model sweep of 2026-12-02, exported at two settings only.
_SWEEP_ARCHS = ("hf_llama", "hf_t5_enc", "hf_swin", "hf_mobilenet_v2", "hf_detr")


@dataclasses.dataclass(frozen=True)
class ExportSpec:
    """One export: an architecture, the exporter, the opset, and whether the exporter may fold/optimise.

    ``fold=False`` is ``do_constant_folding=False`` for the TorchScript exporter (it otherwise
    fuses BatchNorm into Conv itself) and ``optimize=False`` for the dynamo one: the raw graphs.
    """

    arch: str
    dynamo: bool
    opset: int
    fold: bool = True
    #: Decoder layers and hidden size of ``hf_gpt2`` / ``hf_llama`` (None: the tiny config's 2 and 32);
    #: ``bench_llm`` builds LLM-size graphs (tens of thousands of nodes) this way.
    layers: int | None = None
    hidden: int | None = None

    @property
    def name(self) -> str:
        size = "" if self.layers is None and self.hidden is None else f"_L{self.layers or 2}_h{self.hidden or 32}"
        return f"{self.arch}{size}_{'dynamo' if self.dynamo else 'ts'}_opset{self.opset}" + ("" if self.fold else "_nofold")

    @property
    def description(self) -> str:
        option = ("optimize" if self.dynamo else "do_constant_folding") + f"={self.fold}"
        size = "" if self.layers is None and self.hidden is None else \
            f" ({self.layers or 2} layers, hidden size {self.hidden or 32})"
        return (f"{ARCHS[self.arch].description}{size}; "
                f"torch.onnx.export(dynamo={self.dynamo}, opset {self.opset}, {option})")


EXPORTS: list[ExportSpec] = [
    *(ExportSpec(arch, dynamo, opset) for arch in ARCHS if arch not in _SWEEP_ARCHS
      for dynamo, opset in ((False, 14), (False, 17), (True, 18))),
    *(ExportSpec(arch, False, 17) for arch in _SWEEP_ARCHS),
    # torch 2.13's dynamo exporter fails on Swin's and T5's views with a dynamic batch ("Cannot view a
    # tensor with shape ... and strides ..."): those two are TorchScript only.
    *(ExportSpec(arch, True, 18) for arch in _SWEEP_ARCHS if arch not in ("hf_swin", "hf_t5_enc")),
    # The exporters' own folding hides what a simplifier must do on graphs other tools write.
    ExportSpec("hf_bert", False, 14, fold=False),
    ExportSpec("torch_cnn_bn", False, 14, fold=False),
    ExportSpec("torch_cnn_bn", True, 18, fold=False),
]


def _perturb(module: Any, seed: int) -> None:
    """Adds a random offset in [0.01, 0.1) to every floating parameter and buffer (so none is 0 or 1)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            if tensor.is_floating_point():
                tensor.add_(torch.empty(tensor.shape, dtype=tensor.dtype).uniform_(0.01, 0.1, generator=gen))


def _arch_module(arch: str, layers: int | None = None, hidden: int | None = None,
                 ) -> tuple[Any, tuple[Any, ...], list[str], list[str], list[dict[int, str]]]:
    """(module, example args, input names, output names, per input {axis: dim name}).

    ``layers``, ``hidden``: the decoder layers and hidden size of ``hf_gpt2`` and ``hf_llama``
    (default 2 and 32; the feed-forward is twice the hidden size, the heads of 8 or 16 values).
    """
    if (layers is not None or hidden is not None) and arch not in ("hf_gpt2", "hf_llama"):
        raise ValueError(f"{arch}: only hf_gpt2 and hf_llama take a size")
    layers, hidden = layers or 2, hidden or 32
    import torch
    from torch import nn

    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)

    class Outputs(nn.Module):
        """Calls a transformers model with keyword inputs and returns some of its outputs as a tuple."""

        def __init__(self, model: nn.Module, keys: tuple[str, ...], arg_names: tuple[str, ...]) -> None:
            super().__init__()
            self.model, self.keys, self.arg_names = model, keys, arg_names

        def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
            out = self.model(**dict(zip(self.arg_names, args, strict=True)), return_dict=True)
            return tuple(out[k] for k in self.keys)

    class One(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return self.inner(x)

    class Two(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return self.inner(x, mask)

    ids = torch.randint(0, 64, (2, 8), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, -2:] = 0
    text_axes = [{0: "batch", 1: "seq"}, {0: "batch", 1: "seq"}]
    if arch == "hf_bert":
        from transformers import BertConfig, BertModel

        config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=64, max_position_embeddings=64, attn_implementation="eager")
        inner = Outputs(BertModel(config), ("last_hidden_state", "pooler_output"), ("input_ids", "attention_mask"))
        return Two(inner), (ids, mask), ["input_ids", "attention_mask"], ["last_hidden_state", "pooler_output"], \
            text_axes
    if arch == "hf_gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(vocab_size=64, n_positions=64, n_embd=hidden, n_layer=layers, n_head=hidden // 16,
                            use_cache=False,
                            attn_implementation="sdpa")
        inner = Outputs(GPT2LMHeadModel(config), ("logits",), ("input_ids", "attention_mask"))
        return Two(inner), (ids, mask), ["input_ids", "attention_mask"], ["logits"], text_axes
    if arch == "hf_vit":
        from transformers import ViTConfig, ViTModel

        config = ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=2,
                           num_attention_heads=2, intermediate_size=64)
        inner = Outputs(ViTModel(config), ("last_hidden_state", "pooler_output"), ("pixel_values",))
        return One(inner), (torch.randn(2, 3, 32, 32, generator=gen),), ["pixel_values"], \
            ["last_hidden_state", "pooler_output"], [{0: "batch"}]
    if arch == "hf_wav2vec2":
        from transformers import Wav2Vec2Config, Wav2Vec2Model

        config = Wav2Vec2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                conv_dim=(16, 16, 16), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3),
                                num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2,
                                feat_extract_norm="layer", do_stable_layer_norm=True)
        inner = Outputs(Wav2Vec2Model(config), ("last_hidden_state",), ("input_values",))
        return One(inner), (torch.randn(2, 800, generator=gen),), ["input_values"], ["last_hidden_state"], \
            [{0: "batch", 1: "samples"}]
    if arch == "hf_whisper_enc":
        from transformers import WhisperConfig
        from transformers.models.whisper.modeling_whisper import WhisperEncoder

        config = WhisperConfig(num_mel_bins=16, d_model=32, encoder_layers=2, encoder_attention_heads=2,
                               encoder_ffn_dim=64, max_source_positions=16, attn_implementation="sdpa")
        inner = Outputs(WhisperEncoder(config), ("last_hidden_state",), ("input_features",))
        return One(inner), (torch.randn(2, 16, 32, generator=gen),), ["input_features"], ["last_hidden_state"], \
            [{0: "batch"}]
    if arch == "torch_lstm":

        class Lstm(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.lstm = nn.LSTM(16, 32, num_layers=2, batch_first=True)
                self.head = nn.Linear(32, 4)

            def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
                y, (h, _) = self.lstm(x)
                return self.head(y), h

        return One(Lstm()), (torch.randn(2, 8, 16, generator=gen),), ["features"], ["scores", "h_n"], \
            [{0: "batch", 1: "seq"}]
    if arch == "torch_cnn_bn":

        def block(cin: int, cout: int, stride: int = 1) -> nn.Module:
            return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

        class Cnn(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.stem = block(3, 16)
                self.body = nn.Sequential(block(16, 16), nn.Conv2d(16, 16, 3, 1, 1), nn.BatchNorm2d(16))
                self.down = block(16, 32, 2)
                self.head = nn.Linear(32, 10)

            def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
                h = self.stem(x)
                h = torch.relu(h + self.body(h))
                h = self.down(nn.functional.max_pool2d(h, 2))
                return (torch.log_softmax(self.head(h.mean(dim=(2, 3))), dim=-1),)

        return One(Cnn()), (torch.randn(2, 3, 48, 48, generator=gen),), ["pixels"], ["log_probs"], \
            [{0: "batch", 2: "height", 3: "width"}]
    if arch == "hf_llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(vocab_size=64, hidden_size=hidden, intermediate_size=2 * hidden,
                             num_hidden_layers=layers, num_attention_heads=hidden // 8,
                             num_key_value_heads=hidden // 16, max_position_embeddings=64,
                             use_cache=False, attn_implementation="eager")
        inner = Outputs(LlamaForCausalLM(config), ("logits",), ("input_ids", "attention_mask"))
        return Two(inner), (ids, mask), ["input_ids", "attention_mask"], ["logits"], text_axes
    if arch == "hf_t5_enc":
        from transformers import T5Config, T5EncoderModel

        config = T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                          relative_attention_num_buckets=8, feed_forward_proj="gated-gelu", use_cache=False)
        inner = Outputs(T5EncoderModel(config), ("last_hidden_state",), ("input_ids", "attention_mask"))
        return Two(inner), (ids, mask), ["input_ids", "attention_mask"], ["last_hidden_state"], text_axes
    image = (torch.randn(1, 3, 64, 64, generator=gen),)
    if arch == "hf_swin":
        from transformers import SwinConfig, SwinForImageClassification

        config = SwinConfig(image_size=64, patch_size=4, embed_dim=16, depths=[1, 2], num_heads=[2, 4],
                            window_size=4, num_labels=10)
        inner = Outputs(SwinForImageClassification(config), ("logits",), ("pixel_values",))
        return One(inner), image, ["pixel_values"], ["logits"], [{0: "batch"}]
    if arch == "hf_mobilenet_v2":
        from transformers import MobileNetV2Config, MobileNetV2ForImageClassification

        config = MobileNetV2Config(image_size=64, depth_multiplier=0.35, num_labels=10)
        inner = Outputs(MobileNetV2ForImageClassification(config), ("logits",), ("pixel_values",))
        return One(inner), image, ["pixel_values"], ["logits"], [{0: "batch"}]
    if arch == "hf_detr":
        from transformers import DetrConfig, DetrForObjectDetection, ResNetConfig

        backbone = ResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 48, 64], depths=[1, 1, 1, 1],
                                layer_type="basic", out_features=["stage4"])
        config = DetrConfig(use_timm_backbone=False, use_pretrained_backbone=False, backbone_config=backbone,
                            d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                            decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_queries=10,
                            num_labels=5)
        inner = Outputs(DetrForObjectDetection(config), ("logits", "pred_boxes"), ("pixel_values",))
        return One(inner), image, ["pixel_values"], ["logits", "pred_boxes"], [{0: "batch"}]
    raise ValueError(f"unknown architecture {arch!r}")


def export_model(name: str, path: str) -> None:
    """Exports the ``EXPORTS`` entry ``name`` to ``path`` (imports torch; run in a child process)."""
    export_spec(next(s for s in EXPORTS if s.name == name), path)


def export_spec(spec: ExportSpec, path: str) -> None:
    """Exports ``spec`` (any :class:`ExportSpec`, sized or not) to ``path`` (imports torch; run in a child)."""
    import warnings

    import torch

    module, args, input_names, output_names, axes = _arch_module(spec.arch, spec.layers, spec.hidden)
    _perturb(module, seed=2)
    module.eval()
    with torch.no_grad():
        module(*args)  # a module that does not run says so here, not deep inside an exporter
    kwargs: dict[str, Any] = {"opset_version": spec.opset, "input_names": input_names,
                              "output_names": output_names}
    kwargs["optimize" if spec.dynamo else "do_constant_folding"] = spec.fold
    if spec.dynamo:
        dims: dict[str, Any] = {}
        shapes = tuple({axis: dims.setdefault(dim, torch.export.Dim(dim)) for axis, dim in a.items()} for a in axes)
        kwargs["dynamic_shapes"] = shapes
    else:
        dynamic: dict[str, dict[int, str]] = dict(zip(input_names, axes, strict=True))
        batch = {0: "batch"}
        for out in output_names:
            dynamic[out] = {1: "batch"} if out == "h_n" else batch
        if spec.arch in ("hf_bert", "hf_gpt2", "torch_lstm", "hf_llama", "hf_t5_enc"):
            dynamic.update({out: {0: "batch", 1: "seq"} for out in output_names if out not in ("pooler_output", "h_n")})
        if spec.arch == "hf_wav2vec2":
            dynamic["last_hidden_state"] = {0: "batch", 1: "frames"}
        kwargs["dynamic_axes"] = dynamic
    with warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr):
        warnings.simplefilter("ignore")
        program = torch.onnx.export(module, args, None if spec.dynamo else path, dynamo=spec.dynamo, **kwargs)
        if spec.dynamo:
            program.save(path)
    model = onnx.load(path)
    model.doc_string = f"{spec.description}; random weights; torch {torch.__version__}"
    onnx.save(model, path)


_EXPORT = f"""
import json, sys, time, traceback
sys.path.insert(0, {str(HERE)!r})
import bench_simplify
start = time.perf_counter()
try:
    bench_simplify.export_model(sys.argv[1], sys.argv[2])
except BaseException as error:
    print(json.dumps({{"error": bench_simplify.one_line(error)}}))
    traceback.print_exc()
    sys.exit(1)
print(json.dumps({{"seconds": time.perf_counter() - start}}))
"""


def one_line(error: BaseException) -> str:
    """The innermost cause of ``error`` on one line (exporters wrap the real reason)."""
    inner = error
    while inner.__cause__ is not None:
        inner = inner.__cause__
    text = " ".join(str(inner).split()) or type(inner).__name__
    return f"{type(inner).__name__}: {text}"[:200]


# --- the model list --------------------------------------------------------------------------------


@dataclasses.dataclass
class Subject:
    """A model of the benchmark: a file that exists, or an export to build first."""

    name: str
    source: str  # "repo", "onnx light zoo", "onnxruntime datasets", "export"
    description: str
    path: pathlib.Path | None = None
    export: ExportSpec | None = None
    dims: dict[str, int] = dataclasses.field(default_factory=dict)


#: ``--quick``: a few small models of each source (about 2-3 minutes in all).
QUICK = ("demo", "tiny_bert_opset14_nofold", "onnx_light_squeezenet", "hf_bert_ts_opset17",
         "torch_cnn_bn_ts_opset14_nofold")


def subjects() -> list[Subject]:
    """Every model: the repository's, the installed packages', then the exports."""
    found = [Subject("demo", "repo", "models/demo.onnx", REPO / "models" / "demo.onnx")]
    found += [Subject(p.stem, "repo", f"models/real/{p.name}", p) for p in sorted((REPO / "models" / "real").glob("*.onnx"))]
    for item in load_models_builder().installed_models():
        source = "onnxruntime datasets" if item.package == "onnxruntime" else "onnx light zoo"
        found.append(Subject(item.name, source, f"{item.package}: {item.path.name}", item.path))
    found += [Subject(s.name, "export", s.description, export=s, dims=dict(ARCHS[s.arch].dims)) for s in EXPORTS]
    return found


def select(all_subjects: list[Subject], quick: bool, only: str) -> list[Subject]:
    patterns = [p.strip() for p in only.split(",") if p.strip()]
    if patterns:
        unknown = [p for p in patterns if not any(fnmatch.fnmatchcase(s.name, p) for s in all_subjects)]
        if unknown:
            raise SystemExit(f"bench_simplify: error: no model matches {', '.join(unknown)} (see --list)")
        return [s for s in all_subjects if any(fnmatch.fnmatchcase(s.name, p) for p in patterns)]
    if quick:
        return [s for s in all_subjects if s.name in QUICK]
    return all_subjects


# --- inputs, reference outputs, verification (each in a child process) -------------------------------

_NP_TYPES = {
    "tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
    "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int16)": np.int16, "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8, "tensor(uint16)": np.uint16, "tensor(uint32)": np.uint32,
    "tensor(uint64)": np.uint64, "tensor(bool)": np.bool_, "tensor(string)": np.str_,
}


def dim_size(name: str | None, dims: dict[str, int]) -> int:
    """The size a dynamic dimension gets: the model's own table, then :data:`DIM_RULES`, else 1."""
    if not name:
        return 1
    if name in dims:
        return dims[name]
    lower = name.lower()
    for fragments, size in DIM_RULES:
        if any(f in lower for f in fragments):
            return size
    return 1


def _session(path: str) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def _make_inputs(specs: list[dict[str, Any]], seed: int) -> dict[str, np.ndarray]:
    """Seeded inputs from (name, type, concrete shape) specs; each input its own stream."""
    feeds = {}
    for index, spec in enumerate(specs):
        rng = np.random.default_rng([seed, index])
        shape, dtype = tuple(spec["shape"]), _NP_TYPES[spec["type"]]
        if dtype in (np.float32, np.float64, np.float16):
            value = rng.standard_normal(shape).astype(dtype)
        elif dtype is np.bool_:
            value = rng.random(shape) < 0.5
        elif dtype is np.str_:
            value = rng.integers(0, 4, shape).astype(str).astype(object)
        else:
            value = rng.integers(0, 2 if "mask" in spec["name"].lower() else 4, shape).astype(dtype)
        feeds[spec["name"]] = value
    return feeds


def _fed_inputs(session: Any, path: str) -> list[Any]:
    """The inputs a user feeds: not those an initializer backs (listed as inputs by IR < 4 models,
    such as onnx's light zoo, where they are the weights; overriding them is not what we compare)."""
    model = onnx.load(path, load_external_data=False)
    backed = {t.name for t in model.graph.initializer} | {t.values.name for t in model.graph.sparse_initializer}
    return [arg for arg in session.get_inputs() if arg.name not in backed]


def reference(original: str, out_pickle: str, dims_json: str) -> None:
    """Child: inputs for ``original``, its outputs in onnxruntime (optimisations off), pickled; prints JSON."""
    start = time.perf_counter()
    dims = json.loads(dims_json)
    session = _session(original)
    specs = []
    for arg in _fed_inputs(session, original):
        if arg.type not in _NP_TYPES:
            raise SystemExit(f"input {arg.name} has type {arg.type}: no generated value for it")
        shape = [d if isinstance(d, int) and d >= 0 else dim_size(d if isinstance(d, str) else None, dims)
                 for d in arg.shape]
        specs.append({"name": arg.name, "type": arg.type, "shape": shape})
    names = [o.name for o in session.get_outputs()]
    outputs = session.run(names, _make_inputs(specs, SEED))
    with open(out_pickle, "wb") as f:
        pickle.dump({"inputs": specs, "names": names, "outputs": outputs}, f)
    print(json.dumps({"seconds": time.perf_counter() - start, "inputs": specs}))


def _compare(expected: Any, actual: Any, where: str) -> tuple[str | None, float]:
    """(None or the first difference, max abs error) of two onnxruntime values."""
    if isinstance(expected, np.ndarray) or isinstance(actual, np.ndarray):
        expected, actual = np.asarray(expected), np.asarray(actual)
        if expected.shape != actual.shape:
            return f"{where}: shape {list(actual.shape)} instead of {list(expected.shape)}", 0.0
        if expected.dtype != actual.dtype:
            return f"{where}: dtype {actual.dtype} instead of {expected.dtype}", 0.0
        if expected.dtype.kind == "f":
            rtol, atol = (RTOL_F16, ATOL_F16) if expected.dtype == np.float16 else (RTOL, ATOL)
            e, a = expected.astype(np.float64), actual.astype(np.float64)
            if not np.array_equal(np.isnan(e), np.isnan(a)):
                return f"{where}: NaNs at other places", float("inf")
            finite = np.isfinite(e) & np.isfinite(a)
            if not np.array_equal(e[~finite & ~np.isnan(e)], a[~finite & ~np.isnan(e)]):
                return f"{where}: infinities differ", float("inf")
            err = float(np.max(np.abs(e[finite] - a[finite]), initial=0.0))
            if not np.allclose(a[finite], e[finite], rtol=rtol, atol=atol):
                return f"{where}: max abs error {err:.2e} (rtol {rtol:g}, atol {atol:g})", err
            return None, err
        if not np.array_equal(expected, actual):
            return f"{where}: {int(np.sum(expected != actual))} of {expected.size} values differ", 0.0
        return None, 0.0
    if isinstance(expected, dict) and isinstance(actual, dict):
        if set(expected) != set(actual):
            return f"{where}: other keys", 0.0
        worst = 0.0
        for key in expected:
            diff, err = _compare(expected[key], actual[key], f"{where}[{key!r}]")
            if diff:
                return diff, err
            worst = max(worst, err)
        return None, worst
    if isinstance(expected, (list, tuple)) and isinstance(actual, (list, tuple)):
        if len(expected) != len(actual):
            return f"{where}: {len(actual)} items instead of {len(expected)}", 0.0
        worst = 0.0
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            diff, err = _compare(e, a, f"{where}[{i}]")
            if diff:
                return diff, err
            worst = max(worst, err)
        return None, worst
    if isinstance(expected, float) and isinstance(actual, float):
        ok = np.isclose(actual, expected, rtol=RTOL, atol=ATOL, equal_nan=True)
        return (None if ok else f"{where}: {actual} instead of {expected}"), abs(actual - expected)
    return (None if expected == actual else f"{where}: {actual!r} instead of {expected!r}"), 0.0


def _dims(value: onnx.ValueInfoProto) -> list[int | str | None] | None:
    """The declared dims of a tensor value (int, symbol or None), or None without a shape."""
    tensor = value.type.tensor_type
    if not value.type.HasField("tensor_type") or not tensor.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim]


def interface_change(original: onnx.GraphProto, output: onnx.GraphProto, ir_version: int = 8) -> str:
    """How ``output`` changed the graph inputs callers see: "" when kept, else the first change.

    Every declared input of the original (initializer-backed ones included from IR 4: by
    the IR spec an initializer that is also a graph input is a default a caller may
    override; below IR 4, its ``ir_version``, onnxruntime runs them as constants that no
    caller can feed, so they are not inputs callers see) must stay, at the same position,
    with the same type, and with a shape no narrower: no dim made static, no rank imposed
    on an input without one.
    """
    inputs = list(output.input)
    constants = {t.name for t in original.initializer} if ir_version < 4 else set()
    for index, before in enumerate(v for v in original.input if v.name not in constants):
        if index >= len(inputs) or inputs[index].name != before.name:
            kept = {v.name for v in inputs}
            dropped = [v.name for v in original.input if v.name not in kept | constants]
            if dropped:
                return f"drops {len(dropped)} of the {len(original.input)} inputs (e.g. {dropped[0]!r})"
            return f"reorders the inputs ({before.name!r} is no longer input {index})"
        after = inputs[index]
        if before.type.WhichOneof("value") != after.type.WhichOneof("value") or (
                before.type.HasField("tensor_type")
                and before.type.tensor_type.elem_type != after.type.tensor_type.elem_type):
            return f"changes the type of input {before.name!r}"
        was, now = _dims(before), _dims(after)
        if was is None:
            if now is not None:
                return f"gives input {before.name!r} a rank it did not declare"
            continue
        if now is None:
            continue  # widened: any shape
        if len(was) != len(now):
            return f"changes the rank of input {before.name!r}"
        for axis, (a, b) in enumerate(zip(was, now, strict=True)):
            if not isinstance(a, int) and isinstance(b, int):
                return f"narrows dim {axis} of input {before.name!r} from {a or '?'} to {b}"
            if isinstance(a, int) and isinstance(b, int) and a != b:
                return f"changes dim {axis} of input {before.name!r} from {a} to {b}"
    return ""


def verify(output: str, ref_pickle: str, original: str = "") -> None:
    """Child: nodes, op types, full check, the inputs' contract and the onnxruntime comparison of one
    tool's output; prints JSON."""
    start = time.perf_counter()
    model = onnx.load(output, load_external_data=False)
    result: dict[str, Any] = {"nodes": count_nodes(model), "op_counts": op_counts(model),
                              "opset": default_opset(model)}
    if original:
        source = onnx.load(original, load_external_data=False)
        result["interface"] = interface_change(source.graph, model.graph, source.ir_version)
    del model
    try:
        onnx.checker.check_model(output, full_check=True)
        result["valid"] = True
    except Exception as error:  # noqa: BLE001  the checker's verdict is the answer
        result["valid"], result["valid_error"] = False, one_line(error)
    if ref_pickle:
        with open(ref_pickle, "rb") as f:
            ref = pickle.load(f)
        try:
            session = _session(output)
            names = [o.name for o in session.get_outputs()]
            if names != ref["names"]:
                raise ValueError(f"outputs {names} instead of {ref['names']}")
            feeds = _make_inputs(ref["inputs"], SEED)
            wanted = {i.name for i in _fed_inputs(session, output)}
            if not wanted <= set(feeds):
                raise ValueError(f"new inputs {sorted(wanted - set(feeds))}")
            actual = session.run(names, {k: v for k, v in feeds.items() if k in wanted})
        except Exception as error:  # noqa: BLE001  an output that does not run is a wrong output
            result["equal"], result["equal_detail"] = False, f"does not run: {one_line(error)}"
        else:
            worst = 0.0
            result["equal"], result["equal_detail"] = True, ""
            for name, e, a in zip(names, ref["outputs"], actual, strict=True):
                diff, err = _compare(e, a, name)
                worst = max(worst, err)
                if diff:
                    result["equal"], result["equal_detail"] = False, diff[:200]
                    break
            result["max_abs_error"] = worst
    result["seconds"] = time.perf_counter() - start
    print(json.dumps(result))


def _child(function: str) -> str:
    """A snippet calling ``bench_simplify.<function>(*sys.argv[1:])``; errors as {"error": ...}."""
    return f"""
import json, sys
sys.path.insert(0, {str(HERE)!r})
import bench_simplify
try:
    bench_simplify.{function}(*sys.argv[1:])
except BaseException as error:
    print(json.dumps({{"error": bench_simplify.one_line(error)}}))
    raise
"""


# Ours with its own onnxruntime check (what a user gets without --no-check): the exit status.
_OWN_CHECK = f"""
import contextlib, io, json, sys, time
sys.path.insert(0, {str(REPO)!r})
import passes.cli
src, dst, *rest = sys.argv[1:]
dims = [a for a in rest if not a.startswith("--")]
argv = [src, "-o", dst, "-q"] + [a for d in dims for a in ("--dim", d)] + [a for a in rest if a.startswith("--")]
err = io.StringIO()
start = time.perf_counter()
with contextlib.redirect_stderr(err):
    code = passes.cli.main(argv)
lines = [line for line in err.getvalue().splitlines() if line.strip()]
print(json.dumps({{"seconds": time.perf_counter() - start, "exit_code": code, "message": lines[-1][:200] if lines else ""}}))
"""


# --- running ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class Cell:
    """One tool on one model."""

    model: str
    tool: str
    status: str = "ok"  # "ok", "failed", "timeout", "not installed", "skipped"
    error: str = ""
    nodes: int | None = None
    opset: int | None = None
    valid: bool | None = None
    valid_error: str = ""
    equal: bool | None = None  # None: not compared (the original does not run in onnxruntime)
    equal_detail: str = ""
    interface: str = ""  # "" (the inputs callers see are kept, or not checked) or how they changed
    max_abs_error: float | None = None
    work_s: float | None = None
    wall_s: float | None = None
    peak_rss_mb: float | None = None
    op_counts: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def good(self) -> bool:
        """Valid, equal, and with the original's inputs."""
        return self.status == "ok" and bool(self.valid) and self.equal is True and not self.interface

    @property
    def wrong(self) -> bool:
        """An output that is invalid, computes something else, or drops or narrows an input."""
        return self.status == "ok" and (self.valid is False or self.equal is False or bool(self.interface))

    def text(self) -> str:
        if self.status != "ok":
            return self.status
        flags = [f for f, bad in (("invalid", self.valid is False), ("differs", self.equal is False),
                                  ("inputs changed", bool(self.interface)), ("unverified", self.equal is None))
                 if bad]
        return f"{self.nodes}" + (f" ({', '.join(flags)})" if flags else "")


@dataclasses.dataclass
class ModelResult:
    name: str
    source: str
    description: str
    status: str = "ok"  # "ok" or "export failed: ..." / "unreadable: ..."
    nodes_before: int | None = None
    opset_before: int | None = None
    op_counts_before: dict[str, int] = dataclasses.field(default_factory=dict)
    reference: str = ""  # "" or why the original could not be run in onnxruntime
    inputs: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    export_s: float | None = None
    own_check: str = ""
    target: int | None = None  # the target opset of this row (``--targets``), else TARGET_OPSET
    cells: dict[str, Cell] = dataclasses.field(default_factory=dict)


def record_verification(cell: Cell, case: str, args: list[Any], timeout: float) -> None:
    """Runs the ``verify`` child on a tool's output (``args``: output, reference outputs, and the
    original when the inputs' contract is checked) and copies what it found into ``cell``."""
    v = measure("verify", case, _child("verify"), args, timeout)
    if not v.ok:
        cell.status, cell.error = "failed", f"verification failed: {_failure(v, timeout)[1]}"
        return
    for key in ("nodes", "opset", "valid", "valid_error", "equal", "equal_detail", "interface", "max_abs_error",
                "op_counts"):
        if key in v.extra:
            setattr(cell, key, v.extra[key])


def _failure(m: Any, timeout: float) -> tuple[str, str]:
    if m.wall_seconds >= timeout:
        return "timeout", f"timeout after {timeout:.0f} s"
    return "failed", (m.extra.get("error") or m.error or "no result").strip()[:200]


def run_model(subject: Subject, tools: list[str], folder: pathlib.Path, timeout: float, keep: bool,
              own_check: bool, target: int | None = None) -> ModelResult:
    """Exports (if needed), runs the original, then every tool and its verification, each in a child.

    ``target``: the target opset of this run (``--targets``); the row is then named ``MODEL@T`` and
    onnxsim runs with its own target opset (:func:`harness.tool_snippet`, ``onnxsim_target``).
    """
    name = subject.name if target is None else f"{subject.name}@{target}"
    result = ModelResult(name, subject.source, subject.description, target=target)
    src = subject.path
    if subject.export is not None:
        src = folder / "exports" / f"{subject.name}.onnx"
        if not src.exists():
            src.parent.mkdir(parents=True, exist_ok=True)
            partial = src.with_suffix(".partial.onnx")
            m = measure("export", subject.name, _EXPORT, [subject.name, partial], timeout)
            if not m.ok or not partial.exists():
                _, reason = _failure(m, timeout)
                result.status = f"export failed: {reason}"
                partial.unlink(missing_ok=True)
                return result
            partial.rename(src)
            result.export_s = m.seconds
    try:
        header = onnx.load(str(src), load_external_data=False)
    except Exception as error:  # noqa: BLE001
        result.status = f"unreadable: {one_line(error)}"
        return result
    result.nodes_before, result.opset_before = count_nodes(header), default_opset(header)
    result.op_counts_before = op_counts(header)
    del header
    work = folder / "outputs"
    work.mkdir(parents=True, exist_ok=True)
    ref = work / f"{name}.reference.pkl"
    m = measure("reference", subject.name, _child("reference"), [src, ref, json.dumps(subject.dims)], timeout)
    if m.ok:
        result.inputs = m.extra.get("inputs", [])
    else:
        result.reference = _failure(m, timeout)[1]
        ref.unlink(missing_ok=True)
    for tool in tools:
        cell = result.cells[tool] = Cell(name, tool)
        missing = tool_installed(tool)
        if missing:
            cell.status, cell.error = "not installed", missing
            continue
        dst = work / f"{name}.{tool.replace('+', '_')}.onnx"
        dst.unlink(missing_ok=True)
        snippet = tool_snippet(tool, TARGET_OPSET if target is None else target, onnxsim_target=target is not None)
        m = measure(tool, name, snippet, [src, dst], timeout)
        cell.wall_s, cell.peak_rss_mb = m.wall_seconds, m.peak_rss_mib
        if not m.ok or not dst.exists():
            cell.status, cell.error = _failure(m, timeout) if not m.ok else ("failed", "wrote no output")
        else:
            cell.work_s = m.seconds
            record_verification(cell, subject.name, [dst, ref if ref.exists() else "", src], timeout)
        if not keep:
            dst.unlink(missing_ok=True)
        print(f"bench_simplify: {name:<34} {tool:<11} {cell.text():<22} "
              f"{cell.work_s if cell.work_s is not None else float('nan'):7.2f} s  "
              f"{cell.error or cell.valid_error or cell.equal_detail or cell.interface}"[:240], file=sys.stderr, flush=True)
    if own_check and OURS in tools and tool_installed(OURS) == "":
        dims = [f"{d}={dim_size(d, subject.dims)}" for d in sorted(_named_dims(src))]
        dst = work / f"{name}.own_check.onnx"
        extra = [] if target is None else [f"--target-opset={target}"]
        c = measure("own check", name, _OWN_CHECK, [src, dst, *dims, *extra], timeout)
        if not c.ok:
            result.own_check = _failure(c, timeout)[0]
        else:
            code, message = c.extra.get("exit_code"), c.extra.get("message", "")
            result.own_check = "pass" if code == 0 else f"exit {code}: {message}"
        dst.unlink(missing_ok=True)
    if not keep:
        ref.unlink(missing_ok=True)
    return result


def _named_dims(path: pathlib.Path) -> set[str]:
    model = onnx.load(str(path), load_external_data=False)
    return {d.dim_param for i in model.graph.input if i.type.HasField("tensor_type")
            for d in i.type.tensor_type.shape.dim if d.dim_param}


# --- report ----------------------------------------------------------------------------------------


def _md(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def tables(results: list[ModelResult], tools: list[str]) -> str:
    """The markdown node table (best in bold), the time table and the notes."""
    head = "| model | source | nodes | " + " | ".join(tools) + (" | own check |" if OURS in tools else " |")
    lines = ["### Nodes after (valid and equal unless marked; best in bold)", "", head,
             "|" + "---|" * (len(tools) + 3 + (OURS in tools))]
    notes = []
    for r in results:
        if r.status != "ok":
            lines.append(f"| {r.name} | {r.source} | | " + _md(r.status) + " |" + " |" * (len(tools) - 1 + (OURS in tools)))
            continue
        good = [c.nodes for c in r.cells.values() if c.good]
        best = min(good) if good else None
        cells = []
        for tool in tools:
            c = r.cells[tool]
            text = c.text()
            cells.append(f"**{text}**" if c.good and c.nodes == best else text)
            reason = c.error or "; ".join(x for x in (c.valid_error, c.equal_detail, c.interface) if x)
            if reason and (c.status != "ok" or c.wrong):
                notes.append(f"- {r.name}, {tool}: {_md(reason)}")
        if r.reference:
            notes.append(f"- {r.name}: the original does not run in onnxruntime ({_md(r.reference)}): "
                         "outputs unverified")
        own = [_md(r.own_check)] if OURS in tools else []
        lines.append(f"| {r.name} | {r.source} | {r.nodes_before} | " + " | ".join(cells + own) + " |")
    if any(r.target is not None for r in results):
        lines += ["", fused_table(results, tools)]
    lines += ["", "### Time of the work (seconds: load + passes + save, after the imports)", "",
              "| model | " + " | ".join(tools) + " |", "|" + "---|" * (len(tools) + 1)]
    for r in results:
        if r.status == "ok":
            cells = [f"{c.work_s:.2f}" if c.work_s is not None else c.status for c in (r.cells[t] for t in tools)]
            lines.append(f"| {r.name} | " + " | ".join(cells) + " |")
    if notes:
        lines += ["", "### Notes", "", *notes]
    return "\n".join(lines)


#: The standard fused ops ``--targets`` counts (the opset that introduced each): LayerNormalization-17,
#: Gelu-20, RMSNormalization-23.
FUSED_OPS = (("LayerNormalization", "LN"), ("Gelu", "Gelu"), ("RMSNormalization", "RMS"))


def fused_cell(cell: Cell) -> str:
    """``LN/Gelu/RMS`` counts of a tool's output and its opset, e.g. ``5/2/0 @20``."""
    if cell.status != "ok" or cell.nodes is None:
        return cell.status
    counts = "/".join(str(cell.op_counts.get(op, 0)) for op, _ in FUSED_OPS)
    return f"{counts} @{cell.opset}" + ("" if cell.good else " (wrong)")


def fused_table(results: list[ModelResult], tools: list[str]) -> str:
    """Per row and tool: how many LayerNormalization / Gelu / RMSNormalization nodes its output has."""
    lines = ["### Standard fused ops in each output: "
             + "/".join(short for _, short in FUSED_OPS) + " nodes, then the output's opset", "",
             "| model | before | " + " | ".join(tools) + " |", "|" + "---|" * (len(tools) + 2)]
    for r in results:
        if r.status != "ok":
            continue
        before = "/".join(str(r.op_counts_before.get(op, 0)) for op, _ in FUSED_OPS) + f" @{r.opset_before}"
        lines.append(f"| {r.name} | {before} | " + " | ".join(fused_cell(r.cells[t]) for t in tools) + " |")
    return "\n".join(lines)


def summary(results: list[ModelResult], tools: list[str]) -> tuple[str, dict[str, Any]]:
    """Summary lines and their data: sums where all tools are right, where ours loses, wrong outputs."""
    ok = [r for r in results if r.status == "ok"]
    common = [r for r in ok if all(r.cells[t].good for t in tools)]
    sums = {t: sum(r.cells[t].nodes for r in common) for t in tools}
    lines = ["### Summary", "",
             f"- nodes summed over the {len(common)} models where every tool's output is valid and equal: "
             + ", ".join(f"{t} {sums[t]}" for t in tools)]
    no_constant = {t: sum(r.cells[t].nodes - r.cells[t].op_counts.get("Constant", 0) for r in common) for t in tools}
    lines.append("- the same without Constant nodes (the others turn them into initializers): "
                 + ", ".join(f"{t} {no_constant[t]}" for t in tools))
    data: dict[str, Any] = {"models_all_good": [r.name for r in common], "node_sums": sums,
                            "node_sums_without_constant": no_constant}
    others = [t for t in tools if t != OURS]
    if OURS in tools and others:
        behind = []
        for r in ok:
            ours = r.cells[OURS]
            rivals = [(r.cells[t].nodes, t) for t in others if r.cells[t].good]
            if ours.good and rivals and ours.nodes > min(rivals)[0]:
                behind.append((r.name, ours.nodes, *min(rivals)))
        judged = sum(1 for r in ok if r.cells[OURS].good and any(r.cells[t].good for t in others))
        lines.append(f"- {OURS} has more nodes than the best valid-and-equal other tool on {len(behind)} of "
                     f"{judged} models" + (": " + ", ".join(f"{m} {o} vs {b} ({t})" for m, o, b, t in behind)
                                           if behind else ""))
        data["ours_behind"] = [{"model": m, "ours": o, "best": b, "best_tool": t} for m, o, b, t in behind]
    wrong = {t: [r.name for r in ok if r.cells[t].wrong] for t in tools}
    failed = {t: [r.name for r in ok if r.cells[t].status in ("failed", "timeout")] for t in tools}
    lines.append("- wrong outputs (invalid or differ): " + ", ".join(
        f"{t} {len(wrong[t])}" + (f" ({', '.join(wrong[t])})" if wrong[t] else "") for t in tools))
    lines.append("- failed or timed out: " + ", ".join(
        f"{t} {len(failed[t])}" + (f" ({', '.join(failed[t])})" if failed[t] else "") for t in tools))
    exports = [r for r in results if r.source == "export"]
    bad_exports = [r for r in exports if r.status != "ok"]
    lines.append(f"- exports: {len(exports) - len(bad_exports)} of {len(exports)} built"
                 + ("; " + "; ".join(f"{r.name}: {r.status}" for r in bad_exports) if bad_exports else ""))
    if OURS in tools and any(r.own_check for r in ok):  # not run at all with --no-own-check
        own = [r for r in ok if r.own_check and r.own_check != "pass"]
        lines.append(f"- ours' own onnxruntime check (without --no-check) passes on {sum(r.own_check == 'pass' for r in ok)}"
                     f" of {len(ok)} models" + ("; not on: " + ", ".join(f"{r.name} ({r.own_check[:80]})" for r in own)
                                                if own else ""))
    data["wrong"], data["failed"] = wrong, failed
    if OURS in tools and SLIM in tools:
        text, gaps = histograms(ok)
        lines += ["", text]
        data["extra_vs_onnxslim"] = gaps
    return "\n".join(lines), data


def histograms(results: list[ModelResult], worst: int = 5) -> tuple[str, list[dict[str, Any]]]:
    """Where ours has the most nodes more than onnxslim (both valid and equal), by op type."""
    gaps = []
    for r in results:
        ours, slim = r.cells.get(OURS), r.cells.get(SLIM)
        if ours and slim and ours.good and slim.good:
            ops = sorted(set(ours.op_counts) | set(slim.op_counts))
            diff = {op: ours.op_counts.get(op, 0) - slim.op_counts.get(op, 0) for op in ops}
            gaps.append({"model": r.name, "ours": ours.nodes, "onnxslim": slim.nodes,
                         "extra": ours.nodes - slim.nodes,
                         "ops": {op: [ours.op_counts.get(op, 0), slim.op_counts.get(op, 0)]
                                 for op in ops if diff[op]}})
    gaps.sort(key=lambda g: -g["extra"])
    lines = [f"### Extra nodes against onnxslim: the {worst} worst models, op types that differ "
             "(ours / onnxslim)", ""]
    for g in gaps[:worst]:
        if g["extra"] <= 0:
            break
        ops = sorted(g["ops"].items(), key=lambda kv: -(kv[1][0] - kv[1][1]))
        lines.append(f"- **{g['model']}**: {g['ours']} vs {g['onnxslim']} ({g['extra']:+d}): "
                     + ", ".join(f"{op} {a}/{b}" for op, (a, b) in ops))
    total: dict[str, int] = {}
    for g in gaps:
        for op, (a, b) in g["ops"].items():
            total[op] = total.get(op, 0) + a - b
    more = sorted(((op, n) for op, n in total.items() if n > 0), key=lambda kv: -kv[1])
    fewer = sorted(((op, n) for op, n in total.items() if n < 0), key=lambda kv: kv[1])
    lines += ["", f"Over all {len(gaps)} models where both are valid and equal, ours has more "
              + (", ".join(f"{op} (+{n})" for op, n in more) or "of no op type")
              + "; fewer " + (", ".join(f"{op} ({n})" for op, n in fewer) or "of no op type") + "."]
    return "\n".join(lines), gaps


def _header(mode: str, models: int, seconds: float, cpus: int | None, targets: list[int] | None = None) -> str:
    target = f"target opsets {', '.join(map(str, targets))}" if targets else f"target opset {TARGET_OPSET}"
    return f"## bench_simplify ({mode} run: {models} rows, {seconds / 60:.1f} min, {cpus} CPUs, {target})"


def merged(base: dict[str, Any], newer: dict[str, Any], label: str) -> dict[str, Any]:
    """``base`` with the cells (and model rows) of ``newer`` in place of the same model's and tool's."""
    replaced = {(r["model"], r["tool"]) for r in newer["rows"]}
    rows = [r for r in base["rows"] if (r["model"], r["tool"]) not in replaced] + newer["rows"]
    models = {m["name"]: m for m in base["models"]}
    for m in newer["models"]:
        models[m["name"]] = {**models.get(m["name"], {}), **m}
    note = (base.get("note", "") + "; " if base.get("note") else "") + f"cells of {', '.join(newer['tools'])} from {label}"
    return {**base, "rows": rows, "models": list(models.values()), "note": note}


def render(payload: dict[str, Any]) -> str:
    """The tables and summary again, from a ``--json`` file (e.g. after changing the summary)."""
    cell_fields = {f.name for f in dataclasses.fields(Cell)}
    model_fields = {f.name for f in dataclasses.fields(ModelResult)}
    results = {m["name"]: ModelResult(**{k: v for k, v in m.items() if k in model_fields})
               for m in payload["models"]}
    for row in payload["rows"]:
        results[row["model"]].cells[row["tool"]] = Cell(**{k: v for k, v in row.items() if k in cell_fields})
    tools = payload["tools"]
    mode = "quick" if payload.get("quick") else ("selected" if payload.get("only") else "full")
    text, _ = summary(list(results.values()), tools)
    return (_header(mode, len(results), payload.get("seconds", 0.0), payload.get("cpu_count"),
                    payload.get("targets")) + "\n\n"
            + tables(list(results.values()), tools) + "\n\n" + text)


# --- driver ----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)} (about 2-3 minutes)")
    parser.add_argument("--only", default="", help="comma-separated model names or shell patterns (see --list)")
    parser.add_argument("--tools", default=",".join(TOOLS), help="comma-separated subset of " + ",".join(TOOLS))
    parser.add_argument("--keep", type=pathlib.Path, metavar="DIR",
                        help="keep exports (DIR/exports, reused next time) and outputs (DIR/outputs) here")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per tool, model and step (default 300)")
    parser.add_argument("--no-own-check", action="store_true", help="do not also run ours with its own check")
    parser.add_argument("--targets", default="", metavar="T,...",
                        help="comma-separated target opsets (e.g. 18,20,23): every model once per target, ours "
                             "with --target-opset T, onnxsim with its own target opset, onnxscript converted to "
                             "T; adds a table of the LayerNormalization/Gelu/RMSNormalization nodes per output")
    parser.add_argument("--json", type=pathlib.Path, help="write the results here as JSON")
    parser.add_argument("--list", action="store_true", help="list the models and exit")
    parser.add_argument("--render", type=pathlib.Path, metavar="FILE.json",
                        help="print the tables and summary of an earlier run's --json file and exit")
    parser.add_argument("--merge", type=pathlib.Path, metavar="NEWER.json", action="append", default=[],
                        help="with --render: a later run (say --tools optimize on new code) whose cells replace "
                             "the same model's and tool's; --json writes the merged file")
    args = parser.parse_args(argv)
    if args.render:
        payload = json.loads(args.render.read_text(encoding="utf-8"))
        for newer in args.merge:
            payload = merged(payload, json.loads(newer.read_text(encoding="utf-8")), newer.name)
        print(render(payload))
        if args.json and args.merge:
            args.json.write_text(json.dumps(payload, indent=2, default=str) + "\n", encoding="utf-8")
        return 0
    tools = [t for t in args.tools.split(",") if t]
    unknown = sorted(set(tools) - set(TOOLS))
    if unknown:
        parser.error(f"unknown tools: {', '.join(unknown)} (known: {', '.join(TOOLS)})")
    all_subjects = subjects()
    if args.list:
        for s in all_subjects:
            print(f"{s.name:<36} {s.source:<22} {s.description}")
        return 0
    chosen = select(all_subjects, args.quick, args.only)
    try:
        targets = [int(t) for t in args.targets.split(",") if t.strip()]
    except ValueError:
        parser.error(f"--targets: not a comma-separated list of opsets: {args.targets!r}")
    started = time.time()
    with contextlib.ExitStack() as stack:
        if args.keep:
            folder = args.keep.resolve()
            folder.mkdir(parents=True, exist_ok=True)
        else:
            folder = pathlib.Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench_simplify_")))
        results = []
        for subject in chosen:
            for target in targets or [None]:
                r = run_model(subject, tools, folder, args.timeout, args.keep is not None, not args.no_own_check,
                              target)
                if r.status != "ok":
                    print(f"bench_simplify: {r.name:<34} {r.status}", file=sys.stderr, flush=True)
                results.append(r)
    seconds = time.time() - started
    table = tables(results, tools)
    text, data = summary(results, tools)
    mode = "quick" if args.quick else ("selected" if args.only else "full")
    print(_header(mode, len(results), seconds, os.cpu_count(), targets) + "\n\n" + table + "\n\n" + text)
    if args.json:
        rows = []
        for r in results:
            for tool in tools if r.status == "ok" else []:
                c = r.cells[tool]
                rows.append({"model": r.name, "source": r.source, "tool": tool, "cell": c.text(),
                             "nodes_before": r.nodes_before, **{k: v for k, v in dataclasses.asdict(c).items()
                                                                 if k not in ("model", "tool")}})
        models = [{k: v for k, v in dataclasses.asdict(r).items() if k != "cells"} for r in results]
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "benchmark": "simplify", "quick": args.quick, "only": args.only, "tools": tools, "targets": targets,
            "python": sys.version.split()[0], "cpu_count": os.cpu_count(), "seconds": seconds,
            "tolerances": {"float": [RTOL, ATOL], "float16": [RTOL_F16, ATOL_F16]},
            "rows": rows, "models": models, "summary": data, "table": table, "summary_text": text,
        }, indent=2, default=str) + "\n", encoding="utf-8")
    broken = [r.name for r in results if r.status == "ok" and OURS in r.cells and r.cells[OURS].wrong]
    if broken:
        print(f"bench_simplify: {OURS} wrote an invalid or different model for {', '.join(broken)}", file=sys.stderr)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
