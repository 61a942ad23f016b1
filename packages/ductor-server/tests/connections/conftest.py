"""Fixtures for connections: the app in process on either backend with two tenants,
a secret key ring, loopback allowed for the outbound guard, the built-in providers
plus `echo` (a provider of the tests' own), and a real HTTP sink on 127.0.0.1."""

from __future__ import annotations

import asyncio
import hashlib
import sys
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any

import msgspec
import pytest

from ductor_server import Settings
from ductor_server.composition import build, default_providers
from ductor_server.connections import new_secret_key
from ductor_server.providers import (
    CallContext,
    CheckResult,
    Operation,
    ProviderRegistry,
    provider_failure,
)
from ductor_server.storage import Store, open_store
from ductor_server.testing import TenantApi, served

from .sink import HttpSink

KEY_1 = new_secret_key("k1")
KEY_2 = new_secret_key("k2")


class EchoSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    region: str
    retries: int = 0


class EchoSecrets(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    token: str
    extra: str | None = None


class SendInput(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    to: str
    text: str = ""


class EchoProvider:
    """Answers with what it was given: the token only as its SHA-256 (or, for
    `text == "leak"`, the token itself, which the server must hide); fails with the
    token in its message when `text == "fail"`, and crashes so when `"crash"`."""

    name = "echo"
    description = "Echoes its input (tests)."
    settings: type[msgspec.Struct] = EchoSettings
    secrets: type[msgspec.Struct] = EchoSecrets
    operations: Mapping[str, Operation] = {
        "send": Operation(name="send", description="Echo.", input=SendInput, output=dict)
    }

    async def call(
        self,
        operation: str,
        settings: EchoSettings,
        secrets: EchoSecrets,
        input: SendInput,
        context: CallContext,
    ) -> Any:
        if input.text == "fail":
            raise provider_failure(
                "echo.refused", f"refused token {secrets.token}", retryable=False
            )
        if input.text == "crash":
            raise RuntimeError(f"crashed holding {secrets.token}")
        if input.text == "exit":
            sys.exit(f"exited holding {secrets.token}")
        if input.text == "leak":
            return {"echo": secrets.token, "nested": [{"t": f"x{secrets.token}y"}]}
        return {
            "to": input.to,
            "text": input.text,
            "region": settings.region,
            "token_sha256": hashlib.sha256(secrets.token.encode()).hexdigest(),
            "key": context.idempotency_key,
            "connection": context.connection,
        }

    async def test(
        self, settings: EchoSettings, secrets: EchoSecrets, context: CallContext
    ) -> CheckResult:
        if settings.region == "exit":
            sys.exit(f"exited holding {secrets.token}")
        if settings.region == "down":
            raise provider_failure(
                "echo.down", f"region down for {secrets.token}", retryable=True, details={"at": 1}
            )
        return CheckResult(ok=True, message=f"region {settings.region} with {secrets.token}")


def providers() -> ProviderRegistry:
    registry = default_providers()
    registry.register(EchoProvider(), origin="tests")
    return registry


class Api(TenantApi):
    async def run_to_end(
        self, definition: dict[str, Any], input: Any = None, *, publish: bool = True
    ) -> dict[str, Any]:
        """Publish `definition` (unless told not to), start a run of it and wait until
        it ends."""
        if publish:
            await self.ok("POST", "/v1/workflows", json=definition)
        run = await self.ok(
            "POST", "/v1/runs", json={"family_slug": definition["family_slug"], "input": input}
        )
        deadline = asyncio.get_running_loop().time() + 30
        while not run["status"].endswith(("SUCCEEDED", "FAILED", "CANCELLED")):
            assert asyncio.get_running_loop().time() < deadline, run
            await asyncio.sleep(0.05)
            run = await self.ok("GET", f"/v1/runs/{run['id']}")
        return run


def step(run: dict[str, Any], ref: str) -> dict[str, Any]:
    """The step `ref` of a run view."""
    (found,) = [s for s in run["steps"] if s["ref"] == ref]
    return found


def _database(request: pytest.FixtureRequest) -> str | None:
    return request.getfixturevalue("postgres_url") if request.param == "postgres" else None


async def _served(settings: Settings, backend: str) -> AsyncIterator[Api]:
    async with served(build(settings, providers=providers())) as (client, keys, store):
        yield Api(client, keys, store, backend)


@pytest.fixture(params=["sqlite", "postgres"])
async def api(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Api]:
    """The app with secret keys k1 and loopback allowed, every engine role running."""
    settings = Settings(
        data_dir=tmp_path,
        database_url=_database(request),
        poll_interval=0.05,
        secret_keys=KEY_1,
        outbound_allow=("127.0.0.1/32",),
    )
    async for api in _served(settings, request.param):
        yield api


@pytest.fixture
async def keyless(tmp_path: Path) -> AsyncIterator[Api]:
    """The app (SQLite) without secret keys."""
    settings = Settings(data_dir=tmp_path, poll_interval=0.05, outbound_allow=("127.0.0.1/32",))
    async for api in _served(settings, "sqlite"):
        yield api


@pytest.fixture
async def guarded(tmp_path: Path) -> AsyncIterator[Api]:
    """The app (SQLite) with keys and an outbound guard that allows nothing extra."""
    settings = Settings(data_dir=tmp_path, poll_interval=0.05, secret_keys=KEY_1)
    async for api in _served(settings, "sqlite"):
        yield api


@pytest.fixture
def sink() -> Iterator[HttpSink]:
    with HttpSink() as s:
        yield s


@pytest.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """An opened, migrated store of each backend in turn."""
    opened = open_store(_database(request) or str(tmp_path / "ductor.db"))
    await opened.open()
    await opened.migrate()
    try:
        yield opened
    finally:
        await opened.close()
