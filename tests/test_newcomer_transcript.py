"""docs/newcomer.md is the real output of its session: run again, it reads the same (numbers with a
decimal point aside: times, sizes and errors vary with the machine and the libraries).

The session starts with a PyTorch export (torch: the ``real`` extra), hence ``heavy`` (``pytest -m
heavy``). After a change that alters the output, ``python docs/newcomer.py`` writes the page again.
"""

from __future__ import annotations

import difflib
import importlib.util
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent


def _generator():
    spec = importlib.util.spec_from_file_location("newcomer_page", REPO / "docs" / "newcomer.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.heavy
def test_the_newcomer_page_is_the_real_output_of_its_session() -> None:
    """In the default run (about 9 s): a page left behind by a change of the summary fails here."""
    pytest.importorskip("torch")
    page = _generator()
    steps = page.session()
    assert [code for *_, code in steps] == [0, 0, 0, 0, 0, 2, 0, 0], [s[2][-500:] for s in steps]
    expected = page.stable(page.PAGE.read_text(encoding="utf-8")).splitlines()
    actual = page.stable(page.render(steps)).splitlines()
    assert actual == expected, "\n".join(difflib.unified_diff(expected, actual, "docs/newcomer.md", "now", lineterm=""))


def test_the_page_shows_each_step_and_what_varies_is_all_that_is_masked() -> None:
    page = _generator()
    text = page.PAGE.read_text(encoding="utf-8")
    for _, command in page.STEPS:
        assert f"$ {command}" in text
    for needle in ("check passed", "--target-opset 23", "float16's default (--precision fp16)", "int64[1,16]",
                   "--skip-fuse-bn (onnxsim): use --no-fuse", "total: 3 model(s): 3 ok"):  # fmt: skip
        assert needle in text, needle
    assert "NOT CHECKED" not in text and "Traceback" not in text
    assert page.stable("nodes 355 112\nfold 0.418 yes\nmax abs 5.96e-08 size 82.4 KiB") == \
        "nodes 355 112\nfold # yes\nmax abs # size # KiB"
