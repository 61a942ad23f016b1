"""The `concurrency` option: its key over the run's input, what the queue stores
of it, its rate in starts per second, and a definition's hash with and without it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ductor_core.concurrency import ConcurrencyOption, RateLimit, key_value, stored_key
from ductor_core.definitions import content_hash, decode_definition, definition_from_obj
from ductor_core.expressions import default_engine

DATA = Path(__file__).parent / "data"


def test_the_key_is_the_cel_value_over_input_as_text() -> None:
    cel = default_engine()
    assert key_value(cel, None, {"user": "ann"}) == ""
    assert key_value(cel, "input.user", {"user": "ann"}) == "ann"
    assert key_value(cel, "input.shard", {"shard": 3}) == "3"
    assert key_value(cel, "[input.a, input.b]", {"a": 1, "b": "x"}) == '[1,"x"]'
    # A key that does not evaluate shares the "" key with runs that have none.
    assert key_value(cel, "input.missing", {"user": "ann"}) == ""


@pytest.mark.parametrize(
    ("value", "kept"),
    [
        ("ann", True),
        ("customer 42", True),
        ("", True),
        ("x" * 64, True),
        ("x" * 65, False),
        ("tab\there", False),
        ("new\nline", False),
        ("#looks-like-a-digest", False),
    ],
)
def test_short_printable_keys_are_stored_as_they_are_others_as_a_digest(
    value: str, kept: bool
) -> None:
    stored = stored_key(value)
    assert (stored == value) is kept
    if not kept:
        assert stored.startswith("#")
        assert len(stored) == 33
        assert stored_key(value + "!") != stored


def test_the_rate_refills_at_limit_per_period() -> None:
    option = ConcurrencyOption(rate=RateLimit(limit=120, period="1m"))
    assert option.per_second == 2.0
    assert ConcurrencyOption(limit=3).per_second is None


def test_a_definition_without_the_option_keeps_its_hash_and_one_with_it_differs() -> None:
    raw = json.loads((DATA / "valid" / "single-step.json").read_text())
    before = content_hash(definition_from_obj(raw))
    assert content_hash(decode_definition(json.dumps({**raw, "concurrency": None}))) == before
    limited = content_hash(definition_from_obj({**raw, "concurrency": {"limit": 2}}))
    assert limited != before
