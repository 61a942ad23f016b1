"""The `http` provider: requests to one HTTP API whose base URL a connection names,
with the connection's secret headers (a token, basic credentials) added.

A request's `path` is joined to the base URL and may not leave its origin (no
absolute URL, no scheme, no `//host`). It must not follow redirects, read an
unbounded body, or let a secret value reach an error or an output.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Mapping
from typing import Annotated, Any, Literal
from urllib.parse import unquote, urlsplit

import httpx
import msgspec

from ductor_core.runs import ErrorInfo
from ductor_server.engine.outbound import is_retryable_status
from ductor_server.providers._exchange import (
    Redactor,
    bad_input,
    check_url,
    elapsed_ms,
    exchange,
    failed_test,
    header_problems,
    header_value_problem,
    unknown_operation,
)
from ductor_server.providers.base import (
    CallContext,
    CheckResult,
    Operation,
    ProviderFailed,
)

Method = Literal["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
QueryValue = str | int | float | bool | list[str | int | float | bool]
Timeout = Annotated[float, msgspec.Meta(gt=0, le=600)]


def check_base_url(url: str) -> None:
    """Refuse a base URL that is not an absolute http(s) URL without credentials,
    query or fragment (a `ValueError`, which msgspec reports as a validation error).
    """
    check_url(url, query=False)


def _check_header_map(headers: dict[str, str], what: str) -> None:
    problems = header_problems(headers, "")
    if problems:
        raise ValueError(f"{what}{problems[0]['pointer']}: {problems[0]['message']}")


class HttpSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A connection's `config`.

    Attributes:
        base_url: the API's absolute http(s) URL; request paths are joined to it.
        headers: default headers sent with every request (not secret).
        timeout: seconds one request may take (at most the step's timeout).
    """

    base_url: str
    headers: dict[str, str] = {}
    timeout: Timeout = 30.0

    def __post_init__(self) -> None:
        check_base_url(self.base_url)
        _check_header_map(self.headers, "headers")


class HttpSecrets(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A connection's `secrets`; at most one of `bearer_token` and
    `username`/`password`, and neither beside an `Authorization` header.

    Attributes:
        headers: secret headers sent with every request (e.g. `Authorization`, `X-Api-Key`).
        bearer_token: sent as `Authorization: Bearer <token>`.
        username: with `password`, sent as HTTP basic authentication.
        password: the basic-authentication password.
    """

    headers: dict[str, str] = {}
    bearer_token: str | None = None
    username: str | None = None
    password: str | None = None

    def __post_init__(self) -> None:
        _check_header_map(self.headers, "headers")
        schemes = (self.bearer_token is not None) + (
            self.username is not None or self.password is not None
        )
        has_header = any(k.lower() == "authorization" for k in self.headers)
        if schemes + has_header > 1:
            raise ValueError(
                "give one of bearer_token, username/password and an Authorization header"
            )
        if (self.username is None) != (self.password is None):
            raise ValueError("username and password go together")
        for value in (self.bearer_token, self.username, self.password):
            if value is not None and any(c in value for c in "\r\n\0"):
                raise ValueError("credentials may not contain CR, LF or NUL")
        if self.bearer_token is not None and header_value_problem(self.bearer_token):
            raise ValueError(
                "bearer_token may hold only printable ASCII characters (it goes out in a header)"
            )
        if self.username is not None and ":" in self.username:
            raise ValueError("a basic-authentication username may not contain ':'")

    def auth_headers(self) -> dict[str, str]:
        """The headers these secrets add to a request."""
        headers = dict(self.headers)
        if self.bearer_token is not None:
            headers["Authorization"] = f"Bearer {self.bearer_token}"
        if self.username is not None and self.password is not None:
            pair = f"{self.username}:{self.password}".encode()
            headers["Authorization"] = f"Basic {base64.b64encode(pair).decode('ascii')}"
        return headers

    def redactor(self) -> Redactor:
        """What keeps these secrets out of errors and outputs."""
        return Redactor(
            [
                *self.auth_headers().values(),
                *self.headers.values(),
                self.bearer_token,
                self.password,
            ]
        )


class RequestInput(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The input of `request`.

    Attributes:
        method: the HTTP method (default GET, or POST when a body is given).
        path: joined to the base URL's path; may not hold a scheme or a host.
        query: query parameters, added to the URL.
        headers: request headers (the connection's secret headers win).
        body: a JSON value sent as the body (`Content-Type: application/json`).
    """

    method: Method | None = None
    path: str = ""
    query: dict[str, QueryValue] = {}
    headers: dict[str, str] = {}
    body: Any = None


class HttpResponse(msgspec.Struct, frozen=True, kw_only=True):
    """The output of `request` (and the `details` of an `http.<status>` failure).

    Attributes:
        status: the HTTP status.
        headers: Content-Type, Content-Length, Location, ETag and Retry-After, if sent.
        body: the body as JSON when it says it is JSON, else as text; null when empty.
    """

    status: int
    headers: dict[str, str]
    body: Any


def merge_headers(*layers: Mapping[str, str]) -> dict[str, str]:
    """The headers of `layers`, a later layer's header replacing an earlier one of
    the same name in any letter case."""
    merged: dict[str, str] = {}
    for layer in layers:
        for name, value in layer.items():
            for existing in [k for k in merged if k.lower() == name.lower()]:
                del merged[existing]
            merged[name] = value
    return merged


def join_url(base_url: str, path: str) -> httpx.URL:
    """`path` appended to the path of `base_url`.

    Raises:
        ValueError: `path` names a scheme or a host, holds a backslash, a
            control character or a `.` or `..` segment (even percent-encoded),
            the result is no valid URL (too long) or leaves the base URL's origin.
    """
    if "\\" in path or any(ord(c) < 32 or ord(c) == 127 for c in path):
        raise ValueError("may not contain backslashes or control characters")
    parts = urlsplit(path)
    if parts.scheme or parts.netloc or path.startswith("//"):
        raise ValueError("must be a path, not an absolute URL")
    # A server that decodes `%2F` or `%5C` before it resolves dot segments would
    # climb out with `..%2F`: segments are looked for after decoding too.
    decoded = unquote(parts.path)
    if "\\" in decoded:
        raise ValueError("may not contain backslashes, even percent-encoded")
    if any(segment in (".", "..") for segment in decoded.split("/")):
        raise ValueError("may not hold . or .. segments (it stays under the base URL's path)")
    base = httpx.URL(base_url)
    try:
        url = base if not path else httpx.URL(base_url.rstrip("/") + "/" + path.lstrip("/"))
    except httpx.InvalidURL as exc:  # e.g. longer than a URL may be
        raise ValueError(f"does not make a valid URL: {exc}") from None
    if (url.scheme, url.host, url.port) != (base.scheme, base.host, base.port):
        raise ValueError("must stay on the base URL's origin")
    return url


class HttpProvider:
    """The `http` provider (one instance serves every connection)."""

    name: str = "http"
    description: str = "Requests to an HTTP API at a base URL, with secret headers."
    settings: type[msgspec.Struct] = HttpSettings
    secrets: type[msgspec.Struct] = HttpSecrets
    operations: Mapping[str, Operation] = {
        "request": Operation(
            name="request",
            description="Send one HTTP request to a path under the base URL.",
            input=RequestInput,
            output=HttpResponse,
        )
    }

    async def call(
        self,
        operation: str,
        settings: HttpSettings,
        secrets: HttpSecrets,
        input: RequestInput,
        context: CallContext,
    ) -> Any:
        """Run `request`: 2xx gives `{status, headers, body}`; other answers fail
        as `http.<status>` (5xx, 408, 425 and 429 retryable)."""
        if operation != "request":
            raise unknown_operation(self.name, operation)
        problems = header_problems(input.headers, "/headers")
        try:
            url = join_url(settings.base_url, input.path)
        except ValueError as exc:
            problems.insert(0, {"pointer": "/path", "message": str(exc)})
        if problems:
            raise bad_input("http", problems)
        if input.query:
            try:
                url = url.copy_merge_params(_query(input.query))
            except httpx.InvalidURL as exc:  # e.g. longer than a URL may be
                message = f"does not make a valid URL: {exc}"
                raise bad_input("http", [{"pointer": "/query", "message": message}]) from None
        method = input.method or ("GET" if input.body is None else "POST")
        headers = merge_headers(settings.headers, input.headers, secrets.auth_headers())
        content: bytes | None = None
        if input.body is not None:
            content = msgspec.json.encode(input.body)
            if not any(k.lower() == "content-type" for k in headers):
                headers["Content-Type"] = "application/json"
        headers["Idempotency-Key"] = context.idempotency_key
        redactor = secrets.redactor()
        what = redactor.text(f"{method} {url.copy_with(query=None)}")
        answer = await exchange(
            context,
            provider="http",
            method=method,
            url=url,
            what=what,
            redactor=redactor,
            headers=headers,
            content=content,
            limit_seconds=settings.timeout,
        )
        output = HttpResponse(status=answer.status, headers=answer.headers, body=answer.body)
        if answer.ok:
            return msgspec.to_builtins(output)
        raise ProviderFailed(
            ErrorInfo(
                code=f"http.{answer.status}",
                message=f"{what} answered {answer.status}",
                retryable=is_retryable_status(answer.status),
                retry_after_seconds=answer.retry_after_seconds,
                details=msgspec.to_builtins(output),
            )
        )

    async def test(
        self, settings: HttpSettings, secrets: HttpSecrets, context: CallContext
    ) -> CheckResult:
        """`HEAD` the base URL with the connection's headers: ok unless the request
        fails, the server answers 5xx, or it refuses the credentials (401, 403)."""
        redactor = secrets.redactor()
        started = time.perf_counter()
        try:
            answer = await exchange(
                context,
                provider="http",
                method="HEAD",
                url=settings.base_url,
                what=f"HEAD {settings.base_url}",
                redactor=redactor,
                headers=merge_headers(settings.headers, secrets.auth_headers()),
                limit_seconds=settings.timeout,
            )
        except ProviderFailed as exc:
            return failed_test(exc, started)
        ok = answer.status < 500 and answer.status not in (401, 403)
        verdict = "reachable" if ok else "refused"
        return CheckResult(
            ok=ok,
            message=f"HEAD {settings.base_url} answered {answer.status} ({verdict})",
            latency_ms=elapsed_ms(started),
            details={"status": answer.status},
        )


def _query(query: dict[str, QueryValue]) -> dict[str, Any]:
    def text(v: str | int | float | bool) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        return str(v)

    return {k: [text(x) for x in v] if isinstance(v, list) else text(v) for k, v in query.items()}


__all__ = [
    "HttpProvider",
    "HttpResponse",
    "HttpSecrets",
    "HttpSettings",
    "RequestInput",
    "check_base_url",
    "join_url",
    "merge_headers",
]
