"""Routing served by the server: the stored configuration, decisions and assignments.

`ductor_server.services.routing.RoutingService` runs the pure
`ductor_routing.Router` against the tables of `routing.store`, and
`services.route_step.RouteStep` is the worker handler of STEP_TYPE_ROUTE. This
package holds the tables and the errors only: no service, no transport.
"""

from __future__ import annotations

from ductor_server.routing.errors import (
    AssignmentStateConflict,
    ConfigChangeConflict,
    RoutableInvalid,
    RoutingObjectInUse,
    RoutingObjectNotFound,
)
from ductor_server.routing.store import AssignmentRecord, RoutingTx, StoredReservation

__all__ = [
    "AssignmentRecord",
    "AssignmentStateConflict",
    "ConfigChangeConflict",
    "RoutableInvalid",
    "RoutingObjectInUse",
    "RoutingObjectNotFound",
    "RoutingTx",
    "StoredReservation",
]
