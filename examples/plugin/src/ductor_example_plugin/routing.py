"""A routing strategy and an enricher (`ductor.routing.strategies`, `.enrichers`)."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from ductor_routing import Routable, Score, Selection, SelectionContext, StrategyRegistry


class LastMember:
    """Always the last eligible member of the pool."""

    name = "example_last"

    def select(self, ctx: SelectionContext) -> Selection:
        if not ctx.candidates:
            return Selection(pick=None, note="no candidates")
        scores = tuple(Score(worker=c.worker.id, value=c.position) for c in ctx.candidates)
        return Selection(pick=ctx.candidates[-1].worker.id, scores=scores, note="the last")


def last_member(options: Mapping[str, Any], registry: StrategyRegistry) -> LastMember:
    """The strategy factory: `(options, registry) -> Strategy`."""
    return LastMember()


class SizeEnricher:
    """Sets `size`: `large` when the attribute `amount` is at least `threshold`."""

    name = "example_size"

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold

    def enrich(self, routable: Routable, now: datetime.datetime) -> Mapping[str, Any]:
        amount = routable.attributes.get("amount", 0)
        large = isinstance(amount, int | float) and amount >= self.threshold
        return {"size": "large" if large else "small"}


def size_enricher(options: Mapping[str, Any]) -> SizeEnricher:
    """The enricher factory: `(options) -> Enricher`; option `threshold` (default 100)."""
    return SizeEnricher(int(options.get("threshold", 100)))
