"""Step handlers run by the workers: the registry one runtime uses and the built-in
handlers (`action:http`, `action:noop`; `bridge` and `route` hold
placeholders that report themselves unavailable until the real ones plug in).

A handler returns the step's output or raises `ActionFailed`; it never touches
run state or the store. Every external call carries the attempt's idempotency key.
There is no process-wide registry: whoever builds a runtime builds its registry.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import httpx
import msgspec

from ductor_core.durations import MAX_DURATION, parse_duration
from ductor_core.errors import DurationError
from ductor_core.runs import ErrorInfo
from ductor_server.engine.errors import DuplicateHandler
from ductor_server.engine.outbound import (
    MAX_RESPONSE_BYTES,
    OutboundForbidden,
    OutboundPolicy,
    guarded_transport,
    is_retryable_status,
    kept_headers,
    read_capped,
    response_body,
    retry_after,
)


class ActionCall(msgspec.Struct, frozen=True, kw_only=True):
    """What a handler is asked to do: one attempt of one step (or scatter item)."""

    tenant_id: str
    run_id: str
    step_ref: str
    item_index: int = -1
    attempt: int
    handler: str
    step_type: str = ""
    payload: Any = None
    idempotency_key: str
    timeout_seconds: float | None = None


class ActionFailed(Exception):
    """Raised by a handler to fail the attempt with `error` (retryable or not)."""

    def __init__(self, error: ErrorInfo) -> None:
        super().__init__(f"{error.code}: {error.message}")
        self.error = error


def failure(code: str, message: str, *, retryable: bool, **extra: Any) -> ActionFailed:
    """Build an `ActionFailed` for `code`."""
    return ActionFailed(ErrorInfo(code=code, message=message, retryable=retryable, **extra))


_ACTION_PREFIX = "action:"  # an ACTION step's `action: <name>` runs handler "action:<name>"

Handler = Callable[[ActionCall], Awaitable[Any]]
"""A step handler: takes the call, returns the output (JSON value) or raises ActionFailed."""


class ActionRegistry:
    """Handlers by handler name ("action:<name>", "bridge", "route").

    A name holds one handler: registering a second one is an error unless the
    caller says `replace=True`. A placeholder (`register_placeholder`) stands in
    for a handler this build may not serve, and the real one replaces it freely.
    """

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}
        self._placeholders: set[str] = set()

    def register(self, handler_name: str, fn: Handler, *, replace: bool = False) -> None:
        """Register `fn` under a raw handler name.

        Raises:
            DuplicateHandler: the name already has a handler (other than a
                placeholder) and `replace` is False.
        """
        taken = handler_name in self._handlers and handler_name not in self._placeholders
        if taken and not replace:
            raise DuplicateHandler(
                f"a handler is already registered for {handler_name!r} (pass replace=True)"
            )
        self._handlers[handler_name] = fn
        self._placeholders.discard(handler_name)

    def register_placeholder(self, handler_name: str, fn: Handler) -> None:
        """Register `fn` as a stand-in that a later `register` replaces without fuss."""
        if handler_name in self._handlers and handler_name not in self._placeholders:
            raise DuplicateHandler(f"a handler is already registered for {handler_name!r}")
        self._handlers[handler_name] = fn
        self._placeholders.add(handler_name)

    def register_action(self, name: str, fn: Handler, *, replace: bool = False) -> None:
        """Register a provider action, used by ACTION steps with `action: <name>`.

        Raises:
            DuplicateHandler: as `register`.
        """
        self.register(_ACTION_PREFIX + name, fn, replace=replace)

    def get(self, handler_name: str) -> Handler | None:
        """The handler for `handler_name`, or None."""
        return self._handlers.get(handler_name)

    async def aclose(self) -> None:
        """Release what handlers hold (HTTP clients); they reopen on next use."""
        for fn in self._handlers.values():
            close = getattr(fn, "aclose", None)
            if close is not None:
                await close()

    def names(self) -> list[str]:
        """Every registered handler name, sorted."""
        return sorted(self._handlers)

    def action_names(self) -> list[str]:
        """The actions an ACTION step may name (`action: <name>`), sorted."""
        return sorted(
            name.removeprefix(_ACTION_PREFIX)
            for name in self._handlers
            if name.startswith(_ACTION_PREFIX)
        )

    async def run(self, call: ActionCall) -> Any:
        """Run the handler for `call.handler`.

        Raises:
            ActionFailed: the handler failed, or none is registered
                (`handler.unknown`, not retryable).
        """
        fn = self._handlers.get(call.handler)
        if fn is None:
            raise failure(
                "handler.unknown",
                f"no handler registered for {call.handler!r}",
                retryable=False,
            )
        return await fn(call)


def action_params(call: ActionCall) -> Mapping[str, Any]:
    """The resolved params of an ACTION call (payload `{"params": {...}}` or the map itself)."""
    payload = call.payload
    if isinstance(payload, Mapping):
        params = payload.get("params", payload)
        if isinstance(params, Mapping):
            return params
    raise failure("action.bad_params", "action params must be a map", retryable=False)


# --- http --------------------------------------------------------------------


def _timeout_seconds(value: Any, default: float) -> float:
    """`params.timeout` in seconds: a number of seconds or a duration, held to what a
    duration in a definition may be (above zero, at most `MAX_DURATION`), so that
    0, a negative number, NaN or infinity never reach httpx (which reads 0 and
    below as a failed connection and NaN or infinity as no timeout at all)."""
    if value is None:
        return default
    if isinstance(value, bool):
        raise failure("action.bad_params", "timeout must be a number or duration", retryable=False)
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        try:
            seconds = parse_duration(value).total_seconds()
        except DurationError as exc:
            raise failure("action.bad_params", exc.message, retryable=False) from exc
    else:
        raise failure("action.bad_params", "timeout must be a number or duration", retryable=False)
    if not 0.0 < seconds <= MAX_DURATION.total_seconds():  # also false for NaN
        raise failure(
            "action.bad_params",
            f"timeout must be above zero and at most 36500d, got {value!r}",
            retryable=False,
        )
    return seconds


class HttpAction:
    """The built-in `http` action over one shared `httpx.AsyncClient`.

    Params: `method` (default GET, or POST when a `body` is given), `url`,
    `headers` (map), `body` (sent as JSON), `timeout` (seconds or "5s").
    2xx gives `{"status", "headers", "body"}`; 5xx, 408, 425, 429, timeouts and
    connection errors are retryable failures; other 4xx are not. Redirects are
    not followed (a 3xx is an answer). With a `policy`, an address it refuses
    fails the step as `outbound.forbidden`; a body over `max_response_bytes`
    fails it as `http.response_too_large` (neither is retried).
    """

    def __init__(
        self,
        client: httpx.AsyncClient | None = None,
        *,
        timeout: float = 30.0,
        policy: OutboundPolicy | None = None,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
    ) -> None:
        self._client = client
        self._owned = client is None
        self._timeout = timeout
        self._policy = policy
        self._max_response_bytes = max_response_bytes

    def _get_client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                follow_redirects=False,
                transport=guarded_transport(self._policy),
                trust_env=self._policy is None,
            )
        return self._client

    async def aclose(self) -> None:
        """Close the client if this action created it."""
        if self._client is not None and self._owned:
            await self._client.aclose()
            self._client = None

    async def __call__(self, call: ActionCall) -> Any:
        params = action_params(call)
        url = params.get("url")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise failure(
                "action.bad_params", "http: `url` must be an http(s) URL", retryable=False
            )
        has_body = "body" in params and params["body"] is not None
        method = params.get("method") or ("POST" if has_body else "GET")
        if not isinstance(method, str):
            raise failure("action.bad_params", "http: `method` must be a string", retryable=False)
        raw_headers = params.get("headers") or {}
        if not isinstance(raw_headers, Mapping):
            raise failure("action.bad_params", "http: `headers` must be a map", retryable=False)
        headers = {str(k): str(v) for k, v in raw_headers.items()}
        headers["Idempotency-Key"] = call.idempotency_key
        content: bytes | None = None
        if has_body:
            content = msgspec.json.encode(params["body"])
            headers.setdefault("Content-Type", "application/json")
        timeout = _timeout_seconds(params.get("timeout"), call.timeout_seconds or self._timeout)
        try:
            async with self._get_client().stream(
                method.upper(), url, headers=headers, content=content, timeout=timeout
            ) as response:
                received = await read_capped(response, self._max_response_bytes)
        except OutboundForbidden as exc:
            raise failure(
                "outbound.forbidden", str(exc), retryable=False, details={"host": exc.host}
            ) from exc
        except httpx.InvalidURL as exc:
            raise failure("action.bad_params", f"http: {exc}", retryable=False) from exc
        except httpx.TimeoutException as exc:
            raise failure("http.timeout", f"{method} {url} timed out", retryable=True) from exc
        except httpx.HTTPError as exc:
            raise failure(
                "http.connection", f"{method} {url} failed: {exc!s}", retryable=True
            ) from exc
        status = response.status_code
        if received is None:
            raise failure(
                "http.response_too_large",
                f"{method.upper()} {url} answered more than {self._max_response_bytes} bytes",
                retryable=False,
                details={"status": status},
            )
        output = {
            "status": status,
            "headers": kept_headers(response),
            "body": response_body(response, received),
        }
        if 200 <= status < 300:
            return output
        raise ActionFailed(
            ErrorInfo(
                code=f"http.{status}",
                message=f"{method.upper()} {url} answered {status}",
                retryable=is_retryable_status(status),
                retry_after_seconds=retry_after(response),
                details=output,
            )
        )


# --- other built-ins -------------------------------------------------------------


async def unavailable_handler(call: ActionCall) -> Any:
    """Fail non-retryably: this kind of step is not served by this build."""
    raise failure(
        "handler.unavailable",
        f"{call.handler!r} steps are not available in this server yet",
        retryable=False,
    )


async def noop_action(call: ActionCall) -> Any:
    """Do nothing and succeed with the params as output (for tests and benchmarks)."""
    payload = call.payload
    if isinstance(payload, Mapping):
        return payload.get("params", payload)
    return payload


def default_registry(http: HttpAction | None = None) -> ActionRegistry:
    """A new registry with the built-in handlers: `action:http`, `action:noop`,
    and placeholders for `bridge` and `route` (unavailable until the bridge and
    routing register theirs). NOTIFY steps run in the coordinator, not here."""
    registry = ActionRegistry()
    registry.register_action("http", http or HttpAction())
    registry.register_action("noop", noop_action)
    registry.register_placeholder("bridge", unavailable_handler)
    registry.register_placeholder("route", unavailable_handler)
    return registry
