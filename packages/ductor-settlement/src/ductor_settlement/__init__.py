"""Ductor's settlement, pure: ledger, holds, pricing, returns, metering, plans, receipts.

No I/O and no clock: every function takes the time it needs (`at`, `now`) as
a timezone-aware datetime, and the server stores what these functions return.

Money
    Every amount is an ``int`` of micros (1 unit = 1 000 000 micros), never a
    float, bounded by `MAX_MICROS` (2**53 - 1) so it is exact in any JSON reader.
    Currencies are upper-case codes ("USD", or a house unit like "CREDITS").

Ledger (`ledger`)
    A tenant's `Ledger` book holds `Account`s (asset, liability, equity,
    revenue, expense; each with a normal balance side and an optional floor)
    and immutable `Entry`s. Sign convention: a `Posting` has one signed amount,
    **positive = debit, negative = credit**; an entry has two or more postings
    that sum to zero per currency. `Ledger.balance` shows an account in its
    normal direction (a buyer wallet, a liability, is positive when funded).
    Entries are idempotent by key (same key and content: same entry; other
    content: ``ledger.idempotency_conflict``) and never change; `reverse`
    writes a new entry that takes back an entry in full or in part. The book
    refuses, with every problem named (account, currency, amount), entries
    that are unbalanced, in the wrong currency, on unknown accounts, or that
    would take an account's *available* balance (posted minus live holds)
    below its floor (``ledger.floor_crossed``).

Holds (`holds`)
    Two-phase transfers, as TigerBeetle's pending transfers: `Ledger.place_hold`
    reserves funds, `Ledger.post_hold` moves all or part of them (writing an
    entry) and releases the rest, `Ledger.void_hold` releases them; at its
    expiry a hold is void (``hold.expired``); a second post or void is
    ``hold.already_final``.

Pricing (`pricing`)
    A `PriceRule` per pool prices an assignment from a fixed price or the
    routing charge, with a take rate in basis points, a minimum charge and a
    minimum payout. The fee is rounded half-even by default (or floor or
    ceiling, as the rule says) and the payout is the charge minus the fee, so
    ``charge == payout + fee`` exactly. `charge_entry` debits the buyer's
    wallet and credits the seller's payable and the platform's revenue.

Returns (`returns`)
    `decide_return` checks a `ReturnPolicy` (warranty window, allowed reasons,
    maximum return rate over a minimum sample) and answers with a
    `ReturnCredit` (a reversal entry of the charge, plus a reroute excluding
    the buyer) or a `ReturnRefusal` with a stable ``return.*`` code.

Metering and plans (`metering`, `plans`)
    `Meter`s count usage per tenant per hour/day/month window; `check_usage`
    says whether new usage is allowed under the tenant's `BudgetPolicy`s,
    which alert thresholds it crosses and, when blocked, raises
    ``budget.exceeded`` naming the meter. `check_entitlement` checks a
    `Plan`'s feature flags and limits (``entitlement.missing``,
    ``entitlement.limit_exceeded``).

Receipts (`receipts`, `dsse`, `canonical`)
    A `Receipt` joins the routing decision, configuration, definition or
    tool-manifest hashes, cost, consent trail and ledger entries of one unit
    of work. Its payload is canonical JSON (RFC 8785) in a DSSE v1 envelope
    ``{"payload": base64, "payloadType": ..., "signatures": [{"keyid", "sig"}]}``
    whose Ed25519 signature covers ``PAE(payloadType, payload)`` =
    ``"DSSEv1" SP len(type) SP type SP len(payload) SP payload``, so the type
    is signed too. A `KeyRing` signs with its active key and keeps old keys
    for verification; public keys are published as a JWK Set
    (``{"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": ..., "x": base64url}]}``)
    and `verify_receipt` needs nothing else. Signed agent-tool manifests use the
    same envelope with another payload type.

Errors (`errors`)
    Every error is a `SettlementError` (a `ductor_core.errors.DuctorError`)
    with a stable ``code`` and JSON ``details``; `ERRORS` lists them all.
"""

from __future__ import annotations

from ductor_settlement.canonical import (
    canonical_hash,
    canonical_json,
    document_hash,
    is_canonical,
    parse_json,
)
from ductor_settlement.dsse import (
    Envelope,
    KeyRing,
    PublicKeys,
    Signature,
    SigningKey,
    decode_envelope,
    encode_envelope,
    export_public_keys,
    key_id_for,
    load_public_keys,
    pae,
    sign,
    verify,
)
from ductor_settlement.errors import (
    ERRORS,
    AccountConflict,
    AlreadyReturned,
    BadSignature,
    BudgetExceeded,
    CurrencyMismatch,
    EntitlementError,
    EntitlementLimitExceeded,
    EntitlementMissing,
    FloorCrossed,
    HoldAlreadyFinal,
    HoldAmountExceeded,
    HoldConflict,
    HoldError,
    HoldExpired,
    HoldInvalid,
    HoldNotFound,
    IdempotencyConflict,
    InvalidAccount,
    InvalidAmount,
    InvalidCharge,
    InvalidEntry,
    InvalidKey,
    InvalidPriceRule,
    InvalidReturnAmount,
    InvalidReturnPolicy,
    InvalidTime,
    InvalidUsage,
    LedgerError,
    LedgerProblem,
    MalformedEnvelope,
    MeteringError,
    NoPriceRule,
    NotCanonical,
    NotReturnable,
    OverReversal,
    PricingError,
    ReceiptError,
    ReturnError,
    ReturnRateExceeded,
    ReturnReasonNotAllowed,
    ReturnWindowClosed,
    SettlementError,
    Unbalanced,
    UnknownAccount,
    UnknownEntry,
    UnknownKey,
    WrongPayloadType,
    ledger_error,
)
from ductor_settlement.holds import (
    Hold,
    HoldStatus,
    expire_hold,
    new_hold,
    post_hold,
    void_hold,
)
from ductor_settlement.ledger import (
    Account,
    AccountKind,
    Entry,
    EntryDraft,
    Ledger,
    LedgerSnapshot,
    NormalBalance,
    Posting,
    Reference,
    ReferenceKind,
    credit,
    debit,
    entry_id_for,
    reverse,
    transfer,
)
from ductor_settlement.metering import (
    MAX_USAGE,
    Aggregation,
    BudgetCheck,
    BudgetPolicy,
    Meter,
    UsageDecision,
    UsageKey,
    UsageWindow,
    aggregate,
    check_budget,
    check_usage,
    usage_key,
    window_end,
    window_start,
)
from ductor_settlement.money import MAX_MICROS, MICROS_PER_UNIT, format_micros
from ductor_settlement.plans import Entitlement, Plan, check_entitlement
from ductor_settlement.pricing import (
    BPS_PER_WHOLE,
    AssignmentAccounts,
    PriceBook,
    PriceRule,
    PriceSource,
    Quote,
    Rounding,
    apply_rate,
    assignment_postings,
    charge_entry,
    quote,
)
from ductor_settlement.receipts import (
    RECEIPT_PAYLOAD_TYPE,
    TOOL_MANIFEST_PAYLOAD_TYPE,
    ConsentRecord,
    Cost,
    DecisionRef,
    Receipt,
    Subject,
    SubjectKind,
    Tool,
    ToolManifest,
    issue_receipt,
    manifest_hash,
    receipt_digest,
    sign_tool_manifest,
    verify_receipt,
    verify_tool_manifest,
)
from ductor_settlement.returns import (
    AssignmentFacts,
    RerouteRequest,
    ReturnCredit,
    ReturnDecision,
    ReturnPolicies,
    ReturnPolicy,
    ReturnRefusal,
    ReturnStats,
    decide_return,
)

__version__ = "0.1.0"

__all__ = [  # noqa: RUF022 - grouped by area, sorted within each group
    "__version__",
    # Money: integer micros and currency codes
    "MAX_MICROS",
    "MICROS_PER_UNIT",
    "format_micros",
    # Ledger: accounts, postings, entries and the book
    "Account",
    "AccountKind",
    "Entry",
    "EntryDraft",
    "Ledger",
    "LedgerSnapshot",
    "NormalBalance",
    "Posting",
    "Reference",
    "ReferenceKind",
    "credit",
    "debit",
    "entry_id_for",
    "reverse",
    "transfer",
    # Holds: two-phase reservations (the book applies them)
    "Hold",
    "HoldStatus",
    "expire_hold",
    "new_hold",
    "post_hold",
    "void_hold",
    # Pricing: one assignment's charge, payout and fee
    "BPS_PER_WHOLE",
    "AssignmentAccounts",
    "PriceBook",
    "PriceRule",
    "PriceSource",
    "Quote",
    "Rounding",
    "apply_rate",
    "assignment_postings",
    "charge_entry",
    "quote",
    # Returns: warranty window, credit and reroute
    "AssignmentFacts",
    "RerouteRequest",
    "ReturnCredit",
    "ReturnDecision",
    "ReturnPolicies",
    "ReturnPolicy",
    "ReturnRefusal",
    "ReturnStats",
    "decide_return",
    # Metering and budgets
    "MAX_USAGE",
    "Aggregation",
    "BudgetCheck",
    "BudgetPolicy",
    "Meter",
    "UsageDecision",
    "UsageKey",
    "UsageWindow",
    "aggregate",
    "check_budget",
    "check_usage",
    "usage_key",
    "window_end",
    "window_start",
    # Plans and entitlements
    "Entitlement",
    "Plan",
    "check_entitlement",
    # Canonical JSON (RFC 8785)
    "canonical_hash",
    "canonical_json",
    "document_hash",
    "is_canonical",
    "parse_json",
    # Signed envelopes (DSSE v1, Ed25519) and keys
    "Envelope",
    "KeyRing",
    "PublicKeys",
    "Signature",
    "SigningKey",
    "decode_envelope",
    "encode_envelope",
    "export_public_keys",
    "key_id_for",
    "load_public_keys",
    "pae",
    "sign",
    "verify",
    # Receipts and signed tool manifests
    "RECEIPT_PAYLOAD_TYPE",
    "TOOL_MANIFEST_PAYLOAD_TYPE",
    "ConsentRecord",
    "Cost",
    "DecisionRef",
    "Receipt",
    "Subject",
    "SubjectKind",
    "Tool",
    "ToolManifest",
    "issue_receipt",
    "manifest_hash",
    "receipt_digest",
    "sign_tool_manifest",
    "verify_receipt",
    "verify_tool_manifest",
    # Errors: one base, a stable code per class
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
