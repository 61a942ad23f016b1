"""Ledger resources: `/v1/accounts`, `/v1/ledger/entries`, `/v1/holds`. Thin handlers
over `LedgerService`.

Every mutating call accepts an `Idempotency-Key`; another tenant's objects are 404.
"""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Controller, Request, Response, get, post
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath, FromQuery, JSONBody, QueryParameter

from ductor_server.services.ledger import (
    AccountBody,
    AccountView,
    EntryBatchBody,
    EntryBatchView,
    EntryBody,
    EntryPageView,
    EntryView,
    HoldBody,
    HoldPostBody,
    HoldPosted,
    HoldView,
    LedgerService,
)
from ductor_server.transports.rest.bodies import (
    NO_BODY,
    EmptyBody,
    NoBody,
    OptionalBody,
    or_default,
    path_id,
    required,
)
from ductor_server.transports.rest.dependencies import services_of
from ductor_server.transports.rest.errors import V1_ERRORS, also_ok
from ductor_server.transports.rest.idempotency import IdempotencyKey, answered, checked_key


def provide_ledger(request: Request[Any, Any, Any]) -> LedgerService:
    """The ledger service."""
    return services_of(request).ledger


_LEDGER = {"ledger": Provide(provide_ledger, sync_to_thread=False)}


class AccountsController(Controller):
    """Ledger accounts: open them, read their balances."""

    path = "/v1/accounts"
    tags = ("ledger",)
    dependencies = _LEDGER

    @post(
        "/",
        status_code=201,
        responses=also_ok(AccountView, "The same account was already open"),
    )
    async def open_account(
        self,
        tenant_id: NamedDependency[str],
        ledger: NamedDependency[LedgerService],
        data: JSONBody[AccountBody | NoBody] = NO_BODY,
        idempotency_key: IdempotencyKey = None,
    ) -> Response[AccountView]:
        """Open an account at zero (201); the same account again is 200, another one
        under the same code 409 `ledger.account_conflict`."""
        body = required(data)
        key = checked_key(idempotency_key)
        return answered(await ledger.open_account(tenant_id, body, idempotency_key=key))

    @get("/", responses=V1_ERRORS)
    async def list_accounts(
        self, tenant_id: NamedDependency[str], ledger: NamedDependency[LedgerService]
    ) -> list[AccountView]:
        """Every account, by code, with `balance`, `pending` and `available`."""
        return await ledger.list_accounts(tenant_id)

    # `path`, not `str`: a code may hold a `/` (a member's wallet is named after its
    # worker id; see `path_id`).
    @get("/{code:path}", responses=V1_ERRORS)
    async def get_account(
        self,
        code: FromPath[str],
        tenant_id: NamedDependency[str],
        ledger: NamedDependency[LedgerService],
        request: Request[Any, Any, Any],
    ) -> AccountView:
        """One account with `balance`, `pending` and `available` (micros, normal direction)."""
        return await ledger.get_account(tenant_id, path_id(request, "code"))


class EntriesController(Controller):
    """Balanced journal entries: post them, read them."""

    path = "/v1/ledger/entries"
    tags = ("ledger",)
    dependencies = _LEDGER

    @post("/", status_code=201, responses=V1_ERRORS)
    async def post_entry(
        self,
        tenant_id: NamedDependency[str],
        ledger: NamedDependency[LedgerService],
        data: JSONBody[EntryBody | NoBody] = NO_BODY,
        idempotency_key: IdempotencyKey = None,
    ) -> Response[EntryView]:
        """Record an entry of two or more postings netting to zero per currency (201);
        422 `ledger.*` lists every problem."""
        body = required(data)
        key = checked_key(idempotency_key)
        return answered(await ledger.post_entry(tenant_id, body, idempotency_key=key))

    @post("/batch", status_code=201, responses=V1_ERRORS)
    async def post_entries(
        self,
        tenant_id: NamedDependency[str],
        ledger: NamedDependency[LedgerService],
        data: JSONBody[EntryBatchBody | NoBody] = NO_BODY,
        idempotency_key: IdempotencyKey = None,
    ) -> Response[EntryBatchView]:
        """Record up to 1,000 entries in one transaction, all or none (201); each may
        carry its own idempotency `key`; a refusal lists every problem with the
        `pointer` of its entry."""
        body = required(data)
        key = checked_key(idempotency_key)
        return answered(await ledger.post_entries(tenant_id, body, idempotency_key=key))

    @get("/", responses=V1_ERRORS)
    async def list_entries(
        self,
        tenant_id: NamedDependency[str],
        ledger: NamedDependency[LedgerService],
        account: FromQuery[str | None] = None,
        cursor: FromQuery[str | None] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=500)] = 50,
    ) -> EntryPageView:
        """Entries newest first; `account` keeps those posting to it, `cursor` pages."""
        return await ledger.list_entries(tenant_id, account=account, cursor=cursor, limit=limit)

    @get("/{entry_id:str}", responses=V1_ERRORS)
    async def get_entry(
        self,
        entry_id: FromPath[str],
        tenant_id: NamedDependency[str],
        ledger: NamedDependency[LedgerService],
    ) -> EntryView:
        """One entry with its postings."""
        return await ledger.get_entry(tenant_id, entry_id)


class HoldsController(Controller):
    """Two-phase holds: reserve funds, then post (all or part) or void; they expire."""

    path = "/v1/holds"
    tags = ("ledger",)
    dependencies = _LEDGER

    @post("/", status_code=201, responses=also_ok(HoldView, "The same hold was already placed"))
    async def place_hold(
        self,
        tenant_id: NamedDependency[str],
        ledger: NamedDependency[LedgerService],
        data: JSONBody[HoldBody | NoBody] = NO_BODY,
        idempotency_key: IdempotencyKey = None,
    ) -> Response[HoldView]:
        """Reserve `amount` from `debit_account` to `credit_account` until it expires (201);
        422 `ledger.floor_crossed` when the funds are not available."""
        body = required(data)
        key = checked_key(idempotency_key)
        return answered(await ledger.place_hold(tenant_id, body, idempotency_key=key))

    @get("/", responses=V1_ERRORS)
    async def list_holds(
        self,
        tenant_id: NamedDependency[str],
        ledger: NamedDependency[LedgerService],
        status: FromQuery[str | None] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=500)] = 50,
    ) -> list[HoldView]:
        """Holds newest first, optionally of one `status`."""
        return await ledger.list_holds(tenant_id, status=status, limit=limit)

    @get("/{hold_id:str}", responses=V1_ERRORS)
    async def get_hold(
        self,
        hold_id: FromPath[str],
        tenant_id: NamedDependency[str],
        ledger: NamedDependency[LedgerService],
    ) -> HoldView:
        """One hold (a pending hold past its expiry is marked `expired`)."""
        return await ledger.get_hold(tenant_id, hold_id)

    @post(
        "/{hold_id:str}/post",
        status_code=200,
        responses=V1_ERRORS,
        operation_class=OptionalBody,
    )
    async def post_hold(
        self,
        hold_id: FromPath[str],
        tenant_id: NamedDependency[str],
        ledger: NamedDependency[LedgerService],
        data: JSONBody[HoldPostBody | NoBody] = NO_BODY,
        idempotency_key: IdempotencyKey = None,
    ) -> Response[HoldPosted]:
        """Post the hold for `amount` (all of it without a body) and release the rest;
        answers the hold and the entry written."""
        body = or_default(data, HoldPostBody())
        key = checked_key(idempotency_key)
        return answered(
            await ledger.post_hold(tenant_id, hold_id, body.amount, idempotency_key=key)
        )

    @post("/{hold_id:str}/void", status_code=200, responses=V1_ERRORS)
    async def void_hold(
        self,
        hold_id: FromPath[str],
        tenant_id: NamedDependency[str],
        ledger: NamedDependency[LedgerService],
        data: JSONBody[EmptyBody | NoBody] = NO_BODY,
        idempotency_key: IdempotencyKey = None,
    ) -> Response[HoldView]:
        """Void the hold: nothing moves, the reservation is released. It takes no
        body (`{}` at most)."""
        key = checked_key(idempotency_key)
        return answered(await ledger.void_hold(tenant_id, hold_id, idempotency_key=key))


LEDGER_CONTROLLERS = (AccountsController, EntriesController, HoldsController)
"""The ledger's controllers, in the order they are served."""

__all__ = [
    "LEDGER_CONTROLLERS",
    "AccountsController",
    "EntriesController",
    "HoldsController",
    "provide_ledger",
]
