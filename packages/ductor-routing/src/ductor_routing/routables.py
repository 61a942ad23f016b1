"""The routable: the one generic work item every routing decision is about.

Plain data only; nothing here routes, reads a clock or does I/O.
"""

from __future__ import annotations

from typing import Any

import msgspec


class Consent(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The consent that travels with a routable (e.g. a lead's opt-in).

    Attributes:
        granted: whether the subject consented to be contacted.
        scopes: what the consent covers (e.g. "phone", "email").
        evidence: where the consent was captured (a URL, a form id, a recording id).
        captured_at: when it was captured, ISO-8601 UTC.
    """

    granted: bool
    scopes: tuple[str, ...] = ()
    evidence: str | None = None
    captured_at: str | None = None


class Routable(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A unit of work to route: a lead, a ticket, an AI task, an inbound event.

    Attributes:
        id: the caller's id, unique per tenant.
        kind: selects the schema the routable is validated against.
        tenant: the tenant that owns it.
        attributes: JSON attributes; rules, filters and strategies read them.
        consent: the consent trail, when the kind needs one.
        price: the routable's own price in integer micros, if it has one.
    """

    id: str
    kind: str
    tenant: str = "default"
    attributes: dict[str, Any] = {}
    consent: Consent | None = None
    price: int | None = None

    def with_attributes(self, extra: dict[str, Any]) -> Routable:
        """A copy whose attributes are these plus `extra` (extra wins)."""
        if not extra:
            return self
        merged = dict(self.attributes)
        merged.update(extra)
        return msgspec.structs.replace(self, attributes=merged)

    def activation(self) -> dict[str, Any]:
        """The routable as the JSON value CEL sees under the name `routable`."""
        return {
            "id": self.id,
            "kind": self.kind,
            "tenant": self.tenant,
            "attributes": self.attributes,
            "consent": msgspec.to_builtins(self.consent) if self.consent is not None else None,
            "price": self.price,
        }
