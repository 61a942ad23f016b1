"""The service layer every transport calls: one module per area, transport-neutral.

Each service speaks in tenants, view structs and `ServerError`s. A mutating
operation takes an optional idempotency key and records it in the transaction
of its effect (see `services.idempotency`), and answers with an `Answer`
(its value, what it did, and whether it was replayed). The composition root
(`ductor_server.composition`) builds one `Services` per process.
"""

from __future__ import annotations

from dataclasses import dataclass

from ductor_server.services.agent import AgentService
from ductor_server.services.ai import AiService
from ductor_server.services.bridge import AppView, BridgeService
from ductor_server.services.connections import ConnectionsService
from ductor_server.services.context import ServiceContext
from ductor_server.services.events import EventAccepted, EventsService
from ductor_server.services.idempotency import Answer, Outcome
from ductor_server.services.inbox import InboxService
from ductor_server.services.keys import KeysService
from ductor_server.services.ledger import LedgerService
from ductor_server.services.metering import MeteringService
from ductor_server.services.queue import QueuePoliciesView, QueuePolicyView, QueueService
from ductor_server.services.receipts import ReceiptService
from ductor_server.services.routing import (
    AssignmentView,
    DecisionView,
    RoutingService,
    RuleSetVersion,
    RuleSetView,
    ShadowReportView,
)
from ductor_server.services.runs import (
    HistoryEntry,
    ItemView,
    RunPage,
    RunsService,
    RunSummary,
    RunView,
    SignalAccepted,
    StepView,
    parse_run_status,
    run_view,
)
from ductor_server.services.tenants import TenantsService
from ductor_server.services.wallets import WalletService
from ductor_server.services.workflows import (
    PublishedWorkflow,
    VersionInfo,
    WorkflowFamilyView,
    WorkflowsService,
    WorkflowSummary,
    WorkflowVersionView,
)


@dataclass(frozen=True, kw_only=True)
class Services:
    """Every service of one process, by area; what transports are given."""

    workflows: WorkflowsService
    runs: RunsService
    events: EventsService
    routing: RoutingService
    bridge: BridgeService
    keys: KeysService
    ledger: LedgerService
    wallets: WalletService
    receipts: ReceiptService
    metering: MeteringService
    connections: ConnectionsService
    inbox: InboxService
    ai: AiService
    agent: AgentService
    tenants: TenantsService
    queue: QueueService


__all__ = [
    "AgentService",
    "AiService",
    "Answer",
    "AppView",
    "AssignmentView",
    "BridgeService",
    "ConnectionsService",
    "DecisionView",
    "EventAccepted",
    "EventsService",
    "HistoryEntry",
    "InboxService",
    "ItemView",
    "KeysService",
    "LedgerService",
    "MeteringService",
    "Outcome",
    "PublishedWorkflow",
    "QueuePoliciesView",
    "QueuePolicyView",
    "QueueService",
    "ReceiptService",
    "RoutingService",
    "RuleSetVersion",
    "RuleSetView",
    "RunPage",
    "RunSummary",
    "RunView",
    "RunsService",
    "ServiceContext",
    "Services",
    "ShadowReportView",
    "SignalAccepted",
    "StepView",
    "TenantsService",
    "VersionInfo",
    "WalletService",
    "WorkflowFamilyView",
    "WorkflowSummary",
    "WorkflowVersionView",
    "WorkflowsService",
    "parse_run_status",
    "run_view",
]
