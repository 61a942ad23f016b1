"""docs/api.md agrees with the server: the error-code table is the one the API
uses, every resource in the docs is in the OpenAPI document, and the error
example is what the server really answers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ductor_server.transports.error_codes import ERROR_CODES
from ductor_server.transports.rest.bodies import TriggerRunBody, decode_body
from ductor_server.transports.rest.errors import STATUS_BY_CODE, ApiError

DOC = (Path(__file__).resolve().parents[1] / "docs" / "api.md").read_text()


def test_the_error_table_is_the_servers() -> None:
    rows = re.findall(r"^\| `([a-z_.]+)` \| (\d{3}) \| `([a-z_]+)` \|", DOC, re.MULTILINE)
    assert {code: int(status) for code, status, _ in rows} == STATUS_BY_CODE
    assert {code: connect for code, _, connect in rows} == {
        code: mapped.connect for code, mapped in ERROR_CODES.items()
    }
    assert len(rows) == len(STATUS_BY_CODE), "a code is listed twice"


def test_the_error_example_is_real() -> None:
    example = json.loads(re.search(r"```json\n(.*?)\n```", DOC, re.DOTALL).group(1))  # type: ignore[union-attr]
    with pytest.raises(ApiError) as refused:
        decode_body(b'{"family_slug": "x", "version": "one"}', TriggerRunBody)
    exc = refused.value
    assert {"code": exc.code, "message": exc.message, "details": exc.details} == example


def test_every_documented_resource_is_routed() -> None:
    from ductor_server import Settings, create_app

    app = create_app(Settings())
    routed = {
        (method, route.path_format)
        for route in app.routes
        for method in getattr(route, "methods", ())
    }
    documented = re.findall(r"^\| `(GET|POST) (/[^`?]*)", DOC, re.MULTILINE)
    assert documented
    for method, path in documented:
        assert (method, path) in routed, (method, path)


def test_every_documented_success_status_is_in_the_openapi_document() -> None:
    from ductor_server import Settings, create_app

    paths = create_app(Settings()).openapi_schema.to_schema()["paths"]
    rows = re.findall(
        r"^\| `(GET|POST|PUT|PATCH|DELETE) (/[^`?]*)[^`]*` \|[^|]*\|(.*)$", DOC, re.MULTILINE
    )
    assert len(rows) > 50
    missing = []
    for method, path, answer in rows:
        operation = paths[path][method.lower()]
        documented = set(re.findall(r"`(2\d\d)\b", answer))
        if documented - set(operation["responses"]):
            missing.append((method, path, sorted(documented), sorted(operation["responses"])))
    assert not missing


def test_an_optional_body_is_not_required_in_the_openapi_document() -> None:
    from ductor_server import Settings, create_app

    paths = create_app(Settings()).openapi_schema.to_schema()["paths"]
    rows = re.findall(r"^\| `POST (/[^`?]*)` \| [^|]*\(optional body\) \|", DOC, re.MULTILINE)
    assert len(rows) >= 4
    for path in rows:
        body = paths[path]["post"]["requestBody"]
        assert not body.get("required"), path
        assert body["content"]["application/json"]["schema"], path
    # A body a call cannot do without stays required.
    assert paths["/v1/runs"]["post"]["requestBody"]["required"] is True


def test_the_long_poll_bounds_are_in_the_openapi_document() -> None:
    from ductor_server import Settings, create_app

    operation = create_app(Settings()).openapi_schema.to_schema()["paths"]["/v1/runs/{run_id}"]
    (wait,) = [p for p in operation["get"]["parameters"] if p["name"] == "wait"]
    assert wait["schema"]["exclusiveMinimum"] == 0
    assert wait["schema"]["maximum"] == 60
