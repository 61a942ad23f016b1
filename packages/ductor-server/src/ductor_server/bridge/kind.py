"""The bridge run kind, and `install`, which plugs the bridge into a runtime.

Runs of family slugs `bridge:<app>:<workflow>` are ticked by the pure bridge
tick with their bookkeeping in `runs.kind_state`; the `bridge` step handler
(`BridgeDriver`) calls the apps. The engine knows none of this: the composition
root registers the kind and the handler.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import httpx
import msgspec

from ductor.protocol import SigningKeys
from ductor_core.runs import ErrorInfo, RunFinished, RunInput, StartChildRun, TickResult
from ductor_server.bridge.concurrency import release_slot
from ductor_server.bridge.driver import BridgeDriver
from ductor_server.bridge.runs import (
    bridge_data,
    start_bridge_child,
    start_triggered_runs,
    trigger_bridge_run,
)
from ductor_server.bridge.schedules import BridgeSchedules
from ductor_server.bridge.tick import BRIDGE_KIND, BRIDGE_SLUG_PREFIX, HANDLER, bridge_tick
from ductor_server.engine.effects import Effects, EngineParts
from ductor_server.engine.kinds import KindTick, failed_tick
from ductor_server.engine.outbound import OutboundPolicy
from ductor_server.storage.protocol import Tx
from ductor_server.storage.records import RunRecord

if TYPE_CHECKING:
    from ductor_server.engine.runtime import Runtime

log = logging.getLogger("ductor.bridge")


class BridgeKind:
    """Runs of SDK-hosted workflows, driven through the bridge protocol."""

    @property
    def name(self) -> str:
        """Always "bridge"."""
        return BRIDGE_KIND

    @property
    def slug_prefix(self) -> str | None:
        """ "bridge:": the slugs of SDK workflows (DAG slugs cannot hold ':')."""
        return BRIDGE_SLUG_PREFIX

    async def tick(
        self,
        tx: Tx,
        parts: EngineParts,
        run: RunRecord,
        inputs: Sequence[RunInput],
        now: datetime,
    ) -> KindTick:
        """Apply `inputs` with the pure bridge tick; a run whose bookkeeping is
        unreadable, or whose tick raises, fails instead."""
        try:
            data = bridge_data(run)
            ticked = bridge_tick(run.state, data, inputs, now, engine=parts.engine)
        except Exception as exc:  # a tick bug must not wedge the run (or the batch)
            log.exception("bridge tick of run %s failed", run.id)
            error = ErrorInfo(code="engine.tick_failed", message=str(exc), retryable=False)
            return KindTick(failed_tick(run.state, error, now), kind_state=run.kind_state)
        result: TickResult = ticked.tick_result()
        return KindTick(result, kind_state=msgspec.to_builtins(ticked.data))

    async def trigger(
        self,
        tx: Tx,
        parts: EngineParts,
        effects: Effects,
        *,
        tenant_id: str,
        family_slug: str,
        version: int | None,
        input: Any,
        now: datetime,
        idempotency_key: str | None = None,
    ) -> RunRecord | None:
        """Start a run of the registered workflow (at its registered version; the
        requested `version` does not apply); None if the app does not serve it."""
        return await trigger_bridge_run(
            tx,
            parts,
            effects,
            tenant_id=tenant_id,
            family_slug=family_slug,
            input=input,
            now=now,
            idempotency_key=idempotency_key,
        )

    async def start_child(
        self,
        tx: Tx,
        parts: EngineParts,
        effects: Effects,
        *,
        parent: RunRecord,
        command: StartChildRun,
        now: datetime,
        depth: int,
    ) -> ErrorInfo | None:
        """Start an SDK workflow as a child (an INVOKE with `app_id`)."""
        started = await start_bridge_child(
            tx,
            parts,
            effects,
            parent=parent,
            step_ref=command.step_ref,
            item_index=command.item_index,
            child_key=command.child_key,
            family_slug=command.family_slug,
            input=command.input,
            now=now,
        )
        if started:
            return None
        return ErrorInfo(
            code="workflow.not_found",
            message=f"child workflow {command.family_slug} is not published",
            retryable=False,
        )

    async def start_triggered(
        self,
        tx: Tx,
        parts: EngineParts,
        effects: Effects,
        *,
        tenant_id: str,
        event_id: str,
        name: str,
        data: Any,
        now: datetime,
    ) -> list[str]:
        """Start every registered SDK workflow whose trigger matches the event."""
        return await start_triggered_runs(
            tx,
            parts,
            effects,
            tenant_id=tenant_id,
            event_id=event_id,
            name=name,
            data=data,
            now=now,
        )

    async def on_finish(
        self,
        tx: Tx,
        parts: EngineParts,
        effects: Effects,
        *,
        run: RunRecord,
        finished: RunFinished,
        now: datetime,
    ) -> None:
        """Free the run's concurrency slot (if it held one) for the next waiting run."""
        await release_slot(tx, effects, run=run, now=now)


def install(
    runtime: Runtime,
    *,
    keys: SigningKeys | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    policy: OutboundPolicy | None = None,
) -> BridgeDriver:
    """Plug the bridge into `runtime` before its loops start: the bridge run kind,
    the `bridge` step handler and the cron triggers (fired by the timer loop).
    Returns the handler.

    Use as `Runtime.start(..., setup=install)`. `keys` default to the
    environment (`DUCTOR_BRIDGE_SIGNING_KEY`); `transport` is for tests; app URLs
    must pass `policy`, the outbound guard.
    """
    runtime.kinds.register(BridgeKind())
    runtime.timers.schedules.append(BridgeSchedules(runtime.parts))
    driver = BridgeDriver(
        runtime.store,
        keys=keys,
        clock=runtime.clock,
        wake=runtime.wakeup,
        parts=runtime.parts,
        transport=transport,
        policy=policy,
    )
    # Takes the place of the built-in placeholder that says the bridge is not served.
    runtime.actions.register(HANDLER, driver)
    return driver


__all__ = ["BridgeKind", "install"]
