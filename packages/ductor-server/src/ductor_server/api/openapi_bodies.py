"""Request-body schemas for the generated OpenAPI document.

Handlers decode their bodies themselves (to name the line and column of bad
JSON, and to fingerprint bodies for idempotency), so Litestar cannot see the
body types; this module adds them to the document it generates. No routes.
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Litestar
from litestar._openapi.plugin import OpenAPIPlugin

from ductor_core.definitions import WorkflowDefinition
from ductor_server.api.bodies import CancelRunBody, EventBody, SignalBody, TriggerRunBody

#: (path, method) -> (body type, required)
REQUEST_BODIES: dict[tuple[str, str], tuple[Any, bool]] = {
    ("/v1/workflows/validate", "post"): (WorkflowDefinition, True),
    ("/v1/workflows", "post"): (WorkflowDefinition, True),
    ("/v1/runs", "post"): (TriggerRunBody, True),
    ("/v1/runs/{run_id}/cancel", "post"): (CancelRunBody, False),
    ("/v1/runs/{run_id}/signals/{name}", "post"): (SignalBody, False),
    ("/v1/events", "post"): (EventBody, True),
}


def document_request_bodies(app: Litestar) -> None:
    """Add each endpoint's JSON request body (and its component schemas) to the document."""
    schema = app.plugins.get(OpenAPIPlugin).provide_openapi_schema()
    entries = list(REQUEST_BODIES.items())
    refs, components = msgspec.json.schema_components(
        [body for _, (body, _) in entries], ref_template="#/components/schemas/{name}"
    )
    existing = schema.setdefault("components", {}).setdefault("schemas", {})
    for name, component in components.items():
        existing.setdefault(name, component)
    paths = schema.get("paths", {})
    for ((path, method), (_, required)), ref in zip(entries, refs, strict=True):
        operation = paths.get(path, {}).get(method)
        if operation is None:
            continue
        operation["requestBody"] = {
            "required": required,
            "content": {"application/json": {"schema": ref}},
        }
