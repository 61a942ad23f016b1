"""The routing configuration document (JSON) and how it becomes a `Router`.

Decoding takes bytes the caller already read; nothing here opens a file.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from ductor_core.expressions import ExpressionEngine
from ductor_routing.enrichment import Enricher, EnricherRegistry, EnricherSpec
from ductor_routing.errors import ConfigError
from ductor_routing.kinds import KindSchema
from ductor_routing.pipeline import Router
from ductor_routing.pools import Pool
from ductor_routing.rules import RuleSet
from ductor_routing.strategies.registry import StrategyRegistry
from ductor_routing.workers import Worker


class RoutingConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Everything a router needs, as one JSON document.

    Attributes:
        seed: fixes seeded random draws (weighted random) for reproducible replays.
        kinds: routable kind to its schema.
        enrichers: CEL enrichers and named enricher plugins, applied in order.
        workers: the worker registry.
        pools: the pools with their members and strategies.
        rule_set: the versioned rule set.
    """

    seed: int = 0
    kinds: dict[str, KindSchema] = {}
    enrichers: tuple[EnricherSpec, ...] = ()
    workers: tuple[Worker, ...] = ()
    pools: tuple[Pool, ...] = ()
    rule_set: RuleSet = RuleSet()


def decode_config(data: bytes | str) -> RoutingConfig:
    """Decode a routing configuration document.

    Raises:
        ConfigError: the JSON is malformed or does not fit the schema (names the path).
    """
    try:
        return msgspec.json.decode(data, type=RoutingConfig)
    except msgspec.DecodeError as exc:
        raise ConfigError(f"invalid routing configuration: {exc}") from exc


def build_router(
    config: RoutingConfig,
    *,
    engine: ExpressionEngine,
    registry: StrategyRegistry | None = None,
    enricher_registry: EnricherRegistry | None = None,
    plugins: Sequence[Enricher] = (),
    seed: int | None = None,
) -> Router:
    """Compile `config` into a router; `seed` overrides the configured one.

    Enrichers listed in the config run first, in order (plugins named there
    are found in `enricher_registry`); enricher objects in `plugins` run after.
    """
    return Router(
        rule_set=config.rule_set,
        pools=config.pools,
        workers=config.workers,
        kinds=config.kinds,
        engine=engine,
        enrichers=(*config.enrichers, *plugins),
        registry=registry,
        enricher_registry=enricher_registry,
        seed=config.seed if seed is None else seed,
    )
