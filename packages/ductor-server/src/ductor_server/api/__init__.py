"""The REST API: controllers, auth, idempotency, the error table. Handlers stay thin."""

from __future__ import annotations

from ductor_server.api.auth import hash_api_key, new_api_key
from ductor_server.api.errors import STATUS_BY_CODE, ErrorBody, status_for
from ductor_server.api.events import EventsController
from ductor_server.api.health import healthz, readyz
from ductor_server.api.runs import RunsController
from ductor_server.api.workflows import WorkflowsController

__all__ = [
    "STATUS_BY_CODE",
    "ErrorBody",
    "EventsController",
    "RunsController",
    "WorkflowsController",
    "hash_api_key",
    "healthz",
    "new_api_key",
    "readyz",
    "status_for",
]
