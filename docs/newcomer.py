"""Writes docs/newcomer.md: a newcomer's session, from a TorchScript export of a small transformer
encoder to a folder of models, with each command's real output.

    python docs/newcomer.py       # rewrites docs/newcomer.md (needs torch: pip install -e '.[real]')

Each command runs in a fresh temporary folder, with ``optimize`` the command of this checkout
(``python -m passes``) and ``python`` this interpreter, stdout and stderr together as a terminal
shows them. tests/test_newcomer_transcript.py runs the session again and compares it with the
page, numbers with a decimal point aside (times, sizes, errors vary with the machine and the
libraries).
"""

from __future__ import annotations

import os
import pathlib
import re
import stat
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "newcomer.md"

EXPORT = '''\
import warnings

import torch

warnings.simplefilter("ignore", DeprecationWarning)  # torch 2.9+ prefers its dynamo exporter; this is TorchScript's
torch.manual_seed(0)


class Encoder(torch.nn.Module):
    """Token ids -> class scores: an embedding, two transformer encoder layers, a mean, a linear head."""

    def __init__(self, vocab: int = 100, width: int = 32, heads: int = 4, layers: int = 2, classes: int = 3):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.position = torch.nn.Parameter(torch.randn(1, 64, width) * 0.02)
        layer = torch.nn.TransformerEncoderLayer(width, heads, dim_feedforward=64, dropout=0.0, batch_first=True,
                                                 activation="gelu")
        self.encoder = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(width, classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids) + self.position[:, : ids.shape[1]]
        return self.head(self.encoder(x).mean(dim=1))


ids = torch.randint(0, 100, (2, 16))
torch.onnx.export(Encoder().eval(), (ids,), "encoder.onnx", input_names=["ids"], output_names=["logits"],
                  dynamic_axes={"ids": {0: "batch", 1: "seq"}, "logits": {0: "batch"}}, opset_version=17,
                  dynamo=False)
print("wrote encoder.onnx")
'''

#: (what the newcomer does and sees, the command). The first step writes export.py (shown on the page).
STEPS: list[tuple[str, str]] = [
    ("A small transformer encoder (token ids in, three class scores out), exported with PyTorch's "
     "TorchScript exporter at opset 17 with a dynamic batch and sequence length; `export.py` is shown "
     "below.", "python export.py"),
    ("Optimise it with the defaults: the opset goes to 18, the shape arithmetic the exporter wrote folds "
     "away, and onnxruntime runs both models and compares them.", "optimize encoder.onnx encoder.opt.onnx"),
    ("At opset 23 the Gelu pattern (`fusable_at_higher_opset` above) becomes one Gelu node.",
     "optimize encoder.onnx encoder23.onnx --target-opset 23"),
    ("In float16: weights and compute in the half type, inputs and outputs still float32, checked at "
     "float16's tolerance against the float32 model.", "optimize encoder.onnx encoder.fp16.onnx --precision fp16"),
    ("For a deployment at batch 1 and 16 tokens: the input becomes static, the rest of the shape "
     "arithmetic folds, and the check runs at that size.",
     "optimize encoder.onnx encoder.static.onnx --input-shape ids:1,16"),
    ("A habit from onnxsim: its flags work where they mean what ours do, and the others say what to "
     "use instead (exit 2, nothing written).", "optimize encoder.onnx encoder.opt.onnx --skip-fuse-bn"),
    ("The same with onnxsim's shape form (one input: the sizes alone) and its tolerance flag.",
     "optimize encoder.onnx encoder.static.onnx --overwrite-input-shape 1,16 --check-rtol 1e-3 -q && echo ok"),
    ("A folder of models (here three of the models so far, each optimised again: a second run finds "
     "little left to do): one process per model, a row each, a totals line, and one JSON report.",
     "mkdir zoo && cp encoder.onnx encoder.fp16.onnx encoder.static.onnx zoo/ && "
     "optimize zoo -o zoo.opt --report zoo.json"),
]


def _shim(folder: pathlib.Path) -> pathlib.Path:
    """A ``bin`` folder with ``optimize`` (this checkout's) and ``python`` (this interpreter)."""
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    for name, command in (("optimize", f'PYTHONPATH="{REPO}" exec "{sys.executable}" -m passes "$@"'),
                          ("python", f'exec "{sys.executable}" "$@"')):  # fmt: skip
        shim = bin_dir / name
        shim.write_text(f"#!/bin/sh\n{command}\n")
        shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    return bin_dir


def session() -> list[tuple[str, str, str, int]]:
    """Runs the steps in a fresh folder: (text, command, output, exit code) each."""
    with tempfile.TemporaryDirectory(prefix="newcomer-") as name:
        root = pathlib.Path(name)
        work = root / "work"
        work.mkdir()
        (work / "export.py").write_text(EXPORT, encoding="utf-8")
        env = {**os.environ, "PATH": f"{_shim(root)}{os.pathsep}{os.environ.get('PATH', '')}", "COLUMNS": "120"}
        env.pop("PYTHONPATH", None)
        found = []
        for text, command in STEPS:
            proc = subprocess.run(["bash", "-c", command], cwd=work, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, timeout=900)  # fmt: skip
            found.append((text, command, proc.stdout.rstrip("\n"), proc.returncode))
        return found


def render(steps: list[tuple[str, str, str, int]]) -> str:
    lines = [
        "# A newcomer's session",
        "",
        "[Back to the README](../README.md). A small transformer encoder exported from PyTorch, then "
        "`optimize` as a newcomer runs it: the defaults, another opset, float16, a static shape, an "
        "onnxsim habit, a folder. Every output below is the real one, written by "
        "`python docs/newcomer.py` (`tests/test_newcomer_transcript.py` runs the session again and "
        "compares it, times and sizes aside).",
        "",
        "`export.py`:",
        "",
        "```python",
        EXPORT.rstrip("\n"),
        "```",
    ]
    for text, command, output, code in steps:
        lines += ["", text, "", "```", f"$ {command}", *([output] if output else []),
                  *([f"[exit {code}]"] if code else []), "```"]  # fmt: skip
    return "\n".join(lines) + "\n"


def stable(text: str) -> str:
    """``text`` without what varies between runs: numbers with a decimal point or an exponent, the
    alignment that depends on their widths."""
    text = re.sub(r"\d+\.\d+(?:e[-+]?\d+)?|\d+e[-+]?\d+", "#", text)
    return "\n".join(re.sub(r"[ \t]+", " ", line).strip() for line in text.splitlines())


def main() -> None:
    PAGE.write_text(render(session()), encoding="utf-8")
    print(f"wrote {PAGE.relative_to(REPO)}")


if __name__ == "__main__":
    main()
