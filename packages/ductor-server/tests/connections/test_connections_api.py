"""`/v1/connections` and `/v1/providers` through the app on both backends: secrets only
as masks, every problem with a pointer, other tenants' connections invisible, tests
through the outbound guard, and ACTION steps through a connection."""

from __future__ import annotations

import asyncio
import base64
import hashlib
from typing import Any

import msgspec
import pytest

from ductor_server.connections.store import ConnectionsTx

from .conftest import Api, step
from .sink import HttpSink, reply

TOKEN = "tok-3f9c1e77a2b84d05b6e1-secret-zq"
API_WITH_TOKEN = {
    "name": "api",
    "provider": "http",
    "config": {"base_url": "https://example.com"},
    "secrets": {"bearer_token": TOKEN},
}
WHSEC = "whsec_" + base64.b64encode(b"webhook-signing-key-of-32-bytes!").decode()


def echo(name: str = "crm", **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "provider": "echo",
        "config": {"region": "eu"},
        "secrets": {"token": TOKEN},
        **extra,
    }


def one_step(args: dict[str, Any], slug: str = "push") -> dict[str, Any]:
    return {
        "family_slug": slug,
        "title": "Push",
        "steps": [{"ref": "push", "type": "STEP_TYPE_ACTION", "args": args}],
        "edges": [],
    }


async def test_create_shows_masks_never_the_secret(api: Api) -> None:
    response = await api.call("POST", "/v1/connections", json=echo(description="the CRM"))
    assert response.status_code == 201, response.text
    created = response.json()
    assert TOKEN not in response.text
    assert created["id"].startswith("con_")
    assert created["secrets"] == {"token": "••••" + TOKEN[-4:]}
    assert created["config"] == {"region": "eu"}
    assert created["secrets_updated_at"] is not None
    for path in ("/v1/connections", "/v1/connections/crm"):
        answer = await api.call("GET", path)
        assert answer.status_code == 200
        assert TOKEN not in answer.text
    listed = await api.ok("GET", "/v1/connections")
    assert [c["name"] for c in listed] == ["crm"]
    async with api.store.transaction() as tx:
        row = await tx.session.fetch_one(
            "SELECT secrets_ciphertext, secrets_key_id, config FROM connections"
            " WHERE tenant_id = %s AND name = %s",
            ("tenant-a", "crm"),
        )
    assert row is not None
    assert TOKEN not in str(row[0])
    assert row[1] == "k1"


async def test_create_is_idempotent_and_names_are_unique(api: Api) -> None:
    first = await api.call("POST", "/v1/connections", json=echo(), key="c-1")
    again = await api.call("POST", "/v1/connections", json=echo(), key="c-1")
    assert first.status_code == again.status_code == 201
    assert again.headers["Idempotency-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    await api.fails(
        "POST",
        "/v1/connections",
        422,
        "idempotency.conflict",
        json=echo(description="x"),
        key="c-1",
    )
    await api.fails("POST", "/v1/connections", 409, "connection.conflict", json=echo())
    assert await api.count("SELECT COUNT(*) FROM connections") == 1


async def test_concurrent_duplicates_make_one_connection(api: Api) -> None:
    # Twenty retries with one key, at once: one connection, every answer the same.
    same_key = await asyncio.gather(
        *(api.call("POST", "/v1/connections", json=echo(), key="burst") for _ in range(20))
    )
    assert {r.status_code for r in same_key} == {201}, [r.text for r in same_key]
    assert len({r.json()["id"] for r in same_key}) == 1
    # Twenty different keys racing for one new name: one wins, the rest are told.
    racing = await asyncio.gather(
        *(
            api.call("POST", "/v1/connections", json=echo("race"), key=f"race-{n}")
            for n in range(20)
        )
    )
    statuses = sorted(r.status_code for r in racing)
    assert statuses == [201] + [409] * 19, [r.text for r in racing]
    assert {r.json()["code"] for r in racing if r.status_code == 409} == {"connection.conflict"}
    assert await api.count("SELECT COUNT(*) FROM connections") == 2


async def test_every_problem_has_a_pointer(api: Api) -> None:
    body = await api.fails(
        "POST",
        "/v1/connections",
        422,
        "connection.invalid",
        json={
            "name": "Bad Name",
            "provider": "echo",
            "config": {"regoin": "eu", "retries": "3"},
            "secrets": {"tokn": TOKEN},
        },
    )
    pointers = {p["pointer"] for p in body["details"]}
    assert pointers == {
        "/name",
        "/config/regoin",
        "/config/region",
        "/config/retries",
        "/secrets/tokn",
        "/secrets/token",
    }
    wrong_type = await api.fails(
        "POST",
        "/v1/connections",
        422,
        "connection.invalid",
        json=echo(config={"region": "eu", "retries": "three"}),
    )
    assert wrong_type["details"] == [
        {"pointer": "/config/retries", "message": "Expected `int`, got `str`"}
    ]
    every_type = await api.fails(
        "POST",
        "/v1/connections",
        422,
        "connection.invalid",
        json={
            "name": "v1",
            "provider": "http",
            "config": {"base_url": 5, "timeout": "x", "headers": 3, "proxy": "p"},
            "secrets": {"bearer_token": 7},
        },
    )
    assert sorted(p["pointer"] for p in every_type["details"]) == [
        "/config/base_url",
        "/config/headers",
        "/config/proxy",
        "/config/timeout",
        "/secrets/bearer_token",
    ]
    secret_type = await api.fails(
        "POST",
        "/v1/connections",
        422,
        "connection.invalid",
        json=echo(secrets={"token": TOKEN, "extra": 12345}),
    )
    assert secret_type["details"][0]["pointer"] == "/secrets/extra"
    unknown = await api.fails(
        "POST",
        "/v1/connections",
        422,
        "connection.invalid",
        json={"name": "x", "provider": "ftp", "config": {}},
    )
    assert unknown["details"][0]["pointer"] == "/provider"
    assert "echo" in unknown["details"][0]["message"]
    huge = await api.fails(
        "POST",
        "/v1/connections",
        422,
        "connection.invalid",
        json=echo(config={"region": "eu" * 50_000}),
    )
    assert huge["details"][0]["pointer"] == "/config"
    nested = await api.fails(
        "POST",
        "/v1/connections",
        422,
        "request.invalid",
        json=echo(config={"region": "eu", "x": {"a" * 10: [[[[[[[[]]]]]]]]} | {}}) | {"y": 1},
    )
    assert nested["details"]["path"] == "$.y"
    assert await api.count("SELECT COUNT(*) FROM connections") == 0


@pytest.mark.parametrize("length", [64, 300, 5000])
async def test_a_name_or_provider_too_long_is_a_problem_at_its_pointer(
    api: Api, length: int
) -> None:
    body = await api.fails(
        "POST",
        "/v1/connections",
        422,
        "connection.invalid",
        json=echo("n" * length) | {"provider": "p" * length},
    )
    assert [p["pointer"] for p in body["details"]] == ["/name", "/provider"]
    assert len(body["message"]) < 500
    assert await api.count("SELECT COUNT(*) FROM connections") == 0


async def test_secrets_hold_at_most_32_values(api: Api) -> None:
    # Every value is looked for in every answer and error: their number is bounded.
    def headers(n: int) -> dict[str, str]:
        return {f"X-Key-{i}": f"secret-value-{i:04d}" for i in range(n)}

    base = {"name": "api", "provider": "http", "config": {"base_url": "https://example.com"}}
    body = await api.fails(
        "POST",
        "/v1/connections",
        422,
        "connection.invalid",
        json=base | {"secrets": {"headers": headers(33)}},
    )
    assert [p["pointer"] for p in body["details"]] == ["/secrets"]
    assert "32" in body["details"][0]["message"]
    assert await api.count("SELECT COUNT(*) FROM connections") == 0
    await api.ok("POST", "/v1/connections", json=base | {"secrets": {"headers": headers(32)}})
    await api.fails(
        "PATCH",
        "/v1/connections/api",
        422,
        "connection.invalid",
        json={"secrets": {"headers": headers(40)}},
    )
    shown = await api.ok("GET", "/v1/connections/api")
    assert shown["secrets"] == {"headers": "••••"}


async def test_the_http_provider_checks_its_own_settings(api: Api) -> None:
    body = await api.fails(
        "POST",
        "/v1/connections",
        422,
        "connection.invalid",
        json={"name": "api", "provider": "http", "config": {"base_url": "ftp://x"}},
    )
    assert [p["pointer"] for p in body["details"]] == ["/config"]
    both = await api.fails(
        "POST",
        "/v1/connections",
        422,
        "connection.invalid",
        json={
            "name": "api",
            "provider": "http",
            "config": {"base_url": "https://example.com"},
            "secrets": {"bearer_token": TOKEN, "username": "u", "password": TOKEN + "x"},
        },
    )
    assert [p["pointer"] for p in both["details"]] == ["/secrets"]
    assert "bearer_token" in both["details"][0]["message"]
    assert TOKEN not in str(both)
    made = await api.ok(
        "POST",
        "/v1/connections",
        json=API_WITH_TOKEN,
    )
    assert made["secrets"] == {"bearer_token": "••••" + TOKEN[-4:]}
    typed = await api.fails(
        "POST", "/v1/connections", 422, "request.invalid", json={"name": 123, "provider": "http"}
    )
    assert typed["details"]["path"] == "$.name"


# Settings no call could ever use: a host name with an empty label, a label over 63
# characters or over 253 in all (no such host), and a header value (a secret's too)
# that cannot go out as ASCII.
_HOST = "host"
_ASCII = "ASCII"


@pytest.mark.parametrize(
    ("provider", "config", "secrets", "at", "said"),
    [
        ("http", {"base_url": "https://api..example.com/v1"}, {}, "/config", _HOST),
        (
            "webhook",
            {"url": f"https://{'a' * 64}.example/hooks"},
            {"signing_secret": WHSEC},
            "/config",
            _HOST,
        ),
        (
            "slack",
            {},
            {"webhook_url": "https://hooks..slack.com/services/T0/B0/x"},
            "/secrets",
            _HOST,
        ),
        (
            "openai",
            {"base_url": f"https://{'a.' * 127}ai/v1"},
            {"api_key": TOKEN},
            "/config",
            _HOST,
        ),
        (
            "smtp",
            {"host": "mail..example.com", "from_address": "a@example.com"},
            {},
            "/config",
            _HOST,
        ),
        (
            "smtp",
            {"host": "m" * 64 + ".example.com", "from_address": "a@example.com"},
            {},
            "/config",
            _HOST,
        ),
        (
            "http",
            {"base_url": "https://example.com", "headers": {"X-Team": "café"}},
            {},
            "/config",
            _ASCII,
        ),
        (
            "http",
            {"base_url": "https://example.com", "headers": {"X-Bel": "\x07"}},
            {},
            "/config",
            _ASCII,
        ),
        (
            "http",
            {"base_url": "https://example.com"},
            {"headers": {"X-Key": "clé"}},
            "/secrets",
            _ASCII,
        ),
        (
            "http",
            {"base_url": "https://example.com"},
            {"bearer_token": "jeton-é"},
            "/secrets",
            _ASCII,
        ),
        ("openai", {"organization": "org-ñ"}, {"api_key": TOKEN}, "/config", _ASCII),
        ("openai", {}, {"api_key": "sk-ø"}, "/secrets", _ASCII),
    ],
)
async def test_settings_no_call_could_use_are_refused_at_their_pointer(
    api: Api, provider: str, config: dict[str, Any], secrets: dict[str, Any], at: str, said: str
) -> None:
    # Refused when the connection is written, not at every call.
    body = await api.fails(
        "POST",
        "/v1/connections",
        422,
        "connection.invalid",
        json={"name": "api", "provider": provider, "config": config, "secrets": secrets},
    )
    assert [p["pointer"] for p in body["details"]] == [at], body
    assert said in body["details"][0]["message"]
    assert await api.count("SELECT COUNT(*) FROM connections") == 0


@pytest.mark.parametrize(
    ("provider", "config", "secrets", "at"),
    [
        ("http", {"base_url": "http://127.0.0.1:99999/"}, {}, "/config"),
        ("webhook", {"url": "http://127.0.0.1:0/hooks"}, {"signing_secret": WHSEC}, "/config"),
        ("slack", {}, {"webhook_url": "https://127.0.0.1:65536/services/T0/B0/x"}, "/secrets"),
        ("openai", {"base_url": "http://127.0.0.1:port/v1"}, {"api_key": TOKEN}, "/config"),
    ],
)
async def test_a_url_whose_port_is_out_of_range_is_refused(
    api: Api, provider: str, config: dict[str, Any], secrets: dict[str, Any], at: str
) -> None:
    body = {"name": "far", "provider": provider, "config": config, "secrets": secrets}
    refused = await api.fails("POST", "/v1/connections", 422, "connection.invalid", json=body)
    (problem,) = refused["details"]
    assert problem["pointer"].startswith(at)
    assert "port from 1 to 65535" in problem["message"]
    report = await api.ok("POST", "/v1/connections/validate", json=body)
    assert [p["pointer"] for p in report["problems"]] == [problem["pointer"]]
    assert await api.count("SELECT COUNT(*) FROM connections") == 0


async def test_a_stored_url_whose_port_is_out_of_range_fails_the_step_once(api: Api) -> None:
    await api.ok(
        "POST",
        "/v1/connections",
        json={"name": "api", "provider": "http", "config": {"base_url": "http://127.0.0.1:1/"}},
    )
    async with api.store.transaction() as tx:  # a row written before ports were checked
        record = await ConnectionsTx(tx).get_for_update("tenant-a", "api")
        assert record is not None
        bad = {"base_url": "http://127.0.0.1:99999/"}
        await ConnectionsTx(tx).update(msgspec.structs.replace(record, config=bad))
    run = await api.run_to_end(one_step({"connection": "api", "operation": "request"}))
    assert run["status"] == "RUN_STATUS_FAILED", run
    error = step(run, "push")["error"]
    assert (error["code"], error["retryable"]) == ("connection.invalid", False), error
    assert "port from 1 to 65535" in error["message"]
    assert step(run, "push")["attempt"] == 1


async def test_other_tenants_connections_are_not_found(api: Api) -> None:
    await api.ok("POST", "/v1/connections", json=echo())
    assert await api.ok("GET", "/v1/connections", as_b=True) == []
    for method, path in [
        ("GET", "/v1/connections/crm"),
        ("PATCH", "/v1/connections/crm"),
        ("DELETE", "/v1/connections/crm"),
        ("POST", "/v1/connections/crm/test"),
    ]:
        kwargs: dict[str, Any] = {"json": {"description": "x"}} if method == "PATCH" else {}
        await api.fails(method, path, 404, "connection.not_found", as_b=True, **kwargs)
    # tenant b may use the same name for its own
    await api.ok("POST", "/v1/connections", json=echo(), as_b=True)


async def test_update_replaces_config_and_merges_secrets(api: Api) -> None:
    created = await api.ok(
        "POST", "/v1/connections", json=echo(secrets={"token": TOKEN, "extra": "e" * 20})
    )
    updated = await api.ok(
        "PATCH", "/v1/connections/crm", json={"config": {"region": "us", "retries": 2}}
    )
    assert updated["config"] == {"region": "us", "retries": 2}
    assert updated["secrets_updated_at"] == created["secrets_updated_at"]
    new_token = "tok-new-0000000000000000000-rotated"
    changed = await api.ok(
        "PATCH", "/v1/connections/crm", json={"secrets": {"token": new_token, "extra": None}}
    )
    assert changed["secrets"] == {"token": "••••" + new_token[-4:]}
    assert changed["secrets_updated_at"] > created["secrets_updated_at"]
    missing = await api.fails(
        "PATCH", "/v1/connections/crm", 422, "connection.invalid", json={"secrets": {"token": None}}
    )
    assert missing["details"][0]["pointer"] == "/secrets/token"
    await api.fails(
        "PATCH", "/v1/connections/crm", 422, "connection.invalid", json={"config": {"region": 1}}
    )
    await api.fails("PATCH", "/v1/connections/crm", 422, "request.invalid", json={"name": "other"})
    # the step sees the new token
    run = await api.run_to_end(
        one_step({"connection": "crm", "operation": "send", "input": {"to": "'a'"}})
    )
    output = step(run, "push")["output"]
    assert output["token_sha256"] == hashlib.sha256(new_token.encode()).hexdigest()
    assert output["region"] == "us"


async def test_secrets_updated_at_is_null_once_every_secret_is_removed(api: Api) -> None:
    created = await api.ok(
        "POST",
        "/v1/connections",
        json=API_WITH_TOKEN,
    )
    assert created["secrets_updated_at"] is not None
    same = await api.ok("PATCH", "/v1/connections/api", json={"secrets": {"bearer_token": TOKEN}})
    assert same["secrets_updated_at"] == created["secrets_updated_at"]
    emptied = await api.ok("PATCH", "/v1/connections/api", json={"secrets": {"bearer_token": None}})
    assert emptied["secrets"] == {}
    assert emptied["secrets_updated_at"] is None
    assert (await api.ok("GET", "/v1/connections/api"))["secrets_updated_at"] is None


async def test_delete(api: Api) -> None:
    await api.ok("POST", "/v1/connections", json=echo())
    response = await api.call("DELETE", "/v1/connections/crm")
    assert response.status_code == 204
    await api.fails("GET", "/v1/connections/crm", 404, "connection.not_found")
    await api.fails("DELETE", "/v1/connections/crm", 404, "connection.not_found")


async def test_secrets_need_a_key(keyless: Api) -> None:
    await keyless.fails("POST", "/v1/connections", 503, "secrets.unconfigured", json=echo())
    assert await keyless.count("SELECT COUNT(*) FROM connections") == 0
    plain = await keyless.ok(
        "POST",
        "/v1/connections",
        json={"name": "open", "provider": "http", "config": {"base_url": "https://example.com"}},
    )
    assert plain["secrets"] == {}
    assert plain["secrets_updated_at"] is None


async def test_providers_are_listed_with_schemas(api: Api) -> None:
    providers = {p["name"]: p for p in await api.ok("GET", "/v1/providers")}
    assert {"http", "echo"} <= set(providers)
    echo_ = providers["echo"]
    assert echo_["origin"] == "tests"
    assert set(echo_["settings"]["properties"]) == {"region", "retries"}
    assert echo_["secrets"]["required"] == ["token"]
    (send,) = echo_["operations"]
    assert send["name"] == "send"
    assert send["required"] == ["to"]
    assert set(send["input"]["properties"]) == {"to", "text"}
    request = providers["http"]["operations"][0]
    assert request["name"] == "request"
    assert request["output"]["properties"]["status"]["type"] == "integer"


async def test_connection_test_answers_check_result(api: Api, sink: HttpSink) -> None:
    await api.ok("POST", "/v1/connections", json=echo())
    # The test takes no body: a field in one is refused, not ignored.
    refused = await api.fails(
        "POST", "/v1/connections/crm/test", 422, "request.invalid", json={"timeout": 1}
    )
    assert refused["details"]["path"] == "$.timeout", refused
    result = await api.ok("POST", "/v1/connections/crm/test", json={})
    assert result["ok"] is True
    assert TOKEN not in str(result)
    assert "••••" in result["message"]
    await api.ok(
        "POST",
        "/v1/connections",
        json={
            "name": "api",
            "provider": "http",
            "config": {"base_url": sink.url},
            "secrets": {"bearer_token": TOKEN},
        },
    )
    sink.answer(204)
    result = await api.ok("POST", "/v1/connections/api/test")
    assert result["ok"] is True, result
    assert sink.last.method == "HEAD"
    assert sink.last.headers["authorization"] == f"Bearer {TOKEN}"


async def test_a_provider_that_calls_sys_exit_fails_its_test_and_its_step_not_the_server(
    api: Api,
) -> None:
    await api.ok("POST", "/v1/connections", json=echo(config={"region": "exit"}))
    result = await api.ok("POST", "/v1/connections/crm/test")
    assert result["ok"] is False
    assert result["details"]["code"] == "provider.crashed"
    assert result["message"] == "SystemExit: exited holding ••••"
    await api.ok("POST", "/v1/connections", json=echo(name="ok"))
    args = {"connection": "ok", "operation": "send", "input": {"to": "'a'", "text": "'exit'"}}
    exited = await api.run_to_end(
        {
            **one_step({}, slug="exits"),
            "steps": [
                {
                    "ref": "push",
                    "type": "STEP_TYPE_ACTION",
                    "args": args,
                    "retry": {"max_attempts": 1},
                }
            ],
        }
    )
    assert step(exited, "push")["error"]["code"] == "provider.crashed"
    assert step(exited, "push")["error"]["message"] == "SystemExit: exited holding ••••"
    assert (await api.ok("POST", "/v1/connections/ok/test"))["ok"] is True


async def test_a_test_that_raises_answers_its_message_and_its_details_with_its_code(
    api: Api,
) -> None:
    await api.ok("POST", "/v1/connections", json=echo(config={"region": "down"}))
    result = await api.ok("POST", "/v1/connections/crm/test")
    assert result["ok"] is False
    assert result["message"] == "region down for ••••"
    assert result["details"] == {"at": 1, "code": "echo.down"}


async def test_connection_test_to_loopback_is_refused_not_hung(
    guarded: Api, sink: HttpSink
) -> None:
    await guarded.ok(
        "POST",
        "/v1/connections",
        json={
            "name": "api",
            "provider": "http",
            "config": {"base_url": sink.url},
            "secrets": {"bearer_token": TOKEN},
        },
    )
    result = await guarded.ok("POST", "/v1/connections/api/test")
    assert result["ok"] is False
    assert result["details"]["code"] == "outbound.forbidden"
    assert sink.seen == []


@pytest.mark.parametrize(
    ("provider", "config", "secrets"),
    [
        ("http", {"base_url": "http://127.0.0.1:9/"}, {}),
        ("webhook", {"url": "http://127.0.0.1:9/hooks"}, {"signing_secret": WHSEC}),
        ("slack", {}, {"webhook_url": "http://127.0.0.1:9/services/T0/B0/x"}),
        ("openai", {"base_url": "http://127.0.0.1:9/v1"}, {"api_key": TOKEN}),
        (
            "smtp",
            {"host": "127.0.0.1", "port": 9, "from_address": "a@example.com"},
            {},
        ),
    ],
)
async def test_every_providers_refused_test_names_the_host(
    guarded: Api, provider: str, config: dict[str, Any], secrets: dict[str, Any]
) -> None:
    body = {"name": "far", "provider": provider, "config": config, "secrets": secrets}
    await guarded.ok("POST", "/v1/connections", json=body)
    result = await guarded.ok("POST", "/v1/connections/far/test")
    assert result["ok"] is False, result
    assert result["details"] == {"code": "outbound.forbidden", "host": "127.0.0.1"}


# --- publishing and running ---------------------------------------------------------


async def test_publish_checks_connection_operation_and_input(api: Api) -> None:
    await api.ok("POST", "/v1/connections", json=echo())
    await api.ok("POST", "/v1/connections", json=echo("theirs"), as_b=True)
    definition = {
        "family_slug": "checked",
        "title": "Checked",
        "steps": [
            {
                "ref": "a",
                "type": "STEP_TYPE_ACTION",
                "args": {"connection": "theirs", "operation": "send", "input": {"to": "'x'"}},
            },
            {
                "ref": "b",
                "type": "STEP_TYPE_ACTION",
                "args": {"connection": "crm", "operation": "shout", "input": {"to": "'x'"}},
            },
            {
                "ref": "c",
                "type": "STEP_TYPE_ACTION",
                "args": {"connection": "crm", "operation": "send", "input": {"txt": "'x'"}},
            },
            {
                "ref": "d",
                "type": "STEP_TYPE_SCATTER",
                "args": {
                    "items": "[1, 2]",
                    "step": {
                        "type": "STEP_TYPE_ACTION",
                        "args": {"connection": "nope", "operation": "send", "input": {"to": "'x'"}},
                    },
                },
            },
        ],
        "edges": [],
    }
    body = await api.fails("POST", "/v1/workflows", 422, "definition.invalid", json=definition)
    got = sorted((p["code"], p["pointer"]) for p in body["details"])
    assert got == [
        ("definition.bad_input", "/steps/2/args/input/to"),
        ("definition.bad_input", "/steps/2/args/input/txt"),
        ("definition.unknown_connection", "/steps/0/args/connection"),
        ("definition.unknown_connection", "/steps/3/args/step/args/connection"),
        ("definition.unknown_operation", "/steps/1/args/operation"),
    ]
    report = await api.ok("POST", "/v1/workflows/validate", json=definition)
    assert report["valid"] is False
    assert len(report["problems"]) == 5
    # tenant b's own connection is fine for tenant b
    ok = one_step({"connection": "theirs", "operation": "send", "input": {"to": "'x'"}})
    await api.ok("POST", "/v1/workflows", json=ok, as_b=True)
    await api.fails("POST", "/v1/workflows", 422, "definition.invalid", json=ok)


async def test_a_step_through_a_connection_runs_without_leaking(api: Api) -> None:
    await api.ok("POST", "/v1/connections", json=echo())
    args = {"connection": "crm", "operation": "send", "input": {"to": "input.who", "text": "'hi'"}}
    run = await api.run_to_end(one_step(args), input={"who": "ada"})
    assert run["status"] == "RUN_STATUS_SUCCEEDED", run
    output = run["output"]["push"]
    assert output["to"] == "ada"
    assert output["region"] == "eu"
    assert output["token_sha256"] == hashlib.sha256(TOKEN.encode()).hexdigest()
    assert output["key"] == f"{run['id']}:push:-1:1"
    leak = await api.run_to_end(
        one_step(
            {"connection": "crm", "operation": "send", "input": {"to": "'a'", "text": "'leak'"}},
            slug="leak",
        )
    )
    assert leak["status"] == "RUN_STATUS_SUCCEEDED"
    assert leak["output"]["push"] == {"echo": "••••", "nested": [{"t": "x••••y"}]}
    failed = await api.run_to_end(
        one_step(
            {"connection": "crm", "operation": "send", "input": {"to": "'a'", "text": "'fail'"}},
            slug="fail",
        )
    )
    assert failed["status"] == "RUN_STATUS_FAILED"
    crashed = await api.run_to_end(
        {
            **one_step({}, slug="crash"),
            "steps": [
                {
                    "ref": "push",
                    "type": "STEP_TYPE_ACTION",
                    "args": {
                        "connection": "crm",
                        "operation": "send",
                        "input": {"to": "'a'", "text": "'crash'"},
                    },
                    "retry": {"max_attempts": 1},
                }
            ],
        }
    )
    assert step(crashed, "push")["error"]["code"] == "provider.crashed"
    assert step(crashed, "push")["error"]["message"] == "RuntimeError: crashed holding ••••"
    for run_ in (run, leak, failed, crashed):
        history = await api.call("GET", f"/v1/runs/{run_['id']}/history")
        got = await api.call("GET", f"/v1/runs/{run_['id']}")
        assert TOKEN not in history.text
        assert TOKEN not in got.text
    assert "refused token ••••" in str(failed)


async def test_bad_input_and_a_deleted_connection_fail_the_step_once(api: Api) -> None:
    await api.ok("POST", "/v1/connections", json=echo())
    args = {"connection": "crm", "operation": "send", "input": {"to": "input.n"}}
    run = await api.run_to_end(one_step(args, slug="typed"), input={"n": 5})
    assert run["status"] == "RUN_STATUS_FAILED"
    error = step(run, "push")["error"]
    assert error["code"] == "connection.bad_input"
    assert error["retryable"] is False
    assert "/input/to" in error["message"]
    assert step(run, "push")["attempt"] == 1
    good = one_step({"connection": "crm", "operation": "send", "input": {"to": "'a'"}}, "gone")
    await api.ok("POST", "/v1/workflows", json=good)
    await api.call("DELETE", "/v1/connections/crm")
    gone = await api.run_to_end(good, publish=False)
    assert gone["status"] == "RUN_STATUS_FAILED"
    assert step(gone, "push")["error"]["code"] == "connection.not_found"
    assert step(gone, "push")["attempt"] == 1


async def test_an_http_connection_step_reaches_the_sink(api: Api, sink: HttpSink) -> None:
    sink.answer(200, {"id": 42})
    await api.ok(
        "POST",
        "/v1/connections",
        json={
            "name": "api",
            "provider": "http",
            "config": {"base_url": sink.url + "/v2"},
            "secrets": {"bearer_token": TOKEN},
        },
    )
    args = {
        "connection": "api",
        "operation": "request",
        "input": {"method": "'POST'", "path": "'/leads'", "body": "{'who': input.who}"},
    }
    run = await api.run_to_end(one_step(args), input={"who": "ada"})
    assert run["status"] == "RUN_STATUS_SUCCEEDED", run
    assert run["output"]["push"]["body"] == {"id": 42}
    seen = sink.last
    assert (seen.method, seen.path) == ("POST", "/v2/leads")
    assert seen.json() == {"who": "ada"}
    assert seen.headers["authorization"] == f"Bearer {TOKEN}"
    assert seen.headers["idempotency-key"] == f"{run['id']}:push:-1:1"
    sink.script(lambda seen: reply(500, {"echo": seen.headers.get("authorization", "")}))
    failed = await api.run_to_end(
        {
            **one_step(args, slug="fails"),
            "steps": [
                {
                    "ref": "push",
                    "type": "STEP_TYPE_ACTION",
                    "args": args,
                    "retry": {"max_attempts": 1},
                }
            ],
        },
        input={"who": "ada"},
    )
    assert failed["status"] == "RUN_STATUS_FAILED"
    history = await api.call("GET", f"/v1/runs/{failed['id']}/history")
    assert "http.500" in history.text
    assert TOKEN not in history.text
    assert TOKEN not in str(failed)


async def test_moving_a_connection_elsewhere_needs_its_secrets_given_again(api: Api) -> None:
    """A key that may write a connection but knows none of its secrets cannot
    point it at a host of its own and have the stored token sent there."""
    await api.ok("POST", "/v1/connections", json=API_WITH_TOKEN)
    before = await api.ok("GET", "/v1/connections/api")
    moved = {"config": {"base_url": "https://attacker.example.net/collect"}}
    refused = await api.fails("PATCH", "/v1/connections/api", 422, "connection.invalid", json=moved)
    assert refused["details"][0]["pointer"] == "/config/base_url"
    assert "bearer_token" in refused["details"][0]["message"]
    # Another port or scheme of the same host is another address too.
    for url in ("https://example.com:8443/v2", "http://example.com/v2"):
        await api.fails(
            "PATCH",
            "/v1/connections/api",
            422,
            "connection.invalid",
            json={"config": {"base_url": url}},
        )
    # A dummy secret field given beside it leaves the token in place: refused as well.
    await api.fails(
        "PATCH",
        "/v1/connections/api",
        422,
        "connection.invalid",
        json={**moved, "secrets": {"other": "x"}},
    )
    # Nothing was written.
    assert await api.ok("GET", "/v1/connections/api") == before
    # The same address with another path, or a setting beside it, needs nothing more.
    same_host = {"config": {"base_url": API_WITH_TOKEN["config"]["base_url"] + "/v2"}}
    await api.ok("PATCH", "/v1/connections/api", json=same_host)
    # Given every secret again (or dropped), the move is the tenant's own.
    await api.ok(
        "PATCH", "/v1/connections/api", json={**moved, "secrets": {"bearer_token": "new-token"}}
    )
    emptied = {
        "config": {"base_url": "https://third.example.org"},
        "secrets": {"bearer_token": None},
    }
    await api.ok("PATCH", "/v1/connections/api", json=emptied)
    # A connection holding no secret moves freely.
    await api.ok(
        "PATCH", "/v1/connections/api", json={"config": {"base_url": "https://fourth.example.org"}}
    )
