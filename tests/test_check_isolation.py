"""The check runs onnxruntime in a child process: a crash, a hang, a signal or the memory bound stays there."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from passes import cli, pipeline

INT_MIN = np.iinfo(np.int32).min


def sigfpe_model(divisor: int = -1) -> onnx.ModelProto:
    """Div(INT_MIN, divisor) computed from an input (so nothing folds it): with -1, onnxruntime's
    integer division traps (SIGFPE)."""
    nodes = [
        helper.make_node("Mul", ["x", "zero"], ["x0"], name="zeroed"),
        helper.make_node("Add", ["x0", "int_min"], ["num"], name="num"),
        helper.make_node("Add", ["x0", "divisor"], ["den"], name="den"),
        helper.make_node("Div", ["num", "den"], ["y"], name="div"),
    ]
    inits = [numpy_helper.from_array(np.array(0, np.int32), "zero"),
             numpy_helper.from_array(np.array(INT_MIN, np.int32), "int_min"),
             numpy_helper.from_array(np.array(divisor, np.int32), "divisor")]
    graph = helper.make_graph(nodes, "sigfpe", [helper.make_tensor_value_info("x", TensorProto.INT32, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, [2])], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def endless_loop_model(trips: int = 10**9) -> onnx.ModelProto:
    """A Loop with a constant trip count of ``trips`` adding 1 each time."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Add", ["v_in", "one"], ["v_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [4])],
        initializer=[numpy_helper.from_array(np.ones(4, np.float32), "one")],
    )  # fmt: skip
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "cond", "x"], ["y"], name="loop", body=body)], "loop",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        initializer=[numpy_helper.from_array(np.array(trips, np.int64), "trips"),
                     numpy_helper.from_array(np.array(True), "cond")],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _leftovers(folder: pathlib.Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def _workers_of(parent: int) -> list[int]:
    """Live check processes started by ``parent`` (they carry its pid on their command line)."""
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(b"passes.verify.worker" in arg for arg in argv) and str(parent).encode() in argv:
            found.append(int(entry.name))
    return found


def test_a_model_that_crashes_onnxruntime_is_not_checked_cleanly(tmp_path: pathlib.Path, capsys) -> None:
    src, out, report = tmp_path / "fpe.onnx", tmp_path / "out.onnx", tmp_path / "r.json"
    onnx.save_model(sigfpe_model(), str(src))
    assert cli.main([str(src), "-o", str(out), "--report", str(report), "-q"]) == 0
    err = capsys.readouterr().err
    assert "NOT CHECKED: the check did not run: onnxruntime crashed (SIGFPE) while running the original" in err
    assert out.exists() and _leftovers(tmp_path) == []
    assert json.loads(report.read_text())["check"]["checked"] is False
    out.unlink()
    assert cli.main([str(src), "-o", str(out), "--require-check", "-q"]) == 1
    assert "SIGFPE" in capsys.readouterr().err
    assert not out.exists() and _leftovers(tmp_path) == []


class _Divisor(ir.passes.InPlacePass):
    """Test-only: turns the divisor 1 into -1, so that the optimised model traps where the original ran."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        model.graph.initializers["divisor"].const_value = ir.tensor(np.array(-1, np.int32), name="divisor")
        return ir.passes.PassResult(model, modified=True)


def test_a_crash_of_the_optimised_model_only_fails_the_check(tmp_path: pathlib.Path, monkeypatch,
                                                             capsys) -> None:  # fmt: skip
    monkeypatch.setitem(pipeline.PASSES, "divisor", pipeline.PassSpec("divisor", "test only", lambda o: _Divisor()))
    src, out, report = tmp_path / "fpe.onnx", tmp_path / "out.onnx", tmp_path / "r.json"
    onnx.save_model(sigfpe_model(divisor=1), str(src))
    assert cli.main([str(src), "-o", str(out), "--passes", "upgrade,divisor", "--report", str(report), "-q"]) == 1
    err = capsys.readouterr().err
    assert "onnxruntime crashed (SIGFPE) while running the optimised model, where the original ran" in err
    found = json.loads(report.read_text())["check"]["first_difference"]
    assert found["pass_name"] == "divisor"  # the bisection restarts the child after the crash
    assert not out.exists() and _leftovers(tmp_path) == []


def test_an_endless_loop_times_out_cleanly(tmp_path: pathlib.Path, capsys) -> None:
    from passes.fold import confirm

    confirm.close_idle()  # the one idle child an earlier in-process run of fold may have kept
    src, out = tmp_path / "loop.onnx", tmp_path / "out.onnx"
    onnx.save_model(endless_loop_model(), str(src))
    assert cli.main([str(src), "-o", str(out), "--check-timeout", "2", "-q"]) == 0
    err = capsys.readouterr().err
    assert "NOT CHECKED: the check did not run: it did not finish within 2 s (running the original model" in err
    assert "--check-timeout" in err and _leftovers(tmp_path) == []
    assert _workers_of(os.getpid()) == []


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_the_check_kills_the_child_and_exits_cleanly(tmp_path: pathlib.Path, signum: int) -> None:
    src, out = tmp_path / "loop.onnx", tmp_path / "out.onnx"
    onnx.save_model(endless_loop_model(), str(src))
    proc = subprocess.Popen([sys.executable, "-m", "passes", str(src), "-o", str(out), "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 60
    while not _workers_of(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    workers = _workers_of(proc.pid)
    assert workers, "the check's process did not start"
    time.sleep(0.5)  # inside onnxruntime's long native call by now
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)  # a hang guard: the parent must not wait for the child
    assert proc.returncode == 128 + signum, err
    assert "interrupted; no output written" in err and "Traceback" not in err
    time.sleep(0.2)
    assert [w for w in workers if pathlib.Path(f"/proc/{w}").exists()] == []
    assert not out.exists() and _leftovers(tmp_path) == []


def test_the_memory_bound_is_a_clean_not_checked(tmp_path: pathlib.Path, capsys) -> None:
    src = tmp_path / "m.onnx"
    onnx.save_model(endless_loop_model(trips=1), str(src))
    assert cli.main([str(src), "-o", str(tmp_path / "o.onnx"), "--check-memory", "32M", "-q"]) == 0
    err = capsys.readouterr().err
    assert "NOT CHECKED: the check did not run: its process" in err and "--check-memory" in err


def test_modules_in_the_callers_folder_are_not_the_checks(tmp_path: pathlib.Path, monkeypatch, capsys) -> None:
    """A file named like a module in the folder the command runs in (a user's ``onnxruntime.py``, ``numpy.py``)
    is not what the check's child or a folder's runs import: ``-c`` and ``-m`` put the current folder first on
    sys.path, and the children take it off."""
    work = tmp_path / "work"
    work.mkdir()
    for name in ("numpy", "onnxruntime", "resource"):
        (work / f"{name}.py").write_text("raise SystemExit('the caller\\'s module was imported')\n")
    src = pathlib.Path(__file__).resolve().parents[1] / "models" / "demo.onnx"
    monkeypatch.chdir(work)
    report = tmp_path / "r.json"
    assert cli.main([str(src), "-o", str(tmp_path / "o.onnx"), "--report", str(report), "-q"]) == 0
    check = json.loads(report.read_text())["check"]
    assert check["checked"] and check["ok"], check
    # A folder's runs are children too.
    (work / "in").mkdir()
    (work / "in" / "demo.onnx").write_bytes(src.read_bytes())
    assert cli.main([str(work / "in"), "-o", str(work / "out"), "--report", str(report), "-q"]) == 0
    (record,) = json.loads(report.read_text())["models"]
    assert record["exit"] == 0 and record["report"]["check"]["ok"], record
