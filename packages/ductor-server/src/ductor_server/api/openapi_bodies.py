"""Request bodies and error answers for the generated OpenAPI document.

Handlers decode their bodies themselves (to name the line and column of bad
JSON, and to fingerprint bodies for idempotency), so Litestar cannot see the
body types; and errors leave through one handler table in the `ErrorBody`
shape. This module adds both to the document Litestar generates. No routes.
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Litestar
from litestar._openapi.plugin import OpenAPIPlugin

from ductor_core.definitions import WorkflowDefinition
from ductor_server.api.bodies import CancelRunBody, EventBody, SignalBody, TriggerRunBody
from ductor_server.api.errors import ErrorBody

#: (path, method) -> (body type, required)
REQUEST_BODIES: dict[tuple[str, str], tuple[Any, bool]] = {
    ("/v1/workflows/validate", "post"): (WorkflowDefinition, True),
    ("/v1/workflows", "post"): (WorkflowDefinition, True),
    ("/v1/runs", "post"): (TriggerRunBody, True),
    ("/v1/runs/{run_id}/cancel", "post"): (CancelRunBody, False),
    ("/v1/runs/{run_id}/signals/{name}", "post"): (SignalBody, False),
    ("/v1/events", "post"): (EventBody, True),
}


#: The error answers every /v1 operation may give (all in the `ErrorBody` shape).
V1_ERRORS: dict[str, str] = {
    "400": "Malformed JSON (`request.malformed_json`, with line and column)",
    "401": "Missing, unknown or revoked API key (`auth.unauthenticated`)",
    "404": "Not found for this tenant (`*.not_found`)",
    "413": "Body over the size limit (`request.too_large`)",
    "422": "Invalid request (`request.invalid`, `definition.invalid`, `idempotency.conflict`)",
}


def document_request_bodies(app: Litestar) -> None:
    """Add each endpoint's JSON request body, and the error answers of every /v1
    operation, with their component schemas, to the document."""
    schema = app.plugins.get(OpenAPIPlugin).provide_openapi_schema()
    entries = list(REQUEST_BODIES.items())
    refs, components = msgspec.json.schema_components(
        [*(body for _, (body, _) in entries), ErrorBody],
        ref_template="#/components/schemas/{name}",
    )
    error_ref = refs[-1]
    existing = schema.setdefault("components", {}).setdefault("schemas", {})
    for name, component in components.items():
        existing.setdefault(name, component)
    paths = schema.get("paths", {})
    for path, item in paths.items():
        if not path.startswith("/v1/"):
            continue
        for operation in item.values():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            for status, description in V1_ERRORS.items():
                operation["responses"][status] = {
                    "description": description,
                    "content": {"application/json": {"schema": error_ref}},
                }
    for ((path, method), (_, required)), ref in zip(entries, refs[:-1], strict=True):
        operation = paths.get(path, {}).get(method)
        if operation is None:
            continue
        operation["requestBody"] = {
            "required": required,
            "content": {"application/json": {"schema": ref}},
        }
