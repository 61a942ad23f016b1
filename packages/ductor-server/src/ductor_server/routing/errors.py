"""Errors of routing in the server, each a `DuctorError` with a stable code; no HTTP here.

DuctorError (ductor_core)
 ├── ServerError
 │    ├── NotFoundError
 │    │    ├── RoutingObjectNotFound     <what>.not_found (pool, worker, ...)
 │    └── AssignmentStateConflict       routing.assignment_state
 └── RoutingError (ductor_routing)
      ├── ConfigError                   routing.config (a change that breaks the config)
      ├── RoutableInvalid               routing.routable_invalid (details: problems)
      ├── AssignConflict                routing.assign_conflict (caps kept losing races)
      └── ConfigChangeConflict          routing.config_conflict (changes kept racing)
"""

from __future__ import annotations

from typing import Any

from ductor_routing import RoutingError
from ductor_server.errors import NotFoundError, ServerError


class RoutingObjectNotFound(NotFoundError):
    """A worker, pool, rule set version, decision or assignment the tenant does not have."""

    def __init__(self, what: str, object_id: str) -> None:
        super().__init__(
            f"{what} {object_id!r} not found",
            code=f"{what}.not_found",
            details={what: object_id},
        )


class AssignmentStateConflict(ServerError):
    """An assignment that cannot make this move from where it is (e.g. complete twice)."""

    code = "routing.assignment_state"


class RoutableInvalid(RoutingError):
    """A routable that fails its kind's schema (or enrichment); details list every problem."""

    code = "routing.routable_invalid"

    def __init__(self, message: str, problems: Any) -> None:
        super().__init__(message, details=problems)


class ConfigChangeConflict(RoutingError):
    """A configuration change that kept meeting newer changes; try again."""

    code = "routing.config_conflict"
    retryable = True
