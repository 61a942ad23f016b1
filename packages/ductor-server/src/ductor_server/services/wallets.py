"""Wallet top-ups through a payment processor (Stripe, experimental).

A top-up asks the processor for a payment of a wallet's currency and records it
`pending`; the payer completes it with the processor (the answer carries the
processor's client secret). The processor's signed webhook then says it was
paid, and the wallet is credited by one ledger entry: the processor's clearing
account (an asset, opened on first use as ``<processor>:clearing:<CURRENCY>``)
is debited and the wallet credited. The entry's key is the top-up's, so however
often (and however concurrently) the webhook is delivered, the wallet is
credited once. A failed or cancelled payment marks the top-up `failed` and moves
nothing.

The wallet must be an account whose balance grows on credit (a liability, as
buyer wallets are) in a currency the processor knows; the amount is in micros
and must be a whole number of the currency's minor units (a cent is 10,000).
"""

from __future__ import annotations

import hashlib
import uuid
from datetime import datetime

import msgspec

from ductor_server.engine.clock import Clock, SystemClock
from ductor_server.errors import RequestInvalid, ServerError
from ductor_server.ledger.errors import LedgerObjectNotFound
from ductor_server.ledger.store import LedgerTx
from ductor_server.ledger.topups import TopUp, TopUpStatus, TopUpTx
from ductor_server.payments import (
    PaymentEvent,
    PaymentGateway,
    PaymentStatus,
    micros_per_minor_unit,
)
from ductor_server.services.idempotency import Answer, Claim, Outcome, once
from ductor_server.services.ledger import AccountBody, EntryBody, LedgerService
from ductor_server.storage.protocol import Store, Tx
from ductor_settlement import AccountKind, NormalBalance, Posting, Reference, ReferenceKind

MAX_TOPUP_MINOR_UNITS = 99_999_999
"""The most one top-up may be, in minor units (Stripe's own limit for most currencies)."""

MAX_DESCRIPTION = 1000
"""The longest description a top-up may carry to the processor."""

MAX_PAGE = 500
"""The most top-ups one list answers."""

# Metadata keys Ductor puts on the processor's payment; the webhook reads them back.
_TENANT = "ductor_tenant"
_TOPUP = "ductor_topup"
_ACCOUNT = "ductor_account"

TOPUP_KEY_PREFIX = "topup:"
"""The ledger idempotency keys of top-up credits (`topup:<id>`), which callers may not use."""


class WalletUnavailable(ServerError):
    """No payment processor is configured on this server."""

    code = "wallet.unavailable"


class TopUpNotFound(LedgerObjectNotFound):
    """A top-up the tenant does not have."""

    def __init__(self, topup_id: str) -> None:
        super().__init__("topup", topup_id)


class TopUpBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/topups`: fund a wallet through the payment processor.

    Attributes:
        account: the wallet's account code; it must grow on credit.
        amount: micros, a whole number of the currency's minor units.
        description: shown by the processor to the payer.
    """

    account: str
    amount: int
    description: str = ""


class TopUpView(msgspec.Struct, frozen=True, kw_only=True):
    """A top-up: pending until the processor says it was paid, then credited or failed."""

    id: str
    account: str
    currency: str
    amount: int
    description: str
    status: TopUpStatus
    processor: str
    payment_id: str
    client_secret: str | None
    credited_amount: int
    entry_id: str | None
    created_at: datetime
    updated_at: datetime


class WebhookAnswer(msgspec.Struct, frozen=True, kw_only=True):
    """What a processor's webhook delivery did.

    Attributes:
        event: the processor's event id.
        handled: False for events about nothing Ductor created (answered 200 so the
            processor stops resending them).
        topup: the top-up it was about.
        status: that top-up's status afterwards.
    """

    event: str
    handled: bool
    topup: str | None = None
    status: TopUpStatus | None = None


def topup_view(topup: TopUp) -> TopUpView:
    """The API view of a stored top-up."""
    return TopUpView(
        id=topup.id,
        account=topup.account,
        currency=topup.currency,
        amount=topup.amount,
        description=topup.description,
        status=topup.status,
        processor=topup.processor,
        payment_id=topup.payment_id,
        client_secret=topup.client_secret,
        credited_amount=topup.credited_amount,
        entry_id=topup.entry_id,
        created_at=topup.created_at,
        updated_at=topup.updated_at,
    )


def _invalid(message: str, pointer: str, **details: object) -> RequestInvalid:
    return RequestInvalid(message, details={"pointer": pointer, **details})


class WalletService:
    """Top-ups of every tenant's wallets through one payment processor."""

    def __init__(
        self,
        store: Store,
        ledger: LedgerService,
        gateway: PaymentGateway | None,
        *,
        clock: Clock | None = None,
    ) -> None:
        self._store = store
        self._ledger = ledger
        self._gateway = gateway
        self._clock = clock or SystemClock()

    def _processor(self) -> PaymentGateway:
        if self._gateway is None:
            raise WalletUnavailable(
                "no payment processor is configured: set DUCTOR_STRIPE_API_KEY and"
                " DUCTOR_STRIPE_WEBHOOK_SECRET (and install the 'stripe' extra)"
            )
        return self._gateway

    async def start_topup(
        self, tenant_id: str, body: TopUpBody, *, idempotency_key: str | None = None
    ) -> Answer[TopUpView]:
        """Open the processor's payment for a top-up and record it `pending` (`CREATED`).

        With an Idempotency-Key the top-up id and the processor's own key derive
        from it, so a retry after any failure opens the same payment.

        Raises:
            WalletUnavailable: no processor is configured (503).
            LedgerObjectNotFound: the wallet account does not exist (404).
            RequestInvalid: an amount that is not positive, too large or not whole
                minor units; a wallet that does not grow on credit; a description
                over `MAX_DESCRIPTION` characters (422).
            PaymentProcessorError: the processor refused (422) or was unreachable (503).
            IdempotencyConflict: the key was used with another body.
        """
        gateway = self._processor()
        if len(body.description) > MAX_DESCRIPTION:
            raise _invalid(
                f"description must be at most {MAX_DESCRIPTION} characters",
                "/description",
            )
        now = self._clock.now()
        claim = Claim.of(tenant_id, "wallets.topups.start", idempotency_key, body, now=now)
        async with self._store.transaction() as tx:
            found = await LedgerTx(tx).get_account(tenant_id, body.account)
        if found is None:
            raise LedgerObjectNotFound("account", body.account)
        record = found.account
        unit = micros_per_minor_unit(record.currency)
        if unit is None:
            raise _invalid(
                f"the processor takes ISO currencies; account {body.account!r} is in"
                f" {record.currency!r}",
                "/account",
                currency=record.currency,
            )
        if record.normal_balance is not NormalBalance.CREDIT:
            raise _invalid(
                f"account {body.account!r} is not a wallet: its balance grows on debit,"
                " so a top-up would lower it",
                "/account",
            )
        minor, rest = divmod(body.amount, unit)
        if body.amount <= 0 or rest or minor > MAX_TOPUP_MINOR_UNITS:
            raise _invalid(
                f"amount must be a positive whole number of {record.currency} minor units"
                f" ({unit} micros each), at most {MAX_TOPUP_MINOR_UNITS * unit}",
                "/amount",
                amount=body.amount,
            )
        if claim is not None:
            topup_id = (
                "top_" + hashlib.sha256(f"{tenant_id}\0{claim.key}".encode()).hexdigest()[:32]
            )
            # The fingerprint too: the same key with another body opens no payment of its own
            # for the first call's top-up (it then fails the claim below).
            processor_key = f"ductor-{topup_id}-{claim.fingerprint[:16]}"
        else:
            topup_id = "top_" + uuid.uuid4().hex
            processor_key = f"ductor-{topup_id}"
        payment = await gateway.create_payment(
            amount=minor,
            currency=record.currency,
            description=body.description or f"Top-up of {body.account}",
            metadata={_TENANT: tenant_id, _TOPUP: topup_id, _ACCOUNT: body.account},
            idempotency_key=processor_key,
        )
        topup = TopUp(
            tenant_id=tenant_id,
            id=topup_id,
            account=body.account,
            currency=record.currency,
            amount=body.amount,
            description=body.description,
            processor=gateway.name,
            payment_id=payment.id,
            client_secret=payment.client_secret,
            status=TopUpStatus.PENDING,
            credited_amount=0,
            entry_id=None,
            created_at=now,
            updated_at=now,
        )

        async def effect(tx: Tx) -> Answer[TopUpView]:
            table = TopUpTx(tx)
            created = await table.insert(topup)
            stored = await table.get(tenant_id, topup_id)
            if stored is None:  # the payment id is another tenant's: never the case with
                raise WalletUnavailable(  # a real processor; refuse rather than mix them
                    "the processor answered a payment that belongs to another top-up",
                    retryable=True,
                )
            return Answer(topup_view(stored), Outcome.CREATED if created else Outcome.OK)

        return await once(self._store, claim, TopUpView, effect)

    async def get_topup(self, tenant_id: str, topup_id: str) -> TopUpView:
        """One of the tenant's top-ups.

        Raises:
            TopUpNotFound: no such top-up in this tenant.
        """
        async with self._store.transaction() as tx:
            found = await TopUpTx(tx).get(tenant_id, topup_id)
        if found is None:
            raise TopUpNotFound(topup_id)
        return topup_view(found)

    async def list_topups(
        self, tenant_id: str, *, account: str | None = None, limit: int = 50
    ) -> list[TopUpView]:
        """The tenant's top-ups, newest first, optionally of one wallet."""
        if not 1 <= limit <= MAX_PAGE:
            raise _invalid(f"limit must be between 1 and {MAX_PAGE}", "/limit")
        async with self._store.transaction() as tx:
            found = await TopUpTx(tx).list(tenant_id, account=account, limit=limit)
        return [topup_view(t) for t in found]

    async def handle_webhook(self, payload: bytes, signature: str | None) -> WebhookAnswer:
        """Apply one signed webhook delivery: credit a paid top-up once, fail a failed one.

        Raises:
            WalletUnavailable: no processor is configured.
            PaymentSignatureInvalid: the signature does not verify (400); nothing happens.
            LedgerError: the credit cannot be written (its account was closed or
                changed); answered with an error so the processor retries.
        """
        event = self._processor().read_event(payload, signature)
        if event.status is PaymentStatus.OTHER or not event.payment_id:
            return WebhookAnswer(event=event.id, handled=False)
        topup = await self._topup_of(event)
        if topup is None:
            return WebhookAnswer(event=event.id, handled=False)
        now = self._clock.now()
        if event.status is PaymentStatus.FAILED:
            async with self._store.transaction() as tx:
                await TopUpTx(tx).fail(topup.tenant_id, topup.id, now=now)
                after = await TopUpTx(tx).get(topup.tenant_id, topup.id)
            assert after is not None
            return WebhookAnswer(event=event.id, handled=True, topup=topup.id, status=after.status)
        credited = await self._credit(topup, event)
        async with self._store.transaction() as tx:
            await TopUpTx(tx).credit(
                topup.tenant_id, topup.id, amount=credited[1], entry_id=credited[0], now=now
            )
        return WebhookAnswer(
            event=event.id, handled=True, topup=topup.id, status=TopUpStatus.CREDITED
        )

    async def _topup_of(self, event: PaymentEvent) -> TopUp | None:
        """The top-up an event's payment funds: by the processor's payment id, and
        only if the payment's metadata names the same tenant and top-up."""
        assert self._gateway is not None
        async with self._store.transaction() as tx:
            topup = await TopUpTx(tx).by_payment(self._gateway.name, event.payment_id)
        if topup is None:
            return None
        meta = event.metadata
        if meta.get(_TENANT) != topup.tenant_id or meta.get(_TOPUP) != topup.id:
            return None
        return topup

    async def _credit(self, topup: TopUp, event: PaymentEvent) -> tuple[str, int]:
        """Write (once) the entry crediting what the payment received; its id and amount."""
        unit = micros_per_minor_unit(event.currency)
        if event.currency != topup.currency or unit is None:
            raise _invalid(
                f"the payment was in {event.currency!r}, the top-up in {topup.currency!r}",
                "/data/object/currency",
            )
        amount = event.amount * unit
        if amount <= 0:
            raise _invalid("the payment received nothing", "/data/object/amount_received")
        clearing = f"{self._processor().name}:clearing:{topup.currency}"
        await self._ledger.open_account(
            topup.tenant_id,
            AccountBody(
                code=clearing,
                currency=topup.currency,
                kind=AccountKind.ASSET,
                name=f"{self._processor().name} clearing ({topup.currency})",
            ),
        )
        entry = await self._ledger.record_entry(
            topup.tenant_id,
            EntryBody(
                postings=(
                    Posting(account=clearing, amount=amount, currency=topup.currency),
                    Posting(account=topup.account, amount=-amount, currency=topup.currency),
                ),
                description=f"top-up {topup.id} paid ({topup.processor} {topup.payment_id})",
                reference=Reference(kind=ReferenceKind.TOP_UP, id=topup.id),
            ),
            idempotency_key=TOPUP_KEY_PREFIX + topup.id,
        )
        return entry.value.id, amount


__all__ = [
    "MAX_TOPUP_MINOR_UNITS",
    "TOPUP_KEY_PREFIX",
    "TopUpBody",
    "TopUpNotFound",
    "TopUpView",
    "WalletService",
    "WalletUnavailable",
    "WebhookAnswer",
    "topup_view",
]
