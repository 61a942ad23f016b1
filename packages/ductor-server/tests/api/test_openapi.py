"""The OpenAPI document describes every request body: each operation whose handler
takes a body lists a JSON schema that resolves to a described object, and no
operation claims a body its handler does not read."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from litestar import Litestar
from litestar.testing import AsyncTestClient

from ductor_server import Settings, create_app

BODY_METHODS = {"POST", "PUT", "PATCH"}


def _takes_a_body(app: Litestar) -> dict[tuple[str, str], bool]:
    """(method, path) of every POST/PUT/PATCH operation -> whether its handler reads a body."""
    found: dict[tuple[str, str], bool] = {}
    for route in app.routes:
        for handler in getattr(route, "route_handlers", ()):
            takes = "data" in inspect.signature(handler.fn).parameters
            for method in handler.http_methods & BODY_METHODS:
                found[(method.lower(), route.path_format)] = takes
    return found


def _resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if ref is None:
        return schema
    prefix = "#/components/schemas/"
    assert ref.startswith(prefix), ref
    resolved: dict[str, Any] = doc["components"]["schemas"][ref.removeprefix(prefix)]
    return resolved


async def test_every_body_taking_operation_lists_its_request_schema(tmp_path: Path) -> None:
    app = create_app(Settings(data_dir=tmp_path))
    async with AsyncTestClient(app=app) as client:
        doc = (await client.get("/docs/openapi.json")).json()
    operations = _takes_a_body(app)
    assert sum(operations.values()) >= 17, operations  # every resource family has some
    assert operations[("post", "/v1/bridge/sync")]
    # The POSTs that read no body; a handler decoding the raw body itself would
    # escape the document, so it would show up here. Stripe's webhook is the one
    # that must: its signature covers the raw bytes (and Stripe documents the body).
    assert sorted(k for k, takes in operations.items() if not takes) == [
        ("post", "/v1/bridge/apps/{app_id}/health"),
        ("post", "/webhooks/stripe"),
    ]
    for (method, path), takes_body in sorted(operations.items()):
        operation = doc["paths"][path][method]
        if not takes_body:
            assert "requestBody" not in operation, (method, path)
            continue
        body = operation.get("requestBody")
        assert body is not None, f"{method.upper()} {path} documents no request body"
        schema = body["content"]["application/json"]["schema"]
        described = _resolve(doc, schema)
        assert described.get("type") == "object", (method, path, described)
        # A call that takes no body documents `{}` (EmptyBody): none or {} is accepted.
        assert described.get("properties") or described.get("title") == "EmptyBody", (
            method,
            path,
            described,
        )
        # The error answers are documented too, in the one error shape.
        error = _resolve(
            doc, operation["responses"]["422"]["content"]["application/json"]["schema"]
        )
        assert {"code", "message"} <= set(error["properties"]), (method, path)


async def test_every_v1_operation_lists_every_status_it_can_answer(tmp_path: Path) -> None:
    from ductor_server.transports.rest.errors import STATUS_BY_CODE

    app = create_app(Settings(data_dir=tmp_path))
    async with AsyncTestClient(app=app) as client:
        doc = (await client.get("/docs/openapi.json")).json()
    # Every status of the error table a request can cause (405 concerns no operation,
    # 500 is a bug, not an answer).
    errors = {str(s) for s in STATUS_BY_CODE.values()} - {"405", "500"}
    assert errors == {
        "400",
        "401",
        "403",
        "404",
        "409",
        "413",
        "415",
        "422",
        "429",
        "502",
        "503",
        "504",
    }
    operations = [
        (method, path, op)
        for path, ops in doc["paths"].items()
        if path.startswith("/v1/")
        for method, op in ops.items()
    ]
    assert len(operations) >= 35
    for method, path, op in operations:
        missing = errors - set(op["responses"])
        assert not missing, f"{method.upper()} {path} does not list {sorted(missing)}"
    # 415 is listed as reserved: a REST body is read as JSON whatever its Content-Type.
    trigger = doc["paths"]["/v1/runs"]["post"]["responses"]
    assert trigger["415"]["description"].startswith("Reserved"), trigger["415"]
    assert "run.wait_limit" in trigger["429"]["description"], trigger["429"]
    # A put that replaces, or a publish of known content, answers 200 besides 201.
    for path in ("/v1/workers", "/v1/pools", "/v1/workflows"):
        assert {"200", "201"} <= set(doc["paths"][path]["post"]["responses"]), path
    for path in ("/v1/workers", "/v1/pools"):
        listed = doc["paths"][path]["get"]["responses"]["200"]["content"]["application/json"]
        assert listed["schema"]["type"] == "array", path
