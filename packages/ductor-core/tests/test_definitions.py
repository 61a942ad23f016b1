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
    "text",
    [
        *("", "2", "s", "-1s", "2 s", "1y", "99999999999999999999d", "36501d", "9" * 400 + "s"),
        # digits are ASCII: other scripts' digits (Arabic-Indic, full-width) are not numbers here
        *("\u0663s", "\uff15m", "1\u0660s", "\u0661.\u0665h"),
    ],
)
def test_bad_durations_are_rejected(text: str) -> None:
    with pytest.raises(DurationError):
        parse_duration(text)


# Content hashes computed from these files before step types became specs: a
# published version is found again by its hash, so these must never move.
PINNED_HASHES = {
    "hello-world.json": "sha256:27dccadebf03227fa66fa9aa1540a60210632152a848579f6fb989fbcb81a123",
    "valid/diamond.json": "sha256:869204398ae4a056d7c936b43bd7a6bb68bbd3524733c18c41e53b05692082f9",
    # Published before ACTION steps took `connection` + `operation` (now refused at
    # publish: `action` and `connection` together), still found by its hash.
    "published/lead-intake-v1.json": (
        "sha256:a55ec92bb7fdb4b6ebebe68aaf5b4f748ddbdef4f091ccaca21187f69cab8a8b"
    ),
    "valid/lead-intake.json": (
        "sha256:a6d86b39a748ba1df2b52937a9235de9b8d8991790c8cb6862996d9657990111"
    ),
    "valid/nightly-fanout.json": (
        "sha256:fbc86a964574f82c51b55af180d500a2c9b80e8f0e37482190c78fb6675e0cb7"
    ),
    "valid/single-step.json": (
        "sha256:32aa9d91058a824d6d7eccd8053c7365abc8435e615a1836baf3215100585d01"
    ),
}


@pytest.mark.parametrize("name", sorted(PINNED_HASHES))
def test_content_hash_of_corpus_definitions_is_pinned(name: str) -> None:
    raw = (Path(__file__).parent / "data" / name).read_bytes()
    assert content_hash(decode_definition(raw)) == PINNED_HASHES[name]
