"""The flags of onnxsim, onnxslim and polygraphy, as their users type them.

Each of their flags is one of:

* **ours**: the same flag with the same meaning (``--target-opset``, ``--atol``...);
* an **alias**: accepted for ours (``--check-rtol`` is ``--rtol``); the shape flags
  (``--overwrite-input-shape``, ``--input-shape``, ``--input-shapes``,
  ``--override-input-shapes``) also take their tools' forms: several
  ``NAME:D0,D1`` after one flag, polygraphy's ``NAME:[D0,D1]``, and onnxsim's bare
  ``D0,D1`` for a model with one input (``--input-shape`` gets one value each);
* a **pointer**: refused with one line that names ours (``--skip-fuse-bn (onnxsim):
  use --no-fuse``), or says there is none and why.

:func:`translate` rewrites a command line before argparse sees it; it refuses
with :class:`Refusal` (the parser turns it into its one-line usage error).
:data:`HABITS` is the table; the README's migration table is tested against it.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Sequence

__all__ = ["HABITS", "SHAPE_FLAGS", "Habit", "Refusal", "bare_count_hint", "translate"]


class Refusal(ValueError):
    """A foreign flag refused: the message is the one line to print."""


@dataclasses.dataclass(frozen=True)
class Habit:
    """A flag of another tool: ``tools`` that have it, and ``ours`` (our flag, for an alias) or ``use``
    (the pointer printed when it is refused)."""

    flag: str
    tools: str
    use: str = ""
    ours: str = ""

    def refusal(self) -> str:
        return f"{self.flag} ({self.tools}): {self.use}"


_NO_QUANTISATION = "no equivalent: this tool does not quantise (--precision fp16|bf16 converts to a half type)"
_NO_EXPORT = "no equivalent: this tool writes ONNX only"
_EXTERNAL = ("not needed: a model with external data keeps it (OUTPUT.data), one over 2 GB gets it; "
             "drop the flag")
_CHECK_ON = ("not needed: the onnxruntime check runs by default (--require-check makes one that cannot "
             "run an error); drop the flag")
_FOLD_LIMIT = "use --fold-size-limit SIZE (the largest constant folding may add; default 1M)"
_PASSES = "use --skip NAME,... or --passes NAME,... (passes: upgrade, fold, simplify, decompose, precision)"
_CHECK_INPUTS = ("use --inputs FILE.npz (the check's inputs, arrays by input name) or --dim NAME=SIZE "
                 "(the size of a dynamic dim in generated inputs)")


def _table() -> dict[str, Habit]:
    rows: list[Habit] = []

    def add(tools: str, use: str, *flags: str, ours: str = "") -> None:
        rows.extend(Habit(flag, tools, use, ours) for flag in flags)

    # onnxsim (0.8's flags, `python -m onnxsim --help`)
    add("onnxsim", "fusions are on by default (--no-fuse turns them off); drop the flag", "--enable-fuse-bn")
    add("onnxsim", "use --no-fuse (it turns off every fusion, BatchNormalization's too)", "--skip-fuse-bn")
    add("onnxsim", _PASSES, "--skip-optimization", "--skip-optimizer", "--enable-optimization")
    add("onnxsim", "use --skip fold", "--skip-constant-folding")
    add("onnxsim", "", "--check-rtol", ours="--rtol")
    add("onnxsim", "", "--check-atol", ours="--atol")
    add("onnxsim", _CHECK_INPUTS, "--test-input-shape", "--input-data-path")
    add("onnxsim", "the check's inputs are seeded normal values and edge values (±0, NaN, ±inf...); --seed N "
        "for another set, --inputs FILE.npz for your own", "--input-fill")
    add("onnxsim", "not needed: dynamic inputs stay dynamic (--input-shape NAME:D0,... makes one static); "
        "drop the flag", "--dynamic-input-shape")
    add("onnxsim", "not needed: subgraphs (If/Loop bodies) and model-local functions are always optimised; "
        "drop the flag", "--include-subgraph")
    add("onnxsim", _FOLD_LIMIT, "--no-large-tensor")
    add("onnxsim", "not needed: initializers that are graph inputs (IR >= 4) are never folded by default "
        "(--freeze-initializer-inputs folds them); drop the flag", "--mutable-initializer")
    add("onnxsim", "no equivalent: the check compares in onnxruntime (on by default) instead of proving with "
        "Z3; --require-check makes a check that cannot run an error", "--certify")
    add("onnxsim", "no equivalent; --no-check turns off the onnxruntime check", "--no-certify")
    add("onnxsim", "use -v (each pass's time) or --report FILE.json (each pass's and phase's seconds)",
        "--profile", "--ort-profile", "--merge-ort-profile")
    add("onnxsim", "use --precision fp16 (float32 islands where needed, checked)", "--fp16-quantize")
    add("onnxsim", "use --precision bf16 (float32 islands where needed, checked)", "--bf16-quantize")
    add("onnxsim", "optimize --help lists the passes", "--list-default-optimizers", "--list-other-optimizers")
    add("onnxsim", "no equivalent: the summary lists the op types and nodes before and after",
        "--graph-diff", "--node-reduction-plot")
    add("onnxsim", "no equivalent: fold and the check run onnxruntime's CPU provider", "--providers", "--cuda")
    add("onnxsim", "no equivalent: outputs are kept as the model declares them", "--unused-output")
    add("onnxsim", "no equivalent: external data is written for a model that has it or is over 2 GB",
        "--external-data-threshold")
    add("onnxsim", "no equivalent: the passes infer shapes where they need them", "--skip-shape-inference")
    add("onnxsim", "no equivalent: onnxruntime's own optimiser is not run (the check turns it off)",
        "--enable-onnxruntime-optimization")
    add("onnxsim", "no equivalent: initializers that are not graph inputs are constants",
        "--initializers-as-non-constants")
    add("onnxsim", "no equivalent: model-local functions are optimised in place, not inlined", "--inline-functions")
    add("onnxsim", "no equivalent: custom ops are carried through as they are", "--custom-lib",
        "--skip-schema-import")
    add("onnxsim", _NO_EXPORT, "--emit-mlir", "--mlir-target", "--onnx-mlir", "--emit-coreml", "--coreml-format",
        "--coreml-compute-units", "--coreml-io-dtype", "--coreml-minimum-deployment-target", "--emit-tflite",
        "--tflite-optimize", "--tflite-backend", "--tflite-int8", "--tflite-calibration-samples",
        "--tflite-io-dtype", "--tflite-flex", "--tflite-layout", "--tflite-edgetpu", "--tflite-edgetpu-compiler",
        "--tflite-edgetpu-check")
    add("onnxsim", _NO_QUANTISATION, "--dynamic-quantize", "--dynamic-quantize-matmul-integer-to-float",
        "--ternary-quantize", "--weight-only-quantize", "--weight-only-quantize-int4",
        "--weight-only-quantize-int16", "--weight-only-quantize-int8-block", "--fp8-quantize", "--fp8-format",
        "--static-quantize", "--static-quantize-int16", "--qoperator-quantize", "--qoperator-quantize-elementwise",
        "--qoperator-quantize-activation", "--qoperator-quantize-concat", "--qoperator-quantize-softmax",
        "--qoperator-quantize-pool", "--qoperator-quantize-where", "--qoperator-quantize-gemm",
        "--calibration-dataset", "--calibration-samples", "--calibration-method")
    # onnxslim (`onnxslim --help`)
    add("onnxslim", "use --skip fold (constant_folding) or --no-fuse (graph_fusion); the other clean-ups "
        "are exact and always run", "--skip-optimizations")
    add("onnxslim", "use --no-fuse (it turns off every fusion)", "--skip-fusion-patterns")
    add("onnxslim", "use --skip fold", "--no-constant-folding")  # before --skip-optimizations
    add("onnxslim", _FOLD_LIMIT, "--size-threshold")
    add("onnxslim", "use --precision fp16 or --precision bf16 (a model is never converted to fp32)", "--dtype")
    add("onnxslim", _CHECK_ON, "--model-check")
    add("onnxslim", _CHECK_INPUTS, "--model-check-inputs")
    add("onnxslim", "no equivalent: outputs keep the names and types the model declares", "--outputs")
    add("onnxslim", "no equivalent: the passes infer shapes where they need them", "--no-shape-infer")
    add("onnxslim", "no equivalent: the summary lists the op types, inputs and outputs (--passes upgrade "
        "--no-check changes little else)", "--inspect", "--dump-to-disk")
    add("onnxslim, onnxsim", _EXTERNAL, "--save-as-external-data")
    # polygraphy (`polygraphy surgeon sanitize`, `run`, `convert`)
    add("polygraphy", "not needed: folding runs by default (--skip fold turns it off); drop the flag",
        "--fold-constants")
    add("polygraphy", "not needed: the clean-up runs after the passes; drop the flag", "--cleanup")
    add("polygraphy", _FOLD_LIMIT, "--fold-size-threshold")
    add("polygraphy", "no equivalent: the passes repeat until a round changes nothing", "--num-passes",
        "--num-const-fold-passes")
    add("polygraphy", "no equivalent: shape arithmetic folds with the rest (--skip fold keeps it all)",
        "--no-fold-shapes")
    add("polygraphy", _EXTERNAL, "--save-external-data")
    add("polygraphy", "not needed: the check compares with onnxruntime by default; drop the flag", "--onnxrt")
    add("polygraphy", "use --inputs FILE.npz (arrays by input name)", "--load-inputs", "--load-input-data")
    add("polygraphy", "use --precision fp16 (float32 islands where needed, checked)", "--fp-to-fp16")
    add("polygraphy", "use -q", "--silent")
    add("polygraphy", "no equivalent: --inputs FILE.npz gives the check your own values", "--val-range")
    add("polygraphy", "no equivalent: the check runs each set of inputs once", "--iterations")
    add("polygraphy", "no equivalent: the check runs onnxruntime only", "--trt")
    return {h.flag: h for h in rows}


#: Every flag of onnxsim, onnxslim and polygraphy that is not ours, by flag.
HABITS: dict[str, Habit] = _table()

#: The shape flags of the other tools, all ``--input-shape`` here (see the module docstring).
SHAPE_FLAGS = ("--input-shape", "--overwrite-input-shape", "--input-shapes", "--override-input-shapes")

#: A further value of a shape flag: ``NAME:D0,D1`` (``NAME:[D0,D1]``) or bare ``D0,D1`` (sizes as integers).
_SHAPE_VALUE = re.compile(r"^(?:.+:)?\[?-?\d+(?:,-?\d+)*\]?$")

#: onnxslim's ``--inputs NAME:DTYPE`` (its dtypes, and the usual spellings of others).
_DTYPE_VALUE = re.compile(r"^.+:(?:fp16|fp32|fp64|bf16|int8|int16|int32|int64|uint8|bool|float16|float32|"
                          r"float64|bfloat16|float|double|half)$", re.IGNORECASE)


def _inputs_refusal(value: str) -> str | None:
    """Why ``--inputs VALUE`` is another tool's form (onnxslim's NAME:DTYPE, polygraphy's shapes), or None."""
    if os.path.exists(value):
        return None
    if _DTYPE_VALUE.match(value):
        return (f"--inputs {value}: onnxslim's --inputs NAME:DTYPE (change an input's type) has no equivalent "
                "(--precision-io makes the inputs and outputs half); here --inputs FILE.npz gives the check's "
                "inputs, arrays by input name")
    if _SHAPE_VALUE.match(value) and ":" in value:
        return (f"--inputs {value}: a shape is given with --input-shape NAME:D0,D1,... (the model becomes "
                "static) or --dim NAME=SIZE (the check's inputs only); here --inputs FILE.npz gives the "
                "check's inputs, arrays by input name")
    return None


def _shape_value(value: str) -> str:
    """polygraphy's ``NAME:[1,3]`` as ``NAME:1,3`` (ours and onnxsim's)."""
    name, sep, dims = value.rpartition(":")
    if dims.startswith("[") and dims.endswith("]"):
        dims = dims[1:-1]
    return f"{name}{sep}{dims}"


def translate(argv: Sequence[str]) -> list[str]:
    """``argv`` with the other tools' forms made ours (see the module docstring).

    Raises:
        Refusal: a flag of another tool that is refused here, or onnxslim's ``--inputs NAME:DTYPE``.
    """
    result: list[str] = []
    tokens = list(argv)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if token == "--":
            result.extend(tokens[i - 1:])
            break
        flag, eq, value = token.partition("=")
        if not token.startswith("--"):
            result.append(token)
            continue
        if flag in SHAPE_FLAGS:
            values = [value] if eq else tokens[i:i + 1]
            i += 0 if eq else len(values)
            while not eq and i < len(tokens) and _SHAPE_VALUE.match(tokens[i]):
                values.append(tokens[i])
                i += 1
            if not values:
                result.append("--input-shape")  # argparse says it needs a value
            for v in values:
                result.extend(["--input-shape", _shape_value(v)])
            continue
        if flag == "--inputs":
            values = [value] if eq else tokens[i:i + 1]
            for v in values:
                why = _inputs_refusal(v)
                if why is not None:
                    raise Refusal(why)
            result.append(token)
            continue
        habit = HABITS.get(flag)
        if habit is None:
            result.append(token)
        elif habit.ours:
            result.append(habit.ours + (eq + value))
        else:
            raise Refusal(habit.refusal())
    return result


def bare_count_hint(word: str) -> str:
    """A hint for an extra positional argument that is a number (onnxsim's ``IN OUT N``), or ""."""
    if word.isascii() and word.isdigit():
        return (" (onnxsim's number of checks? here the onnxruntime check runs by default on "
                "seeded inputs: --seed N for another set)")
    return ""
