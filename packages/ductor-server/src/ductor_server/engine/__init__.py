"""The engine: coordinator, step workers, timers, event ingestion and its ports.

Run state is written only by the coordinator (through a run kind's pure tick);
workers run handlers and report attempts; every durable fact lives in the
store. Ports: `RunKind` (the DAG kind is built in, others plug in),
`TaskQueue` (the store's tasks table; a dispatcher may front it), `WakeUp`.
The `Runtime` that runs the loops is in `ductor_server.engine.runtime` (it
builds on `ductor_server.services`, which builds on this package).
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
from ductor_server.engine.errors import (
    DuplicateHandler,
    DuplicateRunKind,
    EngineSetupError,
    MissingHandler,
    UnknownRunKind,
)
from ductor_server.engine.kinds import KindTick, RunKind, RunKinds, failed_tick
from ductor_server.engine.queue import InProcessWakeUp, NullWakeUp, Topic, WakeUp
from ductor_server.engine.taskqueue import SqlTaskQueue, TaskQueue
from ductor_server.engine.timers import Timers
from ductor_server.engine.workers import Workers

__all__ = [
    "ActionCall",
    "ActionFailed",
    "ActionRegistry",
    "Clock",
    "Coordinator",
    "DuplicateHandler",
    "DuplicateRunKind",
    "EngineSetupError",
    "Handler",
    "HttpAction",
    "InProcessWakeUp",
    "KindTick",
    "ManualClock",
    "MissingHandler",
    "NullWakeUp",
    "RunKind",
    "RunKinds",
    "SqlTaskQueue",
    "SystemClock",
    "TaskQueue",
    "Timers",
    "Topic",
    "UnknownRunKind",
    "WakeUp",
    "Workers",
    "WorkflowCatalog",
    "default_registry",
    "failed_tick",
]
