"""Per-app signing keys and replay refusal on the server's signed bridge routes, in
process over HTTP: a replayed request records nothing, one app's key cannot act
as another app or in another tenant, rotation keeps the old key until revoked,
and the engine calls an app with that app's own key."""

from __future__ import annotations

import asyncio
import io
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from litestar.testing import AsyncTestClient, TestClient

from ductor import ApiError, Client, Context
from ductor.protocol import (
    APP_HEADER,
    SIGNATURE_HEADER,
    CheckpointRequest,
    DescribeResponse,
    InlineRunRequest,
    SigningKeys,
    StepRunOp,
    TriggerInfo,
    WorkflowInfo,
    encode,
    sign,
)
from ductor_core.runs import RunStatus
from ductor_server import Settings, create_app
from ductor_server.bridge.keys import create_app_key, require_nonce_from_env, signing_keys_from_env
from ductor_server.cli import build_parser
from ductor_server.cli_client import ApiClient
from ductor_server.cli_server import create_key
from ductor_server.composition import build
from ductor_server.storage import Store, open_store

from .conftest import TENANT

SERVER_KEY = "server-wide-key-0001"
T1, T2 = "t-one", "t-two"


class Server:
    """The API in process, with an API key for each of two tenants."""

    def __init__(self, client: AsyncTestClient[Any], tokens: dict[str, str], target: str) -> None:
        self.client = client
        self.tokens = tokens
        self.target = target

    def auth(self, tenant: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[tenant]}"}

    async def signed(
        self,
        path: str,
        body: bytes,
        *,
        key: str,
        app: str | None,
        tenant: str = T1,
        header: str | None = None,
        method: str = "POST",
    ) -> httpx.Response:
        headers = {
            **self.auth(tenant),
            SIGNATURE_HEADER: header or SigningKeys(key).request_header(body, now=int(time.time())),
            "content-type": "application/json",
        }
        if app is not None:
            headers[APP_HEADER] = app
        return await self.client.request(method, path, content=body, headers=headers)

    async def new_key(self, app: str, tenant: str = T1, **body: Any) -> dict[str, Any]:
        created = await self.client.post(
            f"/v1/bridge/apps/{app}/keys", json=body or None, headers=self.auth(tenant)
        )
        assert created.status_code == 201, created.text
        answer: dict[str, Any] = created.json()
        return answer

    async def count_runs(self, tenant: str = T1) -> int:
        store = open_store(self.target)
        await store.open()
        try:
            async with store.transaction() as tx:
                row = await tx.session.fetch_one(
                    "SELECT count(*) FROM runs WHERE tenant_id = %s", (tenant,)
                )
        finally:
            await store.close()
        assert row is not None
        return int(row[0])


class ThroughTestClient(httpx.AsyncBaseTransport):
    """Sends an SDK client's calls through the test client (the app runs in its loop)."""

    def __init__(self, client: AsyncTestClient[Any]) -> None:
        self.client = client

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        target = request.url.raw_path.decode("ascii")
        answer = await self.client.request(
            request.method, target, content=await request.aread(), headers=request.headers
        )
        return httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)


def _server_fixture(require_nonce: bool) -> Callable[..., Any]:
    async def fixture(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
    ) -> AsyncIterator[Server]:
        if require_nonce:
            monkeypatch.setenv("DUCTOR_BRIDGE_REQUIRE_NONCE", "1")
        else:
            monkeypatch.delenv("DUCTOR_BRIDGE_REQUIRE_NONCE", raising=False)
        database_url = (
            request.getfixturevalue("postgres_url") if request.param == "postgres" else None
        )
        settings = Settings(data_dir=tmp_path, poll_interval=0.05, database_url=database_url)
        app = create_app(composition=build(settings, bridge_keys=SigningKeys(SERVER_KEY)))
        async with AsyncTestClient(app=app) as client:
            store = open_store(settings.store_target)
            await store.open()
            try:
                tokens = {t: await create_key(store, t, name=t) for t in (T1, T2)}
            finally:
                await store.close()
            yield Server(client, tokens, settings.store_target)

    return fixture


server = pytest.fixture(params=["sqlite", "postgres"])(_server_fixture(require_nonce=False))
strict_server = pytest.fixture(params=["sqlite"])(_server_fixture(require_nonce=True))


def _describe(app: str, *workflows: str | WorkflowInfo) -> bytes:
    """A sync body for `app`: each workflow an id (no options) or a whole `WorkflowInfo`."""
    infos = [WorkflowInfo(id=wf, retries=0) if isinstance(wf, str) else wf for wf in workflows]
    return encode(DescribeResponse(app_id=app, sdk="test", sdk_version="1", workflows=infos))


async def test_a_replayed_inline_run_is_refused_and_starts_no_second_run(server: Server) -> None:
    synced = await server.signed(
        "/v1/bridge/sync", _describe("shop", "wf"), key=SERVER_KEY, app="shop"
    )
    assert synced.status_code == 200, synced.text
    body = encode(InlineRunRequest(app_id="shop", workflow_id="wf", input={"n": 1}))
    header = SigningKeys(SERVER_KEY).request_header(body, now=int(time.time()))
    first = await server.signed("/v1/bridge/runs", body, key=SERVER_KEY, app="shop", header=header)
    assert first.status_code == 201, first.text
    assert await server.count_runs() == 1
    replayed = await server.signed(
        "/v1/bridge/runs", body, key=SERVER_KEY, app="shop", header=header
    )
    assert replayed.status_code == 401
    assert replayed.json()["code"] == "signature.replayed"
    # the refusal is signed too, and nothing was recorded
    SigningKeys(SERVER_KEY).verify(
        replayed.content, replayed.headers[SIGNATURE_HEADER], now=int(time.time())
    )
    assert await server.count_runs() == 1
    # the same nonce does not pass under another app's name or in another tenant either
    elsewhere = await server.signed(
        "/v1/bridge/runs", body, key=SERVER_KEY, app=None, header=header, tenant=T2
    )
    assert elsewhere.status_code == 401
    assert await server.count_runs(T2) == 0
    # a fresh nonce is a new request
    again = await server.signed("/v1/bridge/runs", body, key=SERVER_KEY, app="shop")
    assert again.status_code == 201
    assert await server.count_runs() == 2


async def test_v1_requests_are_refused_when_the_server_requires_nonces(
    strict_server: Server,
) -> None:
    body = _describe("shop")
    now = int(time.time())
    legacy = await strict_server.signed(
        "/v1/bridge/sync",
        body,
        key=SERVER_KEY,
        app=None,
        header=f"t={now},v1={sign(body, SERVER_KEY, now)}",
    )
    assert legacy.status_code == 401
    assert legacy.json()["code"] == "signature.nonce_required"
    fresh = await strict_server.signed("/v1/bridge/sync", body, key=SERVER_KEY, app="shop")
    assert fresh.status_code == 200, fresh.text


async def test_v1_requests_still_work_with_the_server_wide_key(server: Server) -> None:
    body = _describe("legacy")
    now = int(time.time())
    header = f"t={now},v1={sign(body, SERVER_KEY, now)}"  # an SDK that predates nonces
    answer = await server.signed("/v1/bridge/sync", body, key=SERVER_KEY, app=None, header=header)
    assert answer.status_code == 200, answer.text


async def test_an_app_key_cannot_act_as_another_app_or_in_another_tenant(server: Server) -> None:
    a = (await server.new_key("app-a"))["signing_key"]
    b = (await server.new_key("app-b"))["signing_key"]
    assert a != b
    assert a.startswith("dsk_")
    ok = await server.signed("/v1/bridge/sync", _describe("app-a", "wf"), key=a, app="app-a")
    assert ok.status_code == 200, ok.text
    SigningKeys(a).verify(ok.content, ok.headers[SIGNATURE_HEADER], now=int(time.time()))
    ok_b = await server.signed("/v1/bridge/sync", _describe("app-b", "wf"), key=b, app="app-b")
    assert ok_b.status_code == 200, ok_b.text

    # A's key, B's body: refused before anything is written
    as_b = await server.signed("/v1/bridge/sync", _describe("app-b", "evil"), key=a, app="app-a")
    assert (as_b.status_code, as_b.json()["code"]) == (403, "bridge.app_forbidden")
    # A's key, naming B: checked with B's keys
    named_b = await server.signed("/v1/bridge/sync", _describe("app-b", "evil"), key=a, app="app-b")
    assert (named_b.status_code, named_b.json()["code"]) == (401, "signature.mismatch")
    # the server-wide key no longer speaks for an app with keys of its own
    wide = await server.signed(
        "/v1/bridge/sync", _describe("app-b", "evil"), key=SERVER_KEY, app=None
    )
    assert (wide.status_code, wide.json()["code"]) == (403, "bridge.app_forbidden")
    listed = await server.client.get("/v1/bridge/apps", headers=server.auth(T1))
    assert {app["app_id"]: app["workflows"] for app in listed.json()} == {
        "app-a": ["wf"],
        "app-b": ["wf"],
    }

    # A's key in another tenant: that tenant's app-a has no key, so only the
    # server-wide key verifies there
    other = await server.signed(
        "/v1/bridge/sync", _describe("app-a", "wf"), key=a, app="app-a", tenant=T2
    )
    assert (other.status_code, other.json()["code"]) == (401, "signature.mismatch")
    t2_apps = await server.client.get("/v1/bridge/apps", headers=server.auth(T2))
    assert t2_apps.json() == []

    # inline runs, checkpoints and payloads of B's runs are B's alone
    start = encode(InlineRunRequest(app_id="app-b", workflow_id="wf", input=None))
    refused = await server.signed("/v1/bridge/runs", start, key=a, app="app-a")
    assert (refused.status_code, refused.json()["code"]) == (403, "bridge.app_forbidden")
    started = await server.signed("/v1/bridge/runs", start, key=b, app="app-b")
    assert started.status_code == 201, started.text
    run_id = started.json()["run_id"]
    step = StepRunOp(id="s1", name="s1", result=1)
    checkpoint = encode(
        CheckpointRequest(run_id=run_id, app_id="app-b", workflow_id="wf", opcodes=[step])
    )
    path = f"/v1/bridge/runs/{run_id}/checkpoint"
    cross = await server.signed(path, checkpoint, key=a, app="app-a")
    assert (cross.status_code, cross.json()["code"]) == (403, "bridge.app_forbidden")
    own = await server.signed(path, checkpoint, key=b, app="app-b")
    assert (own.status_code, own.json()["recorded"]) == (200, 1)
    payload = f"/v1/bridge/runs/{run_id}/payload?ref=x"
    peek = await server.signed(payload, b"", key=a, app="app-a", method="GET")
    assert (peek.status_code, peek.json()["code"]) == (403, "bridge.app_forbidden")
    read = await server.signed(payload, b"", key=b, app="app-b", method="GET")
    assert read.status_code == 200, read.text
    assert await server.count_runs() == 1


async def test_rotation_keeps_the_old_key_until_it_is_revoked(server: Server) -> None:
    old = await server.new_key("shop")
    new = await server.new_key("shop")
    assert new["previous_keys_expire_at"] is not None
    for key in (old, new):
        answer = await server.signed(
            "/v1/bridge/sync", _describe("shop"), key=key["signing_key"], app="shop"
        )
        assert answer.status_code == 200, answer.text
        # answers carry a signature under each active key, so both app versions verify them
        SigningKeys(key["signing_key"]).verify(
            answer.content, answer.headers[SIGNATURE_HEADER], now=int(time.time())
        )
    listed = (await server.client.get("/v1/bridge/apps/shop/keys", headers=server.auth(T1))).json()
    assert [(k["key_id"], k["primary"], k["active"]) for k in listed] == [
        (new["key_id"], True, True),
        (old["key_id"], False, True),
    ]
    assert "signing_key" not in listed[0]
    revoked = await server.client.delete(
        f"/v1/bridge/apps/shop/keys/{old['key_id']}", headers=server.auth(T1)
    )
    assert revoked.status_code == 200, revoked.text
    assert revoked.json()["active"] is False
    gone = await server.signed(
        "/v1/bridge/sync", _describe("shop"), key=old["signing_key"], app="shop"
    )
    assert (gone.status_code, gone.json()["code"]) == (401, "signature.mismatch")
    still = await server.signed(
        "/v1/bridge/sync", _describe("shop"), key=new["signing_key"], app="shop"
    )
    assert still.status_code == 200
    # another tenant cannot see or revoke the app's keys
    theirs = await server.client.delete(
        f"/v1/bridge/apps/shop/keys/{new['key_id']}", headers=server.auth(T2)
    )
    assert (theirs.status_code, theirs.json()["code"]) == (404, "app_key.not_found")
    assert (
        await server.client.get("/v1/bridge/apps/shop/keys", headers=server.auth(T2))
    ).json() == []
    # with no grace the previous key stops at once; with every key revoked the
    # app does not fall back to the server-wide key
    newest = await server.new_key("shop", grace_seconds=0)
    stopped = await server.signed(
        "/v1/bridge/sync", _describe("shop"), key=new["signing_key"], app="shop"
    )
    assert stopped.status_code == 401
    await server.client.delete(
        f"/v1/bridge/apps/shop/keys/{newest['key_id']}", headers=server.auth(T1)
    )
    revoked_all = await server.signed(
        "/v1/bridge/sync", _describe("shop"), key=newest["signing_key"], app="shop"
    )
    assert (revoked_all.status_code, revoked_all.json()["code"]) == (401, "signature.mismatch")
    assert SIGNATURE_HEADER not in revoked_all.headers  # no key is left to sign with
    fallback = await server.signed("/v1/bridge/sync", _describe("shop"), key=SERVER_KEY, app=None)
    assert (fallback.status_code, fallback.json()["code"]) == (403, "bridge.app_forbidden")


async def test_the_sdk_client_syncs_and_runs_inline_with_its_own_key(server: Server) -> None:
    secret = (await server.new_key("billing"))["signing_key"]
    client = Client(
        "billing",
        signing_key=secret,
        api_key=server.tokens[T1],
        server_url="http://server.test",
        url="http://billing.test/api/ductor",
        transport=ThroughTestClient(server.client),
    )
    ran: list[int] = []

    @client.workflow("count")
    async def count(ctx: Context, n: int) -> int:
        return int(await ctx.step.run("bump", lambda: ran.append(n) or n + 1))

    ack = await client.sync()
    assert ack.accepted == ["count"]
    done = await client.run_inline("count", 41)
    assert (done.status, done.output, ran) == ("RUN_STATUS_SUCCEEDED", 42, [41])
    # the same app id with the server-wide key is refused
    impostor = Client(
        "billing",
        signing_key=SERVER_KEY,
        api_key=server.tokens[T1],
        server_url="http://server.test",
        transport=ThroughTestClient(server.client),
    )
    with pytest.raises(ApiError) as refused:
        await impostor.sync()
    assert (refused.value.status, refused.value.code) == (401, "signature.mismatch")
    await client.aclose()
    await impostor.aclose()


async def test_the_engine_calls_an_app_with_its_own_key(
    store: Store, make_engine: Callable[..., Any]
) -> None:
    async with store.transaction() as tx:
        created = await create_app_key(tx, TENANT, "keyed", now=_now())
    counts: dict[str, int] = {}
    client = Client("keyed", signing_key=created.signing_key)

    @client.workflow("hello")
    async def hello(ctx: Context, name: str) -> str:
        def greet() -> str:
            counts["greet"] = counts.get("greet", 0) + 1
            return f"hello {name}"

        return str(await ctx.step.run("greet", greet))

    # the server-wide key the engine holds is not the app's: the app's own key is used
    async with make_engine(client, server_key="server-wide-not-the-apps") as engine:
        run = (
            await engine.services.runs.trigger(TENANT, "bridge:keyed:hello", None, "ada", None)
        ).value
        view = await engine.wait_run(run.id)
    assert view.status == RunStatus.SUCCEEDED, view.error
    assert view.output == "hello ada"
    assert counts == {"greet": 1}


def _now() -> Any:
    from datetime import UTC, datetime

    return datetime.now(UTC)


class ThroughSyncTestClient(httpx.BaseTransport):
    """Sends the CLI's calls through a synchronous test client."""

    def __init__(self, client: TestClient[Any]) -> None:
        self.client = client

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        answer = self.client.request(
            request.method,
            request.url.raw_path.decode("ascii"),
            content=request.read(),
            headers=request.headers,
        )
        return httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)


def test_the_cli_creates_lists_and_revokes_app_keys(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, poll_interval=0.05)

    async def api_key() -> str:
        store = open_store(settings.store_target)
        await store.open()
        try:
            await store.migrate()
            return await create_key(store, T1, name="cli")
        finally:
            await store.close()

    token = asyncio.run(api_key())
    parser = build_parser()
    app = create_app(composition=build(settings, bridge_keys=None))
    with TestClient(app=app) as http:
        api = ApiClient("http://server.test", token, transport=ThroughSyncTestClient(http))

        def run(*argv: str) -> str:
            args = parser.parse_args(list(argv))
            out = io.StringIO()
            assert args.client_func(api, args, out) == 0
            return out.getvalue()

        secret = run("apps", "keys", "create", "shop").strip()
        assert secret.startswith("dsk_")
        [created] = json.loads(run("apps", "keys", "list", "shop", "--json"))
        assert created["primary"] is True
        assert secret not in run("apps", "keys", "list", "shop")
        second = json.loads(run("apps", "keys", "create", "shop", "--grace", "0", "--json"))
        listing = run("apps", "keys", "list", "shop")
        assert listing.splitlines()[0].startswith(f"{second['key_id']}  primary")
        assert f"{created['key_id']}  inactive" in listing
        assert "revoked" in run("apps", "keys", "revoke", "shop", second["key_id"])
        keys = json.loads(run("apps", "keys", "list", "shop", "--json"))
        assert [k["active"] for k in keys] == [False, False]
        api.close()


async def test_nonces_are_accepted_once_and_purged_after_their_window(store: Store) -> None:
    from ductor_server.bridge import nonces

    async with store.transaction() as tx:
        assert await nonces.first_use(tx, TENANT, "shop", "a" * 32, timestamp=1_000, now=1_000)
        assert not await nonces.first_use(tx, "another", "x", "a" * 32, timestamp=1_000, now=1_100)
    nonces._last_purge = -nonces.PURGE_EVERY_SECONDS  # let the next call purge
    later = nonces.expiry_of(1_000) + 1
    async with store.transaction() as tx:
        assert await nonces.first_use(tx, TENANT, "shop", "b" * 32, timestamp=later, now=later)
        row = await tx.session.fetch_one("SELECT count(*) FROM bridge_nonces", ())
    assert row is not None
    assert int(row[0]) == 1  # the expired nonce was purged


def test_require_nonce_is_on_or_off_and_refuses_anything_else() -> None:
    assert require_nonce_from_env({}) is False
    for on in ("1", "true", "yes", "on", "ON"):
        assert require_nonce_from_env({"DUCTOR_BRIDGE_REQUIRE_NONCE": on}) is True
    for off in ("0", "false", "no", "off", " "):
        assert require_nonce_from_env({"DUCTOR_BRIDGE_REQUIRE_NONCE": off}) is False
    with pytest.raises(ValueError, match="DUCTOR_BRIDGE_REQUIRE_NONCE must be on or off"):
        require_nonce_from_env({"DUCTOR_BRIDGE_REQUIRE_NONCE": "maybe"})


def test_the_previous_server_wide_key_alone_is_refused() -> None:
    assert signing_keys_from_env({}) is None
    kept = signing_keys_from_env(
        {"DUCTOR_BRIDGE_SIGNING_KEY": "new", "DUCTOR_BRIDGE_SIGNING_KEY_FALLBACK": "old"}
    )
    assert kept is not None
    with pytest.raises(ValueError, match="DUCTOR_BRIDGE_SIGNING_KEY_FALLBACK is set without"):
        signing_keys_from_env({"DUCTOR_BRIDGE_SIGNING_KEY_FALLBACK": "old"})


def test_a_blank_server_wide_key_is_refused() -> None:
    # "   " was taken as no key at all: the server started, and every call to an app
    # without keys of its own answered 503 bridge.not_configured.
    for name in ("DUCTOR_BRIDGE_SIGNING_KEY", "DUCTOR_BRIDGE_SIGNING_KEY_FALLBACK"):
        for blank in (" ", "\t\n"):
            env = {"DUCTOR_BRIDGE_SIGNING_KEY": "new", name: blank}
            with pytest.raises(ValueError, match=f"^{name} is blank"):
                signing_keys_from_env(env)
    assert signing_keys_from_env({"DUCTOR_BRIDGE_SIGNING_KEY": ""}) is None  # unset
    kept = signing_keys_from_env({"DUCTOR_BRIDGE_SIGNING_KEY": " new "})
    assert kept is not None
    assert kept.primary == "new"


async def test_a_grace_too_long_for_a_date_is_refused_and_creates_no_key(server: Server) -> None:
    for body in ({"grace_seconds": 9_999_999_999_999}, {"grace_seconds": 2**62}):
        refused = await server.client.post(
            "/v1/bridge/apps/shop/keys", json=body, headers=server.auth(T1)
        )
        assert refused.status_code == 422, refused.text
        assert refused.json()["code"] == "request.invalid"
        assert "grace_seconds" in refused.json()["message"]
    at_most = await server.new_key("shop", grace_seconds=10 * 365 * 86_400)
    assert at_most["previous_keys_expire_at"] is None  # the first key: nothing to expire
    listed = await server.client.get("/v1/bridge/apps/shop/keys", headers=server.auth(T1))
    assert len(listed.json()) == 1


async def test_a_key_for_an_app_id_no_sync_could_register_is_refused_and_creates_none(
    server: Server,
) -> None:
    for app in ("a" * 257, "a%01b", "a%C2%85b", "a:b"):
        refused = await server.client.post(f"/v1/bridge/apps/{app}/keys", headers=server.auth(T1))
        assert refused.status_code == 422, (app, refused.text)
        assert refused.json()["code"] == "request.invalid"
        assert refused.json()["details"]["path"] == "app_id"
        listed = await server.client.get(f"/v1/bridge/apps/{app}/keys", headers=server.auth(T1))
        assert listed.json() == [], app
    refused = await server.signed(
        "/v1/bridge/sync", _describe("a\x01b", "wf"), key=SERVER_KEY, app=None
    )
    assert refused.status_code == 422, refused.text
    assert refused.json()["details"]["pointer"] == "/app_id"
    await server.new_key("a" * 256)


async def test_a_bridge_slug_that_names_no_workflow_is_not_found(server: Server) -> None:
    for slug in ("bridge:", "bridge:shop", "bridge:shop:", "bridge::wf"):
        answer = await server.client.post(
            "/v1/runs", json={"family_slug": slug, "input": None}, headers=server.auth(T1)
        )
        assert answer.status_code == 404, (slug, answer.text)
        assert answer.json()["code"] == "workflow.not_found"
    assert await server.count_runs() == 0


async def test_a_sync_whose_names_cannot_make_a_slug_is_refused_and_records_nothing(
    server: Server,
) -> None:
    refused = await server.signed(
        "/v1/bridge/sync",
        _describe("a:b", WorkflowInfo(id="wf", retries=0)),
        key=SERVER_KEY,
        app="a:b",
    )
    assert refused.status_code == 422, refused.text
    assert refused.json()["details"]["pointer"] == "/app_id"
    refused = await server.signed(
        "/v1/bridge/sync",
        _describe(
            "shop",
            WorkflowInfo(id="wf", retries=0),
            WorkflowInfo(id="", retries=0),
            WorkflowInfo(id="wf", retries=1),
            WorkflowInfo(id="neg", retries=-1),
            WorkflowInfo(id="blank", retries=0, triggers=[TriggerInfo(event="")]),
            WorkflowInfo(id="none", retries=0, triggers=[TriggerInfo(match="true")]),
            WorkflowInfo(id="both", retries=0, triggers=[TriggerInfo(event="e", cron="* * * * *")]),
        ),
        key=SERVER_KEY,
        app="shop",
    )
    assert refused.status_code == 422, refused.text
    error = refused.json()
    assert error["code"] == "request.invalid"
    assert [p["pointer"] for p in error["details"]["problems"]] == [
        "/workflows/1/id",
        "/workflows/2/id",
        "/workflows/3/retries",
        "/workflows/4/triggers/0/event",
        "/workflows/5/triggers/0",
        "/workflows/6/triggers/0",
    ]
    apps = await server.client.get("/v1/bridge/apps", headers=server.auth(T1))
    assert apps.json() == []


async def test_a_sync_past_its_sizes_or_with_a_filter_that_cannot_compile_is_refused(
    server: Server,
) -> None:
    long_app = "a" * 257
    refused = await server.signed(
        "/v1/bridge/sync",
        _describe(long_app, WorkflowInfo(id="wf", retries=0)),
        key=SERVER_KEY,
        app=long_app,
    )
    assert refused.status_code == 422, refused.text
    assert refused.json()["details"]["pointer"] == "/app_id"
    many = [WorkflowInfo(id=f"w{i}", retries=0) for i in range(1_001)]
    refused = await server.signed(
        "/v1/bridge/sync", _describe("shop", *many), key=SERVER_KEY, app="shop"
    )
    assert refused.status_code == 422, refused.text
    assert [p["pointer"] for p in refused.json()["details"]["problems"]] == ["/workflows"]
    triggers = [TriggerInfo(event=f"e{i}") for i in range(101)]
    refused = await server.signed(
        "/v1/bridge/sync",
        _describe(
            "shop",
            WorkflowInfo(id="w" * 257, retries=0),
            WorkflowInfo(id="busy", retries=0, triggers=triggers),
            WorkflowInfo(id="bad", retries=0, triggers=[TriggerInfo(event="e", match="((")]),
            WorkflowInfo(id="long", retries=0, triggers=[TriggerInfo(event="e" * 257)]),
            WorkflowInfo(id="ok", retries=0, triggers=[TriggerInfo(event="e", match="true")]),
        ),
        key=SERVER_KEY,
        app="shop",
    )
    assert refused.status_code == 422, refused.text
    assert [p["pointer"] for p in refused.json()["details"]["problems"]] == [
        "/workflows/0/id",
        "/workflows/1/triggers",
        "/workflows/2/triggers/0/match",
        "/workflows/3/triggers/0/event",
    ]
    apps = await server.client.get("/v1/bridge/apps", headers=server.auth(T1))
    assert apps.json() == []
