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


NAMED = re.compile(r"\$([a-z_]+)")
"""A value the server chose (`"$assignment"`): taken from the first response that
shows it, then put in every later request and compared in every later response."""


def _exchanges() -> list[tuple[str, str, dict[str, str], str, int, Any]]:
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
                body,
                int(status),
                json.loads(answer) if answer.strip() else None,
            )
        )
    return out


def _contains(actual: Any, documented: Any, named: dict[str, str], where: str = "$") -> None:
    if isinstance(documented, dict):
        assert isinstance(actual, dict), where
        for key, value in documented.items():
            assert key in actual, f"{where}.{key} missing"
            _contains(actual[key], value, named, f"{where}.{key}")
    elif isinstance(documented, list):
        assert isinstance(actual, list), where
        assert len(actual) == len(documented), where
        for index, (got, shown) in enumerate(zip(actual, documented, strict=True)):
            _contains(got, shown, named, f"{where}[{index}]")
    elif isinstance(documented, str) and (found := NAMED.fullmatch(documented)):
        assert isinstance(actual, str), where
        assert named.setdefault(found.group(1), actual) == actual, f"{where}: {actual!r}"
    else:
        assert actual == documented, f"{where}: {actual!r} != {documented!r}"


def _fill(text: str, named: dict[str, str]) -> str:
    return NAMED.sub(lambda m: named[m.group(1)], text)


async def test_the_worked_example_runs_as_documented(api: Api) -> None:
    exchanges = _exchanges()
    assert len(exchanges) >= 10
    named: dict[str, str] = {}
    for method, path, headers, body, status, answer in exchanges:
        key = headers.pop("Idempotency-Key", None)
        assert not headers, headers
        sent = json.loads(_fill(body, named)) if body.strip() else None
        response = await api.call(method, _fill(path, named), key=key, json=sent)
        assert response.status_code == status, (method, path, response.text)
        _contains(response.json(), answer, named)
    assert "assignment" in named
