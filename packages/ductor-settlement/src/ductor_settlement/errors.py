"""Errors of the settlement package, all `DuctorError`s with stable codes.

    DuctorError
     └── SettlementError               base of every settlement error ("settlement.error")
          ├── InvalidTime              settlement.naive_time
          ├── LedgerError              carries every `LedgerProblem` found, not just one
          │    ├── InvalidAccount       ledger.invalid_account
          │    ├── AccountConflict      ledger.account_conflict
          │    ├── UnknownAccount       ledger.unknown_account
          │    ├── UnknownEntry         ledger.unknown_entry
          │    ├── InvalidEntry         ledger.invalid_entry
          │    ├── InvalidAmount        ledger.invalid_amount
          │    ├── CurrencyMismatch     ledger.currency_mismatch
          │    ├── Unbalanced           ledger.unbalanced
          │    ├── OverReversal         ledger.over_reversal
          │    ├── FloorCrossed         ledger.floor_crossed
          │    └── IdempotencyConflict  ledger.idempotency_conflict
          ├── HoldError
          │    ├── HoldInvalid          hold.invalid
          │    ├── HoldNotFound         hold.not_found
          │    ├── HoldConflict         hold.conflict
          │    ├── HoldExpired          hold.expired
          │    ├── HoldAlreadyFinal     hold.already_final
          │    └── HoldAmountExceeded   hold.amount_exceeded
          ├── PricingError
          │    ├── InvalidPriceRule     pricing.invalid_rule
          │    ├── NoPriceRule          pricing.no_rule
          │    └── InvalidCharge        pricing.invalid_charge
          ├── ReturnError              what `decide_return` refuses with
          │    ├── InvalidReturnPolicy  return.invalid_policy
          │    ├── NotReturnable        return.not_returnable
          │    ├── ReturnWindowClosed   return.window_closed
          │    ├── ReturnReasonNotAllowed return.reason_not_allowed
          │    ├── ReturnRateExceeded   return.rate_exceeded
          │    ├── AlreadyReturned      return.already_returned
          │    └── InvalidReturnAmount  return.invalid_amount
          ├── MeteringError
          │    ├── InvalidUsage         metering.invalid
          │    └── BudgetExceeded       budget.exceeded
          ├── EntitlementError
          │    ├── EntitlementMissing   entitlement.missing
          │    └── EntitlementLimitExceeded entitlement.limit_exceeded
          └── ReceiptError             signed envelopes (receipts and tool manifests)
               ├── MalformedEnvelope    receipt.malformed
               ├── WrongPayloadType     receipt.wrong_payload_type
               ├── UnknownKey           receipt.unknown_key
               ├── BadSignature         receipt.bad_signature
               ├── NotCanonical         receipt.not_canonical
               └── InvalidKey           receipt.invalid_key

Every error has `details`, a JSON-ready dict naming what is wrong (account,
currency, amount, meter, feature ...), so the server can put it in its error body
as is. Domain code never mentions HTTP; the server maps `code` to a status.
None of these is retryable: retrying the same call gives the same answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from ductor_core.errors import DuctorError

__all__ = [
    "ERRORS",
    "AccountConflict",
    "AlreadyReturned",
    "BadSignature",
    "BudgetExceeded",
    "CurrencyMismatch",
    "EntitlementError",
    "EntitlementLimitExceeded",
    "EntitlementMissing",
    "FloorCrossed",
    "HoldAlreadyFinal",
    "HoldAmountExceeded",
    "HoldConflict",
    "HoldError",
    "HoldExpired",
    "HoldInvalid",
    "HoldNotFound",
    "IdempotencyConflict",
    "InvalidAccount",
    "InvalidAmount",
    "InvalidCharge",
    "InvalidEntry",
    "InvalidKey",
    "InvalidPriceRule",
    "InvalidReturnAmount",
    "InvalidReturnPolicy",
    "InvalidTime",
    "InvalidUsage",
    "LedgerError",
    "LedgerProblem",
    "MalformedEnvelope",
    "MeteringError",
    "NoPriceRule",
    "NotCanonical",
    "NotReturnable",
    "OverReversal",
    "PricingError",
    "ReceiptError",
    "ReturnError",
    "ReturnRateExceeded",
    "ReturnReasonNotAllowed",
    "ReturnWindowClosed",
    "SettlementError",
    "Unbalanced",
    "UnknownAccount",
    "UnknownEntry",
    "UnknownKey",
    "WrongPayloadType",
    "ledger_error",
]


class SettlementError(DuctorError):
    """Base of every settlement error: a stable `code`, a message and JSON `details`."""

    code = "settlement.error"
    details: dict[str, Any]

    def __init__(self, message: str, *, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message, details=dict(details) if details is not None else {})


class InvalidTime(SettlementError):
    """A naive datetime was passed where a timezone-aware (UTC) one is required."""

    code = "settlement.naive_time"


# --- ledger -------------------------------------------------------------------


class LedgerProblem(msgspec.Struct, frozen=True, kw_only=True):
    """One thing wrong with an entry, an account or a hold, stated precisely.

    Attributes:
        code: the stable code of the error this problem raises (``ledger.unbalanced``).
        message: a human sentence naming what is wrong.
        account: the account concerned, when there is one.
        currency: the currency concerned, when there is one.
        amount: by how much, in micros: the signed imbalance (debits minus
            credits) for ``ledger.unbalanced``, the shortfall below the floor
            for ``ledger.floor_crossed``, the excess for ``ledger.over_reversal``.
        posting: the index of the posting concerned, when there is one.
    """

    code: str
    message: str
    account: str | None = None
    currency: str | None = None
    amount: int | None = None
    posting: int | None = None


class LedgerError(SettlementError):
    """An entry, account or hold the ledger refuses; `problems` lists every reason."""

    code = "ledger.error"

    def __init__(self, message: str, *, problems: Sequence[LedgerProblem] = ()) -> None:
        super().__init__(message, details={"problems": msgspec.to_builtins(list(problems))})
        self.problems: tuple[LedgerProblem, ...] = tuple(problems)


class InvalidAccount(LedgerError):
    """An account that cannot be opened: bad code, currency, floor or tenant."""

    code = "ledger.invalid_account"


class AccountConflict(LedgerError):
    """An account code that is already open with different attributes."""

    code = "ledger.account_conflict"


class UnknownAccount(LedgerError):
    """A posting or hold names an account the book does not hold."""

    code = "ledger.unknown_account"


class UnknownEntry(LedgerError):
    """An entry `reverses` or `corrects` an entry the book does not hold."""

    code = "ledger.unknown_entry"


class InvalidEntry(LedgerError):
    """An entry whose shape is wrong: fewer than two postings, no key, other tenant."""

    code = "ledger.invalid_entry"


class InvalidAmount(LedgerError):
    """A posting amount that is zero, not an integer, or beyond `MAX_MICROS`."""

    code = "ledger.invalid_amount"


class CurrencyMismatch(LedgerError):
    """A posting whose currency is not its account's currency."""

    code = "ledger.currency_mismatch"


class Unbalanced(LedgerError):
    """An entry whose postings do not net to zero in some currency."""

    code = "ledger.unbalanced"


class OverReversal(LedgerError):
    """A reversal that does not mirror its entry or takes back more than it moved."""

    code = "ledger.over_reversal"


class FloorCrossed(LedgerError):
    """An entry or hold that would take an account's available balance below its floor."""

    code = "ledger.floor_crossed"


class IdempotencyConflict(LedgerError):
    """An idempotency key already used for an entry with different content."""

    code = "ledger.idempotency_conflict"


_LEDGER_ERRORS: dict[str, type[LedgerError]] = {
    cls.code: cls
    for cls in (
        InvalidAccount,
        AccountConflict,
        UnknownAccount,
        UnknownEntry,
        InvalidEntry,
        InvalidAmount,
        CurrencyMismatch,
        Unbalanced,
        OverReversal,
        FloorCrossed,
        IdempotencyConflict,
    )
}


def ledger_error(problems: Sequence[LedgerProblem]) -> LedgerError:
    """The error to raise for `problems`: the class of the first, carrying them all."""
    if not problems:
        raise ValueError("ledger_error needs at least one problem")
    cls = _LEDGER_ERRORS.get(problems[0].code, LedgerError)
    message = "; ".join(problem.message for problem in problems)
    return cls(message, problems=problems)


# --- holds --------------------------------------------------------------------


class HoldError(SettlementError):
    """A two-phase hold that cannot be created, posted or voided."""

    code = "hold.error"


class HoldInvalid(HoldError):
    """A hold request with a bad amount, expiry, currency or account pair."""

    code = "hold.invalid"


class HoldNotFound(HoldError):
    """A hold id the book does not hold."""

    code = "hold.not_found"


class HoldConflict(HoldError):
    """A hold id already used for a hold with different content."""

    code = "hold.conflict"


class HoldExpired(HoldError):
    """The hold's expiry has passed: it is void and can be neither posted nor voided."""

    code = "hold.expired"


class HoldAlreadyFinal(HoldError):
    """The hold was already posted or voided."""

    code = "hold.already_final"


class HoldAmountExceeded(HoldError):
    """A post of more than the hold reserved."""

    code = "hold.amount_exceeded"


# --- pricing ------------------------------------------------------------------


class PricingError(SettlementError):
    """A price that cannot be computed."""

    code = "pricing.error"


class InvalidPriceRule(PricingError):
    """A price rule whose numbers contradict each other or are out of range."""

    code = "pricing.invalid_rule"


class NoPriceRule(PricingError):
    """No price rule is configured for the pool."""

    code = "pricing.no_rule"


class InvalidCharge(PricingError):
    """A routing-priced rule got no routing charge, or a negative or out-of-range one."""

    code = "pricing.invalid_charge"


# --- returns ------------------------------------------------------------------


class ReturnError(SettlementError):
    """A return refused; `decide_return` reports these as a `ReturnRefusal`."""

    code = "return.error"


class InvalidReturnPolicy(ReturnError):
    """A return policy whose numbers are out of range."""

    code = "return.invalid_policy"


class NotReturnable(ReturnError):
    """No return policy covers the assignment, so it cannot be returned."""

    code = "return.not_returnable"


class ReturnWindowClosed(ReturnError):
    """The warranty window of the assignment has closed."""

    code = "return.window_closed"


class ReturnReasonNotAllowed(ReturnError):
    """The return reason is not one the policy accepts."""

    code = "return.reason_not_allowed"


class ReturnRateExceeded(ReturnError):
    """The buyer's recent return rate is above the policy's threshold."""

    code = "return.rate_exceeded"


class AlreadyReturned(ReturnError):
    """Everything charged for the assignment has already been credited back."""

    code = "return.already_returned"


class InvalidReturnAmount(ReturnError):
    """A partial return amount that is not positive or exceeds what is left."""

    code = "return.invalid_amount"


# --- metering and budgets -----------------------------------------------------


class MeteringError(SettlementError):
    """Usage that cannot be recorded."""

    code = "metering.error"


class InvalidUsage(MeteringError):
    """A usage amount, meter or budget policy that is out of range or mismatched."""

    code = "metering.invalid"


class BudgetExceeded(MeteringError):
    """The usage would take a meter past a blocking budget; `details` names the meter."""

    code = "budget.exceeded"


# --- plans and entitlements ---------------------------------------------------


class EntitlementError(SettlementError):
    """The tenant's plan does not allow what was asked."""

    code = "entitlement.error"


class EntitlementMissing(EntitlementError):
    """The plan does not include the feature, or has it switched off."""

    code = "entitlement.missing"


class EntitlementLimitExceeded(EntitlementError):
    """The plan includes the feature but the amount is above its limit."""

    code = "entitlement.limit_exceeded"


# --- receipts and signed envelopes --------------------------------------------


class ReceiptError(SettlementError):
    """A signed envelope (receipt or tool manifest) that cannot be trusted or read."""

    code = "receipt.error"


class MalformedEnvelope(ReceiptError):
    """An envelope or payload that is not well-formed JSON of the expected shape."""

    code = "receipt.malformed"


class WrongPayloadType(ReceiptError):
    """An envelope whose payload type is not the one the caller expects."""

    code = "receipt.wrong_payload_type"


class UnknownKey(ReceiptError):
    """No signature on the envelope is by a key the verifier holds."""

    code = "receipt.unknown_key"


class BadSignature(ReceiptError):
    """A signature by a known key that does not verify over the envelope."""

    code = "receipt.bad_signature"


class NotCanonical(ReceiptError):
    """A value RFC 8785 cannot encode, or a payload that is not in canonical form."""

    code = "receipt.not_canonical"


class InvalidKey(ReceiptError):
    """Key material, a key ring or a public key set that is malformed."""

    code = "receipt.invalid_key"


ERRORS: tuple[type[SettlementError], ...] = (
    InvalidTime,
    *_LEDGER_ERRORS.values(),
    HoldInvalid,
    HoldNotFound,
    HoldConflict,
    HoldExpired,
    HoldAlreadyFinal,
    HoldAmountExceeded,
    InvalidPriceRule,
    NoPriceRule,
    InvalidCharge,
    InvalidReturnPolicy,
    NotReturnable,
    ReturnWindowClosed,
    ReturnReasonNotAllowed,
    ReturnRateExceeded,
    AlreadyReturned,
    InvalidReturnAmount,
    InvalidUsage,
    BudgetExceeded,
    EntitlementMissing,
    EntitlementLimitExceeded,
    MalformedEnvelope,
    WrongPayloadType,
    UnknownKey,
    BadSignature,
    NotCanonical,
    InvalidKey,
)
"""Every concrete settlement error, one per stable code (for the server's status table)."""
