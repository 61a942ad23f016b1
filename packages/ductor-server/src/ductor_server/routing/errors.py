"""Errors of routing in the server, each a `DuctorError` with a stable code; no HTTP here.

DuctorError (ductor_core)
 ├── ServerError
 │    ├── NotFoundError
 │    │    ├── RoutingObjectNotFound     <what>.not_found (pool, worker, ...)
 │    ├── AssignmentStateConflict       routing.assignment_state
 │    └── RoutingObjectInUse            routing.in_use (a worker or pool still referred to)
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


class RoutingObjectInUse(ServerError):
    """A worker still in a pool, or a pool a rule still picks, cannot be deleted.

    `details.used_by` lists each reference with its configuration pointer.
    """

    code = "routing.in_use"

    def __init__(self, what: str, object_id: str, used_by: list[dict[str, str]]) -> None:
        first = used_by[0]
        holder = ", ".join(f"{k} {v!r}" for k, v in first.items() if k != "pointer")
        more = f" and {len(used_by) - 1} more" if len(used_by) > 1 else ""
        super().__init__(
            f"{what} {object_id!r} is still used by {holder}{more}: change those first",
            details={what: object_id, "used_by": used_by},
        )


class RoutableInvalid(RoutingError):
    """A routable that fails its kind's schema (or enrichment); details list every problem."""

    code = "routing.routable_invalid"

    def __init__(self, message: str, problems: Any) -> None:
        super().__init__(message, details=problems)


class ConfigChangeConflict(RoutingError):
    """A configuration change that kept meeting newer changes; try again."""

    code = "routing.config_conflict"
    retryable = True
