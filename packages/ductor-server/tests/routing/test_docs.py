"""The request samples of "Routing in the server" in docs/routing.md run, in order."""

from __future__ import annotations

import json
import re
from pathlib import Path

from .conftest import Api

DOC = Path(__file__).resolve().parents[4] / "docs" / "routing.md"


def requests() -> list[tuple[str, str, object]]:
    section = DOC.read_text().split("## Routing in the server", 1)[1]
    out = []
    for block in re.findall(r"```http\n(.*?)```", section, flags=re.DOTALL):
        first, _, body = block.partition("\n")
        method, path = first.split()
        out.append((method, path, json.loads(body)))
    return out


async def test_documented_session_runs(api: Api) -> None:
    samples = requests()
    assert [m for m, _, _ in samples].count("POST") == len(samples) >= 5
    answers = [await api.ok(method, path, json=body) for method, path, body in samples]
    decision = answers[-1]
    assert decision["outcome"] == "assigned"
    assert decision["worker"] == "ana"
    assert decision["charge"] == 3_000_000  # first price (the default): pays its bid
    assert decision["explanation"]["rule"] == "default"
