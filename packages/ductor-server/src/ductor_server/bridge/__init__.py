"""The server side of the bridge SDK: SDK-hosted runs, the app registry, the driver.

Runs of the `bridge` kind (family slugs `bridge:<app>:<workflow>`) are ticked
by the pure bridge tick instead of the DAG tick. The bridge plugs into the
engine (`install(runtime)`: the run kind, the `bridge` step handler and the
cron triggers the timer loop fires); the engine never imports it. Nothing
here talks HTTP except the driver and probe.
"""

from __future__ import annotations

from ductor_server.bridge.cron import Cron, CronError, cron_problem
from ductor_server.bridge.driver import BridgeDriver
from ductor_server.bridge.keys import (
    FALLBACK_ENV,
    KEY_ENV,
    REQUIRE_NONCE_ENV,
    AppKey,
    BridgeKeys,
    NewAppKey,
    require_nonce_from_env,
    signing_keys_from_env,
)
from ductor_server.bridge.kind import BridgeKind, install
from ductor_server.bridge.registry import BridgeApp, BridgeSchedule, BridgeWorkflow, SyncOutcome
from ductor_server.bridge.runs import (
    bridge_data,
    create_bridge_run,
    start_bridge_child,
    start_triggered_runs,
    trigger_bridge_run,
)
from ductor_server.bridge.schedules import BridgeSchedules, cron_run_key
from ductor_server.bridge.tick import (
    BRIDGE_KIND,
    BridgeData,
    BridgeTickResult,
    bridge_slug,
    bridge_start,
    bridge_tick,
    checkpoint_input,
    is_bridge_slug,
    parse_bridge_slug,
)

__all__ = [
    "BRIDGE_KIND",
    "FALLBACK_ENV",
    "KEY_ENV",
    "REQUIRE_NONCE_ENV",
    "AppKey",
    "BridgeApp",
    "BridgeData",
    "BridgeDriver",
    "BridgeKeys",
    "BridgeKind",
    "BridgeSchedule",
    "BridgeSchedules",
    "BridgeTickResult",
    "BridgeWorkflow",
    "Cron",
    "CronError",
    "NewAppKey",
    "SyncOutcome",
    "bridge_data",
    "bridge_slug",
    "bridge_start",
    "bridge_tick",
    "checkpoint_input",
    "create_bridge_run",
    "cron_problem",
    "cron_run_key",
    "install",
    "is_bridge_slug",
    "parse_bridge_slug",
    "require_nonce_from_env",
    "signing_keys_from_env",
    "start_bridge_child",
    "start_triggered_runs",
    "trigger_bridge_run",
]
