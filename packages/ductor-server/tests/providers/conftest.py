"""Fixtures for the provider tests: a `CallContext` whose client goes through the
outbound guard (allowing 127.0.0.1 unless a test says otherwise) and a sink."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator

import httpx
import pytest

from ductor_server.engine.outbound import OutboundPolicy, guarded_transport
from ductor_server.providers import CallContext

from .sink import HttpSink

KEY = "run_1:fetch:1"
NOW = 1_780_000_000.0

MakeContext = Callable[..., CallContext]


@pytest.fixture
def sink() -> Iterator[HttpSink]:
    with HttpSink() as s:
        yield s


@pytest.fixture
async def make_context() -> AsyncIterator[MakeContext]:
    """`make_context(allow=["127.0.0.1/32"], timeout=5.0, key=KEY, now=NOW)`."""
    clients: list[httpx.AsyncClient] = []

    def make(
        allow: list[str] | None = None,
        *,
        timeout: float = 5.0,
        key: str = KEY,
        now: float = NOW,
    ) -> CallContext:
        policy = OutboundPolicy(["127.0.0.1/32"] if allow is None else allow)
        client = httpx.AsyncClient(transport=guarded_transport(policy), follow_redirects=False)
        clients.append(client)
        return CallContext(
            tenant_id="t_acme",
            connection="api",
            idempotency_key=key,
            http=client,
            resolve=policy.resolve,
            timeout_seconds=timeout,
            now=now,
        )

    yield make
    for client in clients:
        await client.aclose()


@pytest.fixture
def context(make_context: MakeContext) -> CallContext:
    return make_context()
