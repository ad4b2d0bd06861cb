"""What the command imports at start: modules a run rarely uses are imported at their first use.

:func:`passes.lazy.defer_import` puts a stand-in in ``sys.modules`` (the command's process
only); these tests check that a stand-in runs nothing until an attribute is read, that it then
behaves as the module (attributes, submodules, a later ``import``), that an import error is
raised where the module is first used and a retry works, and that the command itself does not
import sympy (onnx_ir's symbolic-dim arithmetic) on a model that needs none of it, nor the check's
locator and reduction on a model that passes, while writing the same model as the in-process route,
which imports sympy.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


def _package(root: pathlib.Path, name: str) -> pathlib.Path:
    """A package ``name`` whose import appends a line to ``root/log`` (one per module executed)."""
    pkg = root / name
    pkg.mkdir()
    log = root / "log"
    (pkg / "__init__.py").write_text(textwrap.dedent(f"""
        open({str(log)!r}, "a").write("{name}\\n")
        VALUE = 42
        def twice(x):
            return 2 * x
    """))
    (pkg / "sub.py").write_text(textwrap.dedent(f"""
        open({str(log)!r}, "a").write("{name}.sub\\n")
        from {name} import VALUE
        PLUS = VALUE + 1
    """))
    return log


def _run(code: str, root: pathlib.Path) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(root)]))
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_deferred_module_runs_at_its_first_attribute_read(tmp_path: pathlib.Path) -> None:
    log = _package(tmp_path, "heavy_pkg")
    out = _run("""
        import pathlib, sys
        from passes.lazy import defer_import
        log = pathlib.Path(sys.path[0]).parent / "log"
        defer_import("heavy_pkg")
        import heavy_pkg
        print("before", pathlib.Path(%r).exists())
        print("value", heavy_pkg.VALUE, heavy_pkg.twice(4))
        import heavy_pkg as again
        print("same", again is sys.modules["heavy_pkg"], type(again).__name__)
        import heavy_pkg.sub
        print("sub", heavy_pkg.sub.PLUS)
    """ % str(log), tmp_path)
    assert out.split("\n")[:4] == ["before False", "value 42 8", "same True module", "sub 43"]
    assert log.read_text().split() == ["heavy_pkg", "heavy_pkg.sub"]  # each module executed once


def test_a_submodule_import_through_a_deferred_parent(tmp_path: pathlib.Path) -> None:
    log = _package(tmp_path, "heavy_pkg")
    out = _run("""
        from passes.lazy import defer_import
        defer_import("heavy_pkg")
        import heavy_pkg.sub
        print(heavy_pkg.sub.PLUS, heavy_pkg.VALUE)
    """, tmp_path)
    assert out.split() == ["43", "42"]
    assert log.read_text().split() == ["heavy_pkg", "heavy_pkg.sub"]


def test_an_import_error_surfaces_at_first_use_and_a_retry_works(tmp_path: pathlib.Path) -> None:
    _package(tmp_path, "heavy_pkg")
    init = tmp_path / "heavy_pkg" / "__init__.py"
    good = init.read_text()
    init.write_text("raise ImportError('broken on purpose')\n")
    out = _run("""
        import pathlib, sys
        from passes.lazy import defer_import
        defer_import("heavy_pkg")
        import heavy_pkg
        try:
            heavy_pkg.VALUE
        except ImportError as e:
            print("error", e)
        pathlib.Path(%r).write_text(%r)
        import importlib; importlib.invalidate_caches()
        print("retry", heavy_pkg.VALUE)
    """ % (str(init), good), tmp_path)
    assert out.split("\n")[:2] == ["error broken on purpose", "retry 42"]


def test_modules_already_imported_or_missing_are_left_alone(tmp_path: pathlib.Path) -> None:
    out = _run("""
        import sys, json
        from passes.lazy import defer_import
        defer_import("json", "no_such_module_here", "json.decoder")
        print(sys.modules["json"] is json, "no_such_module_here" in sys.modules,
              type(sys.modules["json.decoder"]).__name__)
    """, tmp_path)
    assert out.split() == ["True", "False", "module"]


def test_the_command_does_not_import_sympy_and_writes_what_the_api_writes(tmp_path: pathlib.Path) -> None:
    import passes

    demo = REPO / "models" / "demo.onnx"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "passes", str(demo), "-o",
                           str(tmp_path / "cli.onnx"), "-q"], env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "onnx_ir" in imported
    assert not {name for name in imported if name == "sympy" or name.startswith("sympy.")}
    # The check runs, but what follows a difference (the locator, --repro's search) is not imported.
    assert "passes.verify.check" in imported
    assert not imported & {"passes.verify.locate", "passes.verify.reduce", "passes.verify.region"}
    passes.optimize_file(str(demo), str(tmp_path / "api.onnx"))
    assert "sympy" in sys.modules  # imported with onnx_ir in this process: the same model either way
    assert (tmp_path / "cli.onnx").read_bytes() == (tmp_path / "api.onnx").read_bytes()
