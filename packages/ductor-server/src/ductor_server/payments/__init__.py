"""Payment processors that fund wallets: the port the wallet service calls, and money units.

A processor takes a top-up as a payment (`PaymentGateway.create_payment`), and
later tells, through a signed webhook, whether it was paid
(`PaymentGateway.read_event`). The only processor is Stripe
(`ductor_server.payments.stripe`, the optional `stripe` extra). Amounts cross
this port in the processor's minor units (cents); the ledger speaks micros, and
`micros_per_minor_unit` converts. No ledger and no HTTP framework here.
"""

from __future__ import annotations

import enum
from typing import Protocol

import msgspec

from ductor_server.errors import ServerError

# Stripe's currencies with no minor unit, and those with three decimals.
_ZERO_DECIMAL = frozenset(
    [
        "BIF",
        "CLP",
        "DJF",
        "GNF",
        "JPY",
        "KMF",
        "KRW",
        "MGA",
        "PYG",
        "RWF",
        "UGX",
        "VND",
        "VUV",
        "XAF",
        "XOF",
        "XPF",
    ]
)
_THREE_DECIMAL = frozenset({"BHD", "JOD", "KWD", "OMR", "TND"})


def micros_per_minor_unit(currency: str) -> int | None:
    """How many ledger micros one minor unit of `currency` is (10,000 for a cent);
    None when `currency` is not a three-letter ISO code."""
    code = currency.upper()
    if len(code) != 3 or not code.isascii() or not code.isalpha():
        return None
    if code in _ZERO_DECIMAL:
        return 1_000_000
    if code in _THREE_DECIMAL:
        return 1_000
    return 10_000


class PaymentStatus(enum.StrEnum):
    """What a processor says became of a payment."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    OTHER = "other"


class CreatedPayment(msgspec.Struct, frozen=True, kw_only=True):
    """A payment the processor opened: its id and what the payer's client needs."""

    id: str
    client_secret: str | None = None


class PaymentEvent(msgspec.Struct, frozen=True, kw_only=True):
    """One verified webhook event about a payment.

    Attributes:
        id: the processor's event id.
        kind: the processor's event type (``payment_intent.succeeded`` ...).
        status: what it means for the payment.
        payment_id: the payment it is about ("" when it is about none).
        amount: the amount received, in minor units (0 unless it succeeded).
        currency: the payment's currency, upper case.
        metadata: what Ductor attached to the payment when it created it.
    """

    id: str
    kind: str
    status: PaymentStatus
    payment_id: str = ""
    amount: int = 0
    currency: str = ""
    metadata: dict[str, str] = msgspec.field(default_factory=dict)


class PaymentSignatureInvalid(ServerError):
    """A webhook whose signature does not verify (or that cannot be read)."""

    code = "webhook.signature_invalid"


class PaymentProcessorError(ServerError):
    """The processor refused or failed a call; retryable when it was unreachable."""

    code = "wallet.processor_error"


class PaymentGateway(Protocol):
    """A payment processor, as the wallet service uses it."""

    name: str
    """The processor's name, stored with each top-up ("stripe")."""

    async def create_payment(
        self,
        *,
        amount: int,
        currency: str,
        description: str,
        metadata: dict[str, str],
        idempotency_key: str,
    ) -> CreatedPayment:
        """Open a payment of `amount` minor units; the same key opens it once.

        Raises:
            PaymentProcessorError: the processor refused or could not be reached.
        """
        ...

    def read_event(self, payload: bytes, signature: str | None) -> PaymentEvent:
        """The event a webhook carries, once its signature verifies.

        Raises:
            PaymentSignatureInvalid: a missing, wrong or stale signature, or a payload
                that is not an event.
        """
        ...


__all__ = [
    "CreatedPayment",
    "PaymentEvent",
    "PaymentGateway",
    "PaymentProcessorError",
    "PaymentSignatureInvalid",
    "PaymentStatus",
    "micros_per_minor_unit",
]
