"""The inference proxy against a hostile tenant and a hostile upstream, through real
server processes on both backends and the scripted upstream on 127.0.0.1
(tests/ai_upstream.py): requests racing a request budget or a cost budget, an
event over 1 MiB in a stream, usage fields that are negative, huge or not numbers,
answers and events of odd shapes, a caller hanging up on an endless stream, model
names that no upstream should be sent, and prices and settings at their bounds.
Each is a clear answer, never a 5xx of Ductor's own, a hang or a wrong charge.
"""

from __future__ import annotations

import concurrent.futures
import json
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from .ai_upstream import PIECES, UPSTREAM_KEY, ScriptedUpstream
from .conftest import ServerProcess
from .test_ai_proxy_e2e import _record, _setup, _start

MAX_USAGE = 2**53 - 1


@contextmanager
def _streamed(server: ServerProcess, model: str) -> Iterator[httpx.Response]:
    """A streamed chat completion of `model`, open while the block runs."""
    with (
        httpx.Client(base_url=server.url, timeout=30) as http,
        http.stream(
            "POST",
            "/v1/ai/chat/completions",
            json={"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": True},
            headers={"Authorization": f"Bearer {server.api_key}"},
        ) as response,
    ):
        yield response


def _chat(http: httpx.Client, model: str, content: str = "hi", **body: Any) -> httpx.Response:
    return http.post(
        "/v1/ai/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": content}], **body},
    )


def test_concurrent_requests_cannot_pass_a_request_budget(
    server: ServerProcess, upstream: ScriptedUpstream
) -> None:
    server = _start(server)
    with server.client() as http:
        _setup(http, upstream)
        answer = http.put("/v1/budgets/ai.requests", json={"window": "day", "limit": 5})
        assert answer.status_code == 201, answer.text

    def ask(n: int) -> httpx.Response:
        with server.client() as http:
            return _chat(http, "echo", f"n{n}")

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, range(16)))
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [200] * 5 + [429] * 11, [a.text for a in answers if a.status_code >= 500]
    assert {a.json()["code"] for a in answers if a.status_code == 429} == {"budget.exceeded"}
    assert {a.json()["details"]["meter"] for a in answers if a.status_code == 429} == {
        "ai.requests"
    }
    assert len(upstream.bodies("echo")) == 5  # the refused ones were never sent
    with server.client() as http:
        usage = {
            row["meter"]: row["value"]
            for row in http.get("/v1/usage", params={"window": "day"}).json()
        }
        items = http.get("/v1/ai/requests", params={"limit": 500}).json()["items"]
    assert usage["ai.requests"] == 5
    assert sorted(i["status"] for i in items) == ["ok"] * 5 + ["refused"] * 11


def test_an_event_over_a_mebibyte_ends_the_stream(
    server: ServerProcess, upstream: ScriptedUpstream
) -> None:
    """The event's end arrives in the read after the one that brought the buffer near
    1 MiB: it is still one event over 1 MiB, never relayed."""
    server = _start(server)
    with server.client() as http:
        _setup(http, upstream)
    relayed = bytearray()
    with _streamed(server, "bigevent") as response:
        assert response.status_code == 200
        request_id = response.headers["ductor-request-id"]
        for chunk in response.iter_bytes():
            relayed += chunk
    assert b"yyyy" not in relayed
    event, data = bytes(relayed).strip().split(b"\n")
    assert event == b"event: error"
    error = json.loads(data.removeprefix(b"data: "))["error"]
    assert error["code"] == "ai.upstream_error"
    assert "too long" in error["message"]
    record = _record(server, request_id)
    assert (record["status"], record["http_status"]) == ("upstream_error", 200)
    assert record["error_code"] == "ai.upstream_error"


# (usage the upstream claims, the tokens recorded, the source)
_USAGES: list[tuple[Any, tuple[int, int] | None, str]] = [
    ({"prompt_tokens": 5, "completion_tokens": 2}, (5, 2), "upstream"),
    ({"prompt_tokens": -5, "completion_tokens": 2}, None, "estimated"),
    ({"prompt_tokens": 5, "completion_tokens": -2}, None, "estimated"),
    ({"prompt_tokens": "5", "completion_tokens": 2}, None, "estimated"),
    ({"prompt_tokens": 5, "completion_tokens": "2"}, None, "estimated"),
    ({"prompt_tokens": 5.5, "completion_tokens": 2}, None, "estimated"),
    ({"prompt_tokens": True, "completion_tokens": 2}, None, "estimated"),
    ({"prompt_tokens": 10**30, "completion_tokens": 2}, None, "estimated"),
    ({"prompt_tokens": 5, "completion_tokens": None}, None, "estimated"),
    ({"prompt_tokens": 5}, None, "estimated"),
    ("lots", None, "estimated"),
    ({"prompt_tokens": MAX_USAGE, "completion_tokens": MAX_USAGE}, (MAX_USAGE,) * 2, "upstream"),
]


def test_usage_an_upstream_makes_up_is_estimated_or_capped(
    server: ServerProcess, upstream: ScriptedUpstream
) -> None:
    """Usage that is not two counts from 0 to 2^53 - 1 is not believed: the call is
    estimated from its text, whole or streamed; the largest counts cost at most
    2^53 - 1 micros, and the meters stop there too."""
    server = _start(server)
    with server.client() as http:
        _setup(http, upstream)
        price = {"input_per_million": 1_000_000, "output_per_million": 1_000_000}
        assert http.put("/v1/ai/prices/usage", json=price).status_code == 201
        for claimed, tokens, source in _USAGES:
            content = json.dumps(claimed)
            estimated_in = -(-len(content) // 4)
            answer = _chat(http, "usage", content)
            assert answer.status_code == 200, (claimed, answer.text)
            assert answer.headers["ductor-usage-source"] == source, claimed
            record = _record(server, answer.headers["ductor-request-id"])
            expected = tokens or (estimated_in, 2)  # "counted": 7 characters, 2 tokens
            assert (record["tokens_in"], record["tokens_out"]) == expected, claimed
            assert record["usage_source"] == source, claimed
            cost = min(expected[0] + expected[1], MAX_USAGE)
            assert answer.headers["ductor-cost-micros"] == str(cost), claimed
            assert record["cost_micros"] == cost, claimed

            with http.stream(
                "POST",
                "/v1/ai/chat/completions",
                json={
                    "model": "usage",
                    "messages": [{"role": "user", "content": content}],
                    "stream": True,
                },
            ) as streamed:
                assert streamed.status_code == 200
                streamed_id = streamed.headers["ductor-request-id"]
                text = streamed.read()
            assert b"event: error" not in text
            assert b'"usage":' not in text  # the caller did not ask for it
            record = _record(server, streamed_id)
            out = -(-len("".join(PIECES)) // 4)
            expected = tokens or (estimated_in, out)
            assert (record["tokens_in"], record["tokens_out"]) == expected, claimed
            assert record["usage_source"] == source, claimed
        usage = {
            row["meter"]: row["value"]
            for row in http.get("/v1/usage", params={"window": "day"}).json()
        }
    assert usage["ai.tokens"] == MAX_USAGE
    assert usage["ai.cost"] == MAX_USAGE


def test_a_model_name_no_upstream_should_see_is_refused(
    server: ServerProcess, upstream: ScriptedUpstream
) -> None:
    server = _start(server)
    with server.client() as http:
        _setup(http, upstream)
        for model in ("a\x01b", "tab\there", "del\x7f", "x" * 257, " ", ""):
            answer = _chat(http, model)
            assert answer.status_code == 422, (model, answer.text)
            assert answer.json()["code"] == "request.invalid"
            assert [p["pointer"] for p in answer.json()["details"]["problems"]] == ["/model"]
            path = "/v1/ai/prices/" + urllib.parse.quote(model)
            answer = http.put(path, json={"input_per_million": 1})
            assert answer.status_code in (404, 405, 422), (model, answer.text)
            assert answer.status_code < 500
        # A megabyte of a name is over the body limit: 413, before any of it is read.
        answer = _chat(http, "m" * (1024 * 1024 + 1))
        assert answer.status_code == 413, answer.text
        assert answer.json()["code"] == "request.too_large"
        # A name of 256 characters is fine, and may hold `/` and non-ASCII text.
        for model in ("e" * 256, "meta/llama-3", "modèle-ü"):
            answer = _chat(http, model)
            assert answer.status_code == 200, (model, answer.text)
        fine = ("e" * 256, "meta/llama-3", "modèle-ü")
        assert [b["model"] for b in upstream.bodies()] == list(fine)
        # The connection named by header: only the tenant's own slug-shaped names.
        for name in ("../llm", "llm\x7f", "x" * 100_000):
            answer = http.post(
                "/v1/ai/chat/completions",
                json={"model": "echo", "messages": [{"role": "user", "content": "hi"}]},
                headers={"Ductor-Connection": name},
            )
            assert answer.status_code in (400, 404, 431), (name[:20], answer.status_code)
    assert len(upstream.requests) == 3
    assert all(auth == f"Bearer {UPSTREAM_KEY}" for _, auth, _ in upstream.requests)


def test_a_caller_hanging_up_mid_stream_lets_the_upstream_go(
    server: ServerProcess, upstream: ScriptedUpstream
) -> None:
    """A caller that hangs up on a stream that would never end: the proxy stops reading
    the upstream (its connection is closed, so it stops sending), and the record says
    `client_closed`; the server goes on answering."""
    server = _start(server)
    with server.client() as http:
        _setup(http, upstream)
    with _streamed(server, "endless") as response:
        assert response.status_code == 200
        request_id = response.headers["ductor-request-id"]
        got = 0
        for chunk in response.iter_bytes():
            got += len(chunk)
            if got > 256 * 1024:
                break
    record = _record(server, request_id)
    assert (record["status"], record["error_code"]) == ("client_closed", "ai.client_closed")
    assert record["http_status"] == 200
    deadline = time.monotonic() + 10
    while True:  # the upstream's writes fail once the proxy has closed its side
        sent = upstream.endless_sent
        time.sleep(0.5)
        if upstream.endless_sent == sent:
            break
        assert time.monotonic() < deadline, "the upstream is still being read"
    assert sent < 16 * 1024 * 1024
    with server.client() as http:
        assert _chat(http, "echo").status_code == 200


# Answers a careless or hostile upstream may send (`raw` gives them back as sent).
_ODD_ANSWERS = [
    '{"choices": 5}',
    '{"choices": [5, null, {"message": 7}, {"message": {"content": 9}}]}',
    '{"choices": true, "usage": {"prompt_tokens": 1, "completion_tokens": []}}',
    '{"usage": null, "choices": {"message": {}}}',
]
_ODD_STREAMS = [
    'data: {"choices": 5}\n\ndata: [DONE]\n\n',
    'data: {"choices": [7, {"delta": 3}, {"delta": {"content": ["x"]}}]}\n\ndata: [DONE]\n\n',
    'data: {"choices": true, "usage": {"prompt_tokens": "x"}}\n\ndata: [DONE]\n\n',
    "data: {not json\n\ndata: " + "[" * 100_000 + "\n\n: a comment\n\ndata: [DONE]\n\n",
    "event: ping\r\ndata:\r\n\r\nretry: x\n\nid\n\n" + "data: [DONE]",
]


def test_odd_answers_and_events_of_an_upstream_are_passed_on_not_a_crash(
    server: ServerProcess, upstream: ScriptedUpstream
) -> None:
    """Answers whose `choices` or `usage` are of the wrong shape are the upstream's to
    give: passed on as sent (200, estimated), never a 500 of Ductor's; so is each
    event of a stream, which ends as the upstream ended it."""
    server = _start(server)
    with server.client() as http:
        _setup(http, upstream)
        for odd in _ODD_ANSWERS:
            answer = _chat(http, "raw", odd)
            assert answer.status_code == 200, (odd, answer.text)
            assert answer.content == odd.encode()
            assert answer.headers["ductor-usage-source"] == "estimated"
            record = _record(server, answer.headers["ductor-request-id"])
            assert record["status"] == "ok"
        for odd in _ODD_STREAMS:
            with http.stream(
                "POST",
                "/v1/ai/chat/completions",
                json={"model": "raw", "messages": [{"role": "user", "content": odd}]}
                | {"stream": True},
            ) as streamed:
                assert streamed.status_code == 200
                request_id = streamed.headers["ductor-request-id"]
                text = streamed.read().decode()
            assert "event: error" not in text, (odd, text)
            assert text.endswith("data: [DONE]\n\n"), (odd, text[-200:])
            record = _record(server, request_id)
            assert (record["status"], record["usage_source"]) == ("ok", "estimated"), odd
        assert _chat(http, "echo").status_code == 200


def test_prices_and_settings_hold_their_bounds(
    server: ServerProcess, upstream: ScriptedUpstream
) -> None:
    """Prices are integers from 0 to 2^53 - 1 and at most 1000 a tenant, even when
    the last ones are set at the same time; `*` prices the rest; the timeout is 0.1
    to 600 seconds."""
    server = _start(server)
    with server.client() as http:
        _setup(http, upstream)
        for value in (0, MAX_USAGE):
            answer = http.put("/v1/ai/prices/edge", json={"input_per_million": value})
            assert answer.status_code in (200, 201), answer.text
        for bad in (-1, MAX_USAGE + 1, 1.5, "1", True, None):
            answer = http.put("/v1/ai/prices/edge", json={"input_per_million": bad})
            assert answer.status_code == 422, (bad, answer.text)
            assert answer.json()["code"] == "request.invalid"
            answer = http.put(
                "/v1/ai/prices/edge", json={"input_per_million": 1, "output_per_million": bad}
            )
            assert answer.status_code == 422, (bad, answer.text)
        assert http.get("/v1/ai/prices/edge").json()["input_per_million"] == MAX_USAGE
        # `*` prices a model without a price of its own; a name may hold `/`.
        star = http.put("/v1/ai/prices/*", json={"input_per_million": 2_000_000})
        assert star.status_code == 201, star.text
        assert _chat(http, "echo").headers["ductor-cost-micros"] == "22"  # 11 tokens in
        meta = http.put("/v1/ai/prices/meta/llama-3", json={"input_per_million": 1})
        assert meta.status_code == 201, meta.text
        assert http.get("/v1/ai/prices/meta/llama-3").json()["model"] == "meta/llama-3"
        assert http.delete("/v1/ai/prices/meta/llama-3").status_code == 204
        gone = http.get("/v1/ai/prices/meta/llama-3")
        assert (gone.status_code, gone.json()["code"]) == (404, "ai.price_not_found")
        assert http.delete("/v1/ai/prices/meta/llama-3").status_code == 404

        for seconds in (0.1, 600):
            answer = http.put("/v1/ai/settings", json={"timeout_seconds": seconds})
            assert answer.status_code == 200, answer.text
        for seconds in (0.09, 600.1, -1, "60"):
            answer = http.put("/v1/ai/settings", json={"timeout_seconds": seconds})
            assert answer.status_code == 422, (seconds, answer.text)
        answer = http.put("/v1/ai/settings", json={"default_connection": "nope"})
        assert (answer.status_code, answer.json()["code"]) == (404, "connection.not_found")

        have = len(http.get("/v1/ai/prices").json())
        for n in range(have, 995):
            assert http.put(f"/v1/ai/prices/m{n}", json={"input_per_million": 1}).status_code == 201

    def put(n: int) -> int:
        with server.client() as mine:
            return mine.put(f"/v1/ai/prices/race{n}", json={"input_per_million": 1}).status_code

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        statuses = sorted(pool.map(put, range(12)))
    assert statuses == [201] * 5 + [422] * 7
    with server.client() as http:
        assert len(http.get("/v1/ai/prices").json()) == 1000
        # At the limit a price is still replaced, and removing one makes room.
        assert http.put("/v1/ai/prices/m994", json={"input_per_million": 2}).status_code == 200
        assert http.delete("/v1/ai/prices/m994").status_code == 204
        assert http.put("/v1/ai/prices/last", json={"input_per_million": 2}).status_code == 201


def test_requests_in_flight_pass_a_cost_budget_only_by_what_they_use(
    server: ServerProcess, upstream: ScriptedUpstream
) -> None:
    """Requests admitted together on their estimates may take `ai.cost` past its limit
    by what they use (their real usage is never refused), and the next is refused."""
    server = _start(server)
    with server.client() as http:
        _setup(http, upstream)
        price = {"input_per_million": 1_000_000, "output_per_million": 1_000_000}
        assert http.put("/v1/ai/prices/echo", json=price).status_code == 201
        assert (
            http.put("/v1/budgets/ai.cost", json={"window": "day", "limit": 20}).status_code == 201
        )

    def ask(n: int) -> httpx.Response:
        with server.client() as http:
            return _chat(http, "echo", f"n{n}")

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(ask, range(6)))
    ok = [a for a in answers if a.status_code == 200]
    assert {a.status_code for a in answers} <= {200, 429}
    assert ok  # the first is admitted whatever the order
    with server.client() as http:
        usage = {
            row["meter"]: row["value"]
            for row in http.get("/v1/usage", params={"window": "day"}).json()
        }
        assert usage["ai.cost"] == 18 * len(ok)  # 11 + 7 tokens at 1 micro each
        assert len(upstream.bodies("echo")) == len(ok)
        refused = _chat(http, "echo")
        assert refused.status_code == 429, refused.text
        assert refused.json()["details"]["meter"] == "ai.cost"
