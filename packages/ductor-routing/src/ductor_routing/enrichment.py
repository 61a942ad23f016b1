"""The Enrich stage: derived attributes from CEL expressions or enricher plugins.

Enrichers are pure functions of the routable and `now`; they never do I/O.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import msgspec

from ductor_core.expressions import CompiledExpression, ExpressionEngine
from ductor_routing.activations import Activations
from ductor_routing.routables import Routable


class EnricherSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Set `attribute` to the value of CEL `expr` over `routable`, `attributes` and `now`."""

    attribute: str
    expr: str


@runtime_checkable
class Enricher(Protocol):
    """A plugin that derives attributes from a routable (pure, no I/O)."""

    @property
    def name(self) -> str: ...

    def enrich(self, routable: Routable, now: datetime.datetime) -> Mapping[str, Any]:
        """The attributes to add (they override existing ones of the same name)."""
        ...


class CelEnricher:
    """An enricher that evaluates one compiled CEL expression."""

    def __init__(self, spec: EnricherSpec, engine: ExpressionEngine) -> None:
        """Compile `spec.expr` once (raises ExpressionError on bad syntax)."""
        self.spec = spec
        self.name = f"cel:{spec.attribute}"
        self._program: CompiledExpression = engine.compile(spec.expr)
        self._activations = Activations([spec.expr])

    def enrich(self, routable: Routable, now: datetime.datetime) -> Mapping[str, Any]:
        """`{attribute: value of the expression}`."""
        activation = self._activations.build(routable, now)
        return {self.spec.attribute: self._program.evaluate(activation)}
