"""The one error base of ductor-core, with a stable code and a retryable flag.

    DuctorError
     ├── DefinitionError      a definition that cannot be decoded or is invalid
     ├── ExpressionError      a CEL expression that does not compile or evaluate
     └── DurationError        a duration string that does not parse

Domain code never mentions HTTP; the server maps `code` to a status in one table.
"""

from __future__ import annotations

from typing import Any


class DuctorError(Exception):
    """Base of every Ductor error: a stable `code`, a message and `retryable`."""

    code: str = "ductor.error"
    retryable: bool = False

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        retryable: bool | None = None,
        details: Any = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if retryable is not None:
            self.retryable = retryable
        self.details = details


class DefinitionError(DuctorError):
    """A workflow definition that cannot be decoded or does not validate."""

    code = "definition.invalid"


class ExpressionError(DuctorError):
    """A CEL expression failed to compile or evaluate; names the expression."""

    code = "expression.error"

    def __init__(self, message: str, *, expression: str, code: str | None = None) -> None:
        super().__init__(f"{message} (in expression {expression!r})", code=code)
        self.expression = expression


class DurationError(DuctorError):
    """A duration string such as "2s" or "1h30m" that does not parse."""

    code = "duration.invalid"


def fault_text(exc: BaseException) -> str:
    """`exc` as `Type: text`, for the message of a failure that code from outside
    (a plugin, a provider) raised; never raises, though its text may."""
    try:
        text = str(exc)
    except Exception:
        text = "(its text could not be read)"
    return f"{type(exc).__name__}: {text}"
