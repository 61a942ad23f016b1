"""KeysService and TenantsService on both backends: scopes checked and never widened,
bad requests refused whole with pointers, revoked and expired keys refused at once,
`last_used_at` written at most once a minute, the last admin key kept, one key per
idempotency key even under concurrency, and keys compared in constant time."""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from ductor_server.engine.clock import ManualClock
from ductor_server.errors import (
    Forbidden,
    KeyExpired,
    KeyInvalid,
    KeyNotFound,
    LastAdminKey,
    RequestInvalid,
    TenantConflict,
    TenantInvalid,
    TenantNotFound,
    Unauthenticated,
)
from ductor_server.services import keys as keys_module
from ductor_server.services import tenants as tenants_module
from ductor_server.services.keys import Caller, CreateKeyBody, KeysService, Scope, granted
from ductor_server.services.tenants import TenantBody, TenantsService
from ductor_server.storage import Store

OPERATOR_KEY = "op_" + "x" * 40


def body(*scopes: str, name: str = "k", **kw: Any) -> CreateKeyBody:
    return CreateKeyBody(name=name, scopes=list(scopes), **kw)


async def _admin(keys: KeysService, tenant: str = "t1") -> Caller:
    return await keys.authenticate(await keys.provision(tenant, name="root"))


def test_scopes_imply_the_narrower_ones() -> None:
    assert granted(["admin"]) == set(Scope)
    assert granted(["write"]) == {Scope.WRITE, Scope.READ, Scope.EVENTS_SEND}
    assert granted(["read"]) == {Scope.READ}
    assert granted(["events:send"]) == {Scope.EVENTS_SEND}
    assert granted(["read", "events:send"]) == {Scope.READ, Scope.EVENTS_SEND}
    assert granted(["root", ""]) == set()


async def test_a_key_carries_its_scopes_and_cannot_mint_wider(store: Store) -> None:
    keys = KeysService(store, clock=ManualClock())
    admin = await _admin(keys)
    created = (await keys.create(admin, body("read", "events:send", "read", name="ci"))).value
    assert created.key is not None
    assert created.key.startswith("dk_")
    assert created.scopes == ["read", "events:send"]  # canonical order, repeats once
    assert created.status == "active"
    reader = await keys.authenticate(created.key)
    assert (reader.tenant_id, reader.key_id) == ("t1", created.id)
    assert list(reader.scopes) == created.scopes
    assert reader.may(Scope.READ)
    assert reader.may(Scope.EVENTS_SEND)
    assert not reader.may(Scope.WRITE)
    with pytest.raises(Forbidden) as refused:
        reader.require(Scope.WRITE)
    assert refused.value.code == "auth.forbidden"
    assert refused.value.details == {"needed": "write", "scopes": ["read", "events:send"]}
    # The service itself refuses a wider key, whatever route let the caller in.
    with pytest.raises(Forbidden) as wider:
        await keys.create(reader, body("write"))
    assert wider.value.details["scopes"] == ["write"]
    writer = Caller(tenant_id="t1", key_id="x", scopes=("write",))
    with pytest.raises(Forbidden):
        await keys.create(writer, body("admin"))
    assert (await keys.create(writer, body("read", "events:send"))).value.key


async def test_bad_requests_are_refused_whole_with_pointers(store: Store) -> None:
    clock = ManualClock()
    keys = KeysService(store, clock=clock)
    admin = await _admin(keys)
    cases: list[tuple[CreateKeyBody, list[str]]] = [
        (body(name=""), ["/name", "/scopes"]),
        (body("read", "root", "READ", name="x" * 101), ["/name", "/scopes/1", "/scopes/2"]),
        (body("read", name="tab\there"), ["/name"]),
        (body(*["read"] * 9), ["/scopes"]),
        (body("read", expires_in="soon"), ["/expires_in"]),
        (body("read", expires_in="0s"), ["/expires_in"]),
        (body("read", expires_in="36501d"), ["/expires_in"]),
        (body("read", expires_at="tomorrow"), ["/expires_at"]),
        (body("read", expires_at="2031-01-01T00:00:00"), ["/expires_at"]),  # no offset
        (body("read", expires_at="2029-01-01T00:00:00Z"), ["/expires_at"]),  # the past
        (body("read", expires_at="2200-01-01T00:00:00Z"), ["/expires_at"]),
        (body("read", expires_at="2031-01-01T00:00:00Z", expires_in="1d"), ["/expires_in"]),
    ]
    for request, pointers in cases:
        with pytest.raises(KeyInvalid) as refused:
            await keys.create(admin, request)
        assert refused.value.code == "key.invalid"
        assert [p["pointer"] for p in refused.value.details] == pointers, request
        assert all(p["message"] for p in refused.value.details)
    assert len((await keys.list("t1")).items) == 1  # nothing was written


async def test_revoked_and_expired_keys_fail_on_the_next_call(store: Store) -> None:
    clock = ManualClock()
    keys = KeysService(store, clock=clock)
    admin = await _admin(keys)
    short = (await keys.create(admin, body("read", expires_in="90s"))).value
    at = (await keys.create(admin, body("read", expires_at="2030-01-01T00:02:00+00:00"))).value
    doomed = (await keys.create(admin, body("write"))).value
    assert short.key
    assert at.key
    assert doomed.key
    assert short.expires_at == clock.now() + timedelta(seconds=90)
    await keys.authenticate(short.key)
    await keys.revoke("t1", doomed.id)
    with pytest.raises(Unauthenticated) as revoked:
        await keys.authenticate(doomed.key)
    assert revoked.value.code == "auth.unauthenticated"
    assert (await keys.revoke("t1", doomed.id)).status == "revoked"  # again: no change
    clock.advance(90)
    with pytest.raises(KeyExpired) as expired:
        await keys.authenticate(short.key)
    assert expired.value.code == "auth.key_expired"
    assert "expired at 2030-01-01T00:01:30Z" in expired.value.message
    await keys.authenticate(at.key)
    clock.advance(30)
    with pytest.raises(KeyExpired):
        await keys.authenticate(at.key)
    statuses = {k.id: k.status for k in (await keys.list("t1")).items}
    assert statuses == {
        admin.key_id: "active",
        short.id: "expired",
        at.id: "expired",
        doomed.id: "revoked",
    }
    with pytest.raises(Unauthenticated):
        await keys.authenticate("dk_" + "0" * 43)


async def test_last_use_is_written_at_most_once_a_minute(store: Store) -> None:
    clock = ManualClock()
    keys = KeysService(store, clock=clock)
    admin = await _admin(keys)
    key = (await keys.create(admin, body("read"))).value.key
    assert key is not None
    calls: list[str] = []
    touch, read = store.transaction, store.read

    def counting_touch() -> Any:
        calls.append("transaction")
        return touch()

    def counting_read() -> Any:
        calls.append("read")
        return read()

    first = clock.now()
    await keys.authenticate(key)
    store.transaction = counting_touch  # type: ignore[method-assign]
    store.read = counting_read  # type: ignore[method-assign]
    try:
        for _ in range(50):  # within the minute: one read each, no transaction
            clock.advance(1)
            caller = await keys.authenticate(key)
        assert calls == ["read"] * 50
        clock.advance(10)  # 60 s after the first use: stale, written once more
        await keys.authenticate(key)
        assert calls[50:] == ["read", "transaction"]
    finally:
        store.transaction = touch  # type: ignore[method-assign]
        store.read = read  # type: ignore[method-assign]
    view = await keys.get("t1", caller.key_id)
    assert view.last_used_at == first + timedelta(seconds=60)


async def test_the_last_live_admin_key_is_kept(store: Store) -> None:
    clock = ManualClock()
    keys = KeysService(store, clock=clock)
    admin = await _admin(keys)
    with pytest.raises(LastAdminKey) as refused:
        await keys.revoke("t1", admin.key_id)
    assert refused.value.code == "key.last_admin"
    # An admin key that expires soon does not count once it has expired.
    soon = (await keys.create(admin, body("admin", expires_in="1m"))).value
    clock.advance(61)
    with pytest.raises(LastAdminKey):
        await keys.revoke("t1", admin.key_id)
    await keys.revoke("t1", soon.id)  # expired: revoking it is always fine
    # Two live admin keys revoked at once: exactly one revoke passes.
    second = (await keys.create(admin, body("admin"))).value
    results = await asyncio.gather(
        keys.revoke("t1", admin.key_id), keys.revoke("t1", second.id), return_exceptions=True
    )
    assert sum(isinstance(r, LastAdminKey) for r in results) == 1, results
    live = [k for k in (await keys.list("t1")).items if k.status == "active"]
    assert len(live) == 1
    assert live[0].scopes == ["admin"]


async def test_another_tenants_keys_are_out_of_reach(store: Store) -> None:
    keys = KeysService(store, clock=ManualClock())
    a = await _admin(keys, "ta")
    b = await _admin(keys, "tb")
    b_key = (await keys.create(b, body("read"))).value
    with pytest.raises(KeyNotFound):
        await keys.get("ta", b_key.id)
    with pytest.raises(KeyNotFound):
        await keys.revoke("ta", b_key.id)
    assert {k.id for k in (await keys.list("ta")).items} == {a.key_id}
    assert {k.id for k in (await keys.list("tb")).items} == {b.key_id, b_key.id}
    assert b_key.key is not None
    assert (await keys.authenticate(b_key.key)).tenant_id == "tb"


async def test_pages_follow_their_cursor(store: Store) -> None:
    clock = ManualClock()
    keys = KeysService(store, clock=clock)
    admin = await _admin(keys)
    for i in range(6):
        clock.advance(1)
        await keys.create(admin, body("read", name=f"k{i}"))
    seen: list[str] = []
    cursor = None
    while True:
        page = await keys.list("t1", cursor=cursor, limit=4)
        seen += [k.name for k in page.items]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == ["k5", "k4", "k3", "k2", "k1", "k0", "root"]


async def test_an_empty_cursor_is_the_first_page(store: Store) -> None:
    # `GET /v1/keys?cursor=&limit=`, as the docs write it, lists from the start (as
    # `GET /v1/runs` does); a cursor the API never gave is still refused.
    clock = ManualClock()
    keys = KeysService(store, clock=clock)
    tenants = TenantsService(store, clock=clock, operator_key=OPERATOR_KEY)
    await _admin(keys)
    await tenants.create(TenantBody(id="acme"))
    assert [k.name for k in (await keys.list("t1", cursor="", limit=5)).items] == ["root"]
    assert [t.id for t in (await tenants.list(cursor="", limit=5)).items] == ["acme", "t1"]
    for listing in (keys.list("t1", cursor="zz"), tenants.list(cursor="~")):
        with pytest.raises(RequestInvalid):
            await listing


async def test_concurrent_creates_with_one_idempotency_key_make_one_key(store: Store) -> None:
    keys = KeysService(store, clock=ManualClock())
    admin = await _admin(keys)
    answers = await asyncio.gather(
        *(keys.create(admin, body("read", name="once"), idempotency_key="k-1") for _ in range(20))
    )
    assert len({a.value.id for a in answers}) == 1
    fresh = [a for a in answers if not a.replayed]
    assert len(fresh) == 1
    assert fresh[0].value.key is not None
    assert all(a.value.key is None for a in answers if a.replayed)  # the secret is not kept
    assert [k.name for k in (await keys.list("t1")).items].count("once") == 1


async def test_operators_create_tenants_and_their_keys(store: Store) -> None:
    clock = ManualClock()
    tenants = TenantsService(store, clock=clock, operator_key=OPERATOR_KEY)
    keys = KeysService(store, clock=clock)
    created = (await tenants.create(TenantBody(id="acme", name="Acme Inc."))).value
    assert created.tenant.name == "Acme Inc."
    assert created.key.scopes == ["admin"]
    assert created.key.key is not None
    assert (await keys.authenticate(created.key.key)).tenant_id == "acme"
    with pytest.raises(TenantConflict):
        await tenants.create(TenantBody(id="acme"))
    with pytest.raises(TenantInvalid) as invalid:
        await tenants.create(TenantBody(id="-bad id", name=""))
    assert [p["pointer"] for p in invalid.value.details] == ["/id", "/name"]
    with pytest.raises(TenantInvalid):
        await tenants.create(TenantBody(id="~operator"))
    extra = (await tenants.create_key("acme", body("events:send", name="producer"))).value
    assert extra.key is not None
    assert (await keys.authenticate(extra.key)).scopes == ("events:send",)
    with pytest.raises(TenantNotFound):
        await tenants.create_key("nobody", body("read"))
    replays = [
        await tenants.create(TenantBody(id="beta"), idempotency_key="op-1") for _ in range(2)
    ]
    assert replays[0].value.key.key is not None
    assert replays[1].replayed
    assert replays[1].value.key.key is None
    assert replays[1].value.tenant.id == "beta"
    page = await tenants.list(limit=2)
    assert [t.id for t in page.items] == ["acme", "beta"]
    assert page.next_cursor is None


async def test_keys_are_compared_in_constant_time(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    compared: list[tuple[Any, Any]] = []
    real: Callable[[Any, Any], bool] = hmac.compare_digest

    def spy(a: Any, b: Any) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(keys_module.hmac, "compare_digest", spy)
    monkeypatch.setattr(tenants_module.hmac, "compare_digest", spy)
    keys = KeysService(store, clock=ManualClock())
    await _admin(keys)
    assert compared, "an API key is compared with compare_digest"
    tenants = TenantsService(store, operator_key=OPERATOR_KEY)
    compared.clear()
    tenants.authenticate_operator(OPERATOR_KEY)
    with pytest.raises(Unauthenticated):
        tenants.authenticate_operator(OPERATOR_KEY[:-1] + "y")
    assert len(compared) == 2
    with pytest.raises(Unauthenticated, match="no operator key"):
        TenantsService(store).authenticate_operator(OPERATOR_KEY)


async def test_a_tenant_has_a_bounded_number_of_live_keys(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(keys_module, "MAX_LIVE_KEYS", 3)
    keys = KeysService(store, clock=ManualClock())
    admin = await _admin(keys)
    made = [(await keys.create(admin, body("read", name=f"k{i}"))).value for i in range(2)]
    with pytest.raises(RequestInvalid) as refused:
        await keys.create(admin, body("read"))
    assert refused.value.details == {"limit": 3}
    await keys.revoke("t1", made[0].id)  # a revoked key no longer counts
    await keys.create(admin, body("read"))
    tenants = TenantsService(store)
    with pytest.raises(RequestInvalid):
        await tenants.create_key("t1", body("admin"))
