"""Plans and entitlements: flags, limits, and the errors the server relays."""

from __future__ import annotations

import msgspec
import pytest

from ductor_settlement.errors import EntitlementLimitExceeded, EntitlementMissing
from ductor_settlement.plans import Entitlement, Plan, check_entitlement

PRO = msgspec.json.decode(
    b"""{"id": "pro", "name": "Pro",
         "entitlements": {"pools": {"limit": 20}, "shadow": {}, "receipts": {"enabled": false}}}""",
    type=Plan,
)


def test_an_included_feature_passes_and_returns_its_entitlement() -> None:
    assert check_entitlement(PRO, "shadow") == Entitlement()
    assert check_entitlement(PRO, "shadow", 10**9) == Entitlement()  # no limit
    assert check_entitlement(PRO, "pools", 20).limit == 20


def test_a_missing_or_disabled_feature_is_entitlement_missing() -> None:
    with pytest.raises(EntitlementMissing) as caught:
        check_entitlement(PRO, "sso")
    assert caught.value.code == "entitlement.missing"
    assert caught.value.details == {"plan": "pro", "feature": "sso"}
    assert "does not include" in str(caught.value)
    with pytest.raises(EntitlementMissing, match="switched off"):
        check_entitlement(PRO, "receipts")


def test_an_amount_above_the_limit_is_refused_with_limit_and_request() -> None:
    with pytest.raises(EntitlementLimitExceeded) as caught:
        check_entitlement(PRO, "pools", 21)
    assert caught.value.code == "entitlement.limit_exceeded"
    assert caught.value.details == {"plan": "pro", "feature": "pools", "limit": 20, "requested": 21}


def test_a_plan_from_outside_is_decoded_strictly() -> None:
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(b'{"id": "x", "entitlements": {"a": {"limit": -1}}}', type=Plan)
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(b'{"id": "x", "features": {}}', type=Plan)
