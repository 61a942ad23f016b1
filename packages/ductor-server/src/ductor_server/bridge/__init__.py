"""The server side of the bridge SDK: SDK-hosted runs, the app registry, the driver.

Runs whose family slug starts with `bridge:` are ticked by the pure bridge
tick instead of the DAG tick; nothing here talks HTTP except the driver.
"""

from __future__ import annotations

from ductor_server.bridge.driver import BridgeDriver
from ductor_server.bridge.keys import FALLBACK_ENV, KEY_ENV, signing_keys_from_env
from ductor_server.bridge.registry import BridgeApp, BridgeWorkflow, SyncOutcome
from ductor_server.bridge.runs import create_bridge_run, start_bridge_child, start_triggered_runs
from ductor_server.bridge.tick import (
    BridgeData,
    bridge_slug,
    bridge_start,
    bridge_tick,
    checkpoint_input,
    is_bridge_slug,
    parse_bridge_slug,
)

__all__ = [
    "FALLBACK_ENV",
    "KEY_ENV",
    "BridgeApp",
    "BridgeData",
    "BridgeDriver",
    "BridgeWorkflow",
    "SyncOutcome",
    "bridge_slug",
    "bridge_start",
    "bridge_tick",
    "checkpoint_input",
    "create_bridge_run",
    "is_bridge_slug",
    "parse_bridge_slug",
    "signing_keys_from_env",
    "start_bridge_child",
    "start_triggered_runs",
]
