"""The live inbox WebSocket's cap on sockets still waiting for their `auth`
message, against a real server (uvicorn on 127.0.0.1, in this process so that
the cap can be lowered to a few sockets) with the `websockets` library as the
client: the sockets up to the cap wait, one more is refused at once, and each
way a wait ends (authenticated, gone, bad credentials, too slow) frees its place.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest
import uvicorn
from websockets.asyncio.client import ClientConnection, connect

from ductor_server import Settings, create_app
from ductor_server.composition import Composition, build
from ductor_server.services.inbox import SendBody, subscriber_token
from ductor_server.transports.rest import inbox as inbox_routes

pytestmark = pytest.mark.timeout(90)

CAP = 3
TENANT = "tenant-a"


@asynccontextmanager
async def _served(tmp_path: Path) -> AsyncIterator[tuple[str, str]]:
    """Serve the app on a free port of 127.0.0.1; its WebSocket URL and the
    tenant's inbox secret."""
    async with _served_with(tmp_path) as (url, secret, _):
        yield url, secret


@asynccontextmanager
async def _served_with(
    tmp_path: Path, database_url: str | None = None
) -> AsyncIterator[tuple[str, str, Composition]]:
    """As `_served`, with the app's services too (on PostgreSQL with `database_url`)."""
    settings = Settings(data_dir=tmp_path, database_url=database_url, poll_interval=0.05)
    composition = build(settings)
    config = uvicorn.Config(
        create_app(composition=composition),
        host="127.0.0.1",
        port=0,
        log_level="warning",
        lifespan="on",
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    deadline = time.monotonic() + 30
    while not server.started:
        assert not serving.done(), "uvicorn stopped"
        assert time.monotonic() < deadline, "uvicorn did not start"
        await asyncio.sleep(0.02)
    try:
        port = server.servers[0].sockets[0].getsockname()[1]
        secret = (await composition.services.inbox.secret(TENANT)).secret
        yield f"ws://127.0.0.1:{port}/v1/inbox/me/ws", secret, composition
    finally:
        server.should_exit = True
        await serving


def _auth(secret: str, *, token: str | None = None) -> str:
    return msgspec.json.encode(
        {
            "type": "auth",
            "tenant_id": TENANT,
            "subscriber_id": "ann",
            "token": subscriber_token(secret, "ann") if token is None else token,
            "after": 0,
        }
    ).decode()


async def _frame(socket: ClientConnection) -> dict[str, Any]:
    message: dict[str, Any] = msgspec.json.decode(await asyncio.wait_for(socket.recv(), 10))
    return message


async def _closed_with(socket: ClientConnection, status: int, code: str) -> dict[str, Any]:
    """The error frame `socket` got, once the server has closed it with 4000 + status."""
    refused = await _frame(socket)
    assert (refused["type"], refused["status"], refused["code"]) == ("error", status, code)
    await asyncio.wait_for(socket.wait_closed(), 10)
    assert socket.close_code == 4000 + status
    return refused


async def _refused(url: str) -> None:
    """A new socket is refused at once, without sending anything."""
    async with connect(url, open_timeout=10) as socket:
        refused = await _closed_with(socket, 429, "inbox.socket_limit")
    assert refused["details"] == {"per": "unauthenticated", "limit": CAP}
    assert f"{CAP} inbox sockets are already waiting" in refused["message"]


async def _room(url: str, secret: str) -> None:
    """A new socket is let in and authenticates, once the server has seen a
    waiting socket's wait end (it may see it after the client does)."""
    deadline = time.monotonic() + 10
    while True:
        async with connect(url, open_timeout=10) as socket:
            await socket.send(_auth(secret))
            first = await _frame(socket)
        if first["type"] == "ready":
            return
        assert first["code"] == "inbox.socket_limit", first
        assert time.monotonic() < deadline, "no socket was let in again"
        await asyncio.sleep(0.05)


async def test_sockets_waiting_for_their_auth_message_are_capped_per_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(inbox_routes, "MAX_WAITING_FOR_AUTH", CAP)
    # Longer than the test: the waiting sockets must not time out on their own.
    monkeypatch.setattr(inbox_routes, "AUTH_SECONDS", 60.0)
    async with _served(tmp_path) as (url, secret), AsyncExitStack() as stack:

        async def waiting() -> ClientConnection:
            return await stack.enter_async_context(connect(url, open_timeout=10))

        held = [await waiting() for _ in range(CAP)]
        await _refused(url)

        # The waiting sockets were kept: one authenticates, and its place is free.
        await held[0].send(_auth(secret))
        assert (await _frame(held[0]))["type"] == "ready"
        held.append(await waiting())
        await _refused(url)

        # A client that goes away frees its place.
        await held[1].close()
        await _room(url, secret)
        held.append(await waiting())
        await _refused(url)

        # So do bad credentials, refused with 4404.
        await held[2].send(_auth(secret, token="0" * 64))
        await _closed_with(held[2], 404, "inbox.not_found")
        await _room(url, secret)
        held.append(await waiting())
        await _refused(url)

        # So does a wait that outlasts AUTH_SECONDS.
        await held[3].close()
        await _room(url, secret)
        monkeypatch.setattr(inbox_routes, "AUTH_SECONDS", 0.2)
        slow = await waiting()
        await _closed_with(slow, 404, "inbox.not_found")
        monkeypatch.setattr(inbox_routes, "AUTH_SECONDS", 60.0)
        await _room(url, secret)
        held.append(await waiting())
        await _refused(url)


async def test_an_auth_cursor_past_64_bits_is_refused_like_bad_credentials(
    tmp_path: Path,
) -> None:
    async with _served(tmp_path) as (url, secret):
        for after in (2**63, 10**30):
            auth = msgspec.json.decode(_auth(secret))
            async with connect(url, open_timeout=10) as socket:
                await socket.send(msgspec.json.encode({**auth, "after": after}).decode())
                await _closed_with(socket, 404, "inbox.not_found")
        async with connect(url, open_timeout=10) as socket:
            auth = msgspec.json.decode(_auth(secret))
            await socket.send(msgspec.json.encode({**auth, "after": 2**63 - 1}).decode())
            assert (await _frame(socket)) == {"type": "ready", "cursor": 2**63 - 1}


async def test_a_rotated_secret_closes_the_sockets_its_old_tokens_opened(tmp_path: Path) -> None:
    # "Every token made with the old one stops working at once": a socket that
    # authenticated before the rotation gets nothing sent after it.
    async with _served_with(tmp_path) as (url, secret, composition):
        inbox = composition.services.inbox
        async with connect(url, open_timeout=10) as socket:
            await socket.send(_auth(secret))
            assert (await _frame(socket))["type"] == "ready"
            assert (await _frame(socket))["type"] == "counts"
            await inbox.rotate_secret(TENANT)
            await inbox.send(TENANT, SendBody(subscriber_id="ann", title="after the rotation"))
            await _closed_with(socket, 404, "inbox.not_found")
        async with connect(url, open_timeout=10) as socket:
            await socket.send(_auth(secret))
            await _closed_with(socket, 404, "inbox.not_found")


async def test_an_auth_cursor_past_the_last_change_is_refused(tmp_path: Path) -> None:
    async with _served_with(tmp_path) as (url, secret, composition):
        await composition.services.inbox.send(TENANT, SendBody(subscriber_id="ann", title="one"))
        auth = msgspec.json.decode(_auth(secret))
        async with connect(url, open_timeout=10) as socket:
            await socket.send(msgspec.json.encode({**auth, "after": 2}).decode())
            assert (await _frame(socket)) == {"type": "ready", "cursor": 2}
            assert (await _frame(socket))["type"] == "counts"
            refused = await _closed_with(socket, 422, "request.invalid")
            assert refused["details"] == {"pointer": "after", "cursor": 1}
        async with connect(url, open_timeout=10) as socket:
            await socket.send(msgspec.json.encode({**auth, "after": 1}).decode())
            assert (await _frame(socket)) == {"type": "ready", "cursor": 1}


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_any_auth_message_that_cannot_match_is_bad_credentials(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    # A token is only compared: a non-ASCII one, a NUL in the tenant id (which
    # PostgreSQL cannot take) or an id that is no subscriber id is a 404 like any
    # other, on both backends, never a 500 or a storage error.
    database_url = request.getfixturevalue("postgres_url") if backend == "postgres" else None
    async with _served_with(tmp_path, database_url) as (url, secret, _):
        auth = msgspec.json.decode(_auth(secret))
        for changed in (
            {"token": "é" * 64},
            {"token": "\u0663" * 64},
            {"tenant_id": "tenant-a\x00"},
            {"subscriber_id": "a\nb", "token": subscriber_token(secret, "a\nb")},
            {"subscriber_id": "x" * 201, "token": subscriber_token(secret, "x" * 201)},
        ):
            async with connect(url, open_timeout=10) as socket:
                await socket.send(msgspec.json.encode({**auth, **changed}).decode())
                await _closed_with(socket, 404, "inbox.not_found")
        async with connect(url, open_timeout=10) as socket:
            await socket.send(_auth(secret))
            assert (await _frame(socket))["type"] == "ready"


async def test_a_message_that_is_not_a_ping_is_ignored_however_deep(tmp_path: Path) -> None:
    # Only a ping is answered; anything else, even JSON nested past the decoder's
    # depth, leaves the socket open and live.
    async with (
        _served_with(tmp_path) as (url, secret, composition),
        connect(url, open_timeout=10, max_size=None) as socket,
    ):
        await socket.send(_auth(secret))
        assert (await _frame(socket))["type"] == "ready"
        assert (await _frame(socket))["type"] == "counts"
        for junk in ("[" * 100_000 + "]" * 100_000, '{"a":' * 50_000 + "1" + "}" * 50_000):
            await socket.send(junk)
            await socket.send('[1, "x"]')
            await socket.send("not json")
            await socket.send('{"type": "ping"}')
            assert (await _frame(socket)) == {"type": "pong"}
        inbox = composition.services.inbox
        await inbox.send(TENANT, SendBody(subscriber_id="ann", title="still live"))
        change = await _frame(socket)
        assert (change["type"], change["notification"]["title"]) == ("change", "still live")


async def test_a_socket_gets_ready_counts_each_change_then_fresh_counts(tmp_path: Path) -> None:
    # The frames in the order the page gives them: `ready`, the counts (the object
    # GET /v1/inbox/me/counts answers), every change after the cursor, fresh counts
    # after the batch; then each new change as it commits, with counts after it.
    async with _served_with(tmp_path) as (url, secret, composition):
        inbox = composition.services.inbox

        async def counts() -> dict[str, Any]:
            now: dict[str, Any] = msgspec.to_builtins(await inbox.counts(TENANT, "ann"))
            return {"type": "counts", **now}

        for title in ("one", "two", "three"):
            await inbox.send(TENANT, SendBody(subscriber_id="ann", title=title, feed="f"))
        auth = msgspec.json.decode(_auth(secret))
        async with connect(url, open_timeout=10) as socket:
            await socket.send(msgspec.json.encode({**auth, "after": 1}).decode())
            assert await _frame(socket) == {"type": "ready", "cursor": 1}
            assert await _frame(socket) == await counts()
            batch = [await _frame(socket), await _frame(socket)]
            assert [(f["type"], f["seq"], f["kind"]) for f in batch] == [
                ("change", 2, "created"),
                ("change", 3, "created"),
            ]
            assert [f["notification"]["title"] for f in batch] == ["two", "three"]
            assert [f["notification"]["seq"] for f in batch] == [2, 3]
            assert await _frame(socket) == await counts()
            await inbox.send(TENANT, SendBody(subscriber_id="ann", title="four", feed="f"))
            live = await _frame(socket)
            assert (live["type"], live["seq"], live["notification"]["title"]) == (
                "change",
                4,
                "four",
            )
            fresh = await _frame(socket)
            assert fresh == await counts()
            assert fresh["feeds"]["f"] == {"total": 4, "unseen": 4, "unread": 4}
            assert fresh["seq"] == 4
            await socket.send('{"type": "ping"}')
            assert await _frame(socket) == {"type": "pong"}
