"""Decisions and their explanations: what the pipeline returns, as plain data.

An explanation is complete and reproducible: the same inputs and state give an
equal decision, byte for byte once encoded.
"""

from __future__ import annotations

import enum
from typing import Any

import msgspec

from ductor_routing.kinds import Problem
from ductor_routing.state import AssignIntent
from ductor_routing.strategies.base import Score


class Outcome(enum.StrEnum):
    """How a decision ended."""

    ASSIGNED = "assigned"
    """A recipient was picked; the intent commits it."""
    UNASSIGNED = "unassigned"
    """The routable is valid but no rule, pool or candidate took it."""
    INVALID = "invalid"
    """Validation or enrichment failed; `problems` says why."""


class RuleTrace(msgspec.Struct, frozen=True, kw_only=True):
    """Why one rule did or did not match.

    Attributes:
        rule: the rule id.
        priority: its priority.
        matched: whether it matched.
        reason: "matched", "match" (a structured pre-filter failed),
            "when" (the CEL condition was false) or "error" (it did not evaluate).
        detail: the failing filter, the condition's value, or the error.
    """

    rule: str
    priority: int
    matched: bool
    reason: str
    detail: str = ""


class Exclusion(msgspec.Struct, frozen=True, kw_only=True):
    """Members of the chosen pool filtered out for one reason.

    Reasons, checked in this order (the first that applies is reported):
    "unavailable", "excluded" (by the caller, e.g. on reroute), "filter"
    (detail: the attribute), "capacity", "cap"
    (detail: the window), "budget", "funds" (the member's wallet cannot cover
    what it may be charged, in a settled pool), "when" (the member's CEL
    condition; detail: false or the error).
    """

    reason: str
    detail: str
    workers: tuple[str, ...]


class ShadowPick(msgspec.Struct, frozen=True, kw_only=True):
    """What a shadow strategy would have picked; never committed."""

    strategy: str
    pick: str | None
    agrees: bool
    price: int | None = None
    scores: tuple[Score, ...] = ()
    note: str = ""


class Explanation(msgspec.Struct, frozen=True, kw_only=True):
    """Everything needed to understand and replay a decision.

    Attributes:
        rule_set: the rule set id.
        rule_set_version: its version.
        config_hash: a fingerprint of the whole routing configuration (rules,
            pools, workers, kinds, enrichers, seed) the decision was made with.
        rule: the matched rule id, "default" for the default pool, None if neither.
        rules_not_matched: every higher-priority rule and why it did not match.
        enriched: the attributes the Enrich stage added.
        pool: the chosen pool.
        candidates: the eligible workers, in pool order.
        excluded: the pool members filtered out, grouped by reason.
        strategy: the live strategy name.
        scores: the live strategy's score per candidate.
        pick: the chosen worker.
        note: the strategy's note (e.g. "reserve not met").
        shadows: the shadow strategies' picks.
    """

    rule_set: str
    rule_set_version: int
    config_hash: str = ""
    rule: str | None = None
    rules_not_matched: tuple[RuleTrace, ...] = ()
    enriched: dict[str, Any] = {}
    pool: str | None = None
    candidates: tuple[str, ...] = ()
    excluded: tuple[Exclusion, ...] = ()
    strategy: str | None = None
    scores: tuple[Score, ...] = ()
    pick: str | None = None
    note: str = ""
    shadows: tuple[ShadowPick, ...] = ()


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    """The result of routing one routable.

    Attributes:
        id: the decision id (deterministic from tenant, routable id and time
            unless the caller gives one).
        routable_id: the routable routed.
        tenant: its tenant.
        kind: its kind.
        at: the decision time, ISO-8601 UTC.
        outcome: assigned, unassigned or invalid.
        pool: the pool chosen, if any.
        worker: the recipient, if assigned.
        charge: micros charged to the recipient's budget (the clearing price).
        explanation: why.
        intent: what to commit, when assigned.
        problems: validation or enrichment problems, when invalid.
    """

    id: str
    routable_id: str
    tenant: str
    kind: str
    at: str
    outcome: Outcome
    explanation: Explanation
    pool: str | None = None
    worker: str | None = None
    charge: int = 0
    intent: AssignIntent | None = None
    problems: tuple[Problem, ...] = ()
