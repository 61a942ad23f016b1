"""Shadow comparison: how candidate strategies' picks compare with the live picks.

Reads decisions only; shadow picks are never committed by anything here.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from ductor_routing.decisions import Decision

NO_PICK = "(none)"
"""The distribution key for decisions where a strategy picked nobody."""


class ShadowDifference(msgspec.Struct, frozen=True, kw_only=True):
    """One decision where a shadow strategy disagreed with the live pick."""

    decision_id: str
    routable_id: str
    live: str | None
    shadow: str | None


class ShadowStrategyReport(msgspec.Struct, frozen=True, kw_only=True):
    """Agreement of one shadow strategy of one pool with the live strategy.

    Attributes:
        pool: the pool.
        strategy: the shadow strategy.
        live_strategy: the live strategy.
        decisions: decisions in which the shadow ran.
        agreements: decisions where both picked the same recipient.
        agreement_rate: agreements / decisions (1.0 when there were none).
        live_distribution: live picks per recipient.
        shadow_distribution: shadow picks per recipient.
        differences: the first disagreements, in decision order.
    """

    pool: str
    strategy: str
    live_strategy: str
    decisions: int
    agreements: int
    agreement_rate: float
    live_distribution: dict[str, int]
    shadow_distribution: dict[str, int]
    differences: tuple[ShadowDifference, ...]


class ShadowTally:
    """Accumulates shadow agreement decision by decision (constant memory per recipient)."""

    def __init__(self, *, max_differences: int = 20) -> None:
        self.max_differences = max_differences
        self._rows: dict[tuple[str, str], _Row] = {}

    def add(self, decision: Decision) -> None:
        """Count the shadow picks of one decision (decisions without shadows are ignored)."""
        ex = decision.explanation
        if ex.pool is None or not ex.shadows:
            return
        live = ex.pick
        for sp in ex.shadows:
            row = self._rows.get((ex.pool, sp.strategy))
            if row is None:
                row = self._rows[(ex.pool, sp.strategy)] = _Row(ex.strategy or "")
            row.decisions += 1
            live_key = live if live is not None else NO_PICK
            shadow_key = sp.pick if sp.pick is not None else NO_PICK
            row.live[live_key] = row.live.get(live_key, 0) + 1
            row.shadow[shadow_key] = row.shadow.get(shadow_key, 0) + 1
            if sp.pick == live:
                row.agreements += 1
            elif len(row.differences) < self.max_differences:
                row.differences.append(
                    ShadowDifference(
                        decision_id=decision.id,
                        routable_id=decision.routable_id,
                        live=live,
                        shadow=sp.pick,
                    )
                )

    def report(self) -> tuple[ShadowStrategyReport, ...]:
        """One report per (pool, shadow strategy), sorted by pool then strategy."""
        out = []
        for (pool, strategy), row in sorted(self._rows.items()):
            out.append(
                ShadowStrategyReport(
                    pool=pool,
                    strategy=strategy,
                    live_strategy=row.live_strategy,
                    decisions=row.decisions,
                    agreements=row.agreements,
                    agreement_rate=row.agreements / row.decisions if row.decisions else 1.0,
                    live_distribution=dict(sorted(row.live.items())),
                    shadow_distribution=dict(sorted(row.shadow.items())),
                    differences=tuple(row.differences),
                )
            )
        return tuple(out)


class _Row:
    __slots__ = ("agreements", "decisions", "differences", "live", "live_strategy", "shadow")

    def __init__(self, live_strategy: str) -> None:
        self.live_strategy = live_strategy
        self.decisions = 0
        self.agreements = 0
        self.live: dict[str, int] = {}
        self.shadow: dict[str, int] = {}
        self.differences: list[ShadowDifference] = []


def shadow_report(
    decisions: Iterable[Decision], *, max_differences: int = 20
) -> tuple[ShadowStrategyReport, ...]:
    """The agreement report over `decisions`, one entry per (pool, shadow strategy)."""
    tally = ShadowTally(max_differences=max_differences)
    for decision in decisions:
        tally.add(decision)
    return tally.report()
