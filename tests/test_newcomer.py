"""The README as a newcomer reads it: its quick start and every recipe run as written.

README.md is this test's input: each code block after a ``<!-- recipe -->``
marker (``<!-- recipe exit=N -->`` when the recipe shows a failure) is run by
bash in a temporary folder holding a copy of ``models/`` and a ``.venv`` whose
``bin/activate`` puts this interpreter's ``optimize`` (a shim running ``python -m
passes``) and ``python`` first on PATH, and must end with the exit code the
marker states. The quick start runs in a fresh shell (its own first line
activates the venv); the recipes after it in a shell where it is active, as the
README says. No recipe may report NOT CHECKED: each shows the check at work.
So the README and the code cannot drift apart. The page itself stays one page,
its links resolve, and the CI's set-up commands keep their markers.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import stat
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
README = REPO / "README.md"

_MARKER = re.compile(r"^<!-- recipe(?: exit=(\d+))? -->\s*$")


def recipes(text: str) -> list[tuple[str, str, int]]:
    """``(id, commands, expected exit code)`` for each code block after a recipe marker."""
    lines = text.splitlines()
    found = []
    for i, line in enumerate(lines):
        match = _MARKER.match(line)
        if not match:
            continue
        start = i + 1
        while start < len(lines) and not lines[start].startswith("```"):
            assert not lines[start].strip(), f"README.md line {i + 1}: the recipe marker is not before a code block"
            start += 1
        end = start + 1
        while end < len(lines) and not lines[end].startswith("```"):
            end += 1
        commands = "\n".join(lines[start + 1:end])
        first = commands.splitlines()[0] if commands else ""
        words = [w for w in first.split() if not w.startswith("-")][:3]
        found.append((f"line{start + 1}-" + "-".join(re.sub(r"\W+", "_", w)[-20:] for w in words),
                      commands, int(match.group(1) or 0)))
    return found


RECIPES = recipes(README.read_text(encoding="utf-8"))


def test_the_readme_has_a_quick_start_and_recipes() -> None:
    assert len(RECIPES) >= 8
    assert RECIPES[0][1] == ". .venv/bin/activate\noptimize models/demo.onnx demo.opt.onnx"  # the quick start


@pytest.fixture(scope="module")
def bin_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """``optimize`` and ``python`` of this interpreter, first on PATH."""
    folder = tmp_path_factory.mktemp("bin")
    shim = folder / "optimize"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m passes "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    (folder / "python").symlink_to(sys.executable)
    return folder


def _fresh_path() -> str:
    """PATH without any folder that has an ``optimize`` (a fresh shell, before the venv is activated)."""
    return os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if p and not (pathlib.Path(p) / "optimize").exists())  # fmt: skip


@pytest.mark.parametrize(("commands", "code"), [pytest.param(c, e, id=i) for i, c, e in RECIPES])
def test_recipe_runs_as_written(commands: str, code: int, bin_dir: pathlib.Path, tmp_path: pathlib.Path) -> None:
    shutil.copytree(REPO / "models", tmp_path / "models", ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    venv = tmp_path / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "activate").write_text(f'export PATH="{bin_dir}{os.pathsep}$PATH"\n')
    fresh = commands == RECIPES[0][1]
    env = {**os.environ, "PATH": _fresh_path() if fresh else f"{bin_dir}{os.pathsep}{_fresh_path()}"}
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", commands], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == code, f"{commands}\nexit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    assert "Traceback" not in proc.stderr
    assert "NOT CHECKED" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    if code == 0:
        assert "optimize: error:" not in proc.stderr and "failed:" not in proc.stdout, proc.stderr
    else:
        errors = [line for line in proc.stderr.splitlines() if line.startswith("optimize: error:")]
        assert len(errors) == 1 and "hint:" in proc.stderr, proc.stderr


def test_the_readme_is_one_page_with_links_that_resolve() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300
    links = re.findall(r"\]\(((?:docs/)[^)#]+)\)", text)
    assert links and all((REPO / link).is_file() for link in links), links
    for doc in (REPO / "docs").glob("*.md"):
        for link in re.findall(r"\]\(([^)#:]+\.md)\)", doc.read_text(encoding="utf-8")):
            assert (doc.parent / link).resolve().is_file(), (doc.name, link)


def test_the_ci_set_up_commands_keep_their_markers() -> None:
    text = README.read_text(encoding="utf-8")
    for marker, needle in (("<!-- demo-command -->", "optimize models/demo.onnx"),
                           ("<!-- test-command -->", "-m pytest -q")):  # fmt: skip
        after = text.split(marker, 1)[1].lstrip().splitlines()
        assert after[0] == "```" and needle in after[1], marker
