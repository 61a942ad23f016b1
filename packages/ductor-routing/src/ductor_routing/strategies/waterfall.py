"""Priority / waterfall: the eligible member with the best (lowest) priority.

Work falls to the next tier only when every member above it is ineligible.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ductor_routing.strategies.base import Score, Selection, SelectionContext, check_options

if TYPE_CHECKING:
    from ductor_routing.strategies.registry import StrategyRegistry


class Waterfall:
    """Pick the lowest `member.priority`; ties go to the earlier member."""

    name = "waterfall"

    def select(self, ctx: SelectionContext) -> Selection:
        """Rank by member priority, then position."""
        if not ctx.candidates:
            return Selection(pick=None, note="no candidates")
        best = min(ctx.candidates, key=lambda c: (c.member.priority, c.position))
        scores = tuple(
            Score(worker=c.worker.id, value=c.member.priority, note="priority")
            for c in ctx.candidates
        )
        return Selection(pick=best.worker.id, scores=scores)


def waterfall(options: Mapping[str, Any], registry: StrategyRegistry) -> Waterfall:
    """Factory for the registry; takes no options."""
    check_options("waterfall", options, ())
    return Waterfall()
