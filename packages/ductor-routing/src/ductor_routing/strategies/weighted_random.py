"""Weighted random: a pick with probability proportional to weight, seeded and reproducible.

The random draw is fixed by (seed, routable, scope), so replays give the same pick.
A weight of 0 means "send this member nothing"; when every weight is 0, nobody is picked.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ductor_routing.strategies.base import Score, Selection, SelectionContext, check_options

if TYPE_CHECKING:
    from ductor_routing.strategies.registry import StrategyRegistry


class WeightedRandom:
    """Pick a candidate with probability weight / total weight (member weight wins).

    Every candidate is scored: its share of the total weight (note "weight W
    of TOTAL"), or None (note "weight W") when its weight is 0 or less, since
    it is never picked. A zero weight drains a member without removing it, so
    when every candidate has weight 0 the strategy picks nobody (note "every
    candidate has weight 0") rather than hand the work to members set to take
    none.
    """

    name = "weighted_random"

    def select(self, ctx: SelectionContext) -> Selection:
        """Draw once from the context's reproducible random number."""
        if not ctx.candidates:
            return Selection(pick=None, note="no candidates")
        weights = [
            (c, c.member.weight if c.member.weight is not None else c.worker.weight)
            for c in ctx.candidates
        ]
        total = sum(w for _, w in weights if w > 0)
        scores = tuple(
            Score(worker=c.worker.id, value=w / total, note=f"weight {w} of {total}")
            if w > 0
            else Score(worker=c.worker.id, value=None, note=f"weight {w}")
            for c, w in weights
        )
        if total <= 0:
            return Selection(pick=None, scores=scores, note="every candidate has weight 0")
        target = ctx.random() * total
        running = 0
        pick = None
        for c, w in weights:
            if w <= 0:
                continue
            running += w
            pick = c.worker.id
            if target < running:
                break
        return Selection(pick=pick, scores=scores)


def weighted_random(options: Mapping[str, Any], registry: StrategyRegistry) -> WeightedRandom:
    """Factory for the registry; takes no options."""
    check_options("weighted_random", options, ())
    return WeightedRandom()
