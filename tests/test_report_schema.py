"""``--report FILE.json`` in every outcome, against docs/report.schema.json and the README's list of fields.

Each outcome is the command as a user types it: a success, a check that fails, a check that
cannot run (NOT CHECKED), ``--no-check``, ``--require-check`` without a check, a ``--precision``
search that fails (its rounds, islands and errors are in the report), and refusals after the
load (a static shape the model cannot take, a pass that refuses the model). Every field the
schema lists is there, with its type, and no other; ``check`` is always an object with
``checked``, ``ok`` and ``reason``. The validator is a small one written here (no
``jsonschema`` dependency): types, ``required``, ``additionalProperties``, ``items``,
``enum``, ``anyOf`` and local ``$ref``.

The report is never written over a file the run reads (the model, its external data, the
``--inputs`` archive).
"""

from __future__ import annotations

import json
import pathlib
import re
import shutil
from typing import Any

import numpy as np
import onnx
import pytest

from helpers import optimize_command

REPO = pathlib.Path(__file__).resolve().parent.parent
SCHEMA = json.loads((REPO / "docs" / "report.schema.json").read_text(encoding="utf-8"))
DEMO = REPO / "models" / "demo.onnx"
CNN = REPO / "models" / "real" / "small_cnn_opset11_nofold.onnx"
CNN13 = REPO / "models" / "real" / "small_cnn_opset13.onnx"

_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def _is(value: Any, kind: str) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, _TYPES[kind])


def violations(value: Any, schema: dict[str, Any], path: str = "$") -> list[str]:
    """Where ``value`` breaks ``schema`` (a subset of JSON Schema: see the module docstring)."""
    if "$ref" in schema:
        schema = SCHEMA["$defs"][schema["$ref"].rsplit("/", 1)[1]]
    if "anyOf" in schema:
        found = [violations(value, option, path) for option in schema["anyOf"]]
        return [] if any(not f for f in found) else [f"{path}: matches none of anyOf ({found[0][0]})"]
    wrong: list[str] = []
    if "enum" in schema and value not in schema["enum"]:
        wrong.append(f"{path}: {value!r} not in {schema['enum']}")
    if "type" in schema:
        kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_is(value, k) for k in kinds):
            return [*wrong, f"{path}: {type(value).__name__} is not {kinds}"]
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        wrong += [f"{path}: no {key!r}" for key in schema.get("required", []) if key not in value]
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            if key in properties:
                wrong += violations(item, properties[key], f"{path}.{key}")
            elif extra is False:
                wrong.append(f"{path}: {key!r} is not in the schema")
            elif isinstance(extra, dict):
                wrong += violations(item, extra, f"{path}.{key}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            wrong += violations(item, schema["items"], f"{path}[{i}]")
    return wrong


def test_the_validator_catches_what_it_must() -> None:
    assert violations({"input": "m"}, SCHEMA)  # fields missing
    good = {"name": "x", "dtype": None, "shape": [1, "n", None]}
    assert violations(good, {"$ref": "#/$defs/signature"}) == []
    assert violations({**good, "extra": 1}, {"$ref": "#/$defs/signature"}) == ["$: 'extra' is not in the schema"]
    assert violations({**good, "shape": [1.5]}, {"$ref": "#/$defs/signature"})
    assert violations(True, {"type": "integer"}) and violations("ok?", {"enum": ["ok"]})


#: (outcome, command after ``optimize``, exit code, status, written, checked, ok, a word of check.reason)
OUTCOMES = [
    ("success", [str(DEMO), "o.onnx"], 0, "ok", True, True, True, None),
    ("fusions refused", [str(CNN), "o.onnx", "--rtol", "0", "--atol", "0"], 0, "ok", True, True, True, None),
    ("check failed", [str(CNN), "o.onnx", "--rtol", "0", "--atol", "0", "--no-unfused-fallback"], 1, "check failed", False, True, False,
     "check failed"),
    ("check failed, --repro", [str(CNN), "o.onnx", "--rtol", "0", "--atol", "0", "--no-unfused-fallback", "--repro",
                               "repro"], 1,
     "check failed", False, True, False, "check failed"),
    ("not checked", [str(DEMO), "o.onnx", "--dim", f"batch={10**9}"], 0, "not checked", True, False, None,
     "inputs"),
    ("--no-check", [str(DEMO), "o.onnx", "--no-check"], 0, "not checked", True, False, None, "--no-check"),
    ("--require-check", [str(DEMO), "o.onnx", "--dim", f"batch={10**9}", "--require-check"], 1, "check failed",
     False, False, None, "inputs"),
    ("--precision failure", [str(CNN13), "o.onnx", "--precision", "fp16", "--precision-tolerance", "1e-9,0"], 1,
     "check failed", False, False, None, "not run"),
    ("refusal after load", [str(DEMO), "o.onnx", "--input-shape", "x:2,4,9"], 2, "error", False, False, None,
     "not run"),
    ("a pass refuses", [str(DEMO), "o.onnx", "--target-opset", "12"], 2, "error", False, False, None, "not run"),
]


@pytest.mark.parametrize(("outcome", "args", "code", "status", "written", "checked", "ok", "reason"), OUTCOMES,
                         ids=[o[0] for o in OUTCOMES])  # fmt: skip
def test_every_outcome_writes_the_report_with_every_field(outcome: str, args: list[str], code: int, status: str,
                                                          written: bool, checked: bool, ok: bool | None,
                                                          reason: str | None, tmp_path: pathlib.Path) -> None:  # fmt: skip
    proc = optimize_command(*args, "--report", "r.json", "-q", cwd=tmp_path)
    assert proc.returncode == code, proc.stderr
    report = json.loads((tmp_path / "r.json").read_text(encoding="utf-8"))
    assert violations(report, SCHEMA) == []
    assert (report["status"], report["written"]) == (status, written)
    assert (tmp_path / "o.onnx").exists() == written
    check = report["check"]
    assert (check["checked"], check["ok"]) == (checked, ok)
    assert (check["reason"] is None) == (reason is None) and (reason is None or reason in check["reason"]), check
    errors = [line for line in proc.stderr.splitlines() if line.startswith("optimize: error: ")]
    if code:
        assert report["error"] and errors and errors[0] == f"optimize: error: {report['error'].splitlines()[0]}"
    else:
        assert report["error"] is None and not errors
    if outcome == "check failed, --repro":  # what was written, and the command that compares it again
        assert check["repro"]["written"] and check["repro"]["rerun"] and (tmp_path / "repro" / "original.onnx").exists()
    else:
        assert check["repro"] is None
    if outcome == "--precision failure":  # what the search did, to read and act on
        (precision,) = [p for p in report["passes"] if p["name"] == "precision"]
        assert precision["error"] and precision["stats"]["check_rounds"] > 1 and precision["stats"]["islands"]
        assert set(precision["stats"]["max_abs_error"]) == {"log_probs", "features"}
        assert report["after"] is None and "--precision fp16" in report["error"]
    if outcome == "fusions refused":  # the same passes without them, written
        assert check["without_fusions"]["unfused_check"] == "passed" and check["without_fusions"]["fused"] > 0
    else:
        assert check["without_fusions"] is None
    if outcome == "a pass refuses":
        assert report["passes"][-1]["name"] == "upgrade" and "never lowers" in report["passes"][-1]["error"]


def test_the_readme_lists_the_report_fields_of_the_schema() -> None:
    """The README's "fields to assert" name the schema's top-level and check fields, and link the schema."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    paragraph = text[text.index("The fields to assert"):]
    paragraph = paragraph[: paragraph.index("\n\n")]
    named = set(re.findall(r"`([a-z_.\[\]]+)`", paragraph))
    for field in ("written", "status", "error"):
        assert field in named, field
    for field in ("checked", "ok", "reason"):
        assert f"check.{field}" in named, field
    dotted = {f for f in named if "." in f}
    assert all(f.split(".")[0] in SCHEMA["properties"] for f in dotted), dotted
    assert "docs/report.schema.json" in paragraph


@pytest.mark.parametrize("target", ["model", "inputs", "data"])
def test_the_report_is_never_written_over_a_file_the_run_reads(target: str, tmp_path: pathlib.Path) -> None:
    """``--report`` naming the model, its external data or the ``--inputs`` archive is refused (exit 2),
    and the file is left as it was; so is OUTPUT naming the ``--inputs`` archive."""
    model = tmp_path / "m.onnx"
    proto = onnx.load(str(DEMO))
    onnx.save_model(proto, str(model), save_as_external_data=target == "data", all_tensors_to_one_file=True,
                    location="m.data", size_threshold=0)  # fmt: skip
    np.savez(tmp_path / "x.npz", x=np.ones((2, 4, 8), np.float32))
    named = {"model": model, "inputs": tmp_path / "x.npz", "data": tmp_path / "m.data"}[target]
    before = named.read_bytes()
    proc = optimize_command(str(model), "o.onnx", "--inputs", "x.npz", "--report", str(named), cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.startswith("optimize: error: --report"), proc.stderr
    assert named.read_bytes() == before and not (tmp_path / "o.onnx").exists()
    if target == "inputs":
        proc = optimize_command(str(model), "x.npz", "--inputs", "x.npz", cwd=tmp_path)
        assert proc.returncode == 2 and "the file of check inputs" in proc.stderr, proc.stderr
        assert named.read_bytes() == before


def test_a_folder_report_holds_every_models_report(tmp_path: pathlib.Path) -> None:
    """``optimize DIR -o OUT --report all.json``: each model's record has its report, valid against the schema."""
    folder = tmp_path / "in"
    folder.mkdir()
    shutil.copy(DEMO, folder / "demo.onnx")
    (folder / "bad.onnx").write_bytes(b"not a model")
    proc = optimize_command(str(folder), "-o", str(tmp_path / "out"), "--report", "all.json", "--no-check", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    records = {r["model"]: r for r in json.loads((tmp_path / "all.json").read_text())["models"]}
    assert violations(records["demo.onnx"]["report"], SCHEMA) == []
    assert records["demo.onnx"]["report"]["check"]["reason"] == "--no-check"
    assert records["bad.onnx"]["report"] is None  # refused before it was loaded: no report
