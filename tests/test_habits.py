"""Users of onnxsim, onnxslim and polygraphy at home: their flags work here or point to ours.

* Every flag of the installed onnxsim and onnxslim (read from their own argument parsers) is
  ours, an alias of ours, or refused with one line that names ours or says there is none
  (``passes.cli.habits``); polygraphy is not installed: its flags are in the same table.
* The README's migration table is walked: each of its commands, typed as the row shows it
  (``onnxsim --skip-fuse-bn`` becomes ``optimize models/demo.onnx o.onnx --skip-fuse-bn``),
  is accepted, or refused with one line naming a flag of the row's "here" column.
* onnxsim's shape forms (several ``NAME:DIMS`` after one flag, bare ``DIMS`` for a model with one
  input), polygraphy's ``NAME:[DIMS]``, and onnxslim's ``--inputs NAME:DTYPE`` (refused with a
  pointer, not "missing file").
* No abbreviations: ``--job 2`` is not ``--jobs 2``.
"""

from __future__ import annotations

import ast
import importlib.util
import pathlib
import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import helpers
from helpers import one_error_line, optimize_command
from passes.cli import args as cli_args
from passes.cli.habits import HABITS, SHAPE_FLAGS

REPO = pathlib.Path(__file__).resolve().parent.parent
DEMO = REPO / "models" / "demo.onnx"
README = REPO / "README.md"
TOOLS = ("onnxsim", "onnxslim", "polygraphy")


def _ours() -> set[str]:
    return set(cli_args.parser()._option_string_actions)


def _onnxsim_flags() -> set[str]:
    """The option strings of ``onnxsim``'s parser, read from its source (importing onnxsim takes seconds)."""
    spec = importlib.util.find_spec("onnxsim")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("onnxsim is not installed")
    source = pathlib.Path(next(iter(spec.submodule_search_locations))) / "onnx_simplifier.py"
    flags = set()
    for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            flags.update(a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("-"))
    assert "--skip-fuse-bn" in flags and "--overwrite-input-shape" in flags  # the source was read
    return flags


def _onnxslim_flags() -> set[str]:
    argparser = pytest.importorskip("onnxslim.argparser")
    parser = argparser.OnnxSlimArgumentParser(argparser.ModelArguments, argparser.OptimizationArguments,
                                              argparser.ModificationArguments, argparser.CheckerArguments)
    flags = set(parser.parser._option_string_actions)
    assert "--inputs" in flags and "--dtype" in flags
    return flags


@pytest.mark.parametrize("tool", ["onnxsim", "onnxslim"])
def test_every_flag_of_the_installed_tools_is_ours_an_alias_or_a_pointer(tool: str) -> None:
    flags = _onnxsim_flags() if tool == "onnxsim" else _onnxslim_flags()
    ours = _ours()
    handled = ours | set(HABITS) | set(SHAPE_FLAGS)
    unknown = sorted(f for f in flags - {"-h", "--help", "-v", "--version"} if f not in handled)
    assert unknown == []
    for flag in flags & set(HABITS):
        habit = HABITS[flag]
        assert habit.ours in ours if habit.ours else habit.use, flag  # an alias of ours, or a pointer
        assert tool in habit.tools or flag not in flags, (flag, habit.tools)


def test_each_pointer_names_a_flag_of_ours_or_says_there_is_none() -> None:
    ours = _ours()
    for flag, habit in HABITS.items():
        if habit.ours:
            continue
        named = set(re.findall(r"--[a-z][a-z0-9-]*", habit.use)) | set(re.findall(r"(?<![\w-])-[qv]\b", habit.use))
        assert named <= ours, (flag, named - ours)
        assert named or "no equivalent" in habit.use or "--help" in habit.use or "drop the flag" in habit.use, flag


# --- the README's table, walked ----------------------------------------------------------------------


def migration_rows() -> list[tuple[list[str], str]]:
    """(the commands of the "you used" column, the "here" column) of each row of the README's table."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Coming from onnxsim"):]
    section = section[: section.index("\n## ", 3)]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or cells[0] in ("you used", "---"):
            continue
        used = [c for c in re.findall(r"`([^`]+)`", cells[0]) if c.split()[0] in TOOLS or c.startswith("-")]
        rows.append((used, cells[1]))
    return rows


ROWS = migration_rows()


def _as_ours(command: str, cwd: pathlib.Path) -> list[str]:
    """``onnxsim in.onnx out.onnx --skip-fuse-bn`` -> the arguments of ``optimize`` on the demo."""
    words = command.split()
    if words[0] in TOOLS:
        words = words[1:]
        while words and words[0] in ("surgeon", "sanitize", "run", "convert", "debug", "reduce"):
            words = words[1:]
    if "in.onnx" not in words:
        words = ["in.onnx", "out.onnx", *words]
    return [str(DEMO) if w == "in.onnx" else str(cwd / "o.onnx") if w == "out.onnx" else w for w in words]


def test_the_migration_table_has_its_rows() -> None:
    commands = [c for used, _ in ROWS for c in used]
    assert len(ROWS) >= 14 and len(commands) >= 30
    for flag in ("--skip-fuse-bn", "--dtype", "--model-check", "--check-rtol", "--save-as-external-data",
                 "--no-large-tensor", "--skip-optimization", "--skip-constant-folding", "--overwrite-input-shape",
                 "--inputs", "--override-input-shapes", "--fold-constants"):  # fmt: skip
        assert any(flag in c for c in commands), flag


@pytest.mark.parametrize(("used", "here"), [pytest.param(u, h, id=re.sub(r"\W+", "_", u[0])[:40])
                                            for u, h in ROWS if u])  # fmt: skip
def test_every_row_of_the_migration_table(used: list[str], here: str, tmp_path: pathlib.Path) -> None:
    """Each command of the row, as the user types it: accepted (its flags are ours or aliases), or refused
    (exit 2, one line) naming a flag of the row's "here" column, or saying the flag is not needed here."""
    ours = _ours()
    named = set(re.findall(r"--[a-z][a-z0-9-]*", here)) | set(re.findall(r"(?<![\w-])-[qv]\b", here))
    assert named <= ours | set(SHAPE_FLAGS) | {"--check-rtol", "--check-atol"}, named - ours
    for command in used:
        args = _as_ours(command, tmp_path)
        flags = [a.split("=", 1)[0] for a in args if a.startswith("-")]
        accepted = all(f in ours or HABITS.get(f) is not None and HABITS[f].ours or f in SHAPE_FLAGS for f in flags)
        checks = len(args) > 2 and args[2].isdigit()  # onnxsim's IN OUT N
        accepted = accepted and not checks and "ids:int64" not in args
        proc = optimize_command(*args, *([] if {"-v", "--verbose"} & set(flags) else ["-q"]), cwd=tmp_path)
        if accepted:
            assert proc.returncode == 0, (command, proc.stderr)
            assert (tmp_path / "o.onnx").exists()
            (tmp_path / "o.onnx").unlink()
        else:
            line = one_error_line(proc)
            assert "unrecognized arguments: --" not in line, (command, line)
            assert any(flag in line for flag in named) or "drop the flag" in line or "no equivalent" in line, \
                (command, line)


# --- the shape forms ----------------------------------------------------------------------------------


def two_inputs(tmp_path: pathlib.Path) -> pathlib.Path:
    """``y = a + b`` over ``[batch, n]`` inputs, and a Shape chain that folds once they are static."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Shape", ["s"], ["shape"]),
         helper.make_node("Reshape", ["s", "shape"], ["y"])],
        "two", [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", "n"]) for n in ("a", "b")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "n"])],
    )  # fmt: skip
    path = tmp_path / "two.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def _input_dims(path: pathlib.Path) -> dict[str, list[int | str]]:
    model = onnx.load(str(path))
    return {i.name: [d.dim_value or d.dim_param for d in i.type.tensor_type.shape.dim] for i in model.graph.input}


@pytest.mark.parametrize("flag", SHAPE_FLAGS)
def test_several_shapes_after_one_flag_as_onnxsim_takes_them(flag: str, tmp_path: pathlib.Path) -> None:
    src = two_inputs(tmp_path)
    out = tmp_path / "o.onnx"
    proc = optimize_command(str(src), str(out), flag, "a:1,32", "b:[1,32]", "-q", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert _input_dims(out) == {"a": [1, 32], "b": [1, 32]}
    ops = [n.op_type for n in onnx.load(str(out)).graph.node]
    assert "Shape" not in ops  # the shape arithmetic folded at the static sizes
    x = {"a": np.ones((1, 32), np.float32), "b": np.full((1, 32), 2, np.float32)}
    np.testing.assert_array_equal(helpers.ort_run(str(out), x)[0], helpers.ort_run(str(src), x)[0])


def test_a_bare_shape_is_the_only_inputs_and_refused_for_two(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "o.onnx"
    proc = optimize_command(str(DEMO), str(out), "--input-shape", "2,4,8", "-q", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert _input_dims(out) == {"x": [2, 4, 8]}
    proc = optimize_command(str(DEMO), str(out), "--overwrite-input-shape", "2,4,8", "x:2,4,8", "-q", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr  # the same input twice, the same sizes
    line = one_error_line(optimize_command(str(DEMO), str(out), "--input-shape", "2,4,8", "x:3,4,8", cwd=tmp_path))
    assert "given twice with different sizes" in line
    src = two_inputs(tmp_path)
    before = src.read_bytes()
    line = one_error_line(optimize_command(str(src), str(tmp_path / "t.onnx"), "--input-shape", "1,32", cwd=tmp_path))
    assert "a shape without a name is for a model with one input" in line and "'a', 'b'" in line
    assert "give NAME:1,32" in line
    assert src.read_bytes() == before and not (tmp_path / "t.onnx").exists()


def test_a_bare_shape_in_the_api_too(tmp_path: pathlib.Path) -> None:
    import passes

    out = passes.optimize(str(DEMO), output=tmp_path / "o.onnx", input_shapes={"": (2, 4, 8)})
    assert _input_dims(out) == {"x": [2, 4, 8]}
    model = passes.optimize(onnx.load(str(DEMO)), input_shapes={"": (3, 4, 8)})
    assert [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim] == [3, 4, 8]


def test_the_positional_output_after_a_shape_flag_is_not_a_shape(tmp_path: pathlib.Path) -> None:
    """``optimize IN --input-shape x:2,4,8 OUT``: OUT is the output, not another shape."""
    out = tmp_path / "o.onnx"
    proc = optimize_command(str(DEMO), "--input-shape", "x:2,4,8", str(out), "-q", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert _input_dims(out) == {"x": [2, 4, 8]}


@pytest.mark.parametrize("value", ["ids:int64", "input_ids:fp16", "x:1,3,224,224"])
def test_onnxslims_inputs_form_is_refused_with_a_pointer(value: str, tmp_path: pathlib.Path) -> None:
    line = one_error_line(optimize_command(str(DEMO), str(tmp_path / "o.onnx"), "--inputs", value, cwd=tmp_path))
    assert f"--inputs {value}" in line and "--inputs FILE.npz" in line
    assert "missing" not in line and "cannot read" not in line
    assert ("onnxslim" in line) == value.endswith(("int64", "fp16"))


def test_flags_are_not_abbreviated(tmp_path: pathlib.Path) -> None:
    for typed, meant in (("--job", "--jobs"), ("--repo", "--report"), ("--out", "--output"),
                         ("--target", "--target-opset")):  # fmt: skip
        line = one_error_line(optimize_command(str(DEMO), str(tmp_path / "o.onnx"), typed, "2", cwd=tmp_path))
        assert f"unrecognized arguments: {typed}" in line and f"did you mean {meant}" in line, line
    line = one_error_line(optimize_command(str(DEMO), str(tmp_path / "o.onnx"), "3", cwd=tmp_path))
    assert "onnxsim's number of checks" in line and "--seed N" in line
    assert not (tmp_path / "o.onnx").exists()


def test_the_parser_groups_what_each_argument_took() -> None:
    parser = cli_args.parser()
    groups = parser.groups(["in", "-oOUT", "--report=r.json", "-qv", "--input-shape", "a:1", "b:2", "--no-fuse",
                            "--dim", "n=3"])  # fmt: skip
    assert groups == [(None, ["in"]), ("output", ["-o", "OUT"]), ("report", ["--report=r.json"]), ("quiet", ["-q"]),
                      ("verbose", ["-v"]), ("input_shape", ["--input-shape", "a:1"]),
                      ("input_shape", ["--input-shape", "b:2"]), ("fuse", ["--no-fuse"]), ("dim", ["--dim", "n=3"])]
