"""The malformed-definition corpus: each file names exactly the problems it must produce."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ductor_core.validation import PROBLEM_CODES, validate_definition, validate_definition_json

DATA = Path(__file__).parent / "data"
INVALID = sorted((DATA / "invalid").glob("*.json"))


def test_the_corpus_is_big_enough() -> None:
    assert len(INVALID) >= 40
    several = [p for p in INVALID if len(json.loads(p.read_text())["expect"]) > 1]
    assert len(several) >= 10


@pytest.mark.parametrize("path", INVALID, ids=[p.stem for p in INVALID])
def test_invalid_definition_reports_exactly_its_problems(path: Path) -> None:
    case: dict[str, Any] = json.loads(path.read_text())
    report = validate_definition(case["definition"])
    got = [{"code": p.code, "pointer": p.pointer} for p in report.problems]
    assert got == case["expect"]
    assert report.valid is False
    assert validate_definition_json(json.dumps(case["definition"])) == report
    for problem in report.problems:
        assert problem.message.strip()
        assert "\n" not in problem.message


def test_every_problem_code_is_documented_and_exercised_by_the_corpus() -> None:
    seen = {
        expected["code"] for path in INVALID for expected in json.loads(path.read_text())["expect"]
    }
    assert seen == set(PROBLEM_CODES)
