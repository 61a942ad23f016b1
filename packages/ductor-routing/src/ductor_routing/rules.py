"""Rule sets: priority-ordered conditions, each picking a pool, plus a default.

Plain, versioned data; `pipeline.py` compiles it once.
"""

from __future__ import annotations

import msgspec

from ductor_routing.pools import Filter


class Rule(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """If the routable passes `match` and `when`, route to `pool`.

    Attributes:
        id: unique within the rule set.
        pool: the pool this rule picks.
        priority: lower is tried first; ties keep the listed order.
        match: structured pre-filters, checked in Python before any CEL.
        when: a CEL condition over `routable`, `attributes` and `now` (a timestamp);
            none means true.
    """

    id: str
    pool: str
    priority: int = 0
    match: tuple[Filter, ...] = ()
    when: str | None = None


class RuleSet(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A versioned, ordered set of rules with a default pool.

    Attributes:
        id: the rule set's name.
        version: bumped on every change; recorded in each decision.
        rules: the rules, tried in (priority, listed order).
        default_pool: used when no rule matches; none leaves the routable unassigned.
    """

    id: str = "default"
    version: int = 1
    rules: tuple[Rule, ...] = ()
    default_pool: str | None = None
