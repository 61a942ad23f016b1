"""Errors of the routing package, all `DuctorError`s with stable codes.

    DuctorError
     └── RoutingError            base of every routing error ("routing.error")
          ├── ConfigError        a pool, rule set, worker or strategy spec that is wrong
          ├── UnknownStrategy    a strategy name no registry entry provides
          └── AssignConflict     an Assign intent that no longer fits the state (retryable)

A routable that fails its kind's schema is not an error: it yields an
"invalid" decision that lists every problem.
"""

from __future__ import annotations

from ductor_core.errors import DuctorError


class RoutingError(DuctorError):
    """Base of every routing error."""

    code = "routing.error"


class ConfigError(RoutingError):
    """Routing configuration (pools, rules, workers, strategies) that is inconsistent."""

    code = "routing.config"


class UnknownStrategy(RoutingError):
    """A strategy name that no registered factory provides."""

    code = "routing.strategy_unknown"


class AssignConflict(RoutingError):
    """An Assign intent whose reservations no longer fit: route again and retry."""

    code = "routing.assign_conflict"
    retryable = True
