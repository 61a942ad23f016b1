"""Errors of metering in the server, each a `DuctorError` with a stable code; no HTTP here.

DuctorError (ductor_core)
 ├── ServerError
 │    ├── NotFoundError
 │    │    └── MeteringObjectNotFound   meter.not_found, budget.not_found, plan.not_found
 │    └── MeteringConflict             meter.conflict, budget.conflict, plan.conflict
 └── SettlementError (ductor_settlement)  budget.exceeded, entitlement.*, metering.invalid
"""

from __future__ import annotations

from ductor_server.errors import NotFoundError, ServerError


class MeteringObjectNotFound(NotFoundError):
    """A meter, budget or plan the tenant does not have (another tenant's is not found too)."""

    def __init__(self, what: str, object_id: str) -> None:
        super().__init__(
            f"{what} {object_id!r} not found",
            code=f"{what}.not_found",
            details={what: object_id},
        )


class MeteringConflict(ServerError):
    """A create whose id is taken by an object with other attributes."""

    def __init__(self, what: str, object_id: str) -> None:
        super().__init__(
            f"{what} {object_id!r} exists with other attributes",
            code=f"{what}.conflict",
            details={what: object_id},
        )


__all__ = ["MeteringConflict", "MeteringObjectNotFound"]
