"""The code samples in docs/routing.md run, and its JSON samples decode."""

from __future__ import annotations

import re
from pathlib import Path

from ductor_core.expressions import default_engine
from ductor_routing import build_router, decode_config, decode_event

DOC = Path(__file__).resolve().parents[3] / "docs" / "routing.md"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), flags=re.DOTALL)


def test_python_samples_run() -> None:
    samples = blocks("python")
    assert samples
    for sample in samples:
        exec(compile(sample, str(DOC), "exec"), {"__name__": "docs_sample"})


def test_json_samples_decode() -> None:
    events_sample, config_sample = blocks("json")
    router = build_router(decode_config(config_sample), engine=default_engine())
    assert router.pool_ids == ("solar-buyers",)
    events = [decode_event(line) for line in events_sample.strip().splitlines()]
    assert events[0].routable is not None
    assert events[1].complete == "t10"
