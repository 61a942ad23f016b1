"""Auction: the highest effective bid wins; first price (or second) with a reserve.

Effective bid = bid x quality (basis points). Money is int micros throughout.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ductor_routing.errors import ConfigError
from ductor_routing.strategies.base import Score, Selection, SelectionContext

if TYPE_CHECKING:
    from ductor_routing.strategies.registry import StrategyRegistry

_BASIS = 10_000


class Auction:
    """Pick the highest effective bid at or above the reserve; ties go to the earlier member.

    Args:
        reserve: the least bid accepted, in micros.
        pricing: "first" (the winner pays its bid) or "second" (the least it
            needed to win, never below the reserve nor above its bid).
    """

    name = "auction"

    def __init__(self, *, reserve: int = 0, pricing: str = "first") -> None:
        self.reserve = reserve
        self.pricing = pricing

    def select(self, ctx: SelectionContext) -> Selection:
        """Rank bids; price the winner."""
        scores: list[Score] = []
        ranked: list[tuple[int, int, int, str]] = []
        bids: dict[str, tuple[int, int]] = {}
        for c in ctx.candidates:
            bid = c.member.bid
            if bid is None:
                scores.append(Score(worker=c.worker.id, value=None, note="no bid"))
                continue
            if bid < self.reserve:
                scores.append(Score(worker=c.worker.id, value=None, note="below reserve"))
                continue
            effective = bid * c.member.quality // _BASIS
            scores.append(Score(worker=c.worker.id, value=effective, note=f"bid {bid}"))
            ranked.append((-effective, c.position, bid, c.worker.id))
            bids[c.worker.id] = (bid, c.member.quality)
        if not ranked:
            return Selection(pick=None, scores=tuple(scores), note="reserve not met")
        ranked.sort()
        winner = ranked[0]
        bid, quality = bids[winner[3]]
        price = bid
        if self.pricing == "second":
            runner_up = -ranked[1][0] if len(ranked) > 1 else 0
            # The least bid that still ranks first given the winner's quality, rounded up.
            needed = -(-runner_up * _BASIS // max(quality, 1))
            price = min(bid, max(self.reserve, needed))
        return Selection(pick=winner[3], scores=tuple(scores), price=price)


def auction(options: Mapping[str, Any], registry: StrategyRegistry) -> Auction:
    """Factory: options `reserve` (int micros) and `pricing` ("first" or "second")."""
    reserve = options.get("reserve", 0)
    pricing = options.get("pricing", "first")
    if not isinstance(reserve, int) or isinstance(reserve, bool) or reserve < 0:
        raise ConfigError("auction: 'reserve' must be a non-negative integer of micros")
    if pricing not in ("first", "second"):
        raise ConfigError("auction: 'pricing' must be 'first' or 'second'")
    return Auction(reserve=reserve, pricing=pricing)
