"""Longest idle: the candidate whose last assignment is oldest (never assigned first).

Last-assigned times are marks in the state view; ties go to the earlier member.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ductor_routing.state import MarkKind
from ductor_routing.strategies.base import (
    Candidate,
    Score,
    Selection,
    SelectionContext,
    check_options,
    select_lowest,
)

if TYPE_CHECKING:
    from ductor_routing.strategies.registry import StrategyRegistry


class LongestIdle:
    """Pick the worker idle for longest; score is idle seconds (None = never assigned)."""

    name = "longest_idle"

    def select(self, ctx: SelectionContext) -> Selection:
        """Rank by last-assigned time, oldest first."""

        def rank(c: Candidate) -> tuple[tuple[str], Score]:
            last = ctx.state.mark(MarkKind.LAST_ASSIGNED, "", c.worker.id)
            if last is None:
                return ("",), Score(worker=c.worker.id, value=None, note="never assigned")
            idle = (ctx.now - datetime.datetime.fromisoformat(last)).total_seconds()
            return (last,), Score(worker=c.worker.id, value=idle, note="idle seconds")

        return select_lowest(ctx, rank)


def longest_idle(options: Mapping[str, Any], registry: StrategyRegistry) -> LongestIdle:
    """Factory for the registry; takes no options."""
    check_options("longest_idle", options, ())
    return LongestIdle()
