"""The strategy plugin registry: built-ins plus third-party factories by entry point.

Third parties publish a factory `(options, registry) -> Strategy` under the
entry-point group "ductor.routing.strategies". Discovery reads installed
package metadata and happens only when `discover()` is called, never while routing.
"""

from __future__ import annotations

from collections.abc import Mapping

from ductor_routing._plugin_registry import PluginRegistry, build_plugin
from ductor_routing.errors import UnknownStrategy
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


class StrategyRegistry(PluginRegistry[StrategyFactory]):
    """Strategy factories by name; starts with the built-ins."""

    kind = "strategy"
    entry_point_group = ENTRY_POINT_GROUP

    def __init__(self, *, builtins: bool = True) -> None:
        super().__init__(dict(BUILTIN_STRATEGIES) if builtins else {})

    def create(self, spec: StrategySpec) -> Strategy:
        """Build the strategy `spec` names, with its options.

        Raises:
            UnknownStrategy: no factory is registered under the name.
            ConfigError: the factory rejected the options, raised, or answered
                something without `select`.
        """
        factory = self._factories.get(spec.name)
        if factory is None:
            raise UnknownStrategy(
                f"unknown strategy {spec.name!r}; registered: {', '.join(self.names())}"
            )
        strategy: Strategy = build_plugin(
            f"strategy {spec.name!r}",
            lambda: factory(spec.options, self),
            "select",
            "a strategy with select(ctx)",
        )
        return strategy
