"""Every ```python block of docs/sdk.md runs, so the user docs cannot rot."""

from __future__ import annotations

import re
from pathlib import Path

import pytest


def _doc() -> Path:
    for parent in Path(__file__).resolve().parents:
        candidate = parent / "docs" / "sdk.md"
        if candidate.is_file():
            return candidate
    raise FileNotFoundError("docs/sdk.md not found above " + str(Path(__file__)))


BLOCKS = re.findall(r"```python\n(.*?)```", _doc().read_text(encoding="utf-8"), re.S)


def test_the_doc_has_code_samples() -> None:
    assert len(BLOCKS) >= 5


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block-{i}" for i in range(len(BLOCKS))])
def test_doc_sample_runs(code: str) -> None:
    namespace: dict[str, object] = {"__name__": "docs_sample"}
    exec(compile(code, str(_doc()), "exec"), namespace)
