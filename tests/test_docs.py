"""The docs' tables and synopsis, measured against the code.

* docs/guarantees.md's synopsis names every flag of the parser, and no other;
* docs/passes.md's "What each pass removes" table is what the pipeline does to each model now;
* the README's pass table names the passes that exist.
"""

from __future__ import annotations

import pathlib
import re

import pytest

from passes import modelio, pipeline
from passes.cli import args as cli_args
from passes.report import summarize

REPO = pathlib.Path(__file__).resolve().parent.parent


def _synopsis() -> str:
    text = (REPO / "docs" / "guarantees.md").read_text(encoding="utf-8")
    block = text[text.index("## The command"):]
    return block[block.index("```") + 3: block.index("```", block.index("```") + 3)]


def test_the_synopsis_names_every_flag_of_the_parser_and_no_other() -> None:
    parser = cli_args.parser()
    synopsis = _synopsis()
    named = set(re.findall(r"(?<![\w-])(--?[a-z][a-z0-9-]*)", synopsis)) - {"-vv"}
    wanted = set()
    for action in parser._actions:
        strings = [s for s in action.option_strings if s not in ("-h", "--help")]
        if strings:
            wanted.add(next((s for s in strings if s.startswith("--")), strings[0]))
    assert named - {"-o", "-q", "-v"} == wanted - {"--output", "--quiet", "--verbose"}, (named ^ wanted)
    passes_listed = re.search(r"--passes ([a-z,]+)", synopsis).group(1).split(",")
    assert passes_listed == list(pipeline.PASSES)


def test_the_readme_pass_table_names_the_passes() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    table = text[text.index("| pass | what it does |"):]
    table = table[: table.index("\n\n")]
    named = re.findall(r"^\| `([a-z]+)` \|", table, flags=re.MULTILINE)
    assert named == [n for n in pipeline.PASSES if n != "precision"]  # precision: off unless asked (its own section)


def _removes_table() -> list[list[str]]:
    text = (REPO / "docs" / "passes.md").read_text(encoding="utf-8")
    section = text[text.index("## What each pass removes"):]
    section = section[: section.index("\n## ", 3)]
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| `")]  # fmt: skip


ROWS = _removes_table()
PREFIXES = [["upgrade"], ["upgrade", "fold"], ["upgrade", "fold", "simplify"],
            ["upgrade", "fold", "simplify", "decompose"]]  # fmt: skip


@pytest.mark.parametrize("row", ROWS, ids=[r[0].strip("`") for r in ROWS])
def test_the_passes_table_is_what_the_passes_do(row: list[str]) -> None:
    """``optimize MODEL out.onnx --passes PREFIX``'s node count after each prefix of the default pipeline."""
    path = REPO / "models" / row[0].strip("`")
    measured = [summarize(modelio.load_model(path)).nodes]
    for prefix in PREFIXES:
        model = modelio.load_model(path)
        pipeline.optimize_model(model, prefix)
        measured.append(summarize(model).nodes)
    assert [int(c) for c in row[1:]] == measured, f"docs/passes.md: | {row[0]} | {' | '.join(map(str, measured))} |"


def test_the_passes_table_has_the_models() -> None:
    assert len(ROWS) >= 9 and any("tiny_bert_opset11" in r[0] for r in ROWS)
