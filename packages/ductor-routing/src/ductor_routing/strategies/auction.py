"""Auction: the highest effective bid wins; first price (or second) with a reserve.

Effective bid = bid x quality // 10_000 (quality in basis points); it only ranks.
The reserve and every price are in raw bid micros. Reads no state, writes none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ductor_routing.errors import ConfigError
from ductor_routing.pools import MAX_MICROS
from ductor_routing.strategies.base import Score, Selection, SelectionContext, check_options

if TYPE_CHECKING:
    from ductor_routing.strategies.registry import StrategyRegistry

_BASIS = 10_000


def effective_bid(bid: int, quality: int) -> int:
    """The bid as the auction ranks it: `bid * quality // 10_000`, in micros."""
    return bid * quality // _BASIS


def least_winning_bid(target: int, quality: int) -> int:
    """The least raw bid whose effective bid (at `quality`) is at least `target`."""
    if target <= 0:
        return 0
    # floor(b * q / B) >= t  <=>  b >= t * B / q, so round t * B / q up.
    return -(-target * _BASIS // max(quality, 1))


class Auction:
    """Pick the highest effective bid among bids at or above the reserve.

    Ties on the effective bid go to the member listed earlier in the pool.

    The reserve applies to the **raw** bid, not the effective one: it is the
    least money accepted, and quality only ranks. A bid below the reserve
    cannot win whatever its quality; a bid at or above it can, even when its
    effective bid is below the reserve.

    Prices (raw micros, never above the winner's bid, never below the reserve):

    - first: the winner pays its bid.
    - second: the winner pays the least bid that would still have won, holding
      every other bid fixed. Let E be the runner-up's effective bid. A winner
      listed before the runner-up wins a tie, so it needs an effective bid of
      E; a winner listed after it must beat it, so it needs E + 1 micro. The
      price is the least raw bid reaching that at the winner's quality
      (rounded up), or the reserve if higher. Alone, the winner pays the
      reserve.

    Args:
        reserve: the least raw bid accepted, in micros.
        pricing: "first" or "second".
    """

    name = "auction"

    def __init__(self, *, reserve: int = 0, pricing: str = "first") -> None:
        self.reserve = reserve
        self.pricing = pricing

    def select(self, ctx: SelectionContext) -> Selection:
        """Rank bids; price the winner."""
        scores: list[Score] = []
        # (-effective, position, worker id, bid, quality): sorting puts the winner first.
        ranked: list[tuple[int, int, str, int, int]] = []
        for c in ctx.candidates:
            bid = c.member.bid
            if bid is None:
                scores.append(Score(worker=c.worker.id, value=None, note="no bid"))
                continue
            if bid < self.reserve:
                scores.append(Score(worker=c.worker.id, value=None, note="below reserve"))
                continue
            effective = effective_bid(bid, c.member.quality)
            scores.append(Score(worker=c.worker.id, value=effective, note=f"bid {bid}"))
            ranked.append((-effective, c.position, c.worker.id, bid, c.member.quality))
        if not ranked:
            return Selection(pick=None, scores=tuple(scores), note="reserve not met")
        ranked.sort()
        _, position, winner, bid, quality = ranked[0]
        if self.pricing == "first":
            return Selection(pick=winner, scores=tuple(scores), price=bid)
        if len(ranked) == 1:
            return Selection(
                pick=winner,
                scores=tuple(scores),
                price=self.reserve,  # at most the bid: a bid below the reserve is not ranked
                note="second price: no runner-up",
            )
        neg_runner, runner_position, runner, _, _ = ranked[1]
        listed_earlier = runner_position < position
        # A runner-up listed earlier wins ties, so the winner must beat it by one micro.
        needed = least_winning_bid(-neg_runner + (1 if listed_earlier else 0), quality)
        price = min(bid, max(self.reserve, needed))
        note = f"second price: runner-up {runner} at {-neg_runner}" + (
            " + 1 (listed earlier)" if listed_earlier else ""
        )
        return Selection(pick=winner, scores=tuple(scores), price=price, note=note)


def auction(options: Mapping[str, Any], registry: StrategyRegistry) -> Auction:
    """Factory: options `reserve` (int micros, on the raw bid) and `pricing` ("first"/"second")."""
    check_options("auction", options, ("reserve", "pricing"))
    reserve = options.get("reserve", 0)
    pricing = options.get("pricing", "first")
    if not isinstance(reserve, int) or isinstance(reserve, bool) or reserve < 0:
        raise ConfigError("auction: 'reserve' must be a non-negative integer of micros")
    if reserve > MAX_MICROS:
        raise ConfigError("auction: 'reserve' must be at most 10^15 micros")
    if pricing not in ("first", "second"):
        raise ConfigError("auction: 'pricing' must be 'first' or 'second'")
    return Auction(reserve=reserve, pricing=pricing)
