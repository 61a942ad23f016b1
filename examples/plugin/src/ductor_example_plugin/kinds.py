"""A routable kind validator (`ductor.kinds`) for the kind `invoice`."""

from __future__ import annotations

from collections.abc import Iterator

from ductor_routing import Problem, Routable


def validate_invoice(routable: Routable) -> Iterator[Problem]:
    """Every problem of an invoice: `amount` a positive integer, `currency` three
    capital letters."""
    amount = routable.attributes.get("amount")
    if isinstance(amount, bool) or not isinstance(amount, int) or amount <= 0:
        yield Problem(pointer="/attributes/amount", message="an invoice needs a positive amount")
    currency = routable.attributes.get("currency")
    if not (isinstance(currency, str) and len(currency) == 3 and currency.isupper()):
        yield Problem(
            pointer="/attributes/currency", message="an invoice needs a 3-letter currency code"
        )
