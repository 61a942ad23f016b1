"""Least loaded: the candidate with the lowest load relative to its capacity.

Load is read from the state view; ties go to the earlier member.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ductor_routing.strategies.base import Score, Selection, SelectionContext

if TYPE_CHECKING:
    from ductor_routing.strategies.registry import StrategyRegistry


class LeastLoaded:
    """Pick the lowest load / capacity (raw load when capacity is unlimited)."""

    name = "least_loaded"

    def select(self, ctx: SelectionContext) -> Selection:
        """Rank by utilisation, then by raw load, then by position."""
        if not ctx.candidates:
            return Selection(pick=None, note="no candidates")
        ranked = []
        scores = []
        for c in ctx.candidates:
            utilisation = c.load / c.capacity if c.capacity else float(c.load)
            ranked.append((utilisation, c.load, c.position, c.worker.id))
            scores.append(Score(worker=c.worker.id, value=utilisation, note=f"load {c.load}"))
        return Selection(pick=min(ranked)[3], scores=tuple(scores))


def least_loaded(options: Mapping[str, Any], registry: StrategyRegistry) -> LeastLoaded:
    """Factory for the registry; takes no options."""
    return LeastLoaded()
