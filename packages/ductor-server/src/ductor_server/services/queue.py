"""Operators' control of the fair task queue: each tenant's weight, tier and
limits, read and changed at run time (`GET`/`PUT`/`DELETE
/v1/admin/tenants/{tenant}/queue-policy`).

A change is stored (`queue_policies`), then announced on the `POLICY` wake-up
topic, which reaches every process's queue when wake-ups go through Redis;
each queue reads the table again at its next lease (and every few seconds
regardless). Who may call this is the transport's to decide: operators only.
"""

from __future__ import annotations

from datetime import datetime

import msgspec

from ductor_server.engine.fairness import FairPolicy, TenantPolicy
from ductor_server.engine.queue import Topic
from ductor_server.errors import RequestInvalid
from ductor_server.services.context import ServiceContext
from ductor_server.services.idempotency import Answer, Outcome
from ductor_server.storage.queuepolicies import (
    all_queue_policies,
    delete_queue_policy,
    get_queue_policy,
    put_queue_policy,
)

MAX_TENANT_ID = 200
"""The longest tenant id a policy may name."""


class QueuePolicyView(msgspec.Struct, frozen=True, kw_only=True):
    """A tenant's policy in the queue as it applies now.

    Attributes:
        tenant: whose it is.
        policy: the policy (every field, defaults included).
        source: where it comes from: "operator" (set through this API), "settings"
            (named in `DUCTOR_FAIRNESS`) or "default" (the settings' default).
        updated_at: when an operator last set it (None unless `source` is "operator").
    """

    tenant: str
    policy: TenantPolicy
    source: str
    updated_at: datetime | None = None


class QueuePoliciesView(msgspec.Struct, frozen=True, kw_only=True):
    """Every policy operators set, and the settings' default and headroom."""

    default: TenantPolicy
    headroom: float
    tenants: list[QueuePolicyView]


class QueueService:
    """Operators' view and control of the fair queue's per-tenant policies.

    Args:
        context: the store, clock and wake-ups.
        base: the settings' policy (`DUCTOR_FAIRNESS`), under the operators' changes.
    """

    def __init__(self, context: ServiceContext, *, base: FairPolicy | None = None) -> None:
        self._context = context
        self.base = base or FairPolicy()

    async def get_policy(self, tenant: str) -> QueuePolicyView:
        """The policy `tenant`'s tasks are scheduled by now.

        Raises:
            RequestInvalid: the tenant id cannot be one.
        """
        _check_tenant(tenant)
        async with self._context.store.transaction() as tx:
            stored = await get_queue_policy(tx, tenant)
        if stored is not None:
            policy = msgspec.convert(stored.policy, TenantPolicy)
            return QueuePolicyView(
                tenant=tenant, policy=policy, source="operator", updated_at=stored.updated_at
            )
        return self._settings_view(tenant)

    async def list_policies(self) -> QueuePoliciesView:
        """The settings' default and every policy an operator set, by tenant."""
        async with self._context.store.transaction() as tx:
            stored = await all_queue_policies(tx)
        return QueuePoliciesView(
            default=self.base.default,
            headroom=self.base.headroom,
            tenants=[
                QueuePolicyView(
                    tenant=row.tenant_id,
                    policy=msgspec.convert(row.policy, TenantPolicy),
                    source="operator",
                    updated_at=row.updated_at,
                )
                for row in stored
            ],
        )

    async def put_policy(self, tenant: str, policy: TenantPolicy) -> Answer[QueuePolicyView]:
        """Schedule `tenant` by `policy` from now on, in every process (`CREATED`
        when an operator had set none, else `OK`).

        Raises:
            RequestInvalid: the tenant id cannot be one, or the policy cannot work
                (`details.problems` names each problem with its JSON pointer).
        """
        _check_tenant(tenant)
        problems = policy.problems()
        if problems:
            where, what = problems[0]
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise RequestInvalid(
                f"{where}: {what}{more}",
                details={
                    "pointer": where,
                    "problems": [{"pointer": p, "message": m} for p, m in problems],
                },
            )
        now = self._context.clock.now()
        async with self._context.store.transaction() as tx:
            created = await put_queue_policy(tx, tenant, msgspec.to_builtins(policy), now=now)
        self._announce()
        view = QueuePolicyView(tenant=tenant, policy=policy, source="operator", updated_at=now)
        return Answer(view, Outcome.CREATED if created else Outcome.OK)

    async def delete_policy(self, tenant: str) -> QueuePolicyView:
        """Forget the policy an operator set for `tenant`: the settings' applies
        again. Returns it.

        Raises:
            RequestInvalid: the tenant id cannot be one.
        """
        _check_tenant(tenant)
        async with self._context.store.transaction() as tx:
            deleted = await delete_queue_policy(tx, tenant)
        if deleted:
            self._announce()
        return self._settings_view(tenant)

    def _settings_view(self, tenant: str) -> QueuePolicyView:
        named = tenant in self.base.tenants
        return QueuePolicyView(
            tenant=tenant,
            policy=self.base.of(tenant),
            source="settings" if named else "default",
        )

    def _announce(self) -> None:
        # Every queue reads the policies again; a raised limit may let tasks start.
        self._context.wake.notify(Topic.POLICY)
        self._context.wake.notify(Topic.TASKS)


def _check_tenant(tenant: str) -> None:
    if not tenant or len(tenant) > MAX_TENANT_ID or not tenant.isprintable() or "\t" in tenant:
        raise RequestInvalid(
            f"a tenant id is 1 to {MAX_TENANT_ID} printable characters",
            details={"pointer": "tenant"},
        )


__all__ = ["MAX_TENANT_ID", "QueuePoliciesView", "QueuePolicyView", "QueueService"]
