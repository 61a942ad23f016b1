from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from ductor_core import (
    DataflowArgs,
    DefinitionError,
    DurationError,
    StepType,
    WaitArgs,
    content_hash,
    decode_definition,
    format_duration,
    parse_duration,
)

HELLO = (Path(__file__).parent / "data" / "hello-world.json").read_bytes()


def test_seed_hello_world_decodes_with_typed_args() -> None:
    definition = decode_definition(HELLO)
    assert definition.family_slug == "hello-world"
    greet, pause = definition.steps
    assert greet.step_type is StepType.DATAFLOW
    args = greet.typed_args()
    assert isinstance(args, DataflowArgs)
    assert args.project == {"message": '"hello"'}
    assert pause.typed_args() == WaitArgs(duration="2s")


def test_unknown_field_is_rejected_with_its_path() -> None:
    with pytest.raises(DefinitionError) as info:
        decode_definition(
            b'{"family_slug": "x", "steps": [{"ref": "a", "type": "T", "colour": 1}]}'
        )
    assert info.value.code == "definition.malformed"
    assert "colour" in info.value.message
    assert "$.steps[0]" in info.value.message


def test_content_hash_ignores_formatting_and_sees_content() -> None:
    compact = decode_definition(HELLO.replace(b"\n", b"").replace(b"  ", b""))
    assert content_hash(decode_definition(HELLO)) == content_hash(compact)
    changed = decode_definition(HELLO.replace(b'"2s"', b'"3s"'))
    assert content_hash(changed) != content_hash(compact)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2s", timedelta(seconds=2)),
        ("1h30m", timedelta(minutes=90)),
        ("250ms", timedelta(milliseconds=250)),
        ("7d", timedelta(days=7)),
    ],
)
def test_durations_round_trip(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected
    assert parse_duration(format_duration(expected)) == expected


@pytest.mark.parametrize(
    "text", ["", "2", "s", "-1s", "2 s", "1y", "99999999999999999999d", "36501d", "9" * 400 + "s"]
)
def test_bad_durations_are_rejected(text: str) -> None:
    with pytest.raises(DurationError):
        parse_duration(text)
