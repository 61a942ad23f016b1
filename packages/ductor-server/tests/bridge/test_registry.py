"""The bridge app registry on both backends: sync, versions, triggers, staleness."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ductor.protocol import DescribeResponse, TriggerInfo, WorkflowInfo
from ductor_server.bridge.registry import (
    get_app,
    get_workflow,
    list_apps,
    list_workflows,
    sync_app,
    triggered_workflows,
)
from ductor_server.engine.catalog import WorkflowCatalog
from ductor_server.engine.clock import ManualClock
from ductor_server.engine.effects import EngineParts
from ductor_server.engine.queue import NullWakeUp
from ductor_server.services.bridge import BridgeCaller, BridgeService
from ductor_server.services.context import ServiceContext
from ductor_server.storage import Store

from .conftest import TENANT

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _describe(retries: int = 3, *, with_refund: bool = True) -> DescribeResponse:
    workflows = [
        WorkflowInfo(
            id="charge",
            retries=retries,
            triggers=[TriggerInfo(event="order.created", match="event.data.total > 0")],
        )
    ]
    if with_refund:
        workflows.append(
            WorkflowInfo(id="refund", retries=1, triggers=[TriggerInfo(event="order.returned")])
        )
    return DescribeResponse(
        app_id="shop", url="http://app/api/ductor", sdk="t", sdk_version="0", workflows=workflows
    )


async def test_sync_versions_workflows_and_indexes_triggers(store: Store) -> None:
    async with store.transaction() as tx:
        first = await sync_app(tx, TENANT, _describe(), url="http://app/api/ductor", now=T0)
    assert first.accepted == ["charge", "refund"]
    assert first.changes == {"charge": "new", "refund": "new"}
    async with store.transaction() as tx:
        same = await sync_app(tx, TENANT, _describe(), url="http://app/api/ductor", now=T0)
        changed = await sync_app(
            tx, TENANT, _describe(retries=5, with_refund=False), url="http://app/x", now=T0
        )
    assert same.changes == {"charge": "unchanged", "refund": "unchanged"}
    assert changed.changes == {"charge": "changed"}
    async with store.transaction() as tx:
        charge = await get_workflow(tx, TENANT, "shop", "charge")
        workflows = await list_workflows(tx, TENANT, "shop")
        created = await triggered_workflows(tx, TENANT, "order.created")
        returned = await triggered_workflows(tx, TENANT, "order.returned")
        app = await get_app(tx, TENANT, "shop")
        other_tenant = await list_apps(tx, "someone-else")
    assert charge is not None
    assert charge.version == 2
    assert charge.info.retries == 5
    assert [w.workflow_id for w in workflows] == ["charge"]
    assert [w.workflow_id for w in created] == ["charge"]
    assert returned == []
    assert app is not None
    assert app.url == "http://app/x"
    assert other_tenant == []


async def test_an_app_that_went_quiet_is_stale(store: Store) -> None:
    clock = ManualClock(T0)
    context = ServiceContext(
        store=store, wake=NullWakeUp(), clock=clock, parts=EngineParts(catalog=WorkflowCatalog())
    )
    service = BridgeService(context, keys=None)
    caller = BridgeCaller(tenant_id=TENANT, app_id="shop", own_key=False)
    await service.sync(TENANT, _describe(), caller=caller)
    clock.advance(timedelta(minutes=1))
    [fresh] = await service.apps(TENANT)
    clock.advance(timedelta(hours=1))
    [quiet] = await service.apps(TENANT)
    assert not fresh.stale
    assert quiet.stale
    assert quiet.workflows == ["charge", "refund"]
