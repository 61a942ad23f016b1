"""The Enrich stage: derived attributes from CEL expressions or enricher plugins.

Enrichers are pure functions of the routable and `now`; they never do I/O.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import msgspec

from ductor_core.expressions import CompiledExpression, ExpressionEngine
from ductor_routing._plugin_registry import PluginRegistry, build_plugin
from ductor_routing.activations import Activations
from ductor_routing.errors import ConfigError
from ductor_routing.routables import Routable

ENRICHER_ENTRY_POINT_GROUP = "ductor.routing.enrichers"
"""The entry-point group third-party enricher factories are published under."""


class EnricherSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One enricher: CEL (`attribute` + `expr`) or a plugin (`plugin` + `options`).

    Attributes:
        attribute: the attribute a CEL enricher sets.
        expr: the CEL expression over `routable`, `attributes` and `now`.
        plugin: the registered name of an enricher plugin.
        options: the plugin's options.
    """

    attribute: str | None = None
    expr: str | None = None
    plugin: str | None = None
    options: dict[str, Any] = {}

    def problem(self) -> str | None:
        """What is wrong with the spec's shape, if anything."""
        if self.plugin is not None:
            if self.attribute is not None or self.expr is not None:
                return "give either 'plugin' or 'attribute' and 'expr', not both"
            return None
        if self.attribute is None or self.expr is None:
            return "a CEL enricher needs 'attribute' and 'expr'"
        return None


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
        if spec.attribute is None or spec.expr is None:
            raise ConfigError("a CEL enricher needs 'attribute' and 'expr'")
        self.attribute = spec.attribute
        self.name = f"cel:{spec.attribute}"
        self._program: CompiledExpression = engine.compile(spec.expr)
        self._activations = Activations([spec.expr])

    def enrich(self, routable: Routable, now: datetime.datetime) -> Mapping[str, Any]:
        """`{attribute: value of the expression}`."""
        activation = self._activations.build(routable, now)
        return {self.attribute: self._program.evaluate(activation)}


EnricherFactory = Callable[[Mapping[str, Any]], Enricher]
"""Builds an enricher plugin from its options."""


class EnricherRegistry(PluginRegistry[EnricherFactory]):
    """Enricher plugin factories by name (none built in).

    Discovery reads installed package metadata and happens only when
    `discover()` is called, never while routing.
    """

    kind = "enricher"
    entry_point_group = ENRICHER_ENTRY_POINT_GROUP

    def create(self, name: str, options: Mapping[str, Any]) -> Enricher:
        """Build the plugin `name` with `options` (ConfigError if unknown, if the factory
        raises, or if it answers something without `enrich`)."""
        factory = self._factories.get(name)
        if factory is None:
            known = ", ".join(self.names()) or "none"
            raise ConfigError(f"unknown enricher plugin {name!r}; registered: {known}")
        enricher: Enricher = build_plugin(
            f"enricher plugin {name!r}",
            lambda: factory(options),
            "enrich",
            "an enricher with enrich(routable, now)",
        )
        return enricher
