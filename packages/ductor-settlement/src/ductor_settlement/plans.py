"""Plans and entitlements: what a tenant's plan lets it use, and one check to ask.

Pure data and one function; the server looks up the tenant's plan and calls
`check_entitlement` before doing the thing the plan gates.

A `Plan` maps feature names to `Entitlement`s. An entitlement is a feature flag
(`enabled`) and an optional numeric `limit`. A feature the plan does not list,
or lists as disabled, is missing (``entitlement.missing``). With an `amount`,
the check also compares it to the limit (``entitlement.limit_exceeded`` when
above it); the amount is the total the tenant would have after the action (the
number of pools after creating one), not the increment. A feature with no limit
is unlimited.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from ductor_settlement.errors import EntitlementLimitExceeded, EntitlementMissing

__all__ = ["Entitlement", "Plan", "check_entitlement"]


class Entitlement(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a plan grants for one feature.

    Attributes:
        enabled: the feature is on.
        limit: the most of it the tenant may have or use; None is unlimited.
    """

    enabled: bool = True
    limit: Annotated[int, msgspec.Meta(ge=0)] | None = None


class Plan(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A named set of entitlements.

    As JSON: ``{"id": "pro", "entitlements": {"pools": {"limit": 20}, "shadow": {}}}``.

    Attributes:
        id: stable plan id.
        name: for people.
        entitlements: entitlement per feature name.
    """

    id: str
    name: str = ""
    entitlements: dict[str, Entitlement] = {}


def check_entitlement(plan: Plan, feature: str, amount: int | None = None) -> Entitlement:
    """The plan's entitlement for `feature`, if it allows `amount` of it.

    Args:
        plan: the tenant's plan.
        feature: the feature asked for.
        amount: the total the tenant would reach; None checks only the flag.

    Raises:
        EntitlementMissing: the plan does not include `feature` or has it off.
        EntitlementLimitExceeded: `amount` is above the feature's limit.
    """
    entitlement = plan.entitlements.get(feature)
    if entitlement is None or not entitlement.enabled:
        state = "does not include" if entitlement is None else "has switched off"
        raise EntitlementMissing(
            f"plan {plan.id!r} {state} feature {feature!r}",
            details={"plan": plan.id, "feature": feature},
        )
    if amount is not None and entitlement.limit is not None and amount > entitlement.limit:
        raise EntitlementLimitExceeded(
            f"plan {plan.id!r} allows {entitlement.limit} of {feature!r}, {amount} were asked for",
            details={
                "plan": plan.id,
                "feature": feature,
                "limit": entitlement.limit,
                "requested": amount,
            },
        )
    return entitlement
