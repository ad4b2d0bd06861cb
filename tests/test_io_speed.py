"""Speed and memory at the floor: cheap start-up, weights copied by the kernel, one checker each way."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from passes.modelio import detach

REPO = pathlib.Path(__file__).resolve().parent.parent
HEAVY = ("numpy", "onnx", "onnx_ir", "ml_dtypes", "sympy", "onnxruntime", "refimpl")


def _cli(*args: str, importtime: bool = False) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    flags = ["-X", "importtime"] if importtime else []
    return subprocess.run([sys.executable, *flags, "-m", "passes", *args], capture_output=True, text=True,
                          env=env, timeout=300)  # fmt: skip


def _imported(stderr: str) -> set[str]:
    """Top-level packages named in ``-X importtime`` output."""
    return {m.group(1).split(".")[0] for m in re.finditer(r"^import time:.*\|\s+(\S+)$", stderr, re.M)}


# --- 1. start-up ----------------------------------------------------------------------------------


def test_help_imports_nothing_heavy_and_writes_nothing(tmp_path: pathlib.Path) -> None:
    """The declarations are light modules: no cache, nothing written under HOME or XDG_CACHE_HOME."""
    env_home = dict(HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "passes", "--help"], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(REPO), **env_home))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "fold" in proc.stdout and "--fold-size-limit" in proc.stdout
    assert not _imported(proc.stderr) & set(HEAVY), sorted(_imported(proc.stderr) & set(HEAVY))
    assert list(tmp_path.iterdir()) == []


def test_missing_file_fails_without_importing_onnx(tmp_path: pathlib.Path) -> None:
    proc = _cli(str(tmp_path / "nope.onnx"), "-o", str(tmp_path / "out.onnx"), importtime=True)
    assert proc.returncode == 2
    assert f"optimize: error: {tmp_path / 'nope.onnx'}: no such file" in proc.stderr
    assert not _imported(proc.stderr) & set(HEAVY)


def test_a_cache_folder_changes_nothing(tmp_path: pathlib.Path) -> None:
    """What the old declaration cache read (a JSON file, a FIFO) is not read: defaults stay the defaults."""
    cache = tmp_path / "cache" / "onnx-optimize"
    cache.mkdir(parents=True)
    os.mkfifo(cache / "declarations.json")  # a reader would hang
    env = dict(os.environ, PYTHONPATH=str(REPO), XDG_CACHE_HOME=str(tmp_path / "cache"),
               ONNX_OPTIMIZE_CACHE_DIR=str(cache))  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "passes", "--help"], capture_output=True, text=True, env=env,
                          timeout=60)  # fmt: skip
    assert proc.returncode == 0 and "default: 18" in proc.stdout


def _small_model(path: pathlib.Path) -> pathlib.Path:
    w = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(3, 4), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("ReduceL2", ["h"], ["y"], axes=[-1])],
        "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 1])], [w],
    )  # fmt: skip
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), str(path))
    return path


def test_a_run_imports_only_the_passes_it_runs(tmp_path: pathlib.Path) -> None:
    src = _small_model(tmp_path / "m.onnx")
    out = tmp_path / "out.onnx"
    proc = _cli(str(src), "-o", str(out), "--passes", "upgrade", "--no-check", importtime=True)
    assert proc.returncode == 0, proc.stderr
    imported = _imported(proc.stderr)
    assert "refimpl" not in imported and "onnxruntime" not in imported
    assert onnx.load(str(out)).opset_import[0].version == 18
    # --fold-size-limit is parsed by its declaration's parser, without importing the pass.
    bad = _cli(str(src), "-o", str(out), "--fold-size-limit", "lots")
    assert bad.returncode == 2 and "invalid size 'lots'" in bad.stderr


def test_the_classes_carry_their_declarations() -> None:
    from passes import fold, pipeline
    from passes.options import parse_size

    assert pipeline.PASSES["fold"].options == fold.ConstantFoldingPass.OPTIONS
    assert pipeline.PASSES["fold"].options[0].parse is parse_size
    assert pipeline.DEFAULT_FOLD_SIZE_LIMIT == fold.DEFAULT_SIZE_LIMIT


def test_upgrade_error_is_one_class() -> None:
    import pickle

    import onnx_ir as ir

    from passes import errors
    from passes.errors import UpgradeError

    assert errors.UpgradeError is UpgradeError and issubclass(UpgradeError, ir.passes.PassError)
    assert type(pickle.loads(pickle.dumps(UpgradeError("x")))) is UpgradeError


# --- 2. untouched weights are copied by the kernel --------------------------------------------------


def _external_model(folder: pathlib.Path, sizes: dict[str, int], *, transpose: str = "") -> pathlib.Path:
    """Per weight ``w`` (square float32 of the given side, external): ``x_w -> MatMul(w) -> ReduceL2 -> y_w``.

    With ``transpose``, that weight goes through a Transpose first (fold replaces it).
    """
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    inits, nodes, inputs, outputs = [], [], [], []
    for name, side in sizes.items():
        inits.append(numpy_helper.from_array(rng.standard_normal((side, side)).astype(np.float32), name))
        weight = name
        if name == transpose:
            nodes.append(helper.make_node("Transpose", [name], [f"{name}_t"], perm=[1, 0]))
            weight = f"{name}_t"
        nodes.append(helper.make_node("MatMul", [f"x_{name}", weight], [f"h_{name}"]))
        nodes.append(helper.make_node("ReduceL2", [f"h_{name}"], [f"y_{name}"], axes=[-1]))
        inputs.append(helper.make_tensor_value_info(f"x_{name}", TensorProto.FLOAT, [2, side]))
        outputs.append(helper.make_tensor_value_info(f"y_{name}", TensorProto.FLOAT, [2, 1]))
    graph = helper.make_graph(nodes, "external", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    path = folder / "m.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, location="m.onnx.data", size_threshold=1024)
    return path


def _external_bytes(path: pathlib.Path) -> dict[str, bytes]:
    """Each external initializer's bytes, read from its data file by its (location, offset, length)."""
    proto = onnx.load(str(path), load_external_data=False)
    found = {}
    for t in proto.graph.initializer:
        if t.data_location == TensorProto.EXTERNAL:
            info = {e.key: e.value for e in t.external_data}
            with open(path.parent / info["location"], "rb") as f:
                f.seek(int(info.get("offset", 0)))
                found[t.name] = f.read(int(info["length"]))
    return found


def _optimize(src: pathlib.Path, out: pathlib.Path, monkeypatch: pytest.MonkeyPatch, **kwargs) -> dict[str, int]:
    """Runs the pipeline without onnxruntime; returns how many bytes each method wrote."""
    from passes import pipeline
    from passes.modelio import copy as copy_module

    methods: dict[str, int] = {}
    real = copy_module.write_external_data

    def spy(*args, **kw):
        result = real(*args, **kw)
        methods.update(result)
        return result

    monkeypatch.setattr(copy_module, "write_external_data", spy)
    pipeline.optimize_file(src, out, check=pipeline.CheckOptions(enabled=False), **kwargs)
    return methods


SIZES = {"w0": 64, "w1": 600, "w2": 64}  # 16 KiB, 1.4 MiB (aligned to 64 KiB), 16 KiB


def test_untouched_external_weights_are_copied_byte_for_byte(tmp_path: pathlib.Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    src = _external_model(tmp_path / "in", SIZES)
    out = tmp_path / "out.onnx"
    methods = _optimize(src, out, monkeypatch)
    assert "python" not in methods and sum(methods.values()) == sum(4 * s * s for s in SIZES.values())
    assert _external_bytes(out) == _external_bytes(src)
    proto = onnx.load(str(out), load_external_data=False)
    offsets = {t.name: int({e.key: e.value for e in t.external_data}["offset"])
               for t in proto.graph.initializer if t.external_data}
    # onnx.save wrote them back to back: one run, copied as one range, that keeps the input's layout;
    # it starts where w1 (over 1 MiB) lands on a multiple of 64 KiB, so w0 ends where w1 starts.
    assert offsets == {"w0": (64 << 10) - 4 * 64 * 64, "w1": 64 << 10, "w2": (64 << 10) + 4 * 600 * 600}
    assert all(o % 16 == 0 for o in offsets.values())
    assert proto.opset_import[0].version == 18  # the passes ran


def test_a_changed_weight_is_written_and_the_others_copied(tmp_path: pathlib.Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    src = _external_model(tmp_path / "in", SIZES, transpose="w0")
    out = tmp_path / "out.onnx"
    methods = _optimize(src, out, monkeypatch)
    assert methods.pop("python") == 4 * 64 * 64  # the folded Transpose(w0)
    assert sum(methods.values()) == 4 * (600 * 600 + 64 * 64)  # w1 and w2, copied
    before, after = _external_bytes(src), _external_bytes(out)
    assert after["w1"] == before["w1"] and after["w2"] == before["w2"] and "w0" not in after
    folded = onnx.numpy_helper.to_array(next(t for t in onnx.load(str(out)).graph.initializer
                                             if t.name not in ("w1", "w2") and t.dims == [64, 64]))  # fmt: skip
    w0 = np.frombuffer(before["w0"], np.float32).reshape(64, 64)
    np.testing.assert_array_equal(folded, w0.T)
    from passes.verify import check

    assert check.check(src, out).ok


def test_reruns_write_identical_files(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = _external_model(tmp_path / "in", SIZES, transpose="w2")
    for name in ("a", "b"):
        _optimize(src, tmp_path / f"{name}.onnx", monkeypatch)
    a, b = tmp_path / "a.onnx", tmp_path / "b.onnx"
    assert (tmp_path / "a.onnx.data").read_bytes() == (tmp_path / "b.onnx.data").read_bytes()
    proto_a, proto_b = onnx.load(str(a), load_external_data=False), onnx.load(str(b), load_external_data=False)
    for t in proto_b.graph.initializer:  # the data file's name is the only difference
        for e in t.external_data:
            if e.key == "location":
                e.value = "a.onnx.data"
    assert proto_a.SerializeToString() == proto_b.SerializeToString()


@pytest.mark.parametrize("broken", [("copy_file_range",), ("copy_file_range", "sendfile")],
                         ids=["no copy_file_range", "neither copy_file_range nor sendfile"])
def test_without_kernel_copies_it_falls_back_to_a_plain_copy(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, broken: tuple[str, ...]
) -> None:
    import errno

    src = _external_model(tmp_path / "in", SIZES)

    def refuse(*args, **kwargs):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    for name in broken:
        monkeypatch.setattr(os, name, refuse)
    methods = _optimize(src, tmp_path / "out.onnx", monkeypatch)
    expected = "sendfile" if broken == ("copy_file_range",) else "read/write"
    assert set(methods) == {expected}
    assert _external_bytes(tmp_path / "out.onnx") == _external_bytes(src)


def _sparse_model(folder: pathlib.Path) -> tuple[pathlib.Path, np.ndarray]:
    """Three 1 MiB external weights: ``w0`` written, ``w1`` and ``w2`` (the file's end) holes of zeros."""
    folder.mkdir(parents=True, exist_ok=True)
    side, nbytes = 512, 512 * 512 * 4
    inits, nodes, outputs = [], [], []
    for i in range(3):
        tensor = TensorProto(name=f"w{i}", data_type=TensorProto.FLOAT, dims=[side, side])
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", "m.onnx.data"), ("offset", str(i * nbytes)), ("length", str(nbytes))):
            tensor.external_data.add(key=key, value=value)
        inits.append(tensor)
        nodes.append(helper.make_node("MatMul", ["x", f"w{i}"], [f"h{i}"]))
        nodes.append(helper.make_node("ReduceL2", [f"h{i}"], [f"y{i}"], axes=[-1]))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [2, 1]))
    graph = helper.make_graph(nodes, "sparse", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, side])],
                              outputs, inits)  # fmt: skip
    path = folder / "m.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), str(path))
    w0 = np.random.default_rng(0).standard_normal((side, side)).astype(np.float32)
    with open(folder / "m.onnx.data", "wb") as f:
        f.write(w0.tobytes())
        os.truncate(f.fileno(), 3 * nbytes)
    return path, w0


def test_holes_of_the_input_stay_holes_and_read_the_same(tmp_path: pathlib.Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    src, w0 = _sparse_model(tmp_path / "in")
    out = tmp_path / "out.onnx"
    methods = _optimize(src, out, monkeypatch)
    assert sum(methods.values()) == 3 * w0.nbytes and "python" not in methods
    before, after = _external_bytes(src), _external_bytes(out)
    assert after == before
    assert np.frombuffer(after["w0"], np.float32).tobytes() == w0.tobytes()
    assert after["w1"] == after["w2"] == bytes(w0.nbytes)
    data, out_data = src.with_name("m.onnx.data"), tmp_path / "out.onnx.data"
    assert out_data.stat().st_size == data.stat().st_size  # the trailing hole is there too
    if data.stat().st_blocks * 512 < 2 * w0.nbytes:  # this file system keeps holes
        assert methods["hole"] == 2 * w0.nbytes
        assert out_data.stat().st_blocks * 512 < 2 * w0.nbytes
    from passes.verify import check

    assert check.check(src, out).ok


def test_segments_cover_the_range_and_every_written_byte(tmp_path: pathlib.Path) -> None:
    from passes.modelio.copy import segments

    path = tmp_path / "f"
    with open(path, "wb") as f:
        os.truncate(f.fileno(), 4 << 20)
        os.pwrite(f.fileno(), b"\x01" * 4096, 1 << 20)
    fd = os.open(path, os.O_RDONLY)
    try:
        for offset, length in ((0, 4 << 20), (1 << 20, 4096), ((1 << 20) + 100, 10), (5, (2 << 20) - 5),
                               ((3 << 20), 1 << 20)):  # fmt: skip
            runs = list(segments(fd, offset, length))
            assert runs[0][0] == offset and sum(size for _, size, _ in runs) == length
            assert all(a[0] + a[1] == b[0] for a, b in zip(runs, runs[1:]))
            written = range(max(offset, 1 << 20), min(offset + length, (1 << 20) + 4096))
            if written:  # the written bytes are inside data runs
                assert any(start <= written.start and written.stop <= start + size
                           for start, size, data in runs if data)  # fmt: skip
    finally:
        os.close(fd)


def test_a_real_write_error_is_not_taken_for_a_missing_feature(tmp_path: pathlib.Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    from passes.errors import InputError

    src = _external_model(tmp_path / "in", SIZES)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "copy_file_range", full)
    with pytest.raises(InputError, match="No space left on device"):
        _optimize(src, tmp_path / "out.onnx", monkeypatch)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


_SLOW_COPY = """
import os, pathlib, signal, sys, time
from passes.modelio import copy
marker, argv = pathlib.Path(sys.argv[1]), sys.argv[2:]
copy.CHUNK = 1 << 16
real = os.copy_file_range
def slow(*args, **kwargs):
    marker.touch()
    time.sleep(0.1)
    return real(*args, **kwargs)
os.copy_file_range = slow
from passes.cli import command as cli
code = cli.main(argv)
for s in (signal.SIGINT, signal.SIGTERM):
    signal.signal(s, signal.SIG_IGN)
sys.exit(code)
"""


def test_an_interrupt_during_the_copy_leaves_no_partial_output(tmp_path: pathlib.Path) -> None:
    import signal
    import time

    src = _external_model(tmp_path / "in", SIZES)
    marker, out = tmp_path / "copying", tmp_path / "out" / "out.onnx"
    out.parent.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_COPY, str(marker), str(src), "-o", str(out), "--no-check",
                             "-q"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
    deadline = time.monotonic() + 240
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert marker.exists(), proc.communicate()[1]
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err.strip() == "optimize: error: interrupted; no output written"
    assert list(out.parent.iterdir()) == []  # neither the output nor the staged folder


# --- 3. one checker each way; the map-type restore does not re-read the file ----------------------


def _zipmap_model() -> onnx.ModelProto:
    out_type = helper.make_sequence_type_proto(
        helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, None)))
    graph = helper.make_graph(
        [helper.make_node("Softmax", ["x"], ["proba"], axis=1),
         helper.make_node("ZipMap", ["proba"], ["zipped"], domain="ai.onnx.ml", classlabels_int64s=[3, 7])],
        "classifier", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2])],
        [helper.make_tensor_value_info("proba", TensorProto.FLOAT, ["n", 2]), helper.make_value_info("zipped", out_type)],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("ai.onnx.ml", 1)],
                             ir_version=8)  # fmt: skip


def _count_calls(monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> list[object]:
    calls: list[object] = []
    real = getattr(owner, name)

    def counting(*args, **kwargs):
        calls.append(args[0] if args else None)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counting)
    return calls


@pytest.mark.parametrize("kind", ["inline", "external", "map types"])
def test_the_checker_runs_once_on_the_way_in_and_once_on_the_way_out(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    if kind == "external":
        src = _external_model(tmp_path / "in", SIZES)
    elif kind == "inline":
        src = _small_model(tmp_path / "m.onnx")
    else:
        src = tmp_path / "zipmap.onnx"
        onnx.save_model(_zipmap_model(), str(src))
    checks = _count_calls(monkeypatch, onnx.checker, "check_model")
    loads = _count_calls(monkeypatch, detach, "read_view")  # every read of a model file goes through it
    onnx_loads = _count_calls(monkeypatch, onnx, "load_model")
    out = tmp_path / "out.onnx"
    _optimize(src, out, monkeypatch)
    assert len(checks) == 2, checks
    assert onnx_loads == []
    # The save does not re-read what it wrote; only an external-data result's graph is read
    # back (its weights stay on disk), for the strict inference that validates it as an input.
    rereads = [out.name] if kind == "external" else []  # the staged copy, before the commit
    assert [os.path.realpath(p) for p in loads[:1]] == [os.path.realpath(src)] and [pathlib.Path(p).name for p in loads[1:]] == rereads
    if kind == "map types":
        assert onnx.load(str(out)).graph.output[1].type == _zipmap_model().graph.output[1].type


# --- 4. progress on a terminal, nothing extra on a pipe; phase times in the report --------------------


def _run_with_stderr_on_a_pty(args: list[str]) -> tuple[int, str, str]:
    import pty

    master, slave = pty.openpty()
    env = dict(os.environ, COLUMNS="200")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    proc = subprocess.Popen([sys.executable, "-m", "passes", *args], stdout=subprocess.PIPE, stderr=slave,
                            text=True, env=env)  # fmt: skip
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    out = proc.stdout.read()
    proc.wait(timeout=300)
    return proc.returncode, out, b"".join(chunks).decode(errors="replace")


def test_progress_shows_on_a_terminal_only(tmp_path: pathlib.Path) -> None:
    src = _external_model(tmp_path / "in", SIZES)
    report = tmp_path / "r.json"
    args = [str(src), "-o", str(tmp_path / "out.onnx"), "--no-check", "--report", str(report)]
    code, out, err = _run_with_stderr_on_a_pty(args)
    assert code == 0, err
    # Each line is redrawn in place ("\r", erase to the end): what stays is the last drawing.
    lines = [line.rstrip("\r").rsplit("\r", 1)[-1].replace("\x1b[K", "") for line in err.split("\n")]
    assert any(re.fullmatch(r"optimize: loading .*m\.onnx: \d+\.\d\d s", line) for line in lines), lines
    # Each pass: the nodes it handled and the rate.
    assert any(re.fullmatch(r"optimize: running upgrade: [\d,]+ nodes in \d+\.\d\d s \([\d,]+ nodes/s\)", line)
               for line in lines), lines  # fmt: skip
    saved = [line for line in lines if line.startswith("optimize: saving")]
    assert saved and re.search(r": 1\.4 MiB in \d+\.\d\d s \(.*/s\)$", saved[0]), saved
    assert "op type" in out  # the report itself is on stdout
    phases = json.loads(report.read_text())["phases"]
    assert list(phases) == ["load", "passes", "save", "check"] and all(v >= 0 for v in phases.values())
    # -q: nothing at all; a pipe: no progress (the report on stdout as before).
    quiet = _run_with_stderr_on_a_pty([*args, "-q"])
    assert quiet[0] == 0 and quiet[2] == "" and quiet[1] == ""
    piped = _cli(*args)
    assert piped.returncode == 0 and piped.stderr == "" and "op type" in piped.stdout


def test_terminal_progress_reports_bytes_and_rate() -> None:
    import io

    from passes.cli.progress import TerminalProgress, format_bytes

    stream = io.StringIO()
    progress = TerminalProgress(stream, interval=0)
    progress.start("saving out.onnx", 4 << 20, "B")
    progress.advance(1 << 20)
    progress.advance(3 << 20)
    progress.close()
    text = stream.getvalue()
    assert "1.0 MiB of 4.0 MiB (25%)" in text
    assert re.search(r"\d [KMGT]?i?B/s", text)  # the rate's unit depends on how fast the machine is
    assert re.search(r"saving out\.onnx: 4\.0 MiB in \d+\.\d\d s \(.*/s\)\n$", text)
    assert (format_bytes(0), format_bytes(1536), format_bytes(15 << 30)) == ("0 B", "1.5 KiB", "15.0 GiB")


def test_each_pass_reports_the_nodes_it_handles(tmp_path: pathlib.Path) -> None:
    """A pass's progress line counts the nodes it has handled (and the rate), for every pass that walks them."""
    from passes import pipeline
    from passes.phases import Listener

    class Recorder(Listener):
        def __init__(self) -> None:
            self.lines: list[list] = []

        def start(self, message: str, total: int | None = None, unit: str = "") -> None:
            self.lines.append([message, unit, 0])

        def advance(self, amount: int) -> None:
            self.lines[-1][2] += amount

    src = _small_model(tmp_path / "m.onnx")
    recorder = Recorder()
    pipeline.optimize_file(src, tmp_path / "out.onnx", check=pipeline.CheckOptions(enabled=False), progress=recorder)
    nodes = len(onnx.load(str(src)).graph.node)
    counted = {message: done for message, unit, done in recorder.lines if unit == "nodes"}
    for name in ("upgrade", "fold", "simplify"):
        assert counted.get(f"running {name}", 0) >= nodes, recorder.lines


def test_terminal_progress_reports_nodes_and_rate() -> None:
    import io

    from passes.cli.progress import TerminalProgress

    stream = io.StringIO()
    progress = TerminalProgress(stream, interval=0)
    progress.start("running fold", None, "nodes")
    progress.advance(1000)
    progress.advance(500)
    progress.close()
    text = stream.getvalue()
    assert "running fold: 1,000 nodes, " in text and " nodes/s, " in text
    assert re.search(r"running fold: 1,500 nodes in \d+\.\d\d s \([\d,]+ nodes/s\)\n$", text)


def test_a_data_file_cut_short_after_validation_fails_the_copy(tmp_path: pathlib.Path) -> None:
    import errno

    from passes.modelio.copy import Copier

    src, dst = tmp_path / "src", tmp_path / "dst"
    src.write_bytes(b"\x01" * 1000)
    with open(src, "rb") as s, open(dst, "wb") as d:
        with pytest.raises(OSError, match="ended 24 bytes early") as raised:
            Copier().copy(s.fileno(), 24, d.fileno(), 0, 1000)
    assert raised.value.errno == errno.EIO
