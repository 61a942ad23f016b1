"""Every stable error code, triggered once through the public API.

`TRIGGERS` must name every class in `ERRORS`: a new error without a test here
fails `test_every_error_code_has_a_trigger`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import msgspec
import pytest

import ductor_settlement as s
from ductor_core.errors import DuctorError

T = "acme"
NOW = datetime(2025, 3, 1, tzinfo=UTC)
REF = s.Reference(kind=s.ReferenceKind.TOP_UP, id="t")


def _book() -> s.Ledger:
    ledger = s.Ledger(
        T,
        [
            s.Account(tenant_id=T, code="cash", currency="USD", kind=s.AccountKind.ASSET),
            s.Account(
                tenant_id=T, code="wallet", currency="USD", kind=s.AccountKind.LIABILITY, floor=0
            ),
        ],
    )
    ledger.post(_move("fund", "cash", "wallet", 10), at=NOW)
    return ledger


def _move(key: str, debit_account: str, credit_account: str, amount: int) -> s.EntryDraft:
    return s.transfer(
        tenant_id=T,
        idempotency_key=key,
        debit_account=debit_account,
        credit_account=credit_account,
        amount=amount,
        currency="USD",
        reference=REF,
        description=key,
    )


def _draft(*postings: s.Posting, reverses: str | None = None) -> s.EntryDraft:
    return s.EntryDraft(
        tenant_id=T,
        idempotency_key="k",
        description="d",
        reference=REF,
        postings=postings,
        reverses=reverses,
    )


def _hold(ledger: s.Ledger | None = None, amount: int = 5) -> s.Ledger:
    ledger = ledger or _book()
    ledger.place_hold(
        s.new_hold(
            id="h",
            tenant_id=T,
            debit_account="wallet",
            credit_account="cash",
            amount=amount,
            currency="USD",
            now=NOW,
            expires_at=NOW + timedelta(hours=1),
        )
    )
    return ledger


def _void_twice() -> None:
    ledger = _hold()
    ledger.void_hold("h", at=NOW)
    ledger.void_hold("h", at=NOW)


def _over_reversal() -> None:
    ledger = _book()
    fund = ledger.entry_for_key("fund")
    assert fund is not None
    ledger.post(
        _draft(s.debit("wallet", 11, "USD"), s.credit("cash", 11, "USD"), reverses=fund.id),
        at=NOW,
    )


def _return(**changes: object) -> None:
    ledger = _book()
    charge = ledger.post(_draft(s.debit("wallet", 4, "USD"), s.credit("cash", 4, "USD")), at=NOW)
    arguments: dict[str, object] = {
        "policy": s.ReturnPolicy(window=timedelta(days=1), allowed_reasons=("bad",)),
        "now": NOW,
        "stats": s.ReturnStats(assignments=0, returns=0),
        "reason": "bad",
        "amount": None,
        "reversed": {},
    }
    arguments.update(changes)
    decision = s.decide_return(
        arguments["policy"],  # type: ignore[arg-type]
        s.AssignmentFacts(
            assignment_id="a",
            routable_id="r",
            pool="p",
            buyer="b",
            buyer_account="wallet",
            delivered_at=NOW,
            charge_entry=charge,
            already_reversed=arguments["reversed"],  # type: ignore[arg-type]
        ),
        now=arguments["now"],  # type: ignore[arg-type]
        stats=arguments["stats"],  # type: ignore[arg-type]
        reason=arguments["reason"],  # type: ignore[arg-type]
        return_id="ret",
        amount=arguments["amount"],  # type: ignore[arg-type]
    )
    assert isinstance(decision, s.ReturnRefusal)
    raise decision.error()


def _signed() -> tuple[s.KeyRing, s.Envelope]:
    keys = s.KeyRing([s.SigningKey.generate("k")], active="k")
    receipt = s.Receipt(
        id="r",
        tenant_id=T,
        subject=s.Subject(kind=s.SubjectKind.RUN, id="run-1"),
        issued_at=NOW,
        cost=s.Cost(micros=1, currency="USD"),
    )
    return keys, s.issue_receipt(receipt, keys)


def _bad_signature() -> None:
    _, envelope = _signed()
    other = s.KeyRing([s.SigningKey.generate("k")], active="k")
    s.verify_receipt(envelope, other.public_keys())


def _unknown_key() -> None:
    _, envelope = _signed()
    s.verify_receipt(envelope, {})


def _wrong_type() -> None:
    keys, _ = _signed()
    s.verify_receipt(
        s.sign_tool_manifest(s.ToolManifest(name="m", version="1"), keys), keys.public_keys()
    )


def _not_canonical() -> None:
    keys, _ = _signed()
    s.verify_receipt(
        s.sign(s.RECEIPT_PAYLOAD_TYPE, b'{"b":1, "a":2}', keys.active),
        {"k": keys.active.public_key},
    )


PRO = s.Plan(id="pro", entitlements={"pools": s.Entitlement(limit=1)})
TOKENS = s.Meter(name="tokens", unit="token")

TRIGGERS: dict[type[s.SettlementError], Callable[[], object]] = {
    s.InvalidTime: lambda: s.window_start(s.UsageWindow.DAY, datetime(2025, 1, 1)),  # naive
    s.InvalidAccount: lambda: s.Ledger(T).open_account(
        s.Account(tenant_id="x", code="a", currency="USD", kind=s.AccountKind.ASSET)
    ),
    s.AccountConflict: lambda: _book().open_account(
        s.Account(tenant_id=T, code="cash", currency="EUR", kind=s.AccountKind.ASSET)
    ),
    s.UnknownAccount: lambda: _book().post(_move("k", "cash", "ghost", 1), at=NOW),
    s.UnknownEntry: lambda: _book().entry("ent_ghost"),
    s.InvalidEntry: lambda: _book().post(_draft(s.debit("cash", 1, "USD")), at=NOW),
    s.InvalidAmount: lambda: _book().post(_move("k", "cash", "wallet", 0), at=NOW),
    s.CurrencyMismatch: lambda: _book().post(
        _draft(s.debit("cash", 1, "EUR"), s.credit("wallet", 1, "EUR")), at=NOW
    ),
    s.Unbalanced: lambda: _book().post(
        _draft(s.debit("cash", 2, "USD"), s.credit("wallet", 1, "USD")), at=NOW
    ),
    s.OverReversal: _over_reversal,
    s.FloorCrossed: lambda: _book().post(_move("k", "wallet", "cash", 11), at=NOW),
    s.IdempotencyConflict: lambda: _book().post(_move("fund", "cash", "wallet", 9), at=NOW),
    s.HoldInvalid: lambda: s.new_hold(
        id="h",
        tenant_id=T,
        debit_account="a",
        credit_account="b",
        amount=0,
        currency="USD",
        now=NOW,
        expires_at=NOW + timedelta(hours=1),
    ),
    s.HoldNotFound: lambda: _book().void_hold("ghost", at=NOW),
    s.HoldConflict: lambda: _hold(_hold(), amount=6),
    s.HoldExpired: lambda: _hold().post_hold("h", at=NOW + timedelta(hours=1)),
    s.HoldAlreadyFinal: _void_twice,
    s.HoldAmountExceeded: lambda: _hold().post_hold("h", at=NOW, amount=6),
    s.InvalidPriceRule: lambda: s.quote(s.PriceRule(pool="p", currency="USD")),
    s.NoPriceRule: lambda: s.PriceBook().rule_for("p"),
    s.InvalidCharge: lambda: s.quote(
        s.PriceRule(pool="p", currency="USD", source=s.PriceSource.ROUTING)
    ),
    s.InvalidReturnPolicy: lambda: _return(policy=s.ReturnPolicy(window=timedelta(0))),
    s.NotReturnable: lambda: _return(policy=None),
    s.ReturnWindowClosed: lambda: _return(now=NOW + timedelta(days=1)),
    s.ReturnReasonNotAllowed: lambda: _return(reason="meh"),
    s.ReturnRateExceeded: lambda: _return(
        policy=s.ReturnPolicy(window=timedelta(days=1), max_return_rate_bps=0, min_sample=1),
        stats=s.ReturnStats(assignments=5, returns=0),
    ),
    s.AlreadyReturned: lambda: _return(reversed={"wallet": -4}),
    s.InvalidReturnAmount: lambda: _return(amount=5),
    s.InvalidUsage: lambda: s.aggregate(TOKENS, 0, -1),
    s.BudgetExceeded: lambda: s.check_usage(
        TOKENS,
        [s.BudgetPolicy(tenant_id=T, meter="tokens", window=s.UsageWindow.DAY, limit=1)],
        usage={},
        amount=2,
    ).raise_if_blocked(),
    s.EntitlementMissing: lambda: s.check_entitlement(PRO, "sso"),
    s.EntitlementLimitExceeded: lambda: s.check_entitlement(PRO, "pools", 2),
    s.MalformedEnvelope: lambda: s.decode_envelope(b"[]"),
    s.WrongPayloadType: _wrong_type,
    s.UnknownKey: _unknown_key,
    s.BadSignature: _bad_signature,
    s.NotCanonical: _not_canonical,
    s.InvalidKey: lambda: s.load_public_keys(b"{}"),
}


def test_every_error_code_has_a_trigger_and_codes_are_unique() -> None:
    assert set(TRIGGERS) == set(s.ERRORS)
    codes = [cls.code for cls in s.ERRORS]
    assert len(codes) == len(set(codes))


@pytest.mark.parametrize("cls", s.ERRORS, ids=lambda cls: cls.code)
def test_each_code_is_raised_by_its_trigger(cls: type[s.SettlementError]) -> None:
    with pytest.raises(cls) as caught:
        TRIGGERS[cls]()
    error = caught.value
    assert type(error) is cls
    assert error.code == cls.code
    assert isinstance(error, DuctorError)
    assert error.retryable is False
    assert str(error)
    msgspec.json.encode(error.details)  # details are JSON-ready


def test_ledger_errors_carry_every_problem_in_their_details() -> None:
    with pytest.raises(s.LedgerError) as caught:
        _book().post(_draft(s.debit("ghost", 2, "USD"), s.credit("wallet", 1, "USD")), at=NOW)
    assert [p["code"] for p in caught.value.details["problems"]] == [
        "ledger.unknown_account",
        "ledger.unbalanced",
    ]
    assert s.ledger_error(caught.value.problems).code == "ledger.unknown_account"
