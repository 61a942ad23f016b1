"""Two-phase holds, as TigerBeetle's pending transfers: reserve, then post or void.

A hold reserves `amount` to move from `debit_account` to `credit_account`. While
it is pending and unexpired it lowers the *available* balance of whichever of
the two accounts it would move against its normal balance (see `Ledger`), so
nothing else can spend the reserved funds. It then ends in exactly one way:

- **posted** (`post_hold`), in full or in part: the posted amount becomes a
  ledger entry and the remainder is released;
- **voided** (`void_hold`): everything is released;
- **expired** (`expire_hold`): at or after `expires_at` the hold is void by
  itself; posting or voiding it then fails with ``hold.expired``.

A second post or void of a final hold fails with ``hold.already_final``. The
functions here are pure transitions of one `Hold` value given `now`; the
`Ledger` book applies them and writes the entry. Nothing here reads a clock.
"""

from __future__ import annotations

import enum
import re
from datetime import datetime

import msgspec

from ductor_settlement._time import aware
from ductor_settlement.errors import (
    HoldAlreadyFinal,
    HoldAmountExceeded,
    HoldExpired,
    HoldInvalid,
)
from ductor_settlement.money import currency_problem, micros_problem

__all__ = [
    "Hold",
    "HoldStatus",
    "expire_hold",
    "new_hold",
    "post_hold",
    "void_hold",
]

_MAX_ID = 256  # hold ids are stored in an indexed column
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_MAX_DESCRIPTION = 1000


class HoldStatus(enum.StrEnum):
    """Where a hold is in its life; every status but `PENDING` is final."""

    PENDING = "pending"
    """Reserving funds; may still be posted or voided until it expires."""
    POSTED = "posted"
    """Posted in full or in part; `posted_amount` moved, the rest was released."""
    VOIDED = "voided"
    """Voided by request; nothing moved."""
    EXPIRED = "expired"
    """Reached `expires_at` while pending; void, nothing moved."""

    @property
    def final(self) -> bool:
        """True once the hold can change no more."""
        return self is not HoldStatus.PENDING


class Hold(msgspec.Struct, frozen=True, kw_only=True):
    """A pending transfer of `amount` micros from a debit to a credit account.

    Attributes:
        id: unique per tenant; also the hold's idempotency key.
        tenant_id: the tenant whose book holds it.
        debit_account: the account debited when the hold is posted (e.g. a buyer wallet).
        credit_account: the account credited when the hold is posted.
        amount: micros reserved, > 0.
        currency: the currency of both accounts.
        created_at: when it was placed.
        expires_at: when it voids by itself (exclusive: at this instant it is expired).
        description: what the reservation is for.
        status: where it is in its life.
        posted_amount: micros moved by the post (0 unless posted).
        finalized_at: when it was posted, voided or expired.
        entry_id: the ledger entry its post wrote.
    """

    id: str
    tenant_id: str
    debit_account: str
    credit_account: str
    amount: int
    currency: str
    created_at: datetime
    expires_at: datetime
    description: str = ""
    status: HoldStatus = HoldStatus.PENDING
    posted_amount: int = 0
    finalized_at: datetime | None = None
    entry_id: str | None = None

    def is_live(self, at: datetime) -> bool:
        """True while the hold reserves funds: pending and not yet expired at `at`."""
        return self.status is HoldStatus.PENDING and at < self.expires_at

    @property
    def released_amount(self) -> int:
        """Micros given back when the hold ended (0 while it is pending)."""
        return self.amount - self.posted_amount if self.status.final else 0


def new_hold(
    *,
    id: str,
    tenant_id: str,
    debit_account: str,
    credit_account: str,
    amount: int,
    currency: str,
    now: datetime,
    expires_at: datetime,
    description: str = "",
) -> Hold:
    """A pending hold, checked for shape (accounts, funds and floors are the book's job).

    Raises:
        HoldInvalid: an empty, blank or over-long id (over 256 characters), an id
            with a control character or a `/`, an over-long description (over
            1,000), the same account on both sides, a bad amount or currency, or
            an expiry not after `now`.
    """
    now = aware(now, "now")
    expires_at = aware(expires_at, "expires_at")
    reasons: list[str] = []
    if not id or len(id) > _MAX_ID:
        reasons.append(f"the hold id must be 1 to {_MAX_ID} characters")
    elif not id.strip():
        reasons.append("the hold id may not be blank")
    elif _CONTROL.search(id):
        reasons.append("the hold id may not hold a control character (U+0000-U+001F, U+007F)")
    elif "/" in id:
        # The id is a segment of the hold's own paths (/v1/holds/{id}/post).
        reasons.append("the hold id may not contain '/'")
    if len(description) > _MAX_DESCRIPTION:
        reasons.append(f"the description must be at most {_MAX_DESCRIPTION} characters")
    if not debit_account or not credit_account:
        reasons.append("both accounts must be named")
    elif debit_account == credit_account:
        reasons.append(f"the hold debits and credits the same account {debit_account!r}")
    amount_reason = micros_problem(amount)
    if amount_reason is not None:
        reasons.append(amount_reason)
    currency_reason = currency_problem(currency)
    if currency_reason is not None:
        reasons.append(currency_reason)
    if expires_at <= now:
        reasons.append(
            f"the hold expires at {expires_at.isoformat()}, not after now ({now.isoformat()})"
        )
    if reasons:
        shown = id if len(id) <= _MAX_ID else id[:_MAX_ID] + "..."
        raise HoldInvalid(
            f"hold {shown!r} is invalid: " + "; ".join(reasons),
            details={"hold": shown, "reasons": reasons},
        )
    return Hold(
        id=id,
        tenant_id=tenant_id,
        debit_account=debit_account,
        credit_account=credit_account,
        amount=amount,
        currency=currency,
        created_at=now,
        expires_at=expires_at,
        description=description,
    )


def _require_open(hold: Hold, now: datetime, action: str) -> None:
    if hold.status is HoldStatus.EXPIRED or (
        hold.status is HoldStatus.PENDING and now >= hold.expires_at
    ):
        raise HoldExpired(
            f"cannot {action} hold {hold.id!r}: it expired at {hold.expires_at.isoformat()}",
            details={"hold": hold.id, "expires_at": hold.expires_at.isoformat()},
        )
    if hold.status.final:
        raise HoldAlreadyFinal(
            f"cannot {action} hold {hold.id!r}: it is already {hold.status.value}",
            details={"hold": hold.id, "status": hold.status.value},
        )


def post_hold(hold: Hold, *, now: datetime, amount: int | None = None) -> Hold:
    """The hold posted for `amount` (all of it by default); the rest is released.

    The returned hold has no `entry_id` yet: the book sets it when it writes the entry.

    Raises:
        HoldExpired: `now` is at or past the expiry, or the hold already expired.
        HoldAlreadyFinal: the hold was already posted or voided.
        HoldInvalid: `amount` is not a positive integer.
        HoldAmountExceeded: `amount` is more than the hold reserved.
    """
    now = aware(now, "now")
    _require_open(hold, now, "post")
    posted = hold.amount if amount is None else amount
    reason = micros_problem(posted)
    if reason is not None:
        raise HoldInvalid(
            f"cannot post hold {hold.id!r}: {reason}",
            details={"hold": hold.id, "reasons": [reason]},
        )
    if posted > hold.amount:
        raise HoldAmountExceeded(
            f"cannot post {posted} micros of hold {hold.id!r}: it reserved only {hold.amount}",
            details={
                "hold": hold.id,
                "requested": posted,
                "held": hold.amount,
                "currency": hold.currency,
            },
        )
    return msgspec.structs.replace(
        hold, status=HoldStatus.POSTED, posted_amount=posted, finalized_at=now
    )


def void_hold(hold: Hold, *, now: datetime) -> Hold:
    """The hold voided: nothing moves and the whole amount is released.

    Raises:
        HoldExpired: `now` is at or past the expiry (the hold is already void).
        HoldAlreadyFinal: the hold was already posted or voided.
    """
    now = aware(now, "now")
    _require_open(hold, now, "void")
    return msgspec.structs.replace(hold, status=HoldStatus.VOIDED, finalized_at=now)


def expire_hold(hold: Hold, *, now: datetime) -> Hold:
    """The hold marked expired if it is pending and `now` is at or past its expiry.

    Otherwise the same hold is returned unchanged; expiring is never an error.
    """
    now = aware(now, "now")
    if hold.status is HoldStatus.PENDING and now >= hold.expires_at:
        return msgspec.structs.replace(
            hold, status=HoldStatus.EXPIRED, finalized_at=hold.expires_at
        )
    return hold
