"""Stripe as a `PaymentGateway`, through the official `stripe` client (the optional
`stripe` extra: ``pip install 'ductor-server[stripe]'``).

A top-up is a PaymentIntent whose metadata names the tenant, the top-up and the
wallet; Stripe's idempotency key makes a repeated create open it once. Webhooks
are verified with the endpoint's signing secret (`Stripe-Signature`, five
minutes of tolerance) by the client's own `construct_event`. Calls go through
the client's asynchronous HTTPX transport, so the event loop never blocks.
"""

from __future__ import annotations

from typing import Any

import msgspec
import stripe

from ductor_server.payments import (
    CreatedPayment,
    PaymentEvent,
    PaymentProcessorError,
    PaymentSignatureInvalid,
    PaymentStatus,
)

_SUCCEEDED = frozenset({"payment_intent.succeeded"})
_FAILED = frozenset({"payment_intent.payment_failed", "payment_intent.canceled"})

SIGNATURE_TOLERANCE = 300
"""Seconds a webhook's signed timestamp may lag behind the server's clock."""


class _Intent(msgspec.Struct, kw_only=True):
    id: str = ""
    object: str = ""
    amount_received: int = 0
    currency: str = ""
    metadata: dict[str, str] = msgspec.field(default_factory=dict)


class StripeGateway:
    """Top-ups as Stripe PaymentIntents; webhooks verified with the endpoint secret."""

    name = "stripe"

    def __init__(
        self,
        api_key: str,
        webhook_secret: str,
        *,
        api_base: str | None = None,
        timeout: float = 20.0,
    ) -> None:
        """Args:
        api_key: the secret API key (``sk_...``).
        webhook_secret: the webhook endpoint's signing secret (``whsec_...``).
        api_base: another API address than Stripe's (a test double on loopback).
        timeout: seconds one API call may take.
        """
        self._secret = webhook_secret
        self._client = stripe.StripeClient(
            api_key,
            http_client=stripe.HTTPXClient(timeout=timeout),
            base_addresses={"api": api_base} if api_base else None,
            max_network_retries=2,
        )

    async def create_payment(
        self,
        *,
        amount: int,
        currency: str,
        description: str,
        metadata: dict[str, str],
        idempotency_key: str,
    ) -> CreatedPayment:
        """Create the PaymentIntent of one top-up (once per `idempotency_key`).

        Raises:
            PaymentProcessorError: Stripe refused it (`wallet.processor_error`), or
                could not be reached or failed itself (`wallet.processor_unreachable`,
                retryable).
        """
        params: Any = {
            "amount": amount,
            "currency": currency.lower(),
            "description": description,
            "metadata": metadata,
            "automatic_payment_methods": {"enabled": True},
        }
        try:
            intent = await self._client.v1.payment_intents.create_async(
                params, {"idempotency_key": idempotency_key}
            )
        except (stripe.APIConnectionError, stripe.RateLimitError) as error:
            raise PaymentProcessorError(
                "Stripe could not be reached; try again",
                code="wallet.processor_unreachable",
                retryable=True,
            ) from error
        except stripe.StripeError as error:
            if error.http_status is None or error.http_status >= 500:
                raise PaymentProcessorError(
                    "Stripe failed to answer; try again",
                    code="wallet.processor_unreachable",
                    retryable=True,
                ) from error
            raise PaymentProcessorError(
                f"Stripe refused the payment: {error.user_message or error.code or 'error'}",
                details={"processor_code": error.code, "http_status": error.http_status},
            ) from error
        return CreatedPayment(id=intent.id, client_secret=intent.client_secret)

    def read_event(self, payload: bytes, signature: str | None) -> PaymentEvent:
        """The verified event of one webhook delivery.

        Raises:
            PaymentSignatureInvalid: no or a bad `Stripe-Signature`, a stale
                timestamp, or a body that is not a Stripe event.
        """
        if not signature:
            raise PaymentSignatureInvalid("missing Stripe-Signature header")
        try:
            event = self._client.construct_event(
                payload, signature, self._secret, tolerance=SIGNATURE_TOLERANCE
            )
        except stripe.SignatureVerificationError as error:
            raise PaymentSignatureInvalid(
                f"the Stripe-Signature does not verify: {error}"
            ) from error
        except ValueError as error:
            raise PaymentSignatureInvalid("the webhook body is not a Stripe event") from error
        kind = str(event.type)
        try:
            intent = msgspec.convert(event.data.object.to_dict(), _Intent)
        except (msgspec.ValidationError, AttributeError):
            intent = _Intent()
        if intent.object != "payment_intent":
            return PaymentEvent(id=event.id, kind=kind, status=PaymentStatus.OTHER)
        status = (
            PaymentStatus.SUCCEEDED
            if kind in _SUCCEEDED
            else PaymentStatus.FAILED
            if kind in _FAILED
            else PaymentStatus.OTHER
        )
        return PaymentEvent(
            id=event.id,
            kind=kind,
            status=status,
            payment_id=intent.id,
            amount=intent.amount_received if status is PaymentStatus.SUCCEEDED else 0,
            currency=intent.currency.upper(),
            metadata=intent.metadata,
        )


__all__ = ["SIGNATURE_TOLERANCE", "StripeGateway"]
