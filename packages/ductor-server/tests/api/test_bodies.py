"""Request-body decoding: bad JSON is located by line and column, wrong types by path."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ductor_server.transports.rest.bodies import (
    CancelRunBody,
    EventBody,
    SignalBody,
    TriggerRunBody,
    decode_body,
    line_column,
    nesting_depth,
)
from ductor_server.transports.rest.errors import ApiError, status_for


def test_line_column_counts_characters_not_bytes() -> None:
    raw = '{"name": "café",\n  "x": é}'.encode()
    assert line_column(raw, 0) == (1, 1)
    assert line_column(raw, raw.index(b"\n") + 1) == (2, 1)
    # "é" is two bytes; the column still counts it as one character.
    assert line_column(raw, raw.rindex("é".encode())) == (2, 8)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(value=json_values, data=st.data())
def test_a_stray_character_is_found_where_it_was_put(value: Any, data: st.DataObject) -> None:
    lines = json.dumps({"input": value}, indent=2, ensure_ascii=False).split("\n")
    # Put a stray "@" at the start of any line but the first (where JSON expects a
    # value, a key or a closing bracket, never "@").
    index = data.draw(st.integers(min_value=1, max_value=len(lines) - 1))
    indent = len(lines[index]) - len(lines[index].lstrip(" "))
    lines[index] = lines[index][:indent] + "@" + lines[index][indent:]
    with pytest.raises(ApiError) as raised:
        decode_body("\n".join(lines).encode(), Any)
    error = raised.value
    assert error.code == "request.malformed_json"
    assert (error.details["line"], error.details["column"]) == (index + 1, indent + 1)


@pytest.mark.parametrize(
    ("raw", "into", "path"),
    [
        (b'{"family_slug": "a", "version": 1.5}', TriggerRunBody, "$.version"),
        (b'{"family_slug": null}', TriggerRunBody, "$.family_slug"),
        (b'{"name": "a", "id": {"x": 1}}', EventBody, "$.id"),
        (b'"just a string"', EventBody, "$"),
        # A missing or unknown field's path is the field's, not the object's.
        (b'{"input": {}}', TriggerRunBody, "$.family_slug"),
        (b'{"family_slug": "a", "nope": 1}', TriggerRunBody, "$.nope"),
        (b'{"data": {}}', EventBody, "$.name"),
    ],
)
def test_wrong_types_are_request_invalid_with_a_path(raw: bytes, into: Any, path: str) -> None:
    with pytest.raises(ApiError) as raised:
        decode_body(raw, into)
    assert raised.value.code == "request.invalid"
    assert raised.value.details["path"] == path
    assert status_for(raised.value.code) == 422


def test_optional_bodies_may_be_empty_but_not_required_ones() -> None:
    assert decode_body(b"  ", CancelRunBody, optional=True) == CancelRunBody(reason="")
    assert decode_body(b"", SignalBody, optional=True) == SignalBody(payload=None, id=None)
    with pytest.raises(ApiError) as raised:
        decode_body(b"", EventBody)
    assert raised.value.details == {"path": "$", "reason": "empty body"}


def test_status_families() -> None:
    assert status_for("thing.not_found") == 404
    assert status_for("definition.something_new") == 422
    assert status_for("mystery", retryable=True) == 503
    assert status_for("mystery") == 422


# --- hostile bodies --------------------------------------------------------------


def _refused(raw: bytes, into: Any = Any) -> ApiError:
    with pytest.raises(ApiError) as refused:
        decode_body(raw, into)
    return refused.value


def test_invalid_utf8_inside_a_string_is_malformed_json_at_its_byte() -> None:
    raw = b'{"name": "e",\n "id": "ab\xffcd"}'
    error = _refused(raw, EventBody)
    assert error.code == "request.malformed_json"
    assert status_for(error.code) == 400
    assert error.details == {"line": 2, "column": 11, "byte": raw.index(b"\xff")}


@pytest.mark.parametrize(
    "raw",
    [
        b'{"name": "a\\ud800"}',
        b'{"name": "e", "data": {"k": "x\\uDBFFy"}}',
        b'{"name": "e", "data": {"k": "\\\\\\ud800"}}',  # an escaped backslash, then the escape
    ],
)
def test_a_lone_high_surrogate_escape_is_named_where_it_is(raw: bytes) -> None:
    error = _refused(raw, EventBody)
    assert error.code == "request.malformed_json"
    assert "high surrogate" in error.message, error.message
    at = raw.lower().rindex(b"\\ud")
    assert error.details == {"line": 1, "column": at + 1, "byte": at}


def test_an_escaped_backslash_before_u_is_text_and_a_pair_is_one_character() -> None:
    decoded = decode_body(b'{"name": "a\\\\ud800", "id": "\\ud83d\\ude00"}', EventBody)
    assert (decoded.name, decoded.id) == ("a\\ud800", "\U0001f600")


@pytest.mark.parametrize("depth", [65, 1000, 100_000])
def test_a_body_nested_over_64_deep_is_refused(depth: int) -> None:
    error = _refused(b'{"name": "e", "data": ' + b"[" * depth + b"]" * depth + b"}", EventBody)
    assert (error.code, error.details["path"]) == ("request.invalid", "$")
    assert "64" in error.details["reason"]


def test_64_deep_is_fine_and_brackets_in_strings_do_not_count() -> None:
    nested = b"[" * 63 + b"]" * 63
    assert decode_body(b'{"a": ' + nested + b"}", Any) == json.loads(b'{"a": ' + nested + b"}")
    text = json.dumps({"s": "[" * 500 + '\\"{' * 100}).encode()
    assert nesting_depth(text) == 1
    assert decode_body(text, Any)["s"].startswith("[[[")


def test_integers_must_fit_in_64_bits_and_the_path_is_named() -> None:
    assert decode_body(b'{"a": [9223372036854775807, -9223372036854775808]}', Any)
    error = _refused(b'{"family_slug": "x", "version": 9223372036854775808}', TriggerRunBody)
    assert error.details == {"path": "$.version", "reason": "integer does not fit in 64 bits"}
    error = _refused(b'{"name": "e", "data": {"k": [1, -9223372036854775809]}}', EventBody)
    assert error.details["path"] == "$.data.k[1]"


def test_a_nul_character_is_refused_wherever_it_is() -> None:
    error = _refused(b'{"name": "e", "data": {"k": ["a\\u0000"]}}', EventBody)
    assert error.details["path"] == "$.data.k[0]"
    # An escaped backslash before "u0000" is no NUL.
    assert decode_body(b'{"k": "\\\\u0000"}', Any) == {"k": "\\u0000"}


def test_the_depth_scan_is_linear_on_a_megabyte() -> None:
    import time

    raw = b"[" + b",".join([b'"\\\\\\"[[[[", [[[[[[1]]]]]]'] * 40_000) + b"]"
    started = time.perf_counter()
    assert nesting_depth(raw) == 7
    assert time.perf_counter() - started < 1.0
