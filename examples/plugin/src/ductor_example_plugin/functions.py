"""A CEL function (`ductor.cel.functions`): pure, over JSON values."""

from __future__ import annotations

import re
from typing import Any

_NOT_WORD = re.compile(r"[^a-z0-9]+")


def example_slug(text: Any) -> str:
    """example_slug(s): s in lower case, runs of other than a-z and 0-9 made one '-'."""
    if not isinstance(text, str):
        raise TypeError(f"example_slug() wants a string, got {type(text).__name__}")
    return _NOT_WORD.sub("-", text.lower()).strip("-")


EXAMPLES = (
    ('example_slug("Hello, World")', "hello-world"),
    ('example_slug("  Ductor  2.0 ")', "ductor-2-0"),
    ('example_slug("") == ""', True),
    ('size(example_slug("a b c"))', 5),
    ('[" A", "b "].map(s, example_slug(s))', ["a", "b"]),
)
"""Expressions and their answers, the same on every engine."""
