"""Money primitives every settlement module shares: currency codes and the micros range.

Plain values and checks only; no rounding policy lives here (see `pricing.py`).
"""

from __future__ import annotations

import re

__all__ = [
    "CURRENCY_PATTERN",
    "MAX_MICROS",
    "MICROS_PER_UNIT",
    "currency_problem",
    "format_micros",
    "micros_problem",
]

MICROS_PER_UNIT = 1_000_000
"""One unit of a currency (1 USD) is one million micros."""

MAX_MICROS = 2**53 - 1
"""The largest amount or balance, in micros (about 9 billion units).

2**53 - 1 is the largest integer every JSON reader (JavaScript included) holds
exactly, and the largest RFC 8785 canonicalizes; it also fits a Postgres bigint.
"""

CURRENCY_PATTERN = re.compile(r"[A-Z][A-Z0-9]{2,11}")
"""A currency code: ISO 4217 ("USD") or a house unit ("CREDITS"), upper case, 3-12 chars."""


def currency_problem(currency: object) -> str | None:
    """Why `currency` is not a valid currency code, or None when it is."""
    if not isinstance(currency, str) or CURRENCY_PATTERN.fullmatch(currency) is None:
        return f"currency {currency!r} is not an upper-case code of 3 to 12 letters or digits"
    return None


def micros_problem(amount: object, *, allow_zero: bool = False, signed: bool = False) -> str | None:
    """Why `amount` is not a valid amount of micros, or None when it is.

    Args:
        amount: the value to check; must be an `int` (a `bool` is refused).
        allow_zero: whether 0 is acceptable.
        signed: whether negative values are acceptable (their magnitude is bounded too).
    """
    if isinstance(amount, bool) or not isinstance(amount, int):
        return f"amount {amount!r} is not an integer number of micros"
    if amount == 0 and not allow_zero:
        return "amount is zero"
    if amount < 0 and not signed:
        return f"amount {amount} is negative"
    if abs(amount) > MAX_MICROS:
        return f"amount {amount} is beyond the {MAX_MICROS} micros limit"
    return None


def format_micros(amount: int, currency: str) -> str:
    """Micros as a decimal string with its currency, e.g. ``-1.500000 USD``."""
    sign = "-" if amount < 0 else ""
    units, micros = divmod(abs(amount), MICROS_PER_UNIT)
    return f"{sign}{units}.{micros:06d} {currency}"
