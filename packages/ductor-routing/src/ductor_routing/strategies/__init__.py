"""Routing strategies: the built-ins and the plugin registry third parties extend."""

from __future__ import annotations

from ductor_routing.strategies.auction import Auction
from ductor_routing.strategies.base import (
    Candidate,
    Score,
    Selection,
    SelectionContext,
    Strategy,
    StrategyFactory,
)
from ductor_routing.strategies.least_loaded import LeastLoaded
from ductor_routing.strategies.longest_idle import LongestIdle
from ductor_routing.strategies.registry import (
    BUILTIN_STRATEGIES,
    ENTRY_POINT_GROUP,
    StrategyRegistry,
)
from ductor_routing.strategies.round_robin import RoundRobin
from ductor_routing.strategies.skills_match import SkillsMatch
from ductor_routing.strategies.sticky import Sticky
from ductor_routing.strategies.waterfall import Waterfall
from ductor_routing.strategies.weighted_random import WeightedRandom

__all__ = [
    "BUILTIN_STRATEGIES",
    "ENTRY_POINT_GROUP",
    "Auction",
    "Candidate",
    "LeastLoaded",
    "LongestIdle",
    "RoundRobin",
    "Score",
    "Selection",
    "SelectionContext",
    "SkillsMatch",
    "Sticky",
    "Strategy",
    "StrategyFactory",
    "StrategyRegistry",
    "Waterfall",
    "WeightedRandom",
]
