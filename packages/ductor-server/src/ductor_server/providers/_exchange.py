"""One guarded HTTP exchange for the HTTP-shaped built-in providers (`http`,
`webhook`, `slack`, `openai`), and the redaction of a connection's secrets.

An exchange goes through the context's guarded client, reads at most
`MAX_RESPONSE_BYTES`, bounds the whole call by a timeout, and turns every
transport failure into a `ProviderFailed` whose code starts with the provider's
name (`<name>.timeout`, `<name>.connection`, `<name>.response_too_large`) or is
`outbound.forbidden`. It never follows a redirect and never puts a secret value
in an error: every message and detail passes through the connection's `Redactor`.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from ductor_server.engine.outbound import (
    MAX_RESPONSE_BYTES,
    OutboundForbidden,
    kept_headers,
    read_capped,
    response_body,
    retry_after,
)
from ductor_server.netaddr import host_name_problem
from ductor_server.providers.base import (
    REDACTED,
    CallContext,
    CheckResult,
    ProviderFailed,
    Redactor,
    provider_failure,
)

_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_FORBIDDEN_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "idempotency-key"}
)


def unknown_operation(provider: str, operation: str) -> ProviderFailed:
    """The `operation.unknown` failure (not retryable), as the step handler says it."""
    return provider_failure(
        "operation.unknown",
        f"{provider} has no operation {operation!r}",
        retryable=False,
    )


def elapsed_ms(started: float) -> float:
    """Milliseconds since `started` (a `time.perf_counter()` reading)."""
    return round((time.perf_counter() - started) * 1000, 3)


def failed_test(exc: ProviderFailed, started: float) -> CheckResult:
    """The answer of a connection test that failed with `exc` (`started`: a
    `time.perf_counter()` reading): not ok, its message, and its details with its code."""
    details = exc.error.details if isinstance(exc.error.details, Mapping) else {}
    return CheckResult(
        ok=False,
        message=exc.error.message,
        latency_ms=elapsed_ms(started),
        details={**details, "code": exc.error.code},
    )


def check_url(url: str, *, query: bool) -> None:
    """Refuse a URL that is not an absolute http(s) URL, carries credentials or a
    fragment, or (unless `query`) a query; a `ValueError`, which msgspec reports as
    a validation error of the field being decoded."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an absolute http:// or https:// URL")
    if not _port_ok(url):
        raise ValueError("must have a port from 1 to 65535")
    if parts.username is not None or parts.password is not None:
        raise ValueError("must not carry credentials (put them in the secrets)")
    if parts.fragment or (parts.query and not query):
        raise ValueError(
            "must not have a query or a fragment" if not query else "must not have a fragment"
        )
    if any(c in url for c in "\\\r\n\t\0 "):
        raise ValueError("must not contain spaces, backslashes or control characters")
    problem = host_name_problem(parts.hostname)
    if problem is not None:
        raise ValueError(problem)


def _port_ok(url: str | httpx.URL) -> bool:
    try:
        port = url.port if isinstance(url, httpx.URL) else urlsplit(url).port
    except ValueError:  # not a number, or out of range
        return False
    return port is None or 1 <= port <= 65535


def header_problems(
    headers: Mapping[str, str], pointer: str, *, ascii_only: bool = True
) -> list[dict[str, str]]:
    """What is wrong with `headers` (names that are not HTTP tokens, values with
    control characters or, when `ascii_only` as HTTP needs, anything but printable
    ASCII, headers the provider sets itself), each with a JSON pointer under
    `pointer`; never quoting a value."""
    problems: list[dict[str, str]] = []
    for name, value in headers.items():
        where = f"{pointer}/{_escape(name)}"
        if not _TOKEN.fullmatch(name):
            problems.append({"pointer": where, "message": "not a valid header name"})
        elif name.lower() in _FORBIDDEN_HEADERS:
            problems.append({"pointer": where, "message": f"{name} is set by the provider"})
        problem: str | None = None
        if ascii_only:
            problem = header_value_problem(value)
        elif any(c in value for c in "\r\n\0"):
            problem = "header values may not contain CR, LF or NUL"
        if problem is not None:
            problems.append({"pointer": where, "message": problem})
    return problems


def header_value_problem(value: str) -> str | None:
    """Why `value` cannot be sent as a header value, or None: a header goes out as
    ASCII, so it may hold printable ASCII, spaces and tabs only (never quoting it)."""
    if all(c == "\t" or " " <= c <= "~" for c in value):
        return None
    if any(c in value for c in "\r\n\0"):
        return "header values may not contain CR, LF or NUL"
    return "header values may hold only printable ASCII characters, spaces and tabs"


def bad_input(provider: str, problems: list[dict[str, str]]) -> ProviderFailed:
    """The `<provider>.bad_input` failure (not retryable) listing `problems`."""
    first = problems[0]
    return provider_failure(
        f"{provider}.bad_input",
        f"{provider}: {first['pointer'] or '/'}: {first['message']}",
        retryable=False,
        details={"problems": problems},
    )


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


@dataclass(frozen=True, slots=True)
class Answer:
    """A response read in full (within the cap)."""

    status: int
    headers: dict[str, str]
    body: Any
    content: bytes
    retry_after_seconds: float | None

    @property
    def ok(self) -> bool:
        """Whether the status is 2xx."""
        return 200 <= self.status < 300


async def exchange(
    context: CallContext,
    *,
    provider: str,
    method: str,
    url: str | httpx.URL,
    what: str,
    redactor: Redactor,
    headers: Mapping[str, str] | None = None,
    content: bytes | None = None,
    limit_seconds: float | None = None,
    max_bytes: int = MAX_RESPONSE_BYTES,
) -> Answer:
    """Send one request through `context.http` and read the answer.

    Args:
        context: the call's context (its guarded client and timeout).
        provider: the provider's name, the prefix of the error codes.
        method: the HTTP method.
        url: where to (already checked by the caller).
        what: how errors name the request (no secret in it).
        redactor: the connection's secrets, kept out of every error.
        headers: the request headers.
        content: the request body.
        limit_seconds: seconds for the whole exchange (at most `context.timeout_seconds`).
        max_bytes: the most of the response body read.

    Returns:
        The answer, whatever its status (the body's secrets redacted).

    Raises:
        ProviderFailed: `outbound.forbidden`, `<provider>.timeout`,
            `<provider>.connection` (both retryable), `<provider>.bad_input`,
            `<provider>.response_too_large`.
    """
    if not _port_ok(url):
        # The guard's resolver would crash on it, or the connect fail as if retryable.
        raise provider_failure(
            f"{provider}.bad_input",
            f"{what} could not be sent: the port is not from 1 to 65535",
            retryable=False,
        )
    seconds = context.timeout_seconds
    if limit_seconds is not None:
        seconds = min(seconds, limit_seconds)
    try:
        async with asyncio.timeout(seconds):
            async with context.http.stream(
                method,
                url,
                headers=headers,
                content=content,
                timeout=seconds,
                follow_redirects=False,
            ) as response:
                received = await read_capped(response, max_bytes)
    except OutboundForbidden as exc:
        raise provider_failure(
            "outbound.forbidden",
            redactor.text(str(exc)),
            retryable=False,
            details={"host": redactor.text(exc.host)},
        ) from None
    except (TimeoutError, httpx.TimeoutException):
        raise provider_failure(
            f"{provider}.timeout", f"{what} timed out after {seconds:g}s", retryable=True
        ) from None
    except (
        httpx.InvalidURL,
        httpx.UnsupportedProtocol,
        httpx.LocalProtocolError,
        UnicodeEncodeError,  # a header value that is not ASCII
    ):
        # The exception's text may quote a header value: it is not repeated.
        raise provider_failure(
            f"{provider}.bad_input", f"{what} could not be sent as given", retryable=False
        ) from None
    except httpx.HTTPError as exc:
        reason = redactor.text(str(exc)) or type(exc).__name__
        raise provider_failure(
            f"{provider}.connection", f"{what} failed: {reason}", retryable=True
        ) from None
    if received is None:
        raise provider_failure(
            f"{provider}.response_too_large",
            f"{what} answered more than {max_bytes} bytes",
            retryable=False,
            details={"status": response.status_code},
        )
    return Answer(
        status=response.status_code,
        headers=redactor.value(kept_headers(response)),
        body=redactor.value(response_body(response, received)),
        content=received,
        retry_after_seconds=retry_after(response),
    )


__all__ = [
    "REDACTED",
    "Answer",
    "Redactor",
    "bad_input",
    "check_url",
    "elapsed_ms",
    "exchange",
    "failed_test",
    "header_problems",
    "header_value_problem",
    "unknown_operation",
]
