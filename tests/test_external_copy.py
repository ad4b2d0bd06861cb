"""Untouched external weights: never read at load, copied byte for byte, in few kernel calls.

The load leaves external weights in their file (onnx_ir maps one only when a
pass reads it): the bytes the process reads, counted by ``/proc/self/io``'s
``rchar`` (every ``read``/``pread``, Python's or C++'s), stay far below one
weight, and no data file is memory-mapped (a wrapper around ``mmap.mmap``).
The save copies a run of untouched tensors that are adjacent in the input as
one range (:mod:`passes.modelio.copy`): a wrapper around ``os.copy_file_range``
counts the calls. Bounds are counts, never seconds.
"""

from __future__ import annotations

import mmap
import os
import pathlib
from collections.abc import Iterator

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from passes import modelio, pipeline
from passes.modelio import copy as copy_module

_PROC_IO = pathlib.Path("/proc/self/io")
needs_proc_io = pytest.mark.skipif(not _PROC_IO.exists(), reason="no /proc/self/io on this system")


def _rchar() -> int:
    for line in _PROC_IO.read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def _chain_model(folder: pathlib.Path, count: int, shape: tuple[int, int], *, name: str = "m.onnx",
                 seed: int = 0) -> pathlib.Path:  # fmt: skip
    """``x -> MatMul(w0) -> ... -> MatMul(w{count-1}) -> ReduceL2 -> y`` (opset 13), square float32 weights of
    random values, saved by ``onnx.save`` with every weight external, back to back in ``NAME.data``."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    inits, nodes, prev = [], [], "x"
    for i in range(count):
        inits.append(numpy_helper.from_array(rng.uniform(0.25, 0.75, shape).astype(np.float32), f"w{i}"))
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"h{i}"]))
        prev = f"h{i}"
    nodes.append(helper.make_node("ReduceL2", [prev], ["y"], axes=[-1]))
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", shape[0]])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 1])], inits)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    path = folder / name
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=name + ".data", size_threshold=0)  # fmt: skip
    return path


def _external(path: pathlib.Path) -> dict[str, tuple[int, bytes]]:
    """Each external initializer's offset and bytes, read from its data file."""
    proto = onnx.load(str(path), load_external_data=False)
    found = {}
    for t in proto.graph.initializer:
        if t.data_location == TensorProto.EXTERNAL:
            info = {e.key: e.value for e in t.external_data}
            offset = int(info.get("offset", 0))
            with open(path.parent / info["location"], "rb") as f:
                f.seek(offset)
                found[t.name] = (offset, f.read(int(info["length"])))
    return found


@pytest.fixture
def mapped(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The sizes of the files memory-mapped (onnx_ir maps a whole data file to read one weight)."""
    sizes: list[int] = []
    real = mmap.mmap

    def spy(fileno: int, length: int, *args, **kwargs):
        sizes.append(os.fstat(fileno).st_size)
        return real(fileno, length, *args, **kwargs)

    monkeypatch.setattr(mmap, "mmap", spy)
    yield sizes


@pytest.fixture
def copy_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, int]]:
    """Each ``os.copy_file_range`` call as (count, src offset, dst offset)."""
    calls: list[tuple[int, int, int]] = []
    real = os.copy_file_range

    def counting(src: int, dst: int, count: int, offset_src=None, offset_dst=None, *args):
        calls.append((count, offset_src, offset_dst))
        return real(src, dst, count, offset_src, offset_dst, *args)

    monkeypatch.setattr(os, "copy_file_range", counting)
    return calls


needs_copy_file_range = pytest.mark.skipif(not hasattr(os, "copy_file_range"), reason="no os.copy_file_range")


@needs_proc_io
def test_the_load_reads_no_weight_bytes(tmp_path: pathlib.Path, mapped: list[int]) -> None:
    src = _chain_model(tmp_path / "in", 16, (512, 512))  # 16 weights of 1 MiB
    weight = 512 * 512 * 4
    data_size = (tmp_path / "in" / "m.onnx.data").stat().st_size
    assert data_size == 16 * weight
    modelio.load_model(_chain_model(tmp_path / "warm", 2, (512, 512)))  # the imports (their files are read too)
    mapped.clear()
    before = _rchar()
    model = modelio.load_model(src)
    read = _rchar() - before
    assert read < weight // 4, f"the load read {read} bytes"  # the model file is a few KiB
    assert data_size not in mapped  # the data file was not mapped either
    tensors = [v.const_value for v in model.graph.initializers.values()]
    assert len(tensors) == 16 and all(t.raw is None for t in tensors)  # onnx_ir maps on first read only


@needs_proc_io
def test_untouched_weights_come_out_byte_identical_without_being_read(tmp_path: pathlib.Path, mapped: list[int],
                                                                     copy_calls: list) -> None:  # fmt: skip
    """The whole run (load, passes, save, the checker both ways) reads no weight but through the kernel's copy."""
    src = _chain_model(tmp_path / "in", 16, (512, 512))
    weight = 512 * 512 * 4
    data_size = 16 * weight
    pipeline.optimize_file(_chain_model(tmp_path / "warm", 2, (512, 512)), tmp_path / "warm.onnx",
                           check=pipeline.CheckOptions(enabled=False))  # the imports  # fmt: skip
    mapped.clear()
    copy_calls.clear()
    out = tmp_path / "out.onnx"
    before = _rchar()
    pipeline.optimize_file(src, out, check=pipeline.CheckOptions(enabled=False))
    read = _rchar() - before
    copied = sum(count for count, _, _ in copy_calls)  # requested; the kernel counts what it copies as read
    assert onnx.load(str(out), load_external_data=False).opset_import[0].version == 18  # the passes ran
    if copy_calls:
        assert read - data_size < weight // 4, f"{read - data_size} bytes read beside the copy"
    else:  # another copy method (the counts then include its reads)
        assert read < data_size + weight // 4
    assert data_size not in mapped
    before_bytes, after_bytes = _external(src), _external(out)
    assert {k: b for k, (_, b) in after_bytes.items()} == {k: b for k, (_, b) in before_bytes.items()}
    assert copied <= data_size + (64 << 10)


@needs_copy_file_range
def test_many_small_adjacent_weights_are_copied_in_one_call(tmp_path: pathlib.Path, copy_calls: list) -> None:
    """500 weights of 1,156 bytes that ``onnx.save`` wrote back to back: one run, one call (it was 500)."""
    src = _chain_model(tmp_path / "in", 500, (17, 17))
    model = modelio.load_model(src)
    copy_calls.clear()
    out = tmp_path / "out.onnx"
    files = modelio.save_model(model, out)
    assert [f.name for f in files] == ["out.onnx", "out.onnx.data"]
    assert 1 <= len(copy_calls) <= 2, copy_calls
    before, after = _external(src), _external(out)
    assert {k: b for k, (_, b) in after.items()} == {k: b for k, (_, b) in before.items()}
    # The input's layout, shifted as a whole: no tensor re-aligned one call each.
    shift = {after[k][0] - before[k][0] for k in before}
    assert len(shift) == 1 and shift.pop() % 16 == 0


@needs_copy_file_range
def test_a_changed_weight_splits_the_run_in_two(tmp_path: pathlib.Path, copy_calls: list) -> None:
    """Replacing one weight in the middle leaves two runs of untouched ones: two calls, one Python write."""
    import onnx_ir as ir

    src = _chain_model(tmp_path / "in", 300, (17, 17))
    model = modelio.load_model(src)
    value = model.graph.initializers["w150"]
    new = np.full((17, 17), 0.5, np.float32)
    value.const_value = ir.Tensor(new, name="w150")
    copy_calls.clear()
    out = tmp_path / "out.onnx"
    modelio.save_model(model, out)
    assert len(copy_calls) == 2, copy_calls
    before, after = _external(src), _external(out)
    assert after["w150"][1] == new.tobytes()
    assert all(after[k][1] == before[k][1] for k in before if k != "w150")
    assert after["w150"][0] % 16 == 0  # written through Python: aligned


@needs_copy_file_range
def test_large_weights_stay_64k_aligned_and_small_ones_do_not_split_runs(tmp_path: pathlib.Path,
                                                                         copy_calls: list) -> None:  # fmt: skip
    """Small weights between large ones (onnx.save's layout: nothing aligned): every large weight lands
    on a multiple of 64 KiB, a run each, with the small ones that follow it; not one call per small weight."""
    folder = tmp_path / "in"
    folder.mkdir()
    rng = np.random.default_rng(1)
    inits, nodes, prev = [], [], "x"
    for i in range(4):
        big = rng.uniform(0.25, 0.75, (600, 600)).astype(np.float32)  # 1.4 MB: over 1 MiB
        inits.append(numpy_helper.from_array(big, f"big{i}"))
        nodes.append(helper.make_node("MatMul", [prev, f"big{i}"], [f"b{i}"]))
        prev = f"b{i}"
        for j in range(20):
            small = rng.uniform(0.25, 0.75, (600,)).astype(np.float32) + np.float32(j)  # 2,400 bytes
            inits.append(numpy_helper.from_array(small, f"s{i}_{j}"))
            nodes.append(helper.make_node("Mul", [prev, f"s{i}_{j}"], [f"m{i}_{j}"]))
            prev = f"m{i}_{j}"
    nodes.append(helper.make_node("ReduceL2", [prev], ["y"], axes=[-1]))
    graph = helper.make_graph(nodes, "mixed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 600])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 1])], inits)  # fmt: skip
    src = folder / "m.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), str(src),
                    save_as_external_data=True, location="m.onnx.data", size_threshold=0)  # fmt: skip
    before = _external(src)
    assert any(before[f"big{i}"][0] % (64 << 10) for i in range(1, 4))  # the input does not align them
    model = modelio.load_model(src)
    copy_calls.clear()
    out = tmp_path / "out.onnx"
    modelio.save_model(model, out)
    after = _external(out)
    assert {k: b for k, (_, b) in after.items()} == {k: b for k, (_, b) in before.items()}
    assert all(after[f"big{i}"][0] % (64 << 10) == 0 for i in range(4))
    assert len(copy_calls) <= 4, copy_calls  # at most one run per large weight (84 tensors)


def test_our_own_output_keeps_every_offset_on_a_rerun(tmp_path: pathlib.Path) -> None:
    """The layout is a fixed point: saving our output again copies each run to where it already is."""
    src = _chain_model(tmp_path / "in", 40, (17, 17))
    first, second = tmp_path / "a" / "m.onnx", tmp_path / "b" / "m.onnx"
    first.parent.mkdir()
    second.parent.mkdir()
    modelio.save_model(modelio.load_model(src), first)
    modelio.save_model(modelio.load_model(first), second)
    a, b = _external(first), _external(second)
    assert a == b
    assert first.with_name("m.onnx.data").read_bytes() == second.with_name("m.onnx.data").read_bytes()


def test_plan_runs_follow_the_input(tmp_path: pathlib.Path) -> None:
    """The rules of :func:`passes.modelio.copy.plan` on external tensors of one file."""
    import onnx_ir as ir

    data = tmp_path / "w.data"
    data.write_bytes(bytes(8 << 20))

    def ext(offset: int, length: int, name: str) -> ir.ExternalTensor:
        return ir.ExternalTensor("w.data", offset, length, ir.DataType.UINT8, shape=ir.Shape([length]), name=name,
                                 base_dir=str(tmp_path))  # fmt: skip

    big = 2 << 20
    tensors = [
        ext(0, 4000, "a"),  # a run: a, b (back to back), c (12 bytes of padding, under 16)
        ext(4000, 4000, "b"),
        ext(8012, 4000, "c"),
        ext(12100, 4000, "d"),  # 88 bytes after c: a new run
        ext(16100, big, "e"),  # large, right after d: joins d's run, which is placed to align it
        ext(16100 + big + 100, big, "f"),  # large, not congruent with e modulo 64 KiB: a new run
    ]
    placements, size = copy_module.plan(tensors)
    offsets = {p.tensor.name: p.offset for p in placements}
    starts = [p.tensor.name for p in placements if p.run_start]
    assert starts == ["a", "d", "f"]
    assert offsets["a"] == 0 and offsets["b"] == 4000 and offsets["c"] == 8012
    assert offsets["d"] >= 12012 and offsets["e"] - offsets["d"] == 4000 and offsets["e"] % (64 << 10) == 0
    assert offsets["f"] % (64 << 10) == 0 and offsets["f"] >= offsets["e"] + big
    assert size == offsets["f"] + big
    # Written through Python (here: an in-memory tensor) each is aligned on its own.
    mem = ir.Tensor(np.zeros(5000, np.uint8), name="m")
    placements, _ = copy_module.plan([ext(0, 4000, "a"), mem, ext(4000, 4000, "b")])
    assert [p.run_start for p in placements] == [True, True, True]
    assert placements[1].offset % 16 == 0 and placements[1].source is None


@needs_copy_file_range
def test_a_range_is_asked_of_the_kernel_whole(tmp_path: pathlib.Path, copy_calls: list) -> None:
    """An 80 MiB dense range is one call asking for all of it (it was two of 64 MiB and 16 MiB): smaller
    calls were measured slower than ``cp``'s, which asks for up to ``MAX_RW_COUNT`` at a time."""
    rng = np.random.default_rng(7)
    data = rng.integers(0, 256, 80 << 20, dtype=np.uint8).tobytes()
    src_path, dst_path = tmp_path / "src.bin", tmp_path / "dst.bin"
    src_path.write_bytes(data)
    src = os.open(src_path, os.O_RDONLY)
    dst = os.open(dst_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        copier = copy_module.Copier()
        copier.copy(src, 4096, dst, 0, len(data) - 8192)
    finally:
        os.close(src)
        os.close(dst)
    if copier.methods.get("reflink"):
        pytest.skip("the file system shares blocks: no copy call to count")
    assert dst_path.read_bytes() == data[4096:-4096]
    assert copy_calls[0] == (len(data) - 8192, 4096, 0), copy_calls
    assert len(copy_calls) <= 2, copy_calls  # a second call only if the kernel copied less than asked
