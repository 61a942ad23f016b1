"""The strategy seam: what a strategy is given, what it returns, and how it is built.

A strategy is pure: it reads the candidates and the state view and returns a
`Selection` (pick, scores, marks to set). It never changes state itself.
"""

from __future__ import annotations

import datetime
import hashlib
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import msgspec

from ductor_routing.errors import ConfigError
from ductor_routing.pools import Member
from ductor_routing.routables import Routable
from ductor_routing.state import Mark, RoutingState
from ductor_routing.workers import Worker

if TYPE_CHECKING:
    from ductor_routing.strategies.registry import StrategyRegistry


def check_options(strategy: str, options: Mapping[str, Any], known: Collection[str]) -> None:
    """Raise `ConfigError` naming the first option of `options` the strategy does not take
    (a misspelt option would otherwise be ignored, e.g. an auction without its reserve)."""
    for name in options:
        if name not in known:
            takes = ", ".join(repr(k) for k in known) if known else "no options"
            raise ConfigError(f"{strategy}: unknown option {name!r}; it takes {takes}")


class Candidate(msgspec.Struct, frozen=True, kw_only=True):
    """An eligible member, as the strategy sees it.

    Attributes:
        position: the member's position in the pool (breaks ties, lower first).
        worker: the worker.
        member: the membership (bid, priority, weight, ...).
        charge: the most assigning to it can charge its budget, in micros (its
            bid, else the routable's price, else 0); the budget check used it,
            and a strategy's price may be lower, never higher.
        load: the worker's current load on the pool's channel.
        capacity: the worker's capacity on the channel, None if unlimited.
    """

    position: int
    worker: Worker
    member: Member
    charge: int
    load: int
    capacity: int | None


class Score(msgspec.Struct, frozen=True, kw_only=True):
    """A strategy's score for one candidate; `value` None means "cannot be picked"."""

    worker: str
    value: float | int | str | None
    note: str = ""


class Selection(msgspec.Struct, frozen=True, kw_only=True):
    """A strategy's answer.

    Attributes:
        pick: the chosen worker id, or None when no candidate qualifies.
        scores: one score per candidate, in candidate order.
        price: the clearing price in micros, when the strategy sets one (auction).
        marks: marks to set if this selection is committed (cursor, sticky).
        note: why, in a few words, when the pick is None or unusual.
    """

    pick: str | None
    scores: tuple[Score, ...] = ()
    price: int | None = None
    marks: tuple[Mark, ...] = ()
    note: str = ""


class SelectionContext:
    """Everything a strategy may consult for one decision.

    Attributes:
        routable: the enriched routable.
        pool: the pool id.
        scope: the namespace for this strategy's marks (the pool id when live,
            "<pool>#shadow:<name>" for a shadow).
        channel: the pool's capacity channel.
        candidates: eligible members, in pool order.
        state: the read-only state view.
        now: the decision time.
        now_text: `now` as fixed-width ISO-8601 UTC.
        seed: the run's seed; with the routable id and scope it fixes `random()`.
    """

    __slots__ = (
        "_random",
        "candidates",
        "channel",
        "now",
        "now_text",
        "pool",
        "routable",
        "scope",
        "seed",
        "state",
    )

    def __init__(
        self,
        *,
        routable: Routable,
        pool: str,
        scope: str,
        channel: str,
        candidates: Sequence[Candidate],
        state: RoutingState,
        now: datetime.datetime,
        now_text: str,
        seed: int,
    ) -> None:
        self.routable = routable
        self.pool = pool
        self.scope = scope
        self.channel = channel
        self.candidates = candidates
        self.state = state
        self.now = now
        self.now_text = now_text
        self.seed = seed
        self._random: float | None = None

    def random(self) -> float:
        """A number in [0, 1) fixed by (seed, tenant, routable id, scope): reproducible."""
        if self._random is None:
            text = f"{self.seed}\x00{self.routable.tenant}\x00{self.routable.id}\x00{self.scope}"
            digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
            self._random = int.from_bytes(digest, "big") / 2.0**64
        return self._random

    def with_scope(self, scope: str) -> SelectionContext:
        """The same context with marks namespaced under `scope`."""
        return SelectionContext(
            routable=self.routable,
            pool=self.pool,
            scope=scope,
            channel=self.channel,
            candidates=self.candidates,
            state=self.state,
            now=self.now,
            now_text=self.now_text,
            seed=self.seed,
        )


@runtime_checkable
class Strategy(Protocol):
    """Picks one recipient among eligible candidates."""

    @property
    def name(self) -> str: ...

    def select(self, ctx: SelectionContext) -> Selection:
        """Choose among `ctx.candidates`; pure, deterministic for the same inputs."""
        ...


StrategyFactory = Callable[[Mapping[str, Any], "StrategyRegistry"], Strategy]
"""Builds a strategy from its options; the registry lets it build nested ones."""


def select_lowest(
    ctx: SelectionContext, rank: Callable[[Candidate], tuple[tuple[Any, ...], Score]]
) -> Selection:
    """Score every candidate with `rank` and pick the one whose key is lowest.

    `rank(candidate)` returns `(key, score)`; ties on the key go to the earlier
    member (lower position), then to the lower worker id.
    """
    if not ctx.candidates:
        return Selection(pick=None, note="no candidates")
    ranked = []
    scores = []
    for c in ctx.candidates:
        key, score = rank(c)
        ranked.append((*key, c.position, c.worker.id))
        scores.append(score)
    return Selection(pick=min(ranked)[-1], scores=tuple(scores))
