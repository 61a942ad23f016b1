"""The strategy plugin registry: built-ins plus third-party factories by entry point.

Third parties publish a factory `(options, registry) -> Strategy` under the
entry-point group "ductor.routing.strategies". Discovery reads installed
package metadata and happens only when `discover()` is called, never while routing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from importlib import metadata
from typing import Any

from ductor_routing.errors import ConfigError, UnknownStrategy
from ductor_routing.pools import StrategySpec
from ductor_routing.strategies.auction import auction
from ductor_routing.strategies.base import Strategy, StrategyFactory
from ductor_routing.strategies.least_loaded import least_loaded
from ductor_routing.strategies.longest_idle import longest_idle
from ductor_routing.strategies.round_robin import round_robin
from ductor_routing.strategies.skills_match import skills_match
from ductor_routing.strategies.sticky import sticky
from ductor_routing.strategies.waterfall import waterfall
from ductor_routing.strategies.weighted_random import weighted_random

ENTRY_POINT_GROUP = "ductor.routing.strategies"
"""The entry-point group third-party strategy factories are published under."""

BUILTIN_STRATEGIES: Mapping[str, StrategyFactory] = {
    "round_robin": round_robin,
    "weighted_random": weighted_random,
    "least_loaded": least_loaded,
    "longest_idle": longest_idle,
    "waterfall": waterfall,
    "skills_match": skills_match,
    "auction": auction,
    "sticky": sticky,
}


class StrategyRegistry:
    """Strategy factories by name; starts with the built-ins."""

    def __init__(self, *, builtins: bool = True) -> None:
        self._factories: dict[str, StrategyFactory] = dict(BUILTIN_STRATEGIES) if builtins else {}

    def register(self, name: str, factory: StrategyFactory, *, replace: bool = False) -> None:
        """Add a factory under `name`; refuses to shadow an existing one unless `replace`."""
        if name in self._factories and not replace:
            raise ConfigError(f"strategy {name!r} is already registered")
        self._factories[name] = factory

    def names(self) -> tuple[str, ...]:
        """Every registered strategy name, sorted."""
        return tuple(sorted(self._factories))

    def create(self, spec: StrategySpec) -> Strategy:
        """Build the strategy `spec` names, with its options.

        Raises:
            UnknownStrategy: no factory is registered under the name.
            ConfigError: the factory rejected the options.
        """
        factory = self._factories.get(spec.name)
        if factory is None:
            raise UnknownStrategy(
                f"unknown strategy {spec.name!r}; registered: {', '.join(self.names())}"
            )
        return factory(spec.options, self)

    def load_entry_points(self, entry_points: Iterable[metadata.EntryPoint]) -> tuple[str, ...]:
        """Register the factory each entry point names; return the names added."""
        added = []
        for ep in entry_points:
            factory: Any = ep.load()
            if not callable(factory):
                raise ConfigError(f"entry point {ep.name!r} ({ep.value}) is not callable")
            self.register(ep.name, factory)
            added.append(ep.name)
        return tuple(added)

    def discover(self) -> tuple[str, ...]:
        """Register every factory installed under ENTRY_POINT_GROUP; return the names added."""
        return self.load_entry_points(metadata.entry_points(group=ENTRY_POINT_GROUP))
