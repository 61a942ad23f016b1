"""Round robin: the next eligible worker after the last one picked, in worker-id order.

Ordering by id (not position) keeps it fair when members join or leave.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ductor_routing.state import Mark, MarkKind
from ductor_routing.strategies.base import Score, Selection, SelectionContext, check_options

if TYPE_CHECKING:
    from ductor_routing.strategies.registry import StrategyRegistry


class RoundRobin:
    """Pick the first candidate whose worker id sorts after the scope's cursor, wrapping."""

    name = "round_robin"

    def select(self, ctx: SelectionContext) -> Selection:
        """Advance the cursor to the next eligible worker id."""
        if not ctx.candidates:
            return Selection(pick=None, note="no candidates")
        cursor = ctx.state.mark(MarkKind.CURSOR, ctx.scope, "")
        ids = sorted(c.worker.id for c in ctx.candidates)
        start = 0
        if cursor is not None:
            start = next((i for i, wid in enumerate(ids) if wid > cursor), 0)
        rank = {wid: (i - start) % len(ids) for i, wid in enumerate(ids)}
        pick = ids[start]
        scores = tuple(
            Score(worker=c.worker.id, value=rank[c.worker.id], note="turns until picked")
            for c in ctx.candidates
        )
        return Selection(
            pick=pick,
            scores=scores,
            marks=(Mark(kind=MarkKind.CURSOR, scope=ctx.scope, key="", value=pick),),
        )


def round_robin(options: Mapping[str, Any], registry: StrategyRegistry) -> RoundRobin:
    """Factory for the registry; takes no options."""
    check_options("round_robin", options, ())
    return RoundRobin()
