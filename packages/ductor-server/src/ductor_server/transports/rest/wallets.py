"""Wallet top-ups: `/v1/topups` (API key) and the processor's webhook
`POST /webhooks/stripe` (no API key: the `Stripe-Signature` proves it). Thin
handlers over `WalletService`.
"""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Controller, Request, Response, get, post
from litestar.di import NamedDependency, Provide
from litestar.openapi import ResponseSpec
from litestar.params import FromPath, FromQuery, JSONBody, QueryParameter

from ductor_server.services.wallets import TopUpBody, TopUpView, WalletService, WebhookAnswer
from ductor_server.transports.rest.bodies import NO_BODY, NoBody, required
from ductor_server.transports.rest.dependencies import services_of
from ductor_server.transports.rest.errors import V1_ERRORS, ErrorBody
from ductor_server.transports.rest.idempotency import IdempotencyKey, answered, checked_key


def provide_wallets(request: Request[Any, Any, Any]) -> WalletService:
    """The wallet service."""
    return services_of(request).wallets


_WALLETS = {"wallets": Provide(provide_wallets, sync_to_thread=False)}


class TopUpsController(Controller):
    """Fund wallets through the payment processor; credited when its webhook says paid."""

    path = "/v1/topups"
    tags = ("ledger",)
    dependencies = _WALLETS

    @post("/", status_code=201, responses=V1_ERRORS)
    async def start_topup(
        self,
        tenant_id: NamedDependency[str],
        wallets: NamedDependency[WalletService],
        data: JSONBody[TopUpBody | NoBody] = NO_BODY,
        idempotency_key: IdempotencyKey = None,
    ) -> Response[TopUpView]:
        """Open the processor's payment for `amount` micros into wallet `account` and
        answer the `pending` top-up with the payer's `client_secret` (201); 503
        `wallet.unavailable` when no processor is configured."""
        body = required(data)
        key = checked_key(idempotency_key)
        return answered(await wallets.start_topup(tenant_id, body, idempotency_key=key))

    @get("/", responses=V1_ERRORS)
    async def list_topups(
        self,
        tenant_id: NamedDependency[str],
        wallets: NamedDependency[WalletService],
        account: FromQuery[str | None] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=500)] = 50,
    ) -> list[TopUpView]:
        """Top-ups newest first, optionally of one wallet `account`."""
        return await wallets.list_topups(tenant_id, account=account, limit=limit)

    @get("/{topup_id:str}", responses=V1_ERRORS)
    async def get_topup(
        self,
        topup_id: FromPath[str],
        tenant_id: NamedDependency[str],
        wallets: NamedDependency[WalletService],
    ) -> TopUpView:
        """One top-up: `pending`, `credited` (with its ledger `entry_id`) or `failed`."""
        return await wallets.get_topup(tenant_id, topup_id)


@post(
    "/webhooks/stripe",
    status_code=200,
    tags=["ledger"],
    responses={
        400: ResponseSpec(
            data_container=ErrorBody,
            description="The Stripe-Signature does not verify (`webhook.signature_invalid`)",
        ),
        503: ResponseSpec(
            data_container=ErrorBody, description="No processor configured (`wallet.unavailable`)"
        ),
    },
)
async def stripe_webhook(request: Request[Any, Any, Any]) -> WebhookAnswer:
    """Stripe's webhook: a paid top-up is credited to its wallet once, however often
    the event is delivered; a failed one is marked failed. Signed by Stripe, not by
    an API key."""
    payload = await request.body()
    signature = request.headers.get("stripe-signature")
    return await services_of(request).wallets.handle_webhook(payload, signature)


WALLET_CONTROLLERS = (TopUpsController,)
"""The wallet controllers served under /v1 (with an API key)."""

PUBLIC_HANDLERS = (stripe_webhook,)
"""The wallet routes outside /v1, authenticated by their own signatures."""

__all__ = ["PUBLIC_HANDLERS", "WALLET_CONTROLLERS", "TopUpsController", "stripe_webhook"]
