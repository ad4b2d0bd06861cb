"""Memory bounds of issue #29, asserted by counting work and bytes, never seconds.

- A tree ensemble whose probabilities go ``Cast -> Identity -> ZipMap``: the
  types simplify asks onnx shape inference for must not decode the ensemble's
  attribute lists left in the file (``passes.modelio.detach``); decoding them
  all made the run 5x slower and 14x larger than the same model without the Cast.

The reproductions at full size, with seconds and peak RSS, are in
``benchmarks/bench_bounds.py``.
"""

from __future__ import annotations

import contextlib
import pathlib
import sys
import tracemalloc
from collections.abc import Iterator
from unittest import mock

import onnx
import onnx_ir as ir
import pytest

from passes import modelio, pipeline
from passes.ir import inference
from passes.modelio import detach

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))
import bench_bounds  # noqa: E402


@contextlib.contextmanager
def _detaching() -> Iterator[None]:
    """Detach list attributes of at least 4 KiB in files of any size (the defaults need 16 MiB files)."""
    with mock.patch.object(detach, "MIN_FILE", 0), mock.patch.object(detach, "MIN_ATTRIBUTE", 4096):
        yield


def _optimised_with_decodes(path: pathlib.Path) -> tuple[ir.Model, int, int]:
    """The model at ``path`` loaded with its lists detached and optimised (no check); the number of
    attribute lists decoded from the file, and tracemalloc's peak bytes during the passes."""
    decodes = []
    real = detach._decode

    def counting(*args, **kwargs):
        decodes.append(args)
        return real(*args, **kwargs)

    with _detaching(), mock.patch.object(detach, "_decode", counting):
        model = modelio.load_model(path)
        assert len([a for n in model.graph for a in n.attributes.values() if isinstance(a, detach.DetachedAttr)]) >= 10
        tracemalloc.start()
        try:
            pipeline.optimize_model(model)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    return model, len(decodes), peak


@pytest.mark.parametrize("cast", [True, False], ids=["cast", "no-cast"])
def test_tree_ensemble_lists_are_not_decoded_for_shape_inference(tmp_path: pathlib.Path, cast: bool) -> None:
    path = tmp_path / "trees.onnx"
    bench_bounds.build_trees(path, trees=60, depth=6, cast=cast)
    model, decodes, _ = _optimised_with_decodes(path)
    assert decodes == 0
    assert [n.op_type for n in model.graph] == ["TreeEnsembleClassifier", *(["Cast"] if cast else []), "ZipMap"]


def test_inference_over_the_markers_finds_what_it_finds_over_the_lists(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "trees.onnx"
    bench_bounds.build_trees(path, trees=60, depth=6, cast=True)
    with _detaching():
        detached = modelio.load_model(path)
        found = {v.name: t for v, t in inference.infer_all(detached).items()}
    assert not any(a.loaded for n in detached.graph for a in n.attributes.values() if isinstance(a, detach.DetachedAttr))
    assert found == {v.name: t for v, t in inference.infer_all(modelio.load_model(path)).items()}
    assert found["cast"][0] == ir.DataType.FLOAT and found["label"][0] == ir.DataType.INT64


def test_tree_ensemble_with_a_cast_costs_what_it_costs_without(tmp_path: pathlib.Path) -> None:
    peaks = {}
    for cast in (True, False):
        path = tmp_path / f"trees-{cast}.onnx"
        bench_bounds.build_trees(path, trees=200, depth=8, cast=cast)
        assert path.stat().st_size > 2 << 20
        _, _, peaks[cast] = _optimised_with_decodes(path)
    # decoding the lists for inference alone allocated over 10x the file; now within 2x
    assert peaks[True] < 2 * peaks[False] + (1 << 20), peaks
    assert peaks[True] < path.stat().st_size, peaks
