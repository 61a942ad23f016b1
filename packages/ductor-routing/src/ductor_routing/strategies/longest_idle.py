"""Longest idle: the candidate whose last assignment is oldest (never assigned first).

Last-assigned times are marks in the state view; ties go to the earlier member.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ductor_routing.state import MarkKind
from ductor_routing.strategies.base import Score, Selection, SelectionContext

if TYPE_CHECKING:
    from ductor_routing.strategies.registry import StrategyRegistry


class LongestIdle:
    """Pick the worker idle for longest; score is idle seconds (None = never assigned)."""

    name = "longest_idle"

    def select(self, ctx: SelectionContext) -> Selection:
        """Rank by last-assigned time, oldest first."""
        if not ctx.candidates:
            return Selection(pick=None, note="no candidates")
        ranked = []
        scores = []
        for c in ctx.candidates:
            last = ctx.state.mark(MarkKind.LAST_ASSIGNED, "", c.worker.id)
            if last is None:
                scores.append(Score(worker=c.worker.id, value=None, note="never assigned"))
                ranked.append(("", c.position, c.worker.id))
                continue
            idle = (ctx.now - datetime.datetime.fromisoformat(last)).total_seconds()
            scores.append(Score(worker=c.worker.id, value=idle, note="idle seconds"))
            ranked.append((last, c.position, c.worker.id))
        return Selection(pick=min(ranked)[2], scores=tuple(scores))


def longest_idle(options: Mapping[str, Any], registry: StrategyRegistry) -> LongestIdle:
    """Factory for the registry; takes no options."""
    return LongestIdle()
