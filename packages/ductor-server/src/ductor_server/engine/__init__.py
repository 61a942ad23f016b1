"""The engine: coordinator, step workers, timers, event ingestion and the queue seam.

Run state is written only by the coordinator (through the pure tick); workers
run handlers and report attempts; every durable fact lives in the store. The
`Runtime` that runs the loops is in `ductor_server.engine.runtime` (it builds on
`ductor_server.services`, which builds on this package).
"""

from __future__ import annotations

from ductor_server.engine.actions import (
    ActionCall,
    ActionFailed,
    ActionRegistry,
    Handler,
    HttpAction,
    default_registry,
)
from ductor_server.engine.catalog import WorkflowCatalog
from ductor_server.engine.clock import Clock, ManualClock, SystemClock
from ductor_server.engine.coordinator import Coordinator
from ductor_server.engine.errors import DuplicateHandler, EngineSetupError
from ductor_server.engine.queue import InProcessWakeUp, NullWakeUp, Topic, WakeUp
from ductor_server.engine.timers import Timers
from ductor_server.engine.workers import Workers

__all__ = [
    # handlers
    "ActionCall",
    "ActionFailed",
    "ActionRegistry",
    # time and wake-ups
    "Clock",
    # loops
    "Coordinator",
    "DuplicateHandler",
    "EngineSetupError",
    "Handler",
    "HttpAction",
    "InProcessWakeUp",
    "ManualClock",
    "NullWakeUp",
    "SystemClock",
    "Timers",
    "Topic",
    "WakeUp",
    "Workers",
    "WorkflowCatalog",
    "default_registry",
]
