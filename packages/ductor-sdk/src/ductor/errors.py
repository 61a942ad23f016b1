"""The SDK's errors: one base with a stable `code` and `retryable`, plus control flow.

    DuctorError                  base: stable `code`, `message`, `retryable`, `details`
     ├── NonRetriableError       raised by user code: fail now, do not retry
     ├── RetryAfterError         raised by user code: retry, not before `retry_after`
     ├── StepFailed              a step that failed for good, replayed from history
     ├── NonDeterminismError     the workflow's code changed under a running run
     ├── SignatureError          a bridge message whose signature does not verify
     ├── ProtocolError           a bridge message that does not decode or make sense
     ├── WorkflowNotFound        an execute/cancel for a workflow this app does not serve
     ├── DurationError           a duration string that does not parse
     └── ApiError                an error answer from the Ductor REST API (with `status`)

    BaseException
     └── StepInterrupt           the SDK's "stop here" signal; `except Exception` cannot
                                 swallow it

The SDK depends on msgspec and httpx only, so this base mirrors (does not import)
`ductor_core.errors.DuctorError`: same attributes, same meaning. Nothing here does I/O.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any


class DuctorError(Exception):
    """Base of every SDK error: a stable `code`, a message and `retryable`."""

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


class NonRetriableError(DuctorError):
    """Raise from a step or a workflow body to fail it at once, without retries."""

    code = "step.non_retriable"
    retryable = False


class RetryAfterError(DuctorError):
    """Raise from a step or a workflow body to ask for a retry after a delay.

    Args:
        message: what went wrong.
        retry_after: the least time to wait before the next attempt.
    """

    code = "step.retry_after"
    retryable = True

    def __init__(
        self,
        message: str,
        *,
        retry_after: timedelta,
        code: str | None = None,
        details: Any = None,
    ) -> None:
        if not isinstance(retry_after, timedelta):
            raise TypeError(f"retry_after must be a timedelta, got {retry_after!r}")
        super().__init__(message, code=code, details=details)
        self.retry_after = retry_after


class StepFailed(DuctorError):
    """A step failed for good (its retries are spent or it was non-retriable).

    Raised where the workflow awaits that step, on every replay, so user code
    can catch it and compensate. `step` is the step's name; `code` and
    `message` are those of the recorded error.
    """

    code = "step.failed"
    retryable = False

    def __init__(self, step: str, *, code: str, message: str, details: Any = None) -> None:
        super().__init__(f"step {step!r} failed: {message}", code=code, details=details)
        self.step = step
        self.error_message = message


class NonDeterminismError(DuctorError):
    """The workflow asked for steps that do not match the run's recorded history.

    The code changed under a running run (a step renamed, inserted, removed,
    reordered or of another kind). The run fails rather than mis-replaying.
    """

    code = "workflow.changed"
    retryable = False

    def __init__(self, message: str, *, step: str) -> None:
        super().__init__(message)
        self.step = step


class SignatureError(DuctorError):
    """A bridge message whose `Ductor-Signature` is missing, malformed, stale or wrong."""

    code = "signature.invalid"


class ProtocolError(DuctorError):
    """A bridge message that does not decode, or asks for something impossible."""

    code = "protocol.invalid"


class WorkflowNotFound(DuctorError):
    """The engine asked for a workflow id this app does not serve."""

    code = "workflow.not_found"


class DurationError(DuctorError):
    """A duration string such as "2s" or "1h30m" that does not parse."""

    code = "duration.invalid"


class ApiError(DuctorError):
    """An error answer from the Ductor REST API.

    Attributes:
        status: the HTTP status code.
        code: the stable error code from the body (`"run.not_found"`, ...).
    """

    code = "api.error"

    def __init__(
        self,
        message: str,
        *,
        status: int,
        code: str | None = None,
        details: Any = None,
        retryable: bool | None = None,
    ) -> None:
        super().__init__(message, code=code, details=details, retryable=retryable)
        self.status = status


class StepInterrupt(BaseException):
    """Stops a workflow body at a step the SDK will not run in this request.

    A `BaseException` so user code's `except Exception` cannot swallow it.
    Never catch it; the SDK raises and handles it.
    """
