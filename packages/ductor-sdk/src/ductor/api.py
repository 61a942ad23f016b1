"""Typed client of the Ductor REST API (sync `ApiClient` and `AsyncApiClient`).

Trigger runs, send events and signals, read and cancel runs, wait for a
result. Every call sends `Authorization: Bearer <api key>`; an error answer
(`{"code", "message", "details"}`) raises `ApiError` with its code and status.
Answers are read leniently (unknown fields ignored) so a newer server works.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, Final, Self, TypeVar
from urllib.parse import quote

import httpx
import msgspec

from ductor import _telemetry
from ductor._answers import ErrorBody, decode_answer
from ductor.errors import ApiError
from ductor.protocol import UNREADABLE_JSON

__all__ = [
    "DEFAULT_BASE_URL",
    "TERMINAL_STATUSES",
    "ApiClient",
    "AsyncApiClient",
    "EventAccepted",
    "RefusedRun",
    "Run",
    "RunStatus",
]

DEFAULT_BASE_URL: Final = "http://127.0.0.1:7070"
"""Where `ductor dev` serves by default."""

R = TypeVar("R", bound=msgspec.Struct)


class RunStatus(enum.StrEnum):
    """A run's status as the API reports it."""

    PENDING = "RUN_STATUS_PENDING"
    RUNNING = "RUN_STATUS_RUNNING"
    SUCCEEDED = "RUN_STATUS_SUCCEEDED"
    FAILED = "RUN_STATUS_FAILED"
    CANCELLED = "RUN_STATUS_CANCELLED"


TERMINAL_STATUSES: Final = frozenset(
    {RunStatus.SUCCEEDED.value, RunStatus.FAILED.value, RunStatus.CANCELLED.value}
)
"""Statuses a run never leaves."""


class Run(msgspec.Struct, frozen=True, kw_only=True):
    """A run as `GET /v1/runs/{id}` returns it.

    `status` is a string (see `RunStatus`) so a status added later still decodes.
    """

    id: str
    status: str
    family_slug: str | None = None
    version: int | None = None
    input: Any = None
    output: Any = None
    error: Any = None
    steps: Any = None

    @property
    def done(self) -> bool:
        """Whether the run reached a terminal status."""
        return self.status in TERMINAL_STATUSES

    @property
    def succeeded(self) -> bool:
        """Whether the run succeeded."""
        return self.status == RunStatus.SUCCEEDED


class RefusedRun(msgspec.Struct, frozen=True, kw_only=True):
    """A run an event's trigger matched but did not start: `code` says why
    (`run.input_invalid`: the event's data does not satisfy the workflow's
    `input_schema`), `problems` each `{"pointer", "message"}` into the event."""

    family_slug: str
    version: int
    code: str
    problems: list[dict[str, Any]] = []


class EventAccepted(msgspec.Struct, frozen=True, kw_only=True):
    """The answer to `POST /v1/events`: the event's id, whether it repeated one
    already stored, the runs it started, the waiting runs it reached and the
    runs its triggers matched but did not start."""

    id: str | None = None
    name: str | None = None
    duplicate: bool = False
    runs_started: list[str] = []
    runs_notified: list[str] = []
    runs_refused: list[RefusedRun] = []


class _Call(msgspec.Struct, frozen=True, kw_only=True):
    """One prepared API call, shared by the sync and async clients."""

    method: str
    path: str
    body: bytes | None = None
    headers: dict[str, str] = {}


def _traced(call: _Call) -> dict[str, str]:
    """The call's headers with the current trace context (OpenTelemetry, if installed)."""
    headers = dict(call.headers)
    _telemetry.inject(headers)
    return headers


def _post(path: str, body: Any, idempotency_key: str | None = None) -> _Call:
    headers = {} if idempotency_key is None else {"Idempotency-Key": idempotency_key}
    return _Call(method="POST", path=path, body=msgspec.json.encode(body), headers=headers)


def _trigger(
    family_slug: str, input: Any, version: int | None, idempotency_key: str | None
) -> _Call:
    body: dict[str, Any] = {"family_slug": family_slug, "input": input}
    if version is not None:
        body["version"] = version
    return _post("/v1/runs", body, idempotency_key)


def _event(name: str, data: Any, id: str | None, idempotency_key: str | None) -> _Call:
    body: dict[str, Any] = {"name": name, "data": data}
    if id is not None:
        body["id"] = id
    return _post("/v1/events", body, idempotency_key)


def _run_path(run_id: str, suffix: str = "") -> str:
    return f"/v1/runs/{quote(run_id, safe='')}{suffix}"


def _get_run(run_id: str, wait: float | None = None) -> _Call:
    path = _run_path(run_id)
    if wait is not None:
        path += f"?wait={wait:.3f}"
    return _Call(method="GET", path=path)


LONG_POLL = 30.0
"""Seconds one request of `wait_for_result` asks the server to hold it (a long
poll: `GET /v1/runs/{id}?wait=`, answered as soon as the run ends)."""


def _signal(run_id: str, name: str, payload: Any, id: str | None) -> _Call:
    body: dict[str, Any] = {"payload": payload}
    if id is not None:
        body["id"] = id
    return _post(_run_path(run_id, f"/signals/{quote(name, safe='')}"), body)


def _cancel(run_id: str, reason: str | None) -> _Call:
    if reason is None:
        return _Call(method="POST", path=_run_path(run_id, "/cancel"))
    return _post(_run_path(run_id, "/cancel"), {"reason": reason})


def _decode(call: _Call, response: httpx.Response, type_: type[R]) -> R:
    _raise_for(call, response)
    return decode_answer(call.method, call.path, response, type_)


def _raise_for(call: _Call, response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    retryable = response.status_code >= 500 or response.status_code == 429
    try:
        err = msgspec.json.decode(response.content, type=ErrorBody)
    except UNREADABLE_JSON:
        raise ApiError(
            f"{call.method} {call.path} answered {response.status_code}: {response.text[:200]}",
            status=response.status_code,
            retryable=retryable,
        ) from None
    raise ApiError(
        err.message or f"{call.method} {call.path} answered {response.status_code}",
        status=response.status_code,
        code=err.code,
        details=err.details,
        retryable=retryable,
    )


def _http_options(base_url: str, api_key: str | None, timeout: float) -> dict[str, Any]:
    """The httpx client settings both API clients share."""
    headers = {"content-type": "application/json", "accept": "application/json"}
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    return {"base_url": base_url.rstrip("/"), "headers": headers, "timeout": timeout}


def _longer(timeout: httpx.Timeout, extra: float) -> httpx.Timeout:
    """`timeout` with `extra` seconds more to read the answer."""
    read = None if timeout.read is None else timeout.read + extra
    return httpx.Timeout(connect=timeout.connect, read=read, write=timeout.write, pool=timeout.pool)


class _Poll:
    """The deadline of one `wait_for_result`; the clients only fetch and sleep."""

    def __init__(self, run_id: str, timeout: float, clock: Callable[[], float]) -> None:
        self._run_id = run_id
        self._timeout = timeout
        self._clock = clock
        self._deadline = clock() + timeout

    def finished(self, run: Run) -> bool:
        """Whether `run` is done; raises TimeoutError once the deadline has passed."""
        if run.done:
            return True
        if self._clock() >= self._deadline:
            raise TimeoutError(f"run {self._run_id!r} still {run.status} after {self._timeout}s")
        return False

    def refused(self, response: httpx.Response) -> bool:
        """Whether the server refused to hold this request for now (429: too many of
        the tenant's requests wait, `run.wait_limit`), so the client pauses
        `interval` and asks again; raises TimeoutError once the deadline has passed."""
        if response.status_code != 429:
            return False
        if self._clock() >= self._deadline:
            raise TimeoutError(
                f"run {self._run_id!r}: the server refused to wait for it (429) until"
                f" {self._timeout}s had passed"
            )
        return True

    def wait(self) -> float:
        """How long the next request asks the server to hold it: the time left,
        at most `LONG_POLL` seconds, and at least a millisecond."""
        return min(LONG_POLL, max(self._deadline - self._clock(), 0.001))

    @staticmethod
    def held(asked: float, wait: float) -> bool:
        """Whether the server held a request asked at `asked` (monotonic) for about
        `wait` seconds; an answer much sooner, with the run not done, comes from a
        server that does not long-poll, and the client pauses `interval` instead."""
        return time.monotonic() - asked >= wait / 2


class ApiClient:
    """Blocking client of the Ductor REST API.

    Args:
        base_url: the server, e.g. "http://127.0.0.1:7070".
        api_key: sent as `Authorization: Bearer <api_key>`.
        timeout: per-request timeout in seconds.
        transport: an httpx transport (tests, proxies).
    """

    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        *,
        api_key: str | None = None,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._http = httpx.Client(**_http_options(base_url, api_key, timeout), transport=transport)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def _send(self, call: _Call, *, extra: float = 0.0) -> httpx.Response:
        """Send `call`; `extra` seconds are added to the timeout (a long poll)."""
        timeout = httpx.USE_CLIENT_DEFAULT if not extra else _longer(self._http.timeout, extra)
        return self._http.request(
            call.method, call.path, content=call.body, headers=_traced(call), timeout=timeout
        )

    def trigger(
        self,
        family_slug: str,
        input: Any = None,
        *,
        version: int | None = None,
        idempotency_key: str | None = None,
    ) -> Run:
        """Start a run of a workflow family (latest version unless `version`)."""
        call = _trigger(family_slug, input, version, idempotency_key)
        return _decode(call, self._send(call), Run)

    def get_run(self, run_id: str) -> Run:
        """Read a run: status, output, error and per-step state."""
        call = _get_run(run_id)
        return _decode(call, self._send(call), Run)

    def send_event(
        self,
        name: str,
        data: Any = None,
        *,
        id: str | None = None,
        idempotency_key: str | None = None,
    ) -> EventAccepted:
        """Send an event; `id` dedupes repeats of the same event."""
        call = _event(name, data, id, idempotency_key)
        return _decode(call, self._send(call), EventAccepted)

    def signal(self, run_id: str, name: str, payload: Any = None, *, id: str | None = None) -> None:
        """Send signal `name` with `payload` to a run; `id` dedupes repeats of it."""
        call = _signal(run_id, name, payload, id)
        _raise_for(call, self._send(call))

    def cancel(self, run_id: str, *, reason: str | None = None) -> None:
        """Cancel a run (and its children); `reason` becomes the run's error message
        and reaches the workflow's `on_cancel`."""
        call = _cancel(run_id, reason)
        _raise_for(call, self._send(call))

    def wait_for_result(
        self,
        run_id: str,
        *,
        timeout: float = 60.0,
        interval: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
    ) -> Run:
        """Wait for a run to reach a terminal status and return it: each request
        asks the server to answer once the run ends (a long poll, up to 30 s at a
        time); `interval` is the pause between requests only for a server that
        answers at once, or refuses to wait for now (429, `run.wait_limit`).

        Raises:
            TimeoutError: the run is still going after `timeout` seconds.
        """
        poll = _Poll(run_id, timeout, clock)
        while True:
            wait, asked = poll.wait(), time.monotonic()
            call = _get_run(run_id, wait)
            response = self._send(call, extra=wait)
            if poll.refused(response):
                time.sleep(interval)
                continue
            run = _decode(call, response, Run)
            if poll.finished(run):
                return run
            if not poll.held(asked, wait):
                time.sleep(interval)


class AsyncApiClient:
    """Asyncio client of the Ductor REST API; the same calls as `ApiClient`.

    Args:
        base_url: the server, e.g. "http://127.0.0.1:7070".
        api_key: sent as `Authorization: Bearer <api_key>`.
        timeout: per-request timeout in seconds.
        transport: an httpx transport (tests, proxies).
    """

    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        *,
        api_key: str | None = None,
        timeout: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._http = httpx.AsyncClient(
            **_http_options(base_url, api_key, timeout), transport=transport
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def _send(self, call: _Call, *, extra: float = 0.0) -> httpx.Response:
        """Send `call`; `extra` seconds are added to the timeout (a long poll)."""
        timeout = httpx.USE_CLIENT_DEFAULT if not extra else _longer(self._http.timeout, extra)
        return await self._http.request(
            call.method, call.path, content=call.body, headers=_traced(call), timeout=timeout
        )

    async def trigger(
        self,
        family_slug: str,
        input: Any = None,
        *,
        version: int | None = None,
        idempotency_key: str | None = None,
    ) -> Run:
        """Start a run of a workflow family (latest version unless `version`)."""
        call = _trigger(family_slug, input, version, idempotency_key)
        return _decode(call, await self._send(call), Run)

    async def get_run(self, run_id: str) -> Run:
        """Read a run: status, output, error and per-step state."""
        call = _get_run(run_id)
        return _decode(call, await self._send(call), Run)

    async def send_event(
        self,
        name: str,
        data: Any = None,
        *,
        id: str | None = None,
        idempotency_key: str | None = None,
    ) -> EventAccepted:
        """Send an event; `id` dedupes repeats of the same event."""
        call = _event(name, data, id, idempotency_key)
        return _decode(call, await self._send(call), EventAccepted)

    async def signal(
        self, run_id: str, name: str, payload: Any = None, *, id: str | None = None
    ) -> None:
        """Send signal `name` with `payload` to a run; `id` dedupes repeats of it."""
        call = _signal(run_id, name, payload, id)
        _raise_for(call, await self._send(call))

    async def cancel(self, run_id: str, *, reason: str | None = None) -> None:
        """Cancel a run (and its children); `reason` becomes the run's error message
        and reaches the workflow's `on_cancel`."""
        call = _cancel(run_id, reason)
        _raise_for(call, await self._send(call))

    async def wait_for_result(
        self,
        run_id: str,
        *,
        timeout: float = 60.0,  # noqa: ASYNC109 - a polling deadline, as in ApiClient
        interval: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
    ) -> Run:
        """Wait for a run to reach a terminal status and return it, as
        `ApiClient.wait_for_result` does (a long poll).

        Raises:
            TimeoutError: the run is still going after `timeout` seconds.
        """
        poll = _Poll(run_id, timeout, clock)
        while True:
            wait, asked = poll.wait(), time.monotonic()
            call = _get_run(run_id, wait)
            response = await self._send(call, extra=wait)
            if poll.refused(response):
                await asyncio.sleep(interval)
                continue
            run = _decode(call, response, Run)
            if poll.finished(run):
                return run
            if not poll.held(asked, wait):
                await asyncio.sleep(interval)
