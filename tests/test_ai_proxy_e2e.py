"""The inference proxy through real server processes on both backends, called with the
official `openai` client (base_url .../v1/ai, api_key = the tenant's key), against
a scripted upstream on 127.0.0.1 (tests/ai_upstream.py): whole and streamed chat,
embeddings, cost header and record, the price table per tenant, a budget that
refuses the request that would cross it before the upstream sees it, 502/504 and a
broken stream, bad input, tenant isolation, concurrent requests, and an ACTION
step on an openai connection metered the same way.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import time
from typing import Any

import httpx
import openai
import pytest

from ductor_server.connections import new_secret_key

from .ai_upstream import PIECES, STREAM_USAGE, UPSTREAM_KEY, USAGE, ScriptedUpstream
from .conftest import ServerProcess, _create_key


def _target(server: ServerProcess) -> str:
    return server.database_url or str(server.data_dir / "ductor.db")


def _client(server: ServerProcess, key: str | None = None, **kw: Any) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{server.url}/v1/ai", api_key=key or server.api_key, max_retries=0, **kw
    )


def _setup(http: httpx.Client, upstream: ScriptedUpstream, name: str = "llm") -> None:
    answer = http.post(
        "/v1/connections",
        json={
            "name": name,
            "provider": "openai",
            "config": {"base_url": upstream.url},
            "secrets": {"api_key": UPSTREAM_KEY},
        },
    )
    assert answer.status_code == 201, answer.text
    answer = http.put("/v1/ai/settings", json={"default_connection": name})
    assert answer.status_code == 200, answer.text


def _only_ductors_headers(headers: dict[str, str]) -> None:
    """What Ductor sent upstream: the connection's key and the body's type, and none of
    the caller's headers (its own, its cookie, the `openai` client's `X-Stainless-*`
    and user agent)."""
    assert headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert headers["content-type"].startswith("application/json")
    assert "x-caller-secret" not in headers
    assert "cookie" not in headers
    assert "openai-organization" not in headers
    assert not [name for name in headers if name.startswith("x-stainless")]
    assert "openai" not in headers.get("user-agent", "").lower()


def _record(server: ServerProcess, request_id: str) -> dict[str, Any]:
    """The AI request record of `request_id`, once written (a stream's, at its end)."""
    with server.client() as http:
        deadline = time.monotonic() + 10
        while (answer := http.get(f"/v1/ai/requests/{request_id}")).status_code == 404:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    record: dict[str, Any] = answer.json()
    return record


def _start(server: ServerProcess) -> ServerProcess:
    if server.database_url:  # `ductor dev` makes its own secret key; `serve` is given one
        server.extra_env["DUCTOR_SECRET_KEYS"] = new_secret_key("k1")
    return server.start()


def test_chat_stream_embeddings_cost_and_records(
    server: ServerProcess, upstream: ScriptedUpstream
) -> None:
    server = _start(server)
    other_key = asyncio.run(_create_key(_target(server), "other"))
    with server.client() as http:
        _setup(http, upstream)
        assert (
            http.put(
                "/v1/ai/prices/echo",
                json={"input_per_million": 2_500_000, "output_per_million": 10_000_000},
            ).status_code
            == 201
        )
        assert (
            http.put(
                "/v1/ai/prices/echo",
                json={"input_per_million": 3_000_000, "output_per_million": 10_000_000},
            ).status_code
            == 200
        )
        assert (
            http.put("/v1/ai/prices/text-embed", json={"input_per_million": 100_000}).status_code
            == 201
        )
    client = _client(server)

    # A whole chat: the upstream's answer, its cost in a header, the record behind it.
    raw = client.chat.completions.with_raw_response.create(
        model="echo",
        messages=[{"role": "user", "content": "hi there"}],
        extra_headers={"X-Caller-Secret": "s3cret", "Cookie": "session=1"},
    )
    completion = raw.parse()
    assert completion.choices[0].message.content == "echo: hi there"
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == USAGE["prompt_tokens"]
    # 11 * 3 + 7 * 10 micros per token = 103
    assert raw.headers["ductor-cost-micros"] == "103"
    request_id = raw.headers["ductor-request-id"]
    sent = upstream.requests[-1]
    assert sent[0] == "/v1/chat/completions"
    assert sent[1] == f"Bearer {UPSTREAM_KEY}"
    _only_ductors_headers(upstream.headers[-1])
    with server.client() as http:
        record = http.get(f"/v1/ai/requests/{request_id}").json()
    assert record["model"] == "echo"
    assert record["status"] == "ok"
    assert (record["tokens_in"], record["tokens_out"], record["cost_micros"]) == (11, 7, 103)
    assert record["usage_source"] == "upstream"
    assert record["connection"] == "llm"
    assert record["latency_ms"] > 0
    assert record["http_status"] == 200

    # A stream: each chunk reaches the caller before the upstream sends the next one.
    pieces: list[str] = []
    with client.chat.completions.create(
        model="gated", messages=[{"role": "user", "content": "hi"}], stream=True
    ) as stream:
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
                upstream.release()
    assert pieces == PIECES
    assert upstream.gate_released_by_caller is True
    # The proxy asked for usage; the caller did not, so it got no usage chunk, but
    # the record has the upstream's count.
    assert upstream.bodies("gated")[-1]["stream_options"] == {"include_usage": True}
    with client.chat.completions.with_streaming_response.create(
        model="echo",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
    ) as response:
        stream_id = response.headers["ductor-request-id"]
        chunks = list(response.parse())
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 3
    record = _record(server, stream_id)
    assert record["stream"] is True
    assert record["status"] == "ok"
    assert (record["tokens_in"], record["tokens_out"]) == (11, STREAM_USAGE["completion_tokens"])
    assert record["cost_micros"] == 11 * 3 + 3 * 10

    # An answer without usage is estimated, and says so.
    raw = client.chat.completions.with_raw_response.create(
        model="nousage", messages=[{"role": "user", "content": "x" * 40}]
    )
    assert raw.headers["ductor-usage-source"] == "estimated"
    with server.client() as http:
        record = http.get(f"/v1/ai/requests/{raw.headers['ductor-request-id']}").json()
    assert record["usage_source"] == "estimated"
    assert record["tokens_in"] == 10
    assert record["priced"] is False
    assert record["cost_micros"] == 0

    # Embeddings.
    raw_embed = client.embeddings.with_raw_response.create(model="text-embed", input=["a", "b"])
    embedded = raw_embed.parse()
    assert [d.embedding for d in embedded.data] == [[0.5, -0.25, 0.125]] * 2
    assert raw_embed.headers["ductor-cost-micros"] == "1"  # 4 tokens * 0.1 micros, rounded up

    # No caller's header reached the upstream, on any call (streams and embeddings too).
    for headers in upstream.headers:
        _only_ductors_headers(headers)

    # The meters counted every call.
    with server.client() as http:
        usage = {
            row["meter"]: row["value"]
            for row in http.get("/v1/usage", params={"window": "day"}).json()
            if row["meter"].startswith("ai.")
        }
        page = http.get("/v1/ai/requests", params={"limit": 2}).json()
        assert len(page["items"]) == 2
        assert page["next_cursor"]
        rest = http.get(
            "/v1/ai/requests", params={"limit": 50, "cursor": page["next_cursor"]}
        ).json()
        ids = [r["id"] for r in page["items"] + rest["items"]]
    assert usage["ai.requests"] == 5
    assert usage["ai.cost"] == 103 + 0 + 63 + 0 + 1  # echo, gated, streamed echo, nousage, embed
    assert len(ids) == len(set(ids)) == 5
    assert request_id in ids

    # Another tenant sees none of it and cannot use the first tenant's connection.
    other = _client(server, other_key)
    with server.client(other_key) as http:
        assert http.get(f"/v1/ai/requests/{request_id}").status_code == 404
        assert http.get("/v1/ai/requests").json()["items"] == []
        assert http.get("/v1/ai/prices").json() == []
    with pytest.raises(openai.APIStatusError) as refused:
        other.chat.completions.create(
            model="echo",
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={"Ductor-Connection": "llm"},
        )
    assert refused.value.status_code == 404
    assert refused.value.body["code"] == "connection.not_found"  # type: ignore[index]

    # Concurrent requests: each answered and recorded once.
    before = len(upstream.requests)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(
            pool.map(
                lambda i: client.chat.completions.with_raw_response.create(
                    model="echo", messages=[{"role": "user", "content": f"n{i}"}]
                ),
                range(16),
            )
        )
    texts = sorted(a.parse().choices[0].message.content or "" for a in answers)
    assert texts == sorted(f"echo: n{i}" for i in range(16))
    assert len(upstream.requests) - before == 16
    assert len({a.headers["ductor-request-id"] for a in answers}) == 16
    with server.client() as http:
        page = http.get("/v1/ai/requests", params={"limit": 500}).json()
    assert len(page["items"]) == 21

    # A connection's organization is sent as `OpenAI-Organization`, never the caller's.
    with server.client() as http:
        answer = http.post(
            "/v1/connections",
            json={
                "name": "org",
                "provider": "openai",
                "config": {"base_url": upstream.url, "organization": "org-ductor"},
                "secrets": {"api_key": UPSTREAM_KEY},
            },
        )
        assert answer.status_code == 201, answer.text
    client.chat.completions.create(
        model="echo",
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={"Ductor-Connection": "org", "OpenAI-Organization": "org-caller"},
    )
    assert upstream.headers[-1]["openai-organization"] == "org-ductor"


def test_budget_refuses_before_the_upstream_sees_it(
    server: ServerProcess, upstream: ScriptedUpstream
) -> None:
    server = _start(server)
    with server.client() as http:
        _setup(http, upstream)
        http.put(
            "/v1/ai/prices/echo",
            json={"input_per_million": 1_000_000, "output_per_million": 1_000_000},
        )
        # 18 micros a call (11 + 7 tokens at 1 micro each): two fit in 40, a third not.
        answer = http.put("/v1/budgets/ai.cost", json={"window": "day", "limit": 40})
        assert answer.status_code == 201, answer.text
    client = _client(server)
    for _ in range(2):
        client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "hi"}])
    seen = len(upstream.requests)
    with pytest.raises(openai.APIStatusError) as refused:
        client.chat.completions.create(
            model="echo", messages=[{"role": "user", "content": "hi"}], max_tokens=10
        )
    assert refused.value.status_code == 429
    body = refused.value.body
    assert body["code"] == "budget.exceeded"
    assert body["details"]["meter"] == "ai.cost"
    assert len(upstream.requests) == seen  # nothing was sent
    # A count budget on ai.requests refuses exactly the request past it.
    with server.client() as http:
        http.delete("/v1/budgets/ai.cost")
        assert (
            http.put("/v1/budgets/ai.requests", json={"window": "day", "limit": 3}).status_code
            == 201
        )
    client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.APIStatusError) as refused:
        client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "hi"}])
    assert refused.value.body["details"]["meter"] == "ai.requests"  # type: ignore[index]
    assert len(upstream.requests) == seen + 1
    with server.client() as http:
        items = http.get("/v1/ai/requests").json()["items"]
    assert [i["status"] for i in items][:2] == ["refused", "ok"]
    assert items[0]["error_code"] == "budget.exceeded"
    assert items[0]["cost_micros"] == 0


def test_upstream_failures_and_bad_input(server: ServerProcess, upstream: ScriptedUpstream) -> None:
    server = _start(server)
    with server.client() as http:
        _setup(http, upstream)
        assert (
            http.put(
                "/v1/ai/settings", json={"default_connection": "llm", "timeout_seconds": 1}
            ).status_code
            == 200
        )
        assert (
            http.post(
                "/v1/connections",
                json={"name": "hook", "provider": "http", "config": {"base_url": upstream.url}},
            ).status_code
            == 201
        )
    client = _client(server, timeout=30)
    hi = [{"role": "user", "content": "hi"}]

    for model, status in (("fail", 500), ("limited", 429)):
        with pytest.raises(openai.APIStatusError) as failed:
            client.chat.completions.create(model=model, messages=hi)
        assert failed.value.status_code == 502
        body = failed.value.body
        assert body["code"] == "ai.upstream_error"  # type: ignore[index]
        assert body["details"]["upstream_status"] == status  # type: ignore[index]
        # The failure names the record it kept, in details and in the header.
        kept = body["details"]["request_id"]  # type: ignore[index]
        assert failed.value.response.headers["Ductor-Request-Id"] == kept
        record = _record(server, kept)
        assert (record["model"], record["status"], record["http_status"]) == (
            model,
            "upstream_error",
            502,
        )
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as slow:
        client.chat.completions.create(model="slow", messages=hi)
    assert slow.value.status_code == 504
    assert time.monotonic() - started < 4
    assert slow.value.body["code"] == "ai.upstream_timeout"  # type: ignore[index]
    timed_out = _record(server, slow.value.response.headers["Ductor-Request-Id"])
    assert timed_out["status"] == "upstream_timeout"
    assert slow.value.body["details"]["request_id"] == timed_out["id"]  # type: ignore[index]
    # A stream that goes silent midway ends with an error event.
    got: list[str] = []
    with pytest.raises(openai.APIError) as broken:  # noqa: PT012
        for chunk in client.chat.completions.create(model="stall", messages=hi, stream=True):
            got.extend(c.delta.content or "" for c in chunk.choices)
    assert got == ["Hel"]
    assert "silent" in broken.value.message
    # The upstream refused by the outbound guard would be `outbound.forbidden`; an
    # unreachable one is a 502.
    with server.client() as http:
        http.post(
            "/v1/connections",
            json={
                "name": "gone",
                "provider": "openai",
                "config": {"base_url": "http://127.0.0.1:9/v1"},
                "secrets": {"api_key": UPSTREAM_KEY},
            },
        )
        answer = http.post(
            "/v1/ai/chat/completions",
            json={"model": "echo", "messages": hi},
            headers={"Ductor-Connection": "gone"},
        )
        assert answer.status_code == 502
        assert answer.json()["code"] == "ai.upstream_error"

        # Bad input: every problem with a pointer, nothing sent upstream.
        seen = len(upstream.requests)
        answer = http.post("/v1/ai/chat/completions", json={"messages": []})
        assert answer.status_code == 422
        pointers = {p["pointer"] for p in answer.json()["details"]["problems"]}
        assert pointers == {"/model", "/messages"}
        answer = http.post("/v1/ai/embeddings", json={"model": "e"})
        assert answer.json()["details"]["problems"][0]["pointer"] == "/input"
        answer = http.post(
            "/v1/ai/chat/completions",
            content=b'{"model": "echo", "messages": ['
            + b'{"role":"user","content":"'
            + b"x" * (2 * 1024 * 1024)
            + b'"}]}',
            headers={"Content-Type": "application/json"},
        )
        assert answer.status_code == 413
        assert answer.json()["code"] == "request.too_large"
        answer = http.post(
            "/v1/ai/chat/completions",
            json={"model": "echo", "messages": hi, "ductor_connection": "nope"},
        )
        assert answer.status_code == 404
        assert answer.json()["code"] == "connection.not_found"
        answer = http.post(
            "/v1/ai/chat/completions",
            json={"model": "echo", "messages": hi},
            headers={"Ductor-Connection": "hook"},
        )
        assert answer.status_code == 422
        assert answer.json()["code"] == "ai.connection_unsupported"
        answer = http.post(
            "/v1/ai/chat/completions",
            content=b"{nope",
            headers={"Content-Type": "application/json"},
        )
        assert answer.status_code == 400
        assert len(upstream.requests) == seen
        answer = http.put("/v1/ai/settings", json={"default_connection": "hook"})
        assert answer.json()["code"] == "ai.connection_unsupported"
        answer = http.put("/v1/ai/settings", json={"timeout_seconds": 0})
        assert answer.status_code == 422
        assert http.get("/v1/ai/requests", params={"cursor": "bogus"}).status_code == 422
        assert http.get("/v1/ai/prices/nope").json()["code"] == "ai.price_not_found"
        assert http.get("/v1/ai/requests/air_x%00").status_code == 422  # docs/api.md
        assert http.put("/v1/ai/prices/a%00b", json={"input_per_million": 1}).status_code == 422
        items = http.get("/v1/ai/requests").json()["items"]
        statuses = [(i["model"], i["status"], i["http_status"]) for i in items]
    assert ("slow", "upstream_timeout", 504) in statuses
    assert ("fail", "upstream_error", 502) in statuses
    assert ("stall", "upstream_timeout", 200) in statuses
    with server.client() as http:
        assert http.put("/v1/ai/settings", json={"default_connection": None}).status_code == 200
        answer = http.post("/v1/ai/chat/completions", json={"model": "echo", "messages": hi})
    assert answer.status_code == 422
    assert answer.json()["code"] == "ai.no_connection"


def test_an_action_on_an_openai_connection_is_metered(
    server: ServerProcess, upstream: ScriptedUpstream
) -> None:
    server = _start(server)
    with server.client() as http:
        _setup(http, upstream)
        http.put(
            "/v1/ai/prices/echo",
            json={"input_per_million": 1_000_000, "output_per_million": 2_000_000},
        )
        definition = {
            "family_slug": "ask",
            "title": "Ask a model",
            "steps": [
                {
                    "ref": "ask",
                    "type": "STEP_TYPE_ACTION",
                    "args": {
                        "connection": "llm",
                        "operation": "chat",
                        "input": {
                            "model": "'echo'",
                            "messages": "[{'role': 'user', 'content': input.q}]",
                        },
                    },
                }
            ],
            "edges": [],
        }
        answer = http.post("/v1/workflows", json=definition)
        assert answer.status_code in (200, 201), answer.text
        run = http.post("/v1/runs", json={"family_slug": "ask", "input": {"q": "why"}}).json()
    ended = server.wait_for_run(run["id"])
    assert ended["status"] == "RUN_STATUS_SUCCEEDED", ended
    with server.client() as http:
        items = http.get("/v1/ai/requests").json()["items"]
        usage = {
            row["meter"]: row["value"]
            for row in http.get("/v1/usage", params={"window": "day"}).json()
        }
    assert len(items) == 1
    record = items[0]
    assert record["source"] == "action"
    assert record["run_id"] == run["id"]
    assert record["step_ref"] == "ask"
    assert record["model"] == "echo"
    assert (record["tokens_in"], record["tokens_out"], record["cost_micros"]) == (11, 7, 25)
    assert usage["ai.requests"] == 1
    assert usage["ai.tokens"] == 18
    assert usage["ai.cost"] == 25


def test_a_hostile_upstream_is_cut_and_read_safely(
    server: ServerProcess, upstream: ScriptedUpstream
) -> None:
    server = _start(server)
    with server.client() as http:
        _setup(http, upstream)
    hi = [{"role": "user", "content": "hi"}]

    # A stream that never ends is cut once 16 MiB have been relayed, with an error event.
    relayed = bytearray()
    with (
        httpx.Client(base_url=server.url, timeout=30) as http,
        http.stream(
            "POST",
            "/v1/ai/chat/completions",
            json={"model": "endless", "messages": hi, "stream": True},
            headers={"Authorization": f"Bearer {server.api_key}"},
        ) as response,
    ):
        assert response.status_code == 200
        stream_id = response.headers["ductor-request-id"]
        for chunk in response.iter_bytes():
            relayed += chunk
            assert len(relayed) < 20 * 1024 * 1024, "the stream was not cut"
    assert len(relayed) <= 16 * 1024 * 1024 + 1024
    assert len(relayed) > 15 * 1024 * 1024
    head, _, last = bytes(relayed).rstrip(b"\n").rpartition(b"\n\n")
    assert head.endswith(b'"}}]}')  # whole events only before the error
    event, data = last.split(b"\n")
    assert event == b"event: error"
    error = json.loads(data.removeprefix(b"data: "))["error"]
    assert error["code"] == "ai.upstream_error"
    assert "16777216 bytes" in error["message"]
    record = _record(server, stream_id)
    assert (record["status"], record["http_status"]) == ("upstream_error", 200)
    assert record["error_code"] == "ai.upstream_error"

    # A stream whose lines end with CRLF, split between two reads, is read event by event.
    client = _client(server)
    with client.chat.completions.with_streaming_response.create(
        model="crlf", messages=hi, stream=True
    ) as response:
        crlf_id = response.headers["ductor-request-id"]
        pieces = [c.choices[0].delta.content for c in response.parse() if c.choices]
    assert pieces == PIECES
    record = _record(server, crlf_id)
    assert (record["status"], record["usage_source"]) == ("ok", "upstream")
    assert (record["tokens_in"], record["tokens_out"]) == (11, STREAM_USAGE["completion_tokens"])

    # A caller that hangs up once it has `[DONE]` got the whole answer: its record is ok.
    with client.chat.completions.with_streaming_response.create(
        model="linger", messages=hi, stream=True
    ) as response:
        linger_id = response.headers["ductor-request-id"]
        pieces = [c.choices[0].delta.content for c in response.parse() if c.choices]
    assert pieces == PIECES
    assert _record(server, linger_id)["status"] == "ok"

    # JSON nested too deep to read is a 502, in an answer and in an error's body.
    with server.client() as http:
        answer = http.post("/v1/ai/chat/completions", json={"model": "deep", "messages": hi})
        assert answer.status_code == 502, answer.text
        assert answer.json()["code"] == "ai.upstream_error"
        assert answer.json()["details"]["upstream_status"] == 200
        answer = http.post("/v1/ai/chat/completions", json={"model": "deep_error", "messages": hi})
        assert answer.status_code == 502, answer.text
        assert answer.json()["details"]["upstream_status"] == 500
        statuses = [(i["model"], i["status"]) for i in http.get("/v1/ai/requests").json()["items"]]
    assert ("deep", "upstream_error") in statuses
    assert ("deep_error", "upstream_error") in statuses

    # An error object holding lone surrogates (no UTF-8 text can) is still the 502,
    # each replaced by U+FFFD; one nested deeper than a body may is given as its text.
    with server.client() as http:
        answer = http.post(
            "/v1/ai/chat/completions", json={"model": "mangled_error", "messages": hi}
        )
        assert answer.status_code == 502, answer.text
        error = answer.json()
        assert error["message"] == "the upstream answered 500: bad \ufffd input"
        assert error["details"]["upstream_error"] == {
            "message": "bad \ufffd input",
            "code": "\ufffd",
            "\ufffd": 1,
        }
        assert _record(server, answer.headers["ductor-request-id"])["status"] == "upstream_error"
        answer = http.post(
            "/v1/ai/chat/completions", json={"model": "nested_error", "messages": hi}
        )
        assert answer.status_code == 502, answer.text
        shown = answer.json()["details"]["upstream_error"]
        assert isinstance(shown, str)
        assert shown.startswith('{"error": {"message": "too deep", "x": [[[')
    assert httpx.get(f"{server.url}/readyz").status_code == 200


def test_the_connections_key_never_comes_back(
    server: ServerProcess, upstream: ScriptedUpstream
) -> None:
    """An upstream that echoes the key it was sent (`tattle`) has it masked in the
    answer, whole or streamed, as a step's output and an upstream's error are."""
    _start(server)
    with server.client() as http:
        _setup(http, upstream)
        body = {"model": "tattle", "messages": [{"role": "user", "content": "hi"}]}
        whole = http.post("/v1/ai/chat/completions", json=body)
        assert whole.status_code == 200, whole.text
        assert UPSTREAM_KEY not in whole.text
        answer = whole.json()
        assert answer["choices"][0]["message"]["content"] == "you sent Bearer ••••"
        assert answer["echo"] == {"Bearer ••••": ["header", "Bearer ••••"]}
        assert answer["usage"] == USAGE
        assert int(whole.headers["Ductor-Cost-Micros"]) >= 0
        with http.stream(
            "POST", "/v1/ai/chat/completions", json={**body, "stream": True}
        ) as streamed:
            assert streamed.status_code == 200
            text = streamed.read().decode()
        assert UPSTREAM_KEY not in text
        events = [
            json.loads(line[len("data: ") :])
            for line in text.splitlines()
            if line.startswith("data: {")
        ]
        pieces = [e["choices"][0]["delta"]["content"] for e in events if e["choices"]]
        assert pieces == ["you sent Bearer ••••", "."]
        assert text.rstrip().endswith("data: [DONE]")
    # The official client reads the masked answers as it reads any other.
    client = _client(server)
    completion = client.chat.completions.create(
        model="tattle", messages=[{"role": "user", "content": "hi"}]
    )
    assert completion.choices[0].message.content == "you sent Bearer ••••"
    chunks = client.chat.completions.create(
        model="tattle", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
        "you sent Bearer ••••."
    )
