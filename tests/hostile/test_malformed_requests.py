"""Hostile requests against a real server process: every one is a documented 4xx
in the one error shape, the server stays up, and nothing is written.

Each backend gets one `ductor` process; the test sends invalid UTF-8, deep
nesting, integers outside 64 bits, oversized and empty ids, non-object and
truncated bodies, wrong content types, 2 MiB bodies, bad page sizes and cursors,
and garbage path parameters, then compares every table's row count.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg

DEEP = b"[" * 10_000 + b"]" * 10_000
BODY_ROUTES = [
    "/v1/workflows/validate",
    "/v1/workflows",
    "/v1/runs",
    "/v1/runs/run_x/cancel",
    "/v1/runs/run_x/signals/go",
    "/v1/events",
    "/v1/workers",
    "/v1/pools",
    "/v1/rules",
    "/v1/route",
    "/v1/assignments/asg_x/complete",
    "/v1/bridge/apps",
]
JSON = {"content-type": "application/json"}


def hostile_requests() -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(method, path, httpx keyword arguments) of every malformed request."""
    for path in BODY_ROUTES:
        yield "POST", path, {"content": b'{"name": "ab\xffcd", "id": "x\xc3"}', "headers": JSON}
        yield "POST", path, {"content": DEEP, "headers": JSON}
        yield "POST", path, {"content": b'{"input": ' + DEEP + b"}", "headers": JSON}
        yield "POST", path, {"content": b'{"name": "x", "id": ', "headers": JSON}  # truncated
        yield "POST", path, {"content": b"[1, 2]", "headers": JSON}
        yield "POST", path, {"content": b'"text"', "headers": JSON}
        yield "POST", path, {"content": b"12", "headers": JSON}
        yield "POST", path, {"content": b"null", "headers": JSON}
        yield "POST", path, {"content": b'{"a": 1}', "headers": {"content-type": "text/xml"}}
        yield "POST", path, {"content": b" " + b"x" * (2 * 1024 * 1024), "headers": JSON}
        yield "POST", path, {"json": {"id": "a\u0000b", "name": "a\u0000b"}}
    big = 9_223_372_036_854_775_808
    yield "POST", "/v1/runs", {"json": {"family_slug": "x", "version": big}}
    yield "POST", "/v1/runs", {"json": {"family_slug": "x", "input": {"n": -big - 1}}}
    yield "POST", "/v1/route", {"json": {"id": "r1", "kind": "lead", "price": 2**70}}
    yield "POST", "/v1/route", {"json": {"id": "r1", "kind": "lead", "price": 10**15 + 1}}
    yield "POST", "/v1/events", {"json": {"name": "e", "data": [2**64]}}
    yield "POST", "/v1/events", {"content": b'{"name": "e", "data": 1e400}', "headers": JSON}
    yield "GET", "/v1/rules/versions/684442215400994766848", {}
    yield "GET", "/v1/workflows/x/versions/684442215400994766848", {}
    yield "GET", "/v1/workflows/x/versions/-1", {}
    for what in ("workers", "pools"):
        yield "POST", f"/v1/{what}", {"json": {"id": ""}}
        yield "POST", f"/v1/{what}", {"json": {"id": "w" * 500_000}}
        yield "POST", f"/v1/{what}", {"json": {"id": "a\nb"}}
    # A channel is part of every capacity counter's key (a Postgres index limit).
    yield "POST", "/v1/pools", {"json": {"id": "p", "channel": "c" * 300_000}}
    yield "POST", "/v1/workers", {"json": {"id": "w", "capacity": {"c" * 300_000: 1}}}
    yield "POST", "/v1/route", {"json": {"id": "", "kind": "lead"}}
    yield "POST", "/v1/route", {"json": {"id": "r" * 100_000, "kind": "lead"}}
    yield "POST", "/v1/events", {"json": {"name": "e" * 100_000}}
    yield "POST", "/v1/events", {"json": {"name": "e", "id": ""}}
    yield "POST", "/v1/rules", {"json": {"id": ""}}
    wait = {"ref": "w", "type": "STEP_TYPE_WAIT", "args": {"duration": "99999999999999999999d"}}
    definition = {"family_slug": "slow", "title": "Slow", "steps": [wait], "edges": []}
    yield "POST", "/v1/workflows", {"json": definition}
    for limit in ("0", "-1", "100001", "99999999999999999999999", "x"):
        yield "GET", f"/v1/runs?limit={limit}", {}
        yield "GET", f"/v1/assignments?limit={limit}", {}
        yield "GET", f"/v1/pools/p/shadow-report?limit={limit}", {}
    for cursor in ("garbage", "%00", "\u00e9\u2603", "x" * 4000, "eyJ4IjoxfQ"):
        yield "GET", "/v1/runs", {"params": {"cursor": cursor}}
    yield "GET", "/v1/runs?status=RUN_STATUS_NOPE", {}
    for garbage in ("%C3%28", "%FF%FE", "%00", "\u2603\u0301" * 50, "..%2F..%2Fetc"):
        yield "GET", f"/v1/runs/{garbage}", {}
        yield "GET", f"/v1/workers/{garbage}", {}
        yield "GET", f"/v1/workflows/{garbage}", {}
        yield "POST", f"/v1/runs/{garbage}/signals/{garbage}", {"json": {}}
    yield "POST", "/v1/runs", {"json": {"family_slug": "x"}, "headers": {"Idempotency-Key": ""}}


def row_counts(server: Any) -> dict[str, int]:
    """Rows per table of the server's database."""
    if server.database_url:
        return asyncio.run(_postgres_counts(server.database_url))
    with sqlite3.connect(server.data_dir / "ductor.db") as db:
        tables = [
            name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        ]
        return {t: db.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in tables}


async def _postgres_counts(url: str) -> dict[str, int]:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cur = await conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
        )
        tables = [row[0] for row in await cur.fetchall()]
        counts = {}
        for table in tables:
            cur = await conn.execute(f'SELECT count(*) FROM "{table}"')
            row = await cur.fetchone()
            assert row is not None
            counts[table] = row[0]
        return counts


def test_every_malformed_request_is_a_documented_4xx(server: Any) -> None:
    server.start()
    before = row_counts(server)
    answers = []
    with server.client() as http:
        for method, path, kwargs in hostile_requests():
            try:
                response = http.request(method, path, **kwargs)
            except httpx.RemoteProtocolError:
                continue  # the HTTP layer hung up on it: nothing reached the app
            answers.append((method, path, response))
        assert httpx.get(f"{server.url}/healthz").status_code == 200
    assert len(answers) > 150
    wrong = []
    for method, path, response in answers:
        body = (
            response.json()
            if response.headers.get("content-type", "").startswith("application/json")
            else None
        )
        shaped = (
            isinstance(body, dict)
            and set(body) == {"code", "message", "details"}
            and isinstance(body["code"], str)
            and isinstance(body["message"], str)
        )
        if path == "/v1/workflows/validate" and response.status_code == 200:
            # Validation reports a body it cannot read as problems (docs/api.md).
            shaped = body["valid"] is False and bool(body["problems"])
        elif not (400 <= response.status_code < 500 and shaped):
            wrong.append((method, path[:80], response.status_code, response.text[:200]))
            continue
        if not shaped:
            wrong.append((method, path[:80], response.status_code, response.text[:200]))
    assert not wrong, "\n".join(map(str, wrong)) + "\n" + server.log()[-3000:]
    assert row_counts(server) == before


def test_a_bad_query_parameter_is_named_in_the_message(server: Any) -> None:
    server.start()
    with server.client() as http:
        for path, name, reason in (
            ("/v1/runs?limit=x", "limit", "Expected `int`, got `str`"),
            ("/v1/assignments?limit=0", "limit", "Expected `int` >= 1"),
            ("/v1/runs/r?wait=-1", "wait", "Expected `float` > 0.0"),
        ):
            body = http.get(path).json()
            assert body["code"] == "request.invalid", body
            assert body["message"] == f"invalid query parameter `{name}`: {reason}", body
            assert body["details"] == [{"message": reason, "key": name, "source": "query"}]
