"""`parseable`: what the MCP endpoint hands the `mcp` library when a message nests
or counts deeper or longer than its JSON parsers take."""

from __future__ import annotations

import json

import pydantic_core

from ductor_server.json_depth import nesting_depth
from ductor_server.transports.mcp.endpoint import PARSED_DEPTH, parseable, unparseable


def test_a_message_the_parsers_take_is_left_alone() -> None:
    raw = b'{"a": [1, 2.5, -3, "[[[{{{", {"b": null}], "n": ' + b"9" * 100 + b"}"
    assert not unparseable(raw)


def test_deep_values_are_cut_to_an_empty_array_still_too_deep() -> None:
    deep = b"[1," * 5_000 + b'"]]}"' + b"]" * 5_000
    obj = b'{"d":' * 300 + b"1" + b"}" * 300
    raw = b'{"name": "n", "data": ' + deep + b', "other": ' + obj + b', "last": "x"}'
    assert unparseable(raw)
    out = parseable(raw)
    value = pydantic_core.from_json(out)
    assert json.loads(out) == value
    assert nesting_depth(out) == PARSED_DEPTH + 1
    assert (value["name"], value["last"]) == ("n", "x")
    inner = value["data"]
    for _ in range(PARSED_DEPTH - 2):
        inner = inner[1]
    assert inner == [1, []]


def test_long_integers_are_shortened_but_not_strings_or_floats() -> None:
    long = b"7" * 5_000
    arguments = (
        b'{"i": -'
        + long
        + b', "s": "'
        + long
        + b'", "f": 0.'
        + long
        + b', "e": 1e-'
        + long[:300]
        + b', "a": ['
        + long
        + b"]}"
    )
    raw = b'{"params": {"arguments": ' + arguments + b"}}"
    assert unparseable(raw)
    value = pydantic_core.from_json(parseable(raw))["params"]["arguments"]
    assert value["i"] == -(10**20 - 1)
    assert value["a"] == [10**20 - 1]
    assert value["s"] == long.decode()
    assert value["f"] == 0.7777777777777778
    assert value["e"] == 0.0


def test_the_messages_own_id_is_never_rewritten() -> None:
    """A JSON-RPC id of thousands of digits stays the parse error it is: rewritten, the
    call would run and be answered under an id the client never sent."""
    raw = b'{"jsonrpc": "2.0", "id": ' + b"1" * 5_000 + b', "params": {"a": {"n": 1}}}'
    assert parseable(raw) == raw
