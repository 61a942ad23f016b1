"""Weighted random: a pick with probability proportional to weight, seeded and reproducible.

The random draw is fixed by (seed, routable, scope), so replays give the same pick.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ductor_routing.strategies.base import Score, Selection, SelectionContext

if TYPE_CHECKING:
    from ductor_routing.strategies.registry import StrategyRegistry


class WeightedRandom:
    """Pick a candidate with probability weight / total weight (member weight wins)."""

    name = "weighted_random"

    def select(self, ctx: SelectionContext) -> Selection:
        """Draw once from the context's reproducible random number."""
        weights = [
            (c, c.member.weight if c.member.weight is not None else c.worker.weight)
            for c in ctx.candidates
        ]
        total = sum(w for _, w in weights if w > 0)
        if total <= 0:
            return Selection(pick=None, note="no candidate has a positive weight")
        scores = tuple(
            Score(worker=c.worker.id, value=(w / total if w > 0 else None), note="share")
            for c, w in weights
        )
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
    return WeightedRandom()
