"""Detector exports against onnxruntime's basic level: node counts and the ops it removes that we keep.

Four small CNNs with the heads detectors have, random weights perturbed by [0.01, 0.1) (so none is 0
or 1), exported by torch's TorchScript exporter at opsets 11 and 17, with a dynamic batch (64x64
images) and with dynamic height and width:

* ``yolov8``: CSP blocks with SiLU, SPPF (MaxPool, Concat), an Upsample, a split box/class head with
  the DFL softmax and a grid (meshgrid, Range, Concat);
* ``yolov5``: the Focus stem (four ``x[..., a::2, b::2]`` concatenated), the anchor head (view,
  permute, sigmoid, split, grid arithmetic);
* ``dbnet``: a ResNet-like backbone, an FPN with nearest Upsample and additions, the DB head
  (Conv, BatchNorm, ConvTranspose twice, Sigmoid, the differentiable binarisation);
* ``ppocr_det``: PaddleOCR's detector shape: Hardswish/ReLU6 depthwise stages, an SE block
  (Hardsigmoid), an FPN, a ConvTranspose head.

Tools: ``optimize`` (the command with its onnxruntime check, at the model's opset: ``--target-opset``
of the source's) and ``ort-basic`` (``ORT_ENABLE_BASIC`` with ``optimized_model_filepath``). A run
of ours whose check fails says so (the command writes nothing then) and is run again with
``--no-fuse``, so the table still shows what the exact rules leave.

Usage:
    python benchmarks/bench_detectors.py [--quick] [--only yolov5,...] [--keep DIR]
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile
import warnings

import onnx

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from harness import count_nodes, default_opset, measure, op_counts, tool_snippet  # noqa: E402

ARCHS = ("yolov8", "yolov5", "dbnet", "ppocr_det")


def _module(arch: str):  # noqa: C901  (four small architectures, one place)
    import torch
    import torch.nn.functional as F
    from torch import nn

    def cbs(ci: int, co: int, k: int = 3, s: int = 1) -> nn.Module:
        return nn.Sequential(nn.Conv2d(ci, co, k, s, k // 2, bias=False), nn.BatchNorm2d(co), nn.SiLU())

    class C2f(nn.Module):
        def __init__(self, c: int) -> None:
            super().__init__()
            self.cv1, self.cv2 = cbs(c, c, 1), cbs(c + c // 2, c, 1)
            self.m = nn.Sequential(cbs(c // 2, c // 2), cbs(c // 2, c // 2))

        def forward(self, x):
            a, b = self.cv1(x).chunk(2, 1)
            return self.cv2(torch.cat([a, b, self.m(b)], 1))

    class SPPF(nn.Module):
        def __init__(self, c: int) -> None:
            super().__init__()
            self.cv1, self.cv2, self.m = cbs(c, c // 2, 1), cbs(c * 2, c, 1), nn.MaxPool2d(5, 1, 2)

        def forward(self, x):
            x = self.cv1(x)
            y1 = self.m(x)
            y2 = self.m(y1)
            return self.cv2(torch.cat([x, y1, y2, self.m(y2)], 1))

    class YoloV8(nn.Module):
        def __init__(self, nc: int = 4, reg: int = 4) -> None:
            super().__init__()
            self.stem, self.d1, self.c1 = cbs(3, 16, 3, 2), cbs(16, 32, 3, 2), C2f(32)
            self.d2, self.c2, self.d3, self.sppf = cbs(32, 64, 3, 2), C2f(64), cbs(64, 64, 3, 2), SPPF(64)
            self.up, self.c3 = nn.Upsample(scale_factor=2, mode="nearest"), C2f(128)
            self.heads = nn.ModuleList([nn.Conv2d(c, 4 * reg + nc, 1) for c in (128, 64)])
            self.nc, self.reg = nc, reg

        def forward(self, x):
            x = self.c1(self.d1(self.stem(x)))
            p3 = self.c2(self.d2(x))
            p4 = self.sppf(self.d3(p3))
            p3 = self.c3(torch.cat([self.up(p4), p3], 1))
            outs = []
            for head, f, stride in zip(self.heads, (p3, p4), (8, 16)):
                y = head(f)
                b, _, h, w = y.shape
                box, cls = y.split((4 * self.reg, self.nc), 1)
                box = box.view(b, 4, self.reg, h * w).softmax(2)
                box = (box * torch.arange(self.reg, dtype=torch.float32).view(1, 1, self.reg, 1)).sum(2)
                gy, gx = torch.meshgrid(torch.arange(h, dtype=torch.float32), torch.arange(w, dtype=torch.float32),
                                        indexing="ij")  # fmt: skip
                grid = torch.stack((gx, gy), 0).view(1, 2, h * w) + 0.5
                lt, rb = box[:, :2], box[:, 2:]
                outs.append(torch.cat([(grid + (rb - lt) / 2) * stride, (lt + rb) * stride,
                                       cls.view(b, self.nc, h * w).sigmoid()], 1))  # fmt: skip
            return torch.cat(outs, 2)

    class Focus(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = cbs(12, 16)

        def forward(self, x):
            return self.conv(torch.cat([x[..., ::2, ::2], x[..., 1::2, ::2], x[..., ::2, 1::2], x[..., 1::2, 1::2]], 1))

    class YoloV5(nn.Module):
        def __init__(self, nc: int = 3, na: int = 3) -> None:
            super().__init__()
            self.focus, self.d1, self.c1 = Focus(), cbs(16, 32, 3, 2), C2f(32)
            self.d2, self.sppf = cbs(32, 64, 3, 2), SPPF(64)
            self.up, self.c3 = nn.Upsample(scale_factor=2, mode="nearest"), C2f(96)
            self.m = nn.ModuleList([nn.Conv2d(c, na * (nc + 5), 1) for c in (96, 64)])
            self.na, self.no = na, nc + 5
            self.register_buffer("anchor_grid", torch.rand(2, 1, na, 1, 1, 2) * 10 + 1)

        def forward(self, x):
            x = self.c1(self.d1(self.focus(x)))
            p4 = self.sppf(self.d2(x))
            p3 = self.c3(torch.cat([self.up(p4), x], 1))
            z = []
            for i, f in enumerate((p3, p4)):
                y = self.m[i](f)
                bs, _, ny, nx = y.shape
                y = y.view(bs, self.na, self.no, ny, nx).permute(0, 1, 3, 4, 2).contiguous().sigmoid()
                yv, xv = torch.meshgrid(torch.arange(ny), torch.arange(nx), indexing="ij")
                grid = torch.stack((xv, yv), 2).view(1, 1, ny, nx, 2).float()
                xy, wh, conf = y.split((2, 2, self.no - 4), 4)
                xy = (xy * 2 - 0.5 + grid) * (8 * 2**i)
                wh = (wh * 2) ** 2 * self.anchor_grid[i]
                z.append(torch.cat((xy, wh, conf), 4).view(bs, -1, self.no))
            return torch.cat(z, 1)

    class DB(nn.Module):
        def __init__(self, paddle: bool) -> None:
            super().__init__()
            chans = (16, 24, 40, 64) if paddle else (16, 32, 64, 96)
            act = (nn.Hardswish, nn.ReLU6) if paddle else (nn.ReLU, nn.ReLU)
            self.stages, ci = nn.ModuleList(), 3
            for co in chans:
                self.stages.append(nn.Sequential(
                    nn.Conv2d(ci, co, 3, 2, 1, bias=False), nn.BatchNorm2d(co), act[0](),
                    nn.Conv2d(co, co, 3, 1, 1, groups=co if paddle else 1, bias=False), nn.BatchNorm2d(co), act[1]()))
                ci = co
            self.se = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(chans[-1], 16, 1), nn.ReLU(),
                                    nn.Conv2d(16, chans[-1], 1), nn.Hardsigmoid()) if paddle else None  # fmt: skip
            self.lat = nn.ModuleList([nn.Conv2d(c, 32, 1, bias=False) for c in chans])
            self.smooth = nn.ModuleList([nn.Conv2d(32, 8, 3, 1, 1, bias=False) for _ in chans])

            def head() -> nn.Module:
                return nn.Sequential(nn.Conv2d(32, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                                     nn.ConvTranspose2d(8, 8, 2, 2), nn.BatchNorm2d(8), nn.ReLU(),
                                     nn.ConvTranspose2d(8, 1, 2, 2))  # fmt: skip

            self.prob, self.thresh = head(), (None if paddle else head())

        def forward(self, x):
            feats = []
            for stage in self.stages:
                x = stage(x)
                feats.append(x)
            if self.se is not None:
                feats[-1] = feats[-1] * self.se(feats[-1])
            lats = [lat(f) for lat, f in zip(self.lat, feats)]
            for i in range(len(lats) - 1, 0, -1):
                lats[i - 1] = lats[i - 1] + F.interpolate(lats[i], scale_factor=2, mode="nearest")
            outs = [smooth(lat) for smooth, lat in zip(self.smooth, lats)]
            outs = [F.interpolate(o, scale_factor=2**i, mode="nearest") if i else o for i, o in enumerate(outs)]
            fused = torch.cat(outs[::-1], 1)
            p = torch.sigmoid(self.prob(fused))
            if self.thresh is None:
                return p
            t = torch.sigmoid(self.thresh(fused))
            return torch.cat([p, t, torch.reciprocal(1 + torch.exp(-50 * (p - t)))], 1)

    torch.manual_seed(0)
    net = {"yolov8": YoloV8, "yolov5": YoloV5, "dbnet": lambda: DB(False), "ppocr_det": lambda: DB(True)}[arch]()
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for tensor in [*net.parameters(), *net.buffers()]:
            if tensor.is_floating_point():
                tensor.add_(torch.empty(tensor.shape).uniform_(0.01, 0.1, generator=gen))
    return net.eval()


def export(arch: str, opset: int, spatial: bool, path: pathlib.Path) -> None:
    """``arch`` exported by TorchScript at ``opset``; a dynamic batch, and dynamic H and W if ``spatial``."""
    import torch

    axes = {0: "batch", 2: "height", 3: "width"} if spatial else {0: "batch"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_module(arch), torch.randn(1, 3, 64, 64), str(path), dynamo=False, opset_version=opset,
                          input_names=["images"], output_names=["out"], dynamic_axes={"images": axes})  # fmt: skip


_OURS = f"""
import sys
sys.path.insert(0, {str(HERE.parent)!r})
import passes.cli
code = passes.cli.main([sys.argv[1], "-o", sys.argv[2], "-q", "--target-opset", sys.argv[3], *sys.argv[4:]])
if code:
    sys.exit(code)
import json
print(json.dumps({{"seconds": 0.0}}))
"""


def run(arch: str, opset: int, spatial: bool, folder: pathlib.Path) -> str:
    """One row: the source's nodes, ours (and how), onnxruntime's basic level, and the ops it has fewer of."""
    name = f"{arch}_opset{opset}_{'hw' if spatial else 'batch'}"
    src = folder / f"{name}.onnx"
    export(arch, opset, spatial, src)
    source = onnx.load(str(src))
    ours_path, ort_path = folder / f"{name}.ours.onnx", folder / f"{name}.ort.onnx"
    how = ""
    result = measure("optimize", name, _OURS, [src, ours_path, default_opset(source)])
    if not result.ok:
        how = " (check failed; --no-fuse)"
        result = measure("optimize", name, _OURS, [src, ours_path, default_opset(source), "--no-fuse"])
    measure("ort-basic", name, tool_snippet("ort-basic"), [src, ort_path])
    if not result.ok:
        return f"| {name} | {count_nodes(source)} | failed: {result.error} | | |"
    ours, theirs = onnx.load(str(ours_path)), onnx.load(str(ort_path))
    mine, basic = op_counts(ours), op_counts(theirs)
    fewer = ", ".join(f"{op} {mine.get(op, 0)} vs {basic.get(op, 0)}" for op in sorted({*mine, *basic})
                      if basic.get(op, 0) < mine.get(op, 0))  # fmt: skip
    return f"| {name} | {count_nodes(source)} | {count_nodes(ours)}{how} | {count_nodes(theirs)} | {fewer or '-'} |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(ARCHS), help="comma-separated subset of " + ",".join(ARCHS))
    parser.add_argument("--keep", type=pathlib.Path, metavar="DIR", help="keep the models here")
    parser.add_argument("--quick", action="store_true", help="yolov5 and ppocr_det at opset 17 only")
    args = parser.parse_args(argv)
    archs, opsets = (("yolov5", "ppocr_det"), (17,)) if args.quick else (args.only.split(","), (11, 17))
    unknown = sorted(set(archs) - set(ARCHS))
    if unknown:
        parser.error(f"unknown model {', '.join(unknown)} (have: {', '.join(ARCHS)})")
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.keep or pathlib.Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        print("| model | source | ours | ort-basic | ops where ort-basic has fewer (ours vs ort) |")
        print("|---|---|---|---|---|")
        for arch in archs:
            for opset in opsets:
                for spatial in (False, True):
                    print(run(arch, opset, spatial, folder), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
