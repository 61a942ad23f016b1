"""The REST transport (Litestar): controllers, auth, bodies, the error table. Thin
handlers over `ductor_server.services`; `ductor_server.app` assembles them."""

from __future__ import annotations

from ductor_server.transports.rest.admin import ADMIN_ROUTER
from ductor_server.transports.rest.agent import AgentController
from ductor_server.transports.rest.ai import AiController
from ductor_server.transports.rest.bridge import BridgeController
from ductor_server.transports.rest.connections import CONNECTION_CONTROLLERS
from ductor_server.transports.rest.errors import STATUS_BY_CODE, ErrorBody, status_for
from ductor_server.transports.rest.events import EventsController
from ductor_server.transports.rest.extensions import ExtensionsController
from ductor_server.transports.rest.health import healthz, readyz
from ductor_server.transports.rest.inbox import PUBLIC_HANDLERS as INBOX_PUBLIC
from ductor_server.transports.rest.inbox import InboxController
from ductor_server.transports.rest.keys import OPERATOR_CONTROLLERS, KeysController
from ductor_server.transports.rest.ledger import LEDGER_CONTROLLERS
from ductor_server.transports.rest.metering import METERING_CONTROLLERS
from ductor_server.transports.rest.receipts import ReceiptsController, receipt_keys
from ductor_server.transports.rest.routing import ROUTING_CONTROLLERS
from ductor_server.transports.rest.runs import RunsController
from ductor_server.transports.rest.wallets import PUBLIC_HANDLERS, WALLET_CONTROLLERS
from ductor_server.transports.rest.workflows import WorkflowsController

V1_CONTROLLERS = (
    WorkflowsController,
    RunsController,
    EventsController,
    *ROUTING_CONTROLLERS,
    BridgeController,
    *LEDGER_CONTROLLERS,
    *WALLET_CONTROLLERS,
    ReceiptsController,
    *METERING_CONTROLLERS,
    ExtensionsController,
    *CONNECTION_CONTROLLERS,
    InboxController,
    AiController,
    AgentController,
    KeysController,
)
"""Every controller served under /v1 to a tenant's API key."""

PUBLIC_ROUTES = (*PUBLIC_HANDLERS, *INBOX_PUBLIC, ADMIN_ROUTER)
"""Routes the API role serves without a tenant's API key: each checks its own
signature (or, for a subscriber's inbox, its subscriber token; for an
operator's call, the operator key)."""

__all__ = [
    "OPERATOR_CONTROLLERS",
    "PUBLIC_ROUTES",
    "STATUS_BY_CODE",
    "V1_CONTROLLERS",
    "BridgeController",
    "ErrorBody",
    "EventsController",
    "RunsController",
    "WorkflowsController",
    "healthz",
    "readyz",
    "receipt_keys",
    "status_for",
]
