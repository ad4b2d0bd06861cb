"""The house: a new pass is one module plus one registration line; every route refuses alike.

* A toy pass declared in this module (its class, one option) and registered
  with one line gets its CLI flag, ``--help`` entry, API keyword and report
  stats from that alone, and joins the one pass loop where it says it repeats.
* ``build_pass_manager``, ``passes.optimize`` and the command refuse the same
  bad requests with the same message.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any, ClassVar

import helpers
import house_imports
import numpy as np
import onnx
import onnx_ir as ir
import pytest

import passes
from passes import pipeline
from passes.base import Pass
from passes.cli import command as cli
from passes.declarations import PassSpec
from passes.options import Option, parse_int

DEMO = pathlib.Path(__file__).resolve().parent.parent / "models" / "demo.onnx"
X = {"x": np.random.default_rng(7).standard_normal((3, 4, 8)).astype(np.float32)}


class RenameNodesPass(Pass):
    """A toy pass: prefixes every main-graph node name (computes nothing new), counting the names."""

    NAME: ClassVar[str] = "rename"
    DESCRIPTION: ClassVar[str] = "prefix node names (a test's toy pass)"
    OPTIONS: ClassVar[tuple[Option, ...]] = (
        Option("rename_limit", 1000, "rename at most this many nodes", parse=parse_int, metavar="N",
               check=lambda n: None if n >= 0 else "must be >= 0"),
    )  # fmt: skip

    def __init__(self, rename_limit: int = 1000) -> None:
        super().__init__()
        self.rename_limit = rename_limit
        self.stats: dict[str, Any] = {}

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        renamed = 0
        for node in list(model.graph)[: self.rename_limit]:
            if node.name and not node.name.startswith("toy_"):
                node.name = f"toy_{node.name}"
                renamed += 1
        self.stats = {"applied": {"rename": renamed}}
        return ir.passes.PassResult(model, modified=bool(renamed))


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(pipeline.PASSES, "rename", PassSpec.of(RenameNodesPass))  # the one registration line


def test_a_toy_pass_gets_its_flag_help_keyword_and_stats(toy: None, tmp_path: pathlib.Path, capsys) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    help_text = capsys.readouterr().out
    assert "rename     prefix node names (a test's toy pass)" in help_text
    assert "--rename-limit N" in help_text and "rename at most this many nodes" in help_text

    out, report = tmp_path / "o.onnx", tmp_path / "r.json"
    code = cli.main([str(DEMO), "-o", str(out), "--passes", "upgrade,rename", "--rename-limit", "2",
                     "--report", str(report), "-q"])  # fmt: skip
    assert code == 0
    runs = {r["name"]: r for r in json.loads(report.read_text())["passes"]}
    assert runs["rename"]["stats"] == {"applied": {"rename": 2}} and runs["rename"]["modified"] is True
    names = [n.name for n in onnx.load(str(out)).graph.node]
    assert sum(name.startswith("toy_") for name in names) == 2

    result = passes.optimize(onnx.load(str(DEMO)), passes=["rename"], rename_limit=1)  # the API keyword
    assert sum(n.name.startswith("toy_") for n in result.graph.node) == 1
    for expected, actual in zip(helpers.ort_run(str(DEMO), X), helpers.ort_run(result, X)):
        np.testing.assert_array_equal(actual, expected)

    assert cli.main([str(DEMO), "-o", str(out), "--passes", "rename", "--rename-limit", "-1", "-q"]) == 2
    assert "--rename-limit -1: must be >= 0" in capsys.readouterr().err


def test_a_repeating_toy_pass_joins_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Declared ``REPEATS``, it runs in the fold/simplify loop until a round changes nothing."""

    class Repeating(RenameNodesPass):
        REPEATS = True

    monkeypatch.setitem(pipeline.PASSES, "rename", PassSpec.of(Repeating))
    model = ir.load(DEMO)
    runs = {r.name: r for r in pipeline.optimize_model(model, ["fold", "rename", "simplify"])}
    # Round 1 renames; round 2 finds nothing to do in either pass, so the loop stops.
    assert runs["rename"].stats["rounds"] == 2 and runs["fold"].stats["rounds"] == 2
    assert runs["rename"].stats["applied"]["rename"] >= len(model.graph) > 0  # counters summed over rounds
    assert all(n.name.startswith("toy_") for n in model.graph)


def _opset(version: int) -> onnx.ModelProto:
    model = onnx.load(str(DEMO))
    return passes.optimize(model, passes=["upgrade"], target_opset=version)


BAD_REQUESTS = {
    "target below the model's": (dict(passes=["upgrade"], target_opset=18), "--target-opset 18 is lower than the "
                                 "model's opset 19; this tool never lowers an opset"),
    "option of a pass that does not run": (dict(passes=["fold"], fuse=False),
                                           "--no-fuse is an option of simplify, which does not run"),
    "unknown pass": (dict(passes=["fold", "nope"]), "unknown pass 'nope'"),
    "refused value": (dict(passes=["upgrade"], target_opset=0), "--target-opset 0: must be a positive opset"),
}


def _cli_args(request: dict[str, Any]) -> list[str]:
    args = ["--passes", ",".join(request["passes"])]
    if "target_opset" in request:
        args += ["--target-opset", str(request["target_opset"])]
    if request.get("fuse") is False:
        args.append("--no-fuse")
    return args


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_every_route_refuses_alike(case: str, tmp_path: pathlib.Path, capsys) -> None:
    request, message = BAD_REQUESTS[case]
    model = _opset(19)
    src = tmp_path / "m.onnx"
    onnx.save_model(model, str(src))
    before = src.read_bytes()

    with pytest.raises(passes.InputError) as api:
        passes.optimize(model, **request)
    assert message in str(api.value)

    assert message in _refusal_of_manager(request, model)

    out = tmp_path / "out.onnx"
    assert cli.main([str(src), "-o", str(out), *_cli_args(request)]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [f"optimize: error: {api.value!s}"]
    assert not out.exists() and src.read_bytes() == before


def test_the_default_target_never_lowers_and_an_explicit_one_never_silently() -> None:
    model = _opset(20)
    assert passes.optimize(model, passes=["upgrade"]).opset_import[0].version == 20  # default: left as it is
    assert "never lowers" in _refusal_of_manager(dict(passes=["upgrade"], target_opset=19), model)


def _refusal_of_manager(request: dict[str, Any], model: onnx.ModelProto) -> str:
    """The InputError building or running ``build_pass_manager(**request)`` raises (onnx_ir's
    managers wrap what a pass raises in PassErrors: the InputError is their cause)."""
    try:
        passes.build_pass_manager(**request)(ir.from_proto(model))
    except Exception as e:  # noqa: BLE001  looked into below
        seen: BaseException | None = e
        while seen is not None and not isinstance(seen, passes.InputError):
            seen = seen.__cause__
        assert seen is not None, repr(e)
        return str(seen)
    raise AssertionError("not refused")


# --- the floors: data flows down, never back up ----------------------------------------------------

REPO = pathlib.Path(__file__).resolve().parent.parent
_PASSES = {"upgrade", "fold", "simplify", "decompose", "precision", "cleanup"}
_LEAVES = {"errors", "options", "limits", "lazy", "phases", "atomic", "heap", "children"}
#: What each room of the house may import (see docs/architecture.md). Rooms are the packages and
#: top-level modules of passes/, and refimpl/.
MAY_IMPORT: dict[str, set[str]] = {
    "__main__": {"cli"},
    "cli": {"pipeline", "report", "verify", "declarations", *_LEAVES},
    "pipeline": {"runspec", "report", "verify", "modelio", "ir", "declarations", "dim_names", "shapes",
                 "pipeline_check", *_LEAVES},
    "pipeline_check": {"runspec", "report", "verify", "modelio", "ir", "declarations", "dim_names", "shapes",
                       *_LEAVES},
    "runspec": {"loop", "cleanup", "report", "declarations", "shapes", *_LEAVES},
    "loop": {"report", *_LEAVES},
    "report": {"verify", "ir", *_LEAVES},
    **{name: {"base", "declarations", "ir", "refimpl", *_LEAVES} for name in _PASSES},
    "verify": {"modelio", "ir", "declarations", *_LEAVES},
    "modelio": {"ir", *_LEAVES},
    "ir": set(_LEAVES),
    "base": {"declarations", "options"},
    "declarations": {"options"},
    "dim_names": {"errors", "options"},
    "shapes": {"ir", *_LEAVES},
    "refimpl": set(),
    **{leaf: set() for leaf in _LEAVES},
}
#: The exceptions, each with its reason.
EXCEPTIONS = {
    ("upgrade", "verify"): "verify.probe: the highest opset onnxruntime runs bounds --target-opset",
    ("decompose", "verify"): "verify.probe: ReduceLogSumExp stays where onnxruntime has no kernel for its version "
                             "and runs its function body (asked above opset 21 only)",
    ("fold", "verify"): "verify.child: fold's values are confirmed in onnxruntime's child process (the check's "
                        "own when it runs, passed by verify.child.current)",
    ("ir", "modelio"): "ir.inference serialises the attribute lists the load left in the file as their markers "
                       "(modelio.detach.swapped), so inference never decodes them",
    ("loop", "ir"): "ir.known: the types a run of the passes keeps up to date live from the loop's start to its "
                    "end, never across two runs",
    ("precision", "verify"): "verify.probe: which half kernels onnxruntime's CPU provider has; verify.check: the "
                             "check and its locator find the float32 islands (the float32 model's value ranges, "
                             "the first node that differs); verify.repro: --repro DIR when they cannot",
    ("shapes", "simplify"): "simplify.dims.derive: the value_info step names inference's fresh dims by the "
                            "equalities simplify's prover finds (one prover for both)",
    ("simplify", "verify"): "verify.probe: a fusion into a standard op is written only where onnxruntime's CPU "
                            "provider has its kernel (asked once a pattern is found)",
}


def _room(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "refimpl":
        return "refimpl"
    return parts[1] if len(parts) > 1 else "passes"


def _imports(path: pathlib.Path) -> set[str]:
    """Every module ``path`` imports (at the top, in functions, or through ``lazy_module``), but
    not under ``if TYPE_CHECKING``."""
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and "TYPE_CHECKING" in ast.unparse(block.test) for n in ast.walk(block)}  # fmt: skip
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif (isinstance(node, ast.Call) and ast.unparse(node.func) in ("lazy_module", "importlib.import_module")
              and node.args and isinstance(node.args[0], ast.Constant)):  # fmt: skip
            found.add(node.args[0].value)
    return {m for m in found if m.split(".")[0] in ("passes", "refimpl") and m != "passes.__version__"}


def test_every_room_imports_only_the_floors_below_it() -> None:
    wrong = []
    for path in sorted([*REPO.glob("passes/**/*.py"), *REPO.glob("refimpl/**/*.py")]):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        room = _room(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
        if room == "passes":  # the package's face (passes/__init__.py) names everything, lazily
            continue
        for module in _imports(path):
            target = _room(module)
            if target not in (room, "passes") and target not in MAY_IMPORT[room] and (room, target) not in EXCEPTIONS:
                wrong.append(f"{path.relative_to(REPO)} imports {module}")
    assert wrong == []


# --- the import graph: no cycles, no private reach-ins, the page drawn from it ---------------------


def test_no_module_imports_itself_back() -> None:
    """Not at run time, nor through an import for annotations (a shared type lives in the lower module)."""
    graph = house_imports.build()
    assert house_imports.house_cycles(graph) == []


def test_no_private_name_is_taken_from_another_module() -> None:
    assert house_imports.build().private == []


def test_the_finder_sees_every_kind_of_cycle_and_reach_in(tmp_path: pathlib.Path) -> None:
    """A planted package: each cycle and reach-in the rule counts is found, and nothing else."""
    files = {
        "__init__.py": "from pkg.a import A\n",
        "a.py": "from pkg import Thing\nA = 1\n",  # a name of the package's face: a -> pkg -> a
        "b.py": "from . import c\n",  # relative, a submodule
        "c.py": "def late():\n    from pkg.b import x\n",  # inside a function: counts
        "d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.e import E\n",
        "e.py": "import pkg.d\n",  # d <-> e through an annotation only: not run, refused all the same
        "f.py": "from pkg import e\n",  # a submodule, not the face: no cycle with pkg
        "g.py": ("import pkg.e as ee\nfrom pkg.lazy import lazy_module\nfrom pkg.e import _hidden, shown\n"
                 "m = lazy_module('pkg.f')\nee._x, m._y, ee.__name__, pkg.e._z\n"),
        "lazy.py": "",
        "h.py": "from pkg.lazy import lazy_module\nback = lazy_module('pkg.i')\n",
        "i.py": "import pkg.h\n",  # h <-> i through lazy_module (an import at first use)
    }
    for name, text in files.items():
        (tmp_path / "pkg").mkdir(exist_ok=True)
        (tmp_path / "pkg" / name).write_text(text)
    graph = house_imports.build(tmp_path, ["pkg"])
    assert house_imports.cycles(graph.edges) == [["pkg", "pkg.a"], ["pkg.b", "pkg.c"], ["pkg.h", "pkg.i"]]
    assert ["pkg.d", "pkg.e"] not in house_imports.cycles(graph.edges)
    assert house_imports.house_cycles(graph) == [["pkg", "pkg.a"], ["pkg.b", "pkg.c"], ["pkg.d", "pkg.e"],
                                                 ["pkg.h", "pkg.i"]]
    assert "`pkg.d` ↔ `pkg.e`" in house_imports.summary(graph)
    # A package whose only cycle goes through an annotation fails the check (exit 1), one without passes.
    for name, text in {"d.py": files["d.py"], "e.py": files["e.py"]}.items():
        (tmp_path / "typed").mkdir(exist_ok=True)
        (tmp_path / "typed" / name).write_text(text.replace("pkg.", "typed."))
    assert house_imports.main(tmp_path, ["typed"]) == 1
    (tmp_path / "typed" / "d.py").write_text("from typing import TYPE_CHECKING\n")
    assert house_imports.main(tmp_path, ["typed"]) == 0
    assert graph.edges["pkg.f"] == {"pkg.e"}
    assert graph.private == ["pkg.g imports pkg.e._hidden", "pkg.g uses pkg.e._x", "pkg.g uses pkg.e._z",
                             "pkg.g uses pkg.f._y"]
    # A long chain closed at its end is one component (the finder does not recurse).
    chain = {f"m{k}": {f"m{k + 1}"} for k in range(3000)} | {"m3000": {"m0"}}
    assert house_imports.cycles(chain) == [sorted(chain)]


def test_the_architecture_page_holds_the_generated_import_graph() -> None:
    import subprocess
    import sys

    page = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    marker = "<!-- import-graph -->"
    assert page.count(marker) == 2
    held = page.split(marker)[1].strip()
    printed = subprocess.run([sys.executable, str(REPO / "tests" / "house_imports.py")], capture_output=True,
                             text=True, check=True).stdout.strip()
    assert held == printed, "docs/architecture.md: paste `python tests/house_imports.py` between the markers"


# --- modules a reader holds at once ----------------------------------------------------------------

#: The most lines a module of passes/ or refimpl/ may have: the house keeps them under ~450 and splits
#: a longer one along a seam it already shows (each part with a docstring saying what it owns).
MAX_MODULE_LINES = 460


def _long_modules(root: pathlib.Path, limit: int = MAX_MODULE_LINES) -> dict[str, int]:
    """The modules under ``root``'s passes/ and refimpl/ of more than ``limit`` lines, with their lengths."""
    found = {}
    for path in sorted([*root.glob("passes/**/*.py"), *root.glob("refimpl/**/*.py")]):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > limit:
            found[path.relative_to(root).as_posix()] = lines
    return found


def test_no_module_is_longer_than_a_reader_holds_at_once(tmp_path: pathlib.Path) -> None:
    assert _long_modules(REPO) == {}
    # The count sees a planted module one line over, in a subpackage too, and not one at the limit.
    (tmp_path / "passes" / "deep").mkdir(parents=True)
    (tmp_path / "refimpl").mkdir()
    (tmp_path / "passes" / "deep" / "long.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    (tmp_path / "refimpl" / "fits.py").write_text("x = 1\n" * MAX_MODULE_LINES)
    assert _long_modules(tmp_path) == {"passes/deep/long.py": MAX_MODULE_LINES + 1}
