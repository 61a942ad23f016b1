"""The inference proxy's pure rules: the body check (every problem with a pointer),
the token estimate and the cost in micros (integer, rounded up)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from ductor_server.ai import PriceRecord
from ductor_server.errors import RequestInvalid
from ductor_server.services.ai import check_body, cost_micros, estimate_tokens

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def price(pin: int, pout: int) -> PriceRecord:
    return PriceRecord(model="m", input_per_million=pin, output_per_million=pout, updated_at=NOW)


def test_cost_is_integer_micros_rounded_up() -> None:
    assert cost_micros(None, 1000, 1000) == 0
    assert cost_micros(price(3_000_000, 10_000_000), 11, 7) == 103
    assert cost_micros(price(150_000, 600_000), 1, 0) == 1  # 0.15 micros
    assert cost_micros(price(150_000, 600_000), 0, 0) == 0
    assert cost_micros(price(2**53 - 1, 0), 2**40, 0) == 2**53 - 1  # capped, no float


def test_estimate_is_four_characters_a_token() -> None:
    assert estimate_tokens(0) == 1
    assert estimate_tokens(40) == 10
    assert estimate_tokens(41) == 11


def test_a_good_chat_body() -> None:
    body = {
        "model": "gpt",
        "messages": [
            {"role": "system", "content": "x" * 8},
            {"role": "user", "content": [{"type": "text", "text": "y" * 8}]},
        ],
        "max_tokens": 50,
        "stream": True,
    }
    assert check_body("chat", body) == ("gpt", True, 4, 50)


@pytest.mark.parametrize(
    ("kind", "body", "pointers"),
    [
        ("chat", {}, {"/model", "/messages"}),
        ("chat", {"model": "", "messages": []}, {"/model", "/messages"}),
        ("chat", {"model": "m", "messages": ["hi", {"role": "user"}]}, {"/messages/0"}),
        ("chat", {"model": "m", "messages": [{"role": "user"}], "max_tokens": 0}, {"/max_tokens"}),
        ("chat", {"model": "m", "messages": [{"role": "user"}], "stream": "yes"}, {"/stream"}),
        ("chat", {"model": "m\n", "messages": [{"role": "user"}]}, {"/model"}),
        (
            "chat",
            {"model": 3, "messages": [{"role": "user"}], "ductor_connection": 1},
            {"/model", "/ductor_connection"},
        ),
        ("embeddings", {"model": "e"}, {"/input"}),
        ("embeddings", {"model": "e", "input": 5}, {"/input"}),
        ("embeddings", {"model": "e", "input": "a", "stream": True}, {"/stream"}),
        ("chat", [], {""}),
    ],
)
def test_every_problem_has_a_pointer(kind: str, body: object, pointers: set[str]) -> None:
    with pytest.raises(RequestInvalid) as refused:
        check_body(kind, body)
    assert refused.value.code == "request.invalid"
    assert {p["pointer"] for p in refused.value.details["problems"]} == pointers
