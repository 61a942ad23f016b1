"""Canonical JSON (RFC 8785): the RFC's own examples, edge cases, and stability."""

from __future__ import annotations

import enum
import json
from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ductor_settlement.canonical import (
    canonical_hash,
    canonical_json,
    document_hash,
    is_canonical,
    parse_json,
)
from ductor_settlement.errors import NotCanonical


def test_keys_sort_by_utf16_code_units_as_in_rfc_8785_section_3_2_3() -> None:
    value = {
        "\u20ac": "Euro Sign",
        "\r": "Carriage Return",
        "\ufb33": "Hebrew Letter Dalet With Dagesh",
        "1": "One",
        "\U0001f600": "Emoji: Grinning Face",
        "\u0080": "Control",
        "\u00f6": "Latin Small Letter O With Diaeresis",
    }
    keys = list(json.loads(canonical_json(value)))
    # The emoji (surrogates D83D DE00) sorts before U+FB33 in UTF-16, after it in UTF-32.
    assert keys == ["\r", "1", "\u0080", "\u00f6", "\u20ac", "\U0001f600", "\ufb33"]


@pytest.mark.parametrize(
    ("number", "text"),
    [
        (333333333.33333329, b"333333333.3333333"),
        (1e30, b"1e+30"),
        (4.50, b"4.5"),
        (2e-3, b"0.002"),
        (0.000000000000000000000000001, b"1e-27"),
        (1.0, b"1"),
        (-0.0, b"0"),
        (1e21, b"1e+21"),
        (1e20, b"100000000000000000000"),
        (2**53 - 1, b"9007199254740991"),
        (-(2**53 - 1), b"-9007199254740991"),
    ],
)
def test_numbers_take_their_shortest_ecmascript_form(number: float, text: bytes) -> None:
    assert canonical_json(number) == text


def test_strings_escape_only_what_they_must_and_keep_unicode_as_utf8() -> None:
    assert canonical_json('"\\\b\f\n\r\t\x00\x1f') == b'"\\"\\\\\\b\\f\\n\\r\\t\\u0000\\u001f"'
    assert canonical_json("caf\u00e9 \u2028 \U0001f600 /") == (
        '"caf\u00e9 \u2028 \U0001f600 /"'.encode()
    )


def test_whitespace_is_gone_and_nesting_is_sorted_throughout() -> None:
    value = {"b": [3, {"z": None, "a": True}], "a": {"y": 1, "x": "x"}}
    assert canonical_json(value) == b'{"a":{"x":"x","y":1},"b":[3,{"a":true,"z":null}]}'


class _Color(enum.Enum):
    RED = "red"


class _Thing(msgspec.Struct, frozen=True, kw_only=True):
    when: datetime
    color: _Color
    tags: tuple[str, ...]
    amount: int


def test_structs_datetimes_enums_and_tuples_become_json_values() -> None:
    thing = _Thing(
        when=datetime(2025, 1, 2, 3, 4, 5, 6, tzinfo=UTC),
        color=_Color.RED,
        tags=("b", "a"),
        amount=7,
    )
    assert canonical_json(thing) == (
        b'{"amount":7,"color":"red","tags":["b","a"],"when":"2025-01-02T03:04:05.000006Z"}'
    )
    assert canonical_hash(thing).startswith("sha256:")
    assert canonical_hash(thing) == canonical_hash(msgspec.structs.replace(thing))


@pytest.mark.parametrize(
    "bad",
    [2**53, -(2**53), float("nan"), float("inf"), "\ud800", {1: "non-string key"}, object()],
)
def test_values_rfc_8785_cannot_encode_are_refused(bad: object) -> None:
    with pytest.raises(NotCanonical) as caught:
        canonical_json(bad)
    assert caught.value.code == "receipt.not_canonical"


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b'{"a":1,"b":[true,null]}', True),
        (b'{"b":1,"a":2}', False),  # keys out of order
        (b'{"a": 1}', False),  # whitespace
        (b'{"a":1.0}', False),  # number not in shortest form
        (b'{"a":"\\u00e9"}', False),  # needless escape
        (b'{"a":1,"a":2}', False),  # duplicate key
        (b"not json", False),
        (b"NaN", False),
        (b"9007199254740992", True),  # a double, though Python would read an int
        (b"9007199254740993", False),  # no double has this value
    ],
)
def test_is_canonical_recognises_the_form(data: bytes, expected: bool) -> None:
    assert is_canonical(data) is expected


json_values: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53 - 1), max_value=2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(exclude_categories=("Cs",))),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.text(st.characters(exclude_categories=("Cs",)), max_size=6), children, max_size=4
        )
    ),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(json_values, st.randoms(use_true_random=False))
def test_canonical_form_is_stable_under_reparsing_and_key_order(value: Any, rng: Any) -> None:
    encoded = canonical_json(value)
    assert is_canonical(encoded)
    assert canonical_json(parse_json(encoded)) == encoded

    def shuffled(node: Any) -> Any:
        if isinstance(node, dict):
            items = list(node.items())
            rng.shuffle(items)
            return {key: shuffled(child) for key, child in items}
        if isinstance(node, list):
            return [shuffled(child) for child in node]
        return node

    assert canonical_json(shuffled(value)) == encoded


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_a_document_hash_is_the_canonical_hash_where_that_one_answers(value: Any) -> None:
    assert document_hash(value) == canonical_hash(value)


def test_a_document_hash_reads_a_64_bit_integer_as_a_json_reader_does() -> None:
    document = {"uid": 2**62 + 1, "n": 1}
    with pytest.raises(NotCanonical):
        canonical_hash(document)
    # What an RFC 8785 library hashes after parsing the JSON text: the nearest double.
    assert document_hash(document) == canonical_hash({"uid": float(2**62 + 1), "n": 1})
    assert document_hash(document) == canonical_hash(parse_json(json.dumps(document)))
