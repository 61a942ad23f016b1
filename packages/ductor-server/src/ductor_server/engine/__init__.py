"""The engine: coordinator, step workers, timers, event ingestion and the queue seam."""

from __future__ import annotations

from ductor_server.engine.clock import Clock, ManualClock, SystemClock
from ductor_server.engine.queue import InProcessWakeUp, NullWakeUp, Topic, WakeUp

__all__ = [
    "Clock",
    "InProcessWakeUp",
    "ManualClock",
    "NullWakeUp",
    "SystemClock",
    "Topic",
    "WakeUp",
]
