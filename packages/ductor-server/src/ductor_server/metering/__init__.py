"""Metering served by the server: its tables and its errors.

`ductor_server.services.metering.MeteringService` applies the pure rules of
`ductor_settlement` (meters, budgets, plans) to what `metering.store.MeteringTx`
loads and stores; usage counters are written by `storage.usage`. This package
holds the tables and the errors only: no rules, no transport.
"""

from __future__ import annotations

from ductor_server.metering.errors import MeteringConflict, MeteringObjectNotFound
from ductor_server.metering.store import (
    AlertRecord,
    BudgetRecord,
    MeteringTx,
    MeterRecord,
    PlanRecord,
    UsageRecord,
)

__all__ = [
    "AlertRecord",
    "BudgetRecord",
    "MeterRecord",
    "MeteringConflict",
    "MeteringObjectNotFound",
    "MeteringTx",
    "PlanRecord",
    "UsageRecord",
]
