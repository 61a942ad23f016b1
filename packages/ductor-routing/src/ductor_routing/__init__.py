"""Ductor's routing pipeline, pure: no I/O, no clock reads.

Validate -> Enrich -> Filter -> Select -> Assign. Build a `Router` from a
`RoutingConfig` (or its parts), call `route(routable, state, now)`, and commit
the returned `AssignIntent` to your `RoutingState`.
"""

from __future__ import annotations

from ductor_routing.config import RoutingConfig, build_router, decode_config
from ductor_routing.decisions import (
    Decision,
    Exclusion,
    Explanation,
    Outcome,
    RuleTrace,
    ShadowPick,
)
from ductor_routing.enrichment import (
    ENRICHER_ENTRY_POINT_GROUP,
    CelEnricher,
    Enricher,
    EnricherFactory,
    EnricherRegistry,
    EnricherSpec,
)
from ductor_routing.errors import AssignConflict, ConfigError, RoutingError, UnknownStrategy
from ductor_routing.kinds import (
    AttributeSpec,
    AttributeType,
    KindSchema,
    Problem,
    validate_routable,
)
from ductor_routing.pipeline import Router, encode_decision
from ductor_routing.pools import (
    MAX_MICROS,
    Budget,
    Cap,
    Filter,
    FilterOp,
    Member,
    Pool,
    StrategySpec,
    Window,
)
from ductor_routing.routables import Consent, Routable
from ductor_routing.rules import Rule, RuleSet
from ductor_routing.shadow import (
    ShadowDifference,
    ShadowStrategyReport,
    ShadowTally,
    shadow_report,
)
from ductor_routing.simulation import (
    PoolSummary,
    RecipientSummary,
    SimEvent,
    Simulation,
    SimulationSummary,
    decode_event,
    format_micros,
    format_summary,
)
from ductor_routing.state import (
    AssignIntent,
    CounterKey,
    CounterScope,
    InMemoryRoutingState,
    Mark,
    MarkKind,
    Reservation,
    RoutingState,
    format_time,
    period_of,
)
from ductor_routing.strategies import (
    BUILTIN_STRATEGIES,
    ENTRY_POINT_GROUP,
    Candidate,
    Score,
    Selection,
    SelectionContext,
    Strategy,
    StrategyFactory,
    StrategyRegistry,
)
from ductor_routing.workers import Availability, Worker, WorkerKind

__version__ = "0.1.0"

__all__ = [
    "BUILTIN_STRATEGIES",
    "ENRICHER_ENTRY_POINT_GROUP",
    "ENTRY_POINT_GROUP",
    "MAX_MICROS",
    "AssignConflict",
    "AssignIntent",
    "AttributeSpec",
    "AttributeType",
    "Availability",
    "Budget",
    "Candidate",
    "Cap",
    "CelEnricher",
    "ConfigError",
    "Consent",
    "CounterKey",
    "CounterScope",
    "Decision",
    "Enricher",
    "EnricherFactory",
    "EnricherRegistry",
    "EnricherSpec",
    "Exclusion",
    "Explanation",
    "Filter",
    "FilterOp",
    "InMemoryRoutingState",
    "KindSchema",
    "Mark",
    "MarkKind",
    "Member",
    "Outcome",
    "Pool",
    "PoolSummary",
    "Problem",
    "RecipientSummary",
    "Reservation",
    "Routable",
    "Router",
    "RoutingConfig",
    "RoutingError",
    "RoutingState",
    "Rule",
    "RuleSet",
    "RuleTrace",
    "Score",
    "Selection",
    "SelectionContext",
    "ShadowDifference",
    "ShadowPick",
    "ShadowStrategyReport",
    "ShadowTally",
    "SimEvent",
    "Simulation",
    "SimulationSummary",
    "Strategy",
    "StrategyFactory",
    "StrategyRegistry",
    "StrategySpec",
    "UnknownStrategy",
    "Window",
    "Worker",
    "WorkerKind",
    "__version__",
    "build_router",
    "decode_config",
    "decode_event",
    "encode_decision",
    "format_micros",
    "format_summary",
    "format_time",
    "period_of",
    "shadow_report",
    "validate_routable",
]
