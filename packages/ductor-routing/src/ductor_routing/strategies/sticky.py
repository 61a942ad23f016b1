"""Sticky: the same recipient for the same key, while it stays eligible.

The first routable with a key is placed by a fallback strategy; the binding
is a mark that the Assign intent sets.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from ductor_routing.errors import ConfigError
from ductor_routing.filters import MISSING, attribute_getter
from ductor_routing.pools import StrategySpec
from ductor_routing.state import Mark, MarkKind
from ductor_routing.strategies.base import (
    Score,
    Selection,
    SelectionContext,
    Strategy,
    check_options,
)

if TYPE_CHECKING:
    from ductor_routing.strategies.registry import StrategyRegistry


class Sticky:
    """Pick the worker bound to the routable's key; otherwise ask the fallback and bind.

    Args:
        key: dotted attribute path whose value is the sticky key (e.g. "customer_id").
        fallback: the strategy that places a key seen for the first time.
    """

    name = "sticky"

    def __init__(self, *, key: str, fallback: Strategy) -> None:
        self.key = key
        self._get = attribute_getter(key)
        self.fallback = fallback

    def select(self, ctx: SelectionContext) -> Selection:
        """Honour the binding if its worker is a candidate; else fall back and bind."""
        raw = self._get(ctx.routable.attributes)
        if raw is MISSING or raw is None:
            inner = self.fallback.select(ctx)
            return msgspec.structs.replace(inner, note=f"no {self.key}; {inner.note}".strip())
        key = raw if isinstance(raw, str) else msgspec.json.encode(raw).decode()
        bound = ctx.state.mark(MarkKind.STICKY, ctx.scope, key)
        if bound is not None and any(c.worker.id == bound for c in ctx.candidates):
            scores = tuple(
                Score(
                    worker=c.worker.id,
                    value=1 if c.worker.id == bound else 0,
                    note="bound" if c.worker.id == bound else "",
                )
                for c in ctx.candidates
            )
            return Selection(pick=bound, scores=scores)
        inner = self.fallback.select(ctx)
        if inner.pick is None:
            return inner
        note = "rebound, previous worker not eligible" if bound is not None else "new binding"
        bind = Mark(kind=MarkKind.STICKY, scope=ctx.scope, key=key, value=inner.pick)
        return msgspec.structs.replace(inner, marks=(*inner.marks, bind), note=note)


def sticky(options: Mapping[str, Any], registry: StrategyRegistry) -> Sticky:
    """Factory: options `key` (attribute path) and `fallback` (a strategy spec)."""
    check_options("sticky", options, ("key", "fallback"))
    key = options.get("key")
    if not isinstance(key, str) or not key:
        raise ConfigError("sticky: 'key' must name an attribute")
    raw_fallback = options.get("fallback", {"name": "round_robin"})
    try:
        spec = msgspec.convert(raw_fallback, StrategySpec)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"sticky: bad 'fallback': {exc}") from exc
    if spec.name == "sticky":
        raise ConfigError("sticky: the fallback cannot itself be sticky")
    return Sticky(key=key, fallback=registry.create(spec))
