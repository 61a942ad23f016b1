"""What a notification's avatar, CTA URLs and CTA labels may hold: the one set of
rules the NOTIFY step (when validated and when it runs) and the inbox's send API
apply. Pure checks: nothing here evaluates CEL or knows HTTP.

A subscriber's client renders a CTA's `url` as a link and the `avatar` as an
image, so both are absolute `http`/`https` URLs: a `javascript:`, `data:` or
`vbscript:` URL would run script in the subscriber's page. A label is shown on
a button, so it is short, one line and printable.

    url, avatar   absolute http:// or https:// URL with a host, at most
                  MAX_URL characters, no whitespace, no control character
    label         1 to MAX_LABEL characters, no control character
    subscriber    1 to MAX_SUBSCRIBER_ID characters, no control character
    title, body   at most MAX_TEXT characters each, no NUL
    data          at most MAX_DATA_BYTES of JSON, no NUL in a string or a key

The sizes matter most for a NOTIFY step, which copies one notification to up
to 1,000 recipients (and each into their change log): without them one run's
input of a megabyte would be written a thousand times over. A NUL (U+0000),
which the send API refuses anywhere in its body, is refused here too: a
PostgreSQL text column cannot hold one, so a step that wrote one could never
commit its tick.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any
from urllib.parse import urlsplit

import msgspec

MAX_URL = 2048
"""The longest CTA `url` or `avatar`, in characters."""

MAX_LABEL = 200
"""The longest CTA `label`, in characters."""

MAX_SUBSCRIBER_ID = 200
"""The longest subscriber id, in characters."""

SUBSCRIBER_ID_RULE = f"must be 1 to {MAX_SUBSCRIBER_ID} characters without control characters"
"""How a refusal of a subscriber id says what is wanted."""

MAX_TEXT = 10_000
"""The longest `title` or `body`, in characters."""

MAX_DATA_BYTES = 65_536
"""The most bytes of JSON a notification's `data` takes (64 KiB)."""

TEXT_RULE = f"must be at most {MAX_TEXT} characters, none of them NUL (U+0000)"
"""How a refusal of a `title` or `body` says what is wanted."""

DATA_RULE = (
    f"must be at most {MAX_DATA_BYTES // 1024} KiB of JSON, with no NUL (U+0000)"
    " in a string or a key"
)
"""How a refusal of `data` says what is wanted."""

URL_RULE = (
    f"must be an absolute http or https URL of at most {MAX_URL} characters "
    "without whitespace or control characters"
)
"""How a refusal of a `url` or an `avatar` says what is wanted."""

LABEL_RULE = f"must be 1 to {MAX_LABEL} characters without control characters"
"""How a refusal of a `label` says what is wanted."""


# A `\u0000` escape in encoded JSON that is not an escaped backslash followed by
# the text `u0000`: a NUL in one of the value's strings or keys.
_NUL_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")


def _control(ch: str) -> bool:
    # Cc: U+0000-U+001F, U+007F and the C1 controls U+0080-U+009F.
    return unicodedata.category(ch) == "Cc"


def is_link(value: str) -> bool:
    """Whether `value` is an acceptable CTA `url` or `avatar` (see the module rules)."""
    if not value or len(value) > MAX_URL:
        return False
    if any(ch.isspace() or _control(ch) for ch in value):
        return False
    scheme, _, rest = value.partition(":")
    if scheme.lower() not in ("http", "https") or not rest.startswith("//"):
        return False
    try:
        host = urlsplit(value).hostname
    except ValueError:  # an unbalanced [IPv6] host
        return False
    return bool(host)


def is_label(value: str) -> bool:
    """Whether `value` is an acceptable CTA `label` (see the module rules)."""
    return 0 < len(value) <= MAX_LABEL and not any(_control(ch) for ch in value)


def is_text(value: str) -> bool:
    """Whether `value` is an acceptable `title` or `body` (see the module rules)."""
    return len(value) <= MAX_TEXT and "\x00" not in value


def is_data(value: dict[str, Any]) -> bool:
    """Whether `value` is an acceptable `data` (see the module rules)."""
    raw = msgspec.json.encode(value)
    return len(raw) <= MAX_DATA_BYTES and _NUL_ESCAPE.search(raw) is None


def is_subscriber_id(value: str) -> bool:
    """Whether `value` is an acceptable subscriber id (see the module rules)."""
    return 0 < len(value) <= MAX_SUBSCRIBER_ID and not any(_control(ch) for ch in value)
