"""Least loaded: the candidate with the lowest load relative to its capacity.

Load is read from the state view; ties go to the earlier member.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

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


class LeastLoaded:
    """Pick the lowest load / capacity (raw load when capacity is unlimited)."""

    name = "least_loaded"

    def select(self, ctx: SelectionContext) -> Selection:
        """Rank by utilisation, then by raw load, then by position."""

        def rank(c: Candidate) -> tuple[tuple[float, int], Score]:
            utilisation = c.load / c.capacity if c.capacity else float(c.load)
            score = Score(worker=c.worker.id, value=utilisation, note=f"load {c.load}")
            return (utilisation, c.load), score

        return select_lowest(ctx, rank)


def least_loaded(options: Mapping[str, Any], registry: StrategyRegistry) -> LeastLoaded:
    """Factory for the registry; takes no options."""
    check_options("least_loaded", options, ())
    return LeastLoaded()
