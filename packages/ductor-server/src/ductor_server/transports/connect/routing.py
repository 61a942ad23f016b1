"""`RoutingService`: the methods of `/v1/workers`, `/v1/pools`, `/v1/rules`,
`/v1/routing`, `/v1/route`, `/v1/decisions` and `/v1/assignments`, each calling the
service function its REST route calls."""

from __future__ import annotations

from ductor_routing import Pool, Worker
from ductor_server.services.routing import (
    ACCEPTED,
    COMPLETED,
    REJECTED,
    AssignmentView,
    ConfigCheck,
    ConfigCheckBody,
    DecisionView,
    OutcomeBody,
    ReturnBody,
    ReturnView,
    RouteBody,
    RulesBody,
    RuleSetVersion,
    RuleSetView,
    ShadowReportView,
)
from ductor_server.services.settlement import PoolSettlement, PoolSettlementView
from ductor_server.transports.connect.method import (
    Call,
    Empty,
    Id,
    Limit100k,
    Limit1000,
    Method,
    Req,
    Version,
    body_of,
    method,
)


class WorkerRequest(Req, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One worker."""

    worker_id: Id


class PoolRequest(Req, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One pool."""

    pool_id: Id


class PutPoolSettlementRequest(PoolSettlement, frozen=True, kw_only=True):
    """How a pool's assignments are charged (the body of `PUT .../settlement`)."""

    pool_id: Id


class ShadowReportRequest(Req, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A pool's shadow agreement over its latest `limit` decisions."""

    pool_id: Id
    limit: Limit100k = 10_000


class RulesVersionRequest(Req, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One version of the rule set."""

    version: Version


class DecisionRequest(Req, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One routing decision."""

    decision_id: Id


class ListAssignmentsRequest(Req, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Assignments by routable, worker and status."""

    routable_id: str | None = None
    worker: str | None = None
    status: str | None = None
    limit: Limit1000 = 100
    after: str | None = None


class AssignmentRequest(Req, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One assignment."""

    assignment_id: Id


class MoveAssignmentRequest(OutcomeBody, frozen=True, kw_only=True):
    """An assignment's next status: an optional result and reason."""

    assignment_id: Id


class ReturnAssignmentRequest(ReturnBody, frozen=True, kw_only=True):
    """Send a settled assignment back (the body of `POST .../return`)."""

    assignment_id: Id


ROUTING = "RoutingService"


def _move(to_status: str) -> Call:
    return lambda s, t, r, k: s.routing.move_assignment(
        t, r.assignment_id, to_status, result=r.result, reason=r.reason, idempotency_key=k
    )


METHODS: tuple[Method, ...] = (
    method(
        ROUTING,
        "PutWorker",
        Worker,
        Worker,
        lambda s, t, r, k: s.routing.put_worker(t, r, idempotency_key=k),
        rest="POST /v1/workers",
        mutates=True,
        doc="Create or replace a worker.",
    ),
    method(
        ROUTING,
        "ListWorkers",
        Empty,
        list[Worker],
        lambda s, t, r, k: s.routing.list_workers(t),
        rest="GET /v1/workers",
        doc="Every worker, by id.",
    ),
    method(
        ROUTING,
        "GetWorker",
        WorkerRequest,
        Worker,
        lambda s, t, r, k: s.routing.get_worker(t, r.worker_id),
        rest="GET /v1/workers/{worker_id}",
        doc="One worker.",
    ),
    method(
        ROUTING,
        "DeleteWorker",
        WorkerRequest,
        None,
        lambda s, t, r, k: s.routing.delete_entity(t, "worker", r.worker_id),
        rest="DELETE /v1/workers/{worker_id}",
        doc="Delete a worker no pool lists any more.",
    ),
    method(
        ROUTING,
        "PutPool",
        Pool,
        Pool,
        lambda s, t, r, k: s.routing.put_pool(t, r, idempotency_key=k),
        rest="POST /v1/pools",
        mutates=True,
        doc="Create or replace a pool; every member must be a known worker.",
    ),
    method(
        ROUTING,
        "ListPools",
        Empty,
        list[Pool],
        lambda s, t, r, k: s.routing.list_pools(t),
        rest="GET /v1/pools",
        doc="Every pool, by id.",
    ),
    method(
        ROUTING,
        "GetPool",
        PoolRequest,
        Pool,
        lambda s, t, r, k: s.routing.get_pool(t, r.pool_id),
        rest="GET /v1/pools/{pool_id}",
        doc="One pool.",
    ),
    method(
        ROUTING,
        "DeletePool",
        PoolRequest,
        None,
        lambda s, t, r, k: s.routing.delete_entity(t, "pool", r.pool_id),
        rest="DELETE /v1/pools/{pool_id}",
        doc="Delete a pool no rule uses any more.",
    ),
    method(
        ROUTING,
        "PutPoolSettlement",
        PutPoolSettlementRequest,
        PoolSettlementView,
        lambda s, t, r, k: s.routing.put_settlement(
            t, r.pool_id, body_of(r, PoolSettlement), idempotency_key=k
        ),
        rest="PUT /v1/pools/{pool_id}/settlement",
        mutates=True,
        doc="Set how the pool's assignments are charged.",
    ),
    method(
        ROUTING,
        "GetPoolSettlement",
        PoolRequest,
        PoolSettlementView,
        lambda s, t, r, k: s.routing.get_settlement(t, r.pool_id),
        rest="GET /v1/pools/{pool_id}/settlement",
        doc="The pool's settlement.",
    ),
    method(
        ROUTING,
        "GetShadowReport",
        ShadowReportRequest,
        ShadowReportView,
        lambda s, t, r, k: s.routing.shadow_report(t, r.pool_id, limit=r.limit),
        rest="GET /v1/pools/{pool_id}/shadow-report",
        doc="How often each shadow strategy agreed with the live one.",
    ),
    method(
        ROUTING,
        "PublishRules",
        RulesBody,
        RuleSetView,
        lambda s, t, r, k: s.routing.publish_rules(t, r, idempotency_key=k),
        rest="POST /v1/rules",
        mutates=True,
        doc="Publish the rule set as its next version.",
    ),
    method(
        ROUTING,
        "GetRules",
        Empty,
        RuleSetView,
        lambda s, t, r, k: s.routing.get_rules(t),
        rest="GET /v1/rules",
        doc="The rule set in force.",
    ),
    method(
        ROUTING,
        "ListRuleVersions",
        Empty,
        list[RuleSetVersion],
        lambda s, t, r, k: s.routing.list_rule_versions(t),
        rest="GET /v1/rules/versions",
        doc="Every version of the rule set, newest first.",
    ),
    method(
        ROUTING,
        "GetRulesVersion",
        RulesVersionRequest,
        RuleSetView,
        lambda s, t, r, k: s.routing.get_rules(t, r.version),
        rest="GET /v1/rules/versions/{version}",
        doc="One version of the rule set.",
    ),
    method(
        ROUTING,
        "ValidateRouting",
        ConfigCheckBody,
        ConfigCheck,
        lambda s, t, r, k: s.routing.check_config(t, r),
        rest="POST /v1/routing/validate",
        doc="Check workers, pools and a rule set together with the stored ones.",
    ),
    method(
        ROUTING,
        "Route",
        RouteBody,
        DecisionView,
        lambda s, t, r, k: s.routing.route(t, r, idempotency_key=k),
        rest="POST /v1/route",
        mutates=True,
        doc="Validate, enrich, filter, select and assign a routable now.",
    ),
    method(
        ROUTING,
        "GetDecision",
        DecisionRequest,
        DecisionView,
        lambda s, t, r, k: s.routing.get_decision(t, r.decision_id),
        rest="GET /v1/decisions/{decision_id}",
        doc="A stored decision with its explanation.",
    ),
    method(
        ROUTING,
        "ListAssignments",
        ListAssignmentsRequest,
        list[AssignmentView],
        lambda s, t, r, k: s.routing.list_assignments(
            t,
            routable_id=r.routable_id,
            worker=r.worker,
            status=r.status,
            after=r.after,
            limit=r.limit,
        ),
        rest="GET /v1/assignments",
        doc="Assignments by routable, worker and status.",
    ),
    method(
        ROUTING,
        "GetAssignment",
        AssignmentRequest,
        AssignmentView,
        lambda s, t, r, k: s.routing.get_assignment(t, r.assignment_id),
        rest="GET /v1/assignments/{assignment_id}",
        doc="One assignment and its status.",
    ),
    method(
        ROUTING,
        "AcceptAssignment",
        MoveAssignmentRequest,
        AssignmentView,
        _move(ACCEPTED),
        rest="POST /v1/assignments/{assignment_id}/accept",
        mutates=True,
        doc="The assignee takes the work.",
    ),
    method(
        ROUTING,
        "CompleteAssignment",
        MoveAssignmentRequest,
        AssignmentView,
        _move(COMPLETED),
        rest="POST /v1/assignments/{assignment_id}/complete",
        mutates=True,
        doc="The assignee finished; its load is given back.",
    ),
    method(
        ROUTING,
        "RejectAssignment",
        MoveAssignmentRequest,
        AssignmentView,
        _move(REJECTED),
        rest="POST /v1/assignments/{assignment_id}/reject",
        mutates=True,
        doc="The assignee declines; every reservation is given back.",
    ),
    method(
        ROUTING,
        "ReturnAssignment",
        ReturnAssignmentRequest,
        ReturnView,
        lambda s, t, r, k: s.routing.return_assignment(
            t, r.assignment_id, body_of(r, ReturnBody), idempotency_key=k
        ),
        rest="POST /v1/assignments/{assignment_id}/return",
        mutates=True,
        doc="Return a settled assignment: credit the buyer, optionally reroute.",
    ),
)
"""The methods of the routing service."""


__all__ = ["METHODS", "ROUTING"]
