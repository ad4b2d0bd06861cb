"""The large-model benchmark's own machinery: stopping another tool, checking what a tool wrote.

``bench_large`` can run the other tools on a 6 GiB model, where most of them load
every weight: ``_run_capped`` must stop one past its memory cap or its time
limit and say so, and ``_check_output`` must refuse an output whose external
data is not there. The model's weights are dense (every block written, no
value 0 or 1, no two weights equal): a sparse file would let a copy skip them.
One small end-to-end run (one 64 MiB weight, no other tool, the page cache
left warm) checks that ours is measured, checked and reported as opset 18 with
all its weight bytes.
"""

from __future__ import annotations

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))
import bench_large  # noqa: E402

_ALLOCATE = "import time\nblocks = []\nwhile True:\n    blocks.append(bytearray(16 << 20))\n    time.sleep(0.01)\n"


def test_a_tool_past_the_memory_cap_is_stopped() -> None:
    run = bench_large._run_capped([sys.executable, "-c", _ALLOCATE], rss_cap_kib=200 << 10, timeout=60)
    assert run["exit"] == -9
    assert run["error"].startswith("stopped past")
    assert run["peak_rss_mib"] >= 200


def test_a_tool_past_the_time_limit_is_stopped() -> None:
    run = bench_large._run_capped([sys.executable, "-c", "import time; time.sleep(60)"], 1 << 30, timeout=1)
    assert run["exit"] == -9
    assert run["error"] == "stopped after 1 s"
    assert run["seconds"] < 30


def test_a_failing_tool_reports_its_last_error_line() -> None:
    run = bench_large._run_capped([sys.executable, "-c", "raise SystemExit('no luck')"], 1 << 30, timeout=60)
    assert run["exit"] == 1
    assert run["error"] == "no luck"


def test_an_output_without_its_external_data_is_not_valid(tmp_path: pathlib.Path) -> None:
    src = bench_large.build_model(tmp_path, 1)
    assert bench_large._check_output(src)["valid"]  # the data file is there
    (tmp_path / "model.onnx.data").unlink()
    checked = bench_large._check_output(src)
    assert not checked["valid"]
    assert checked["check_error"]


def test_the_weights_are_dense_random_and_different(tmp_path: pathlib.Path) -> None:
    import numpy as np

    src = bench_large.build_model(tmp_path, 2)
    data = tmp_path / "model.onnx.data"
    info = data.stat()
    assert info.st_size == 2 * bench_large.WEIGHT_BYTES
    assert info.st_blocks * 512 >= info.st_size  # no hole
    values = np.fromfile(data, dtype=np.float32).reshape(2, -1)
    assert np.all((values > 0) & (values < 1)) and np.all(values != 0) and np.all(values != 1)
    assert not np.array_equal(values[0], values[1])
    assert len(np.unique(values[0][:4096])) > 4000  # not a repeated pattern
    assert src.exists()


def test_one_weight_end_to_end(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "large.json"
    code = bench_large.main(["--weights", "1", "--pairs", "1", "--cache", "warm", "--settle", "0",
                             "--dir", str(tmp_path), "--json", str(out)])  # fmt: skip
    assert code == 0
    saved = json.loads(out.read_text())
    assert saved["meta"]["cache"] == "warm" and saved["meta"]["dense"]
    assert saved["meta"]["optimize_over_cp"] > 0
    summary = saved["summary"]
    assert summary["optimize"]["ok"]
    assert summary["optimize"]["opset"] == 18
    assert summary["optimize"]["data_bytes"] == bench_large.WEIGHT_BYTES
    assert summary["cp"]["data_bytes"] == bench_large.WEIGHT_BYTES
    assert set(summary) == {"optimize", "cp"}  # no other tool by default
    assert list(tmp_path.iterdir()) == [out]  # the model and the copies are removed


def test_a_baseline_checkout_runs_in_each_round(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "large.json"
    repo = pathlib.Path(bench_large.REPO)
    code = bench_large.main(["--weights", "1", "--pairs", "1", "--cache", "warm", "--settle", "0",
                             "--dir", str(tmp_path), "--baseline", str(repo), "--json", str(out)])  # fmt: skip
    assert code == 0
    saved = json.loads(out.read_text())
    assert set(saved["summary"]) == {"optimize", "baseline", "cp"}
    assert saved["summary"]["baseline"]["ok"] and saved["summary"]["baseline"]["opset"] == 18
    assert len(saved["meta"]["baseline_pair_ratios"]) == 1


def test_the_baseline_runs_its_own_code(tmp_path: pathlib.Path, monkeypatch) -> None:
    """``python -m passes`` imports from the working folder first: the baseline's child runs in its
    checkout, so its code runs whatever folder the benchmark was started from (here this repository)."""
    fake = tmp_path / "fake"
    (fake / "passes").mkdir(parents=True)
    (fake / "passes" / "__init__.py").write_text("")
    (fake / "passes" / "__main__.py").write_text(
        "import pathlib, sys\npathlib.Path(__file__).with_name('ran').write_text('yes')\nsys.exit(3)\n")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(bench_large.REPO)
    code = bench_large.main(["--weights", "1", "--pairs", "1", "--cache", "warm", "--settle", "0",
                             "--dir", str(work), "--baseline", str(fake), "--json", str(tmp_path / "r.json")])  # fmt: skip
    assert code == 0  # ours and cp ran
    assert (fake / "passes" / "ran").read_text() == "yes"
    saved = json.loads((tmp_path / "r.json").read_text())
    assert not saved["summary"]["baseline"]["ok"] and saved["summary"]["optimize"]["ok"]
