"""docs/settlement.md's worked example runs: each request, in order, gets the response
the page shows (every documented field with its documented value), on both backends."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from .conftest import Api

DOC = (Path(__file__).resolve().parents[4] / "docs" / "settlement.md").read_text()
BLOCKS = re.findall(r"```http\n(.*?)\n```", DOC, re.DOTALL)


def _exchanges() -> list[tuple[str, str, dict[str, str], Any, int, Any]]:
    assert len(BLOCKS) % 2 == 0, "every request block is followed by its response block"
    out = []
    for request, response in zip(BLOCKS[::2], BLOCKS[1::2], strict=True):
        head, _, body = request.partition("\n\n")
        start, *header_lines = head.splitlines()
        method, path = start.split(" ", 1)
        headers = dict(line.split(": ", 1) for line in header_lines)
        status, _, answer = response.partition("\n\n")
        out.append(
            (
                method,
                path,
                headers,
                json.loads(body) if body.strip() else None,
                int(status),
                json.loads(answer) if answer.strip() else None,
            )
        )
    return out


def _contains(actual: Any, documented: Any, where: str = "$") -> None:
    if isinstance(documented, dict):
        assert isinstance(actual, dict), where
        for key, value in documented.items():
            assert key in actual, f"{where}.{key} missing"
            _contains(actual[key], value, f"{where}.{key}")
    elif isinstance(documented, list):
        assert isinstance(actual, list), where
        assert len(actual) == len(documented), where
        for index, (got, shown) in enumerate(zip(actual, documented, strict=True)):
            _contains(got, shown, f"{where}[{index}]")
    else:
        assert actual == documented, f"{where}: {actual!r} != {documented!r}"


async def test_the_worked_example_runs_as_documented(api: Api) -> None:
    exchanges = _exchanges()
    assert len(exchanges) >= 10
    for method, path, headers, body, status, answer in exchanges:
        key = headers.pop("Idempotency-Key", None)
        assert not headers, headers
        response = await api.call(method, path, key=key, json=body)
        assert response.status_code == status, (method, path, response.text)
        _contains(response.json(), answer)
