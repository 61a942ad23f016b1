"""Routing served by the server: the stored configuration, decisions and assignments.

`RoutingService` runs the pure `ductor_routing.Router` against live state in
the store; `RouteStep` is the worker handler of STEP_TYPE_ROUTE. No HTTP here.
"""

from __future__ import annotations

from ductor_server.routing.errors import (
    AssignmentStateConflict,
    RoutableInvalid,
    RoutingObjectNotFound,
)
from ductor_server.routing.service import (
    AssignmentView,
    DecisionView,
    OutcomeBody,
    RouteBody,
    RoutingService,
    RulesBody,
    RuleSetVersion,
    RuleSetView,
    ShadowReportView,
    Snapshot,
    counter_text,
)
from ductor_server.routing.steps import RouteStep
from ductor_server.routing.store import AssignmentRecord, RoutingTx, StoredReservation

__all__ = [
    "AssignmentRecord",
    "AssignmentStateConflict",
    "AssignmentView",
    "DecisionView",
    "OutcomeBody",
    "RoutableInvalid",
    "RouteBody",
    "RouteStep",
    "RoutingObjectNotFound",
    "RoutingService",
    "RoutingTx",
    "RuleSetVersion",
    "RuleSetView",
    "RulesBody",
    "ShadowReportView",
    "Snapshot",
    "StoredReservation",
    "counter_text",
]
