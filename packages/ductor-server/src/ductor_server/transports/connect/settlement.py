"""`LedgerService`, `MeteringService`, `ReceiptService` and `WalletService`: the
methods of `/v1/accounts`, `/v1/ledger/entries`, `/v1/holds`, `/v1/meters`,
`/v1/usage`, `/v1/budgets`, `/v1/plans`, `/v1/plan`, `/v1/receipts` and
`/v1/topups`, each calling the service function its REST route calls."""

from __future__ import annotations

from typing import Annotated

import msgspec

from ductor_server.errors import RequestInvalid
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
)
from ductor_server.services.metering import (
    BudgetBody,
    BudgetView,
    MeterBody,
    MeterView,
    PlanAssignBody,
    PlanAssignmentView,
    PlanBody,
    PlanView,
    UsageBody,
    UsageRecorded,
    UsageView,
)
from ductor_server.services.receipts import ReceiptPageView, ReceiptView
from ductor_server.services.wallets import TopUpBody, TopUpView
from ductor_server.transports.connect.method import (
    Cursor,
    Empty,
    Id,
    Limit500,
    Limit1000,
    Method,
    Req,
    method,
)
from ductor_server.transports.rest.metering import usage_time, usage_window


class AccountRequest(Req, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One ledger account."""

    code: Id


class ListEntriesRequest(Req, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Journal entries newest first, of one account or all."""

    account: str | None = None
    cursor: Cursor | None = None
    limit: Limit500 = 50


class EntryRequest(Req, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One journal entry."""

    entry_id: Id


class ListHoldsRequest(Req, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Holds, of one status or all."""

    status: str | None = None
    limit: Limit500 = 50


class HoldRequest(Req, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One hold."""

    hold_id: Id


class PostHoldRequest(HoldPostBody, frozen=True, kw_only=True):
    """Post a hold for `amount` (all of it when absent)."""

    hold_id: Id


class MeterRequest(Req, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One meter."""

    name: Id


class ReadUsageRequest(Req, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Usage counters of one window kind whose window starts in [`from`, `to`)."""

    meter: Annotated[str, msgspec.Meta(max_length=64)] | None = None
    window: Annotated[str, msgspec.Meta(max_length=16)] = "day"
    start: Annotated[str, msgspec.Meta(max_length=64)] | None = msgspec.field(
        default=None, name="from"
    )
    to: Annotated[str, msgspec.Meta(max_length=64)] | None = None
    limit: Limit1000 = 500


class BudgetRequest(Req, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The budget of one meter."""

    meter: Id


def _budget_meter(body: BudgetBody) -> str:
    """The meter a `PutBudget` names (REST takes it from the path).

    Raises:
        RequestInvalid: no `meter`.
    """
    if body.meter is None:
        raise RequestInvalid(
            "invalid request body at $.meter: Object missing required field `meter`",
            details={"path": "$.meter", "reason": "Object missing required field `meter`"},
        )
    return body.meter


class PlanRequest(Req, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One plan."""

    plan_id: Id


class ListReceiptsRequest(Req, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Receipts newest first, of one subject (`run:ID`) or kind, paged by cursor."""

    subject: str | None = None
    kind: str | None = None
    cursor: Cursor | None = None
    limit: Limit500 = 50


class ReceiptRequest(Req, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One signed receipt."""

    receipt_id: Id


class ListTopUpsRequest(Req, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Top-ups newest first, of one account or all."""

    account: str | None = None
    limit: Limit500 = 50


class TopUpRequest(Req, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One top-up."""

    topup_id: Id


LEDGER = "LedgerService"
METERING = "MeteringService"
RECEIPTS = "ReceiptService"
WALLETS = "WalletService"

METHODS: tuple[Method, ...] = (
    method(
        LEDGER,
        "OpenAccount",
        AccountBody,
        AccountView,
        lambda s, t, r, k: s.ledger.open_account(t, r, idempotency_key=k),
        rest="POST /v1/accounts",
        mutates=True,
        doc="Open an account at zero (or find the same account open).",
    ),
    method(
        LEDGER,
        "ListAccounts",
        Empty,
        list[AccountView],
        lambda s, t, r, k: s.ledger.list_accounts(t),
        rest="GET /v1/accounts",
        doc="Every account with its balances, by code.",
    ),
    method(
        LEDGER,
        "GetAccount",
        AccountRequest,
        AccountView,
        lambda s, t, r, k: s.ledger.get_account(t, r.code),
        rest="GET /v1/accounts/{code}",
        doc="One account with its balances.",
    ),
    method(
        LEDGER,
        "PostEntry",
        EntryBody,
        EntryView,
        lambda s, t, r, k: s.ledger.post_entry(t, r, idempotency_key=k),
        rest="POST /v1/ledger/entries",
        mutates=True,
        doc="Post a balanced journal entry.",
    ),
    method(
        LEDGER,
        "PostEntries",
        EntryBatchBody,
        EntryBatchView,
        lambda s, t, r, k: s.ledger.post_entries(t, r, idempotency_key=k),
        rest="POST /v1/ledger/entries/batch",
        mutates=True,
        doc="Post many entries in one transaction, all or none.",
    ),
    method(
        LEDGER,
        "ListEntries",
        ListEntriesRequest,
        EntryPageView,
        lambda s, t, r, k: s.ledger.list_entries(
            t, account=r.account, cursor=r.cursor, limit=r.limit
        ),
        rest="GET /v1/ledger/entries",
        doc="Entries newest first, of one account or all.",
    ),
    method(
        LEDGER,
        "GetEntry",
        EntryRequest,
        EntryView,
        lambda s, t, r, k: s.ledger.get_entry(t, r.entry_id),
        rest="GET /v1/ledger/entries/{entry_id}",
        doc="One entry with its postings.",
    ),
    method(
        LEDGER,
        "PlaceHold",
        HoldBody,
        HoldView,
        lambda s, t, r, k: s.ledger.place_hold(t, r, idempotency_key=k),
        rest="POST /v1/holds",
        mutates=True,
        doc="Reserve an amount (two-phase: post or void it later).",
    ),
    method(
        LEDGER,
        "ListHolds",
        ListHoldsRequest,
        list[HoldView],
        lambda s, t, r, k: s.ledger.list_holds(t, status=r.status, limit=r.limit),
        rest="GET /v1/holds",
        doc="Holds, of one status or all.",
    ),
    method(
        LEDGER,
        "GetHold",
        HoldRequest,
        HoldView,
        lambda s, t, r, k: s.ledger.get_hold(t, r.hold_id),
        rest="GET /v1/holds/{hold_id}",
        doc="One hold.",
    ),
    method(
        LEDGER,
        "PostHold",
        PostHoldRequest,
        HoldPosted,
        lambda s, t, r, k: s.ledger.post_hold(t, r.hold_id, r.amount, idempotency_key=k),
        rest="POST /v1/holds/{hold_id}/post",
        mutates=True,
        doc="Post a hold (all of it, or `amount`) and release the rest.",
    ),
    method(
        LEDGER,
        "VoidHold",
        HoldRequest,
        HoldView,
        lambda s, t, r, k: s.ledger.void_hold(t, r.hold_id, idempotency_key=k),
        rest="POST /v1/holds/{hold_id}/void",
        mutates=True,
        doc="Release a hold whole.",
    ),
    method(
        METERING,
        "CreateMeter",
        MeterBody,
        MeterView,
        lambda s, t, r, k: s.metering.create_meter(t, r, idempotency_key=k),
        rest="POST /v1/meters",
        mutates=True,
        doc="Create a meter (or find the same one).",
    ),
    method(
        METERING,
        "ListMeters",
        Empty,
        list[MeterView],
        lambda s, t, r, k: s.metering.list_meters(t),
        rest="GET /v1/meters",
        doc="Every meter of the tenant.",
    ),
    method(
        METERING,
        "GetMeter",
        MeterRequest,
        MeterView,
        lambda s, t, r, k: s.metering.get_meter(t, r.name),
        rest="GET /v1/meters/{name}",
        doc="One meter.",
    ),
    method(
        METERING,
        "ReadUsage",
        ReadUsageRequest,
        list[UsageView],
        lambda s, t, r, k: s.metering.usage(
            t,
            meter=r.meter,
            window=usage_window(r.window),
            start=usage_time("from", r.start),
            end=usage_time("to", r.to),
            limit=r.limit,
        ),
        rest="GET /v1/usage",
        doc="Usage counters of one window kind, oldest first.",
    ),
    method(
        METERING,
        "RecordUsage",
        UsageBody,
        UsageRecorded,
        lambda s, t, r, k: s.metering.record_usage(t, r, idempotency_key=k),
        rest="POST /v1/usage",
        mutates=True,
        doc="Record usage of a meter (refused past a blocking budget).",
    ),
    method(
        METERING,
        "CreateBudget",
        BudgetBody,
        BudgetView,
        lambda s, t, r, k: s.metering.create_budget(t, r, idempotency_key=k),
        rest="POST /v1/budgets",
        mutates=True,
        doc="Create a budget on a meter (or find the same one).",
    ),
    method(
        METERING,
        "ListBudgets",
        Empty,
        list[BudgetView],
        lambda s, t, r, k: s.metering.list_budgets(t),
        rest="GET /v1/budgets",
        doc="Every budget of the tenant.",
    ),
    method(
        METERING,
        "GetBudget",
        BudgetRequest,
        BudgetView,
        lambda s, t, r, k: s.metering.get_budget(t, r.meter),
        rest="GET /v1/budgets/{meter}",
        doc="The budget of one meter.",
    ),
    method(
        METERING,
        "PutBudget",
        BudgetBody,
        BudgetView,
        lambda s, t, r, k: s.metering.put_budget(t, _budget_meter(r), r, idempotency_key=k),
        rest="PUT /v1/budgets/{meter}",
        mutates=True,
        doc="Replace the budget of a meter.",
    ),
    method(
        METERING,
        "DeleteBudget",
        BudgetRequest,
        None,
        lambda s, t, r, k: s.metering.delete_budget(t, r.meter),
        rest="DELETE /v1/budgets/{meter}",
        doc="Delete the budget of a meter.",
    ),
    method(
        METERING,
        "CreatePlan",
        PlanBody,
        PlanView,
        lambda s, t, r, k: s.metering.create_plan(t, r, idempotency_key=k),
        rest="POST /v1/plans",
        mutates=True,
        doc="Create a plan (or find the same one).",
    ),
    method(
        METERING,
        "ListPlans",
        Empty,
        list[PlanView],
        lambda s, t, r, k: s.metering.list_plans(t),
        rest="GET /v1/plans",
        doc="Every plan of the tenant.",
    ),
    method(
        METERING,
        "GetPlan",
        PlanRequest,
        PlanView,
        lambda s, t, r, k: s.metering.get_plan(t, r.plan_id),
        rest="GET /v1/plans/{plan_id}",
        doc="One plan.",
    ),
    method(
        METERING,
        "GetAssignedPlan",
        Empty,
        PlanAssignmentView,
        lambda s, t, r, k: s.metering.assigned_plan(t),
        rest="GET /v1/plan",
        doc="The tenant's plan and its entitlements.",
    ),
    method(
        METERING,
        "AssignPlan",
        PlanAssignBody,
        PlanAssignmentView,
        lambda s, t, r, k: s.metering.assign_plan(t, r, idempotency_key=k),
        rest="PUT /v1/plan",
        mutates=True,
        doc="Put the tenant on a plan.",
    ),
    method(
        RECEIPTS,
        "ListReceipts",
        ListReceiptsRequest,
        ReceiptPageView,
        lambda s, t, r, k: s.receipts.list(
            t, subject=r.subject, kind=r.kind, cursor=r.cursor, limit=r.limit
        ),
        rest="GET /v1/receipts",
        doc="Signed receipts newest first.",
    ),
    method(
        RECEIPTS,
        "GetReceipt",
        ReceiptRequest,
        ReceiptView,
        lambda s, t, r, k: s.receipts.get(t, r.receipt_id),
        rest="GET /v1/receipts/{receipt_id}",
        doc="One signed receipt.",
    ),
    method(
        WALLETS,
        "StartTopUp",
        TopUpBody,
        TopUpView,
        lambda s, t, r, k: s.wallets.start_topup(t, r, idempotency_key=k),
        rest="POST /v1/topups",
        mutates=True,
        doc="Start a wallet top-up through the payment processor.",
    ),
    method(
        WALLETS,
        "ListTopUps",
        ListTopUpsRequest,
        list[TopUpView],
        lambda s, t, r, k: s.wallets.list_topups(t, account=r.account, limit=r.limit),
        rest="GET /v1/topups",
        doc="Top-ups newest first, of one account or all.",
    ),
    method(
        WALLETS,
        "GetTopUp",
        TopUpRequest,
        TopUpView,
        lambda s, t, r, k: s.wallets.get_topup(t, r.topup_id),
        rest="GET /v1/topups/{topup_id}",
        doc="One top-up.",
    ),
)
"""The methods of the ledger, metering, receipt and wallet services."""


__all__ = ["LEDGER", "METERING", "METHODS", "RECEIPTS", "WALLETS"]
