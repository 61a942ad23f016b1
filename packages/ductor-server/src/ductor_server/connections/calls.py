"""Calling a provider through one of a tenant's stored connections: loading the row
(tenant-scoped), decrypting its secrets, the `CallContext` on the outbound guard,
the ACTION step handler (`connection`), and connection tests.

Secrets live only in memory for the length of one call. Every message, error and
output that leaves a call goes through the connection's `Redactor`, so a
provider (or a remote system echoing a header) cannot put a secret into run
history, a step output, an API answer or a log line. No SQL here
(`ConnectionsTx` has it), no HTTP framework.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec

from ductor_core.errors import fault_text
from ductor_core.runs import ErrorInfo
from ductor_server.connections.errors import (
    ConnectionNotFound,
    SecretsUnconfigured,
    SecretsUndecryptable,
)
from ductor_server.connections.secret_keys import KeyNotInRing, Sealed, SecretKeys, Tampered
from ductor_server.connections.shapes import MASK, problems_of, secret_strings
from ductor_server.connections.store import ConnectionRecord, ConnectionsTx
from ductor_server.engine.actions import ActionCall, ActionFailed, failure
from ductor_server.engine.clock import Clock, SystemClock
from ductor_server.engine.outbound import OutboundForbidden, OutboundPolicy, guarded_transport
from ductor_server.errors import ServerError
from ductor_server.providers.base import (
    CallContext,
    CheckResult,
    Provider,
    ProviderFailed,
    ProviderRegistry,
    Redactor,
)
from ductor_server.storage.protocol import Store

log = logging.getLogger("ductor_server.connections")

HANDLER = "connection"
"""The worker handler name of ACTION steps that name a connection."""

DEFAULT_TIMEOUT = 30.0
"""Seconds one provider call or test may take when the step sets no timeout."""


@dataclass(frozen=True, slots=True)
class Opened:
    """A connection ready to call: its row, provider, decoded settings and secrets."""

    record: ConnectionRecord
    provider: Provider
    settings: Any
    secrets: Any
    redactor: Redactor


def unseal(record: ConnectionRecord, keys: SecretKeys | None) -> dict[str, Any]:
    """The connection's secrets as stored (field -> value); {} when it has none.

    Raises:
        SecretsUnconfigured: it has secrets and the server has no keys.
        SecretsUndecryptable: they do not decrypt under the server's keys.
    """
    if record.secrets_ciphertext is None or record.secrets_key_id is None:
        return {}
    if keys is None:
        raise SecretsUnconfigured()
    sealed = Sealed(kid=record.secrets_key_id, ciphertext=record.secrets_ciphertext)
    try:
        raw = keys.open(sealed, tenant_id=record.tenant_id, connection_id=record.id)
    except (KeyNotInRing, Tampered) as exc:
        raise SecretsUndecryptable(record.name, sealed.kid, str(exc)) from None
    value = msgspec.json.decode(raw)
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True, slots=True)
class CompletedCall:
    """One ACTION attempt through a connection that reached its provider, as told to
    the observers (`ConnectionCalls.observe`), e.g. to meter model calls.

    Attributes:
        output: the provider's output (secrets redacted); None when it failed.
        error: the failure (redacted); None when it succeeded.
        latency_ms: how long the provider took.
    """

    tenant_id: str
    connection: str
    provider: str
    operation: str
    input: Any
    output: Any
    error: ErrorInfo | None
    latency_ms: float
    idempotency_key: str
    run_id: str
    step_ref: str


CallObserver = Callable[[CompletedCall], Awaitable[None]]
"""Told of every `CompletedCall`; what it raises is logged, never fails the step."""


class ProviderUnavailable(ServerError):
    """The connection's provider is not registered in this server (any more)."""

    code = "provider.unknown"
    retryable = False

    def __init__(self, name: str, provider: str) -> None:
        super().__init__(
            f"connection {name!r} uses provider {provider!r}, which this server does not have",
            details={"name": name, "provider": provider},
        )


class StoredConfigInvalid(ServerError):
    """A stored config or secrets object no longer fits its provider's schema."""

    code = "connection.invalid"
    retryable = False

    def __init__(self, name: str, problems: list[dict[str, str]]) -> None:
        super().__init__(
            f"connection {name!r} no longer fits its provider: {problems[0]['message']}",
            details=problems,
        )


def open_record(
    record: ConnectionRecord, providers: ProviderRegistry, keys: SecretKeys | None
) -> Opened:
    """Decode and decrypt a loaded connection.

    Raises:
        ProviderUnavailable, StoredConfigInvalid, SecretsUnconfigured, SecretsUndecryptable.
    """
    provider = providers.get(record.provider)
    if provider is None:
        raise ProviderUnavailable(record.name, record.provider)
    raw_secrets = unseal(record, keys)
    redactor = Redactor(secret_strings(raw_secrets), mask=MASK)
    problems = problems_of(record.config, provider.settings, "/config")
    problems += problems_of(raw_secrets, provider.secrets, "/secrets")
    if problems:
        # Name the place, never the value: a secret's problem message may quote it.
        raise StoredConfigInvalid(
            record.name, [{**p, "message": redactor.text(p["message"])} for p in problems]
        )
    return Opened(
        record=record,
        provider=provider,
        settings=msgspec.convert(record.config, provider.settings),
        secrets=msgspec.convert(raw_secrets, provider.secrets),
        redactor=redactor,
    )


async def load(
    store: Store,
    providers: ProviderRegistry,
    keys: SecretKeys | None,
    tenant_id: str,
    name: str,
) -> Opened:
    """The tenant's connection `name`, opened.

    Raises:
        ConnectionNotFound: no such connection for this tenant.
        ProviderUnavailable, StoredConfigInvalid, SecretsUnconfigured, SecretsUndecryptable.
    """
    async with store.transaction() as tx:
        record = await ConnectionsTx(tx).get(tenant_id, name)
    if record is None:
        raise ConnectionNotFound(name)
    return open_record(record, providers, keys)


class ConnectionCalls:
    """Calls through connections: the `connection` step handler and connection tests.

    Args:
        store: the opened store.
        providers: the providers of this process.
        keys: the server's secret keys (None: connections with secrets fail
            `secrets.unconfigured`).
        policy: the outbound guard every call goes through.
        clock: where `CallContext.now` comes from.
        timeout: seconds a call or test may take when nothing else says.
    """

    def __init__(
        self,
        store: Store,
        providers: ProviderRegistry,
        keys: SecretKeys | None,
        *,
        policy: OutboundPolicy,
        clock: Clock | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self._store = store
        self._providers = providers
        self._keys = keys
        self._policy = policy
        self._clock = clock or SystemClock()
        self._timeout = timeout
        self._client: httpx.AsyncClient | None = None
        self._observers: list[CallObserver] = []

    def observe(self, observer: CallObserver) -> None:
        """Tell `observer` of every ACTION attempt that reached its provider."""
        self._observers.append(observer)

    async def _tell(self, completed: CompletedCall) -> None:
        for observer in self._observers:
            try:
                await observer(completed)
            except Exception as exc:  # an observer's failure must not fail the step
                log.warning(
                    "observer of %s.%s failed: %s: %s",
                    completed.connection,
                    completed.operation,
                    type(exc).__name__,
                    exc,
                )

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                follow_redirects=False,
                transport=guarded_transport(self._policy),
                trust_env=False,
                timeout=self._timeout,
            )
        return self._client

    async def aclose(self) -> None:
        """Close the HTTP client (it reopens on next use)."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def context(
        self,
        opened: Opened,
        *,
        idempotency_key: str,
        timeout: float,
        run_id: str | None = None,
        step_ref: str | None = None,
    ) -> CallContext:
        """The `CallContext` of one call through `opened`."""
        return CallContext(
            tenant_id=opened.record.tenant_id,
            connection=opened.record.name,
            idempotency_key=idempotency_key,
            http=self._http(),
            resolve=self._policy.resolve,
            timeout_seconds=timeout,
            now=self._clock.now().timestamp(),
            run_id=run_id,
            step_ref=step_ref,
        )

    # --- the step handler ----------------------------------------------------------

    async def __call__(self, call: ActionCall) -> Any:
        """Run one attempt of an ACTION step through a connection.

        Raises:
            ActionFailed: with the provider's error, or `connection.not_found`,
                `connection.bad_input`, `operation.unknown`, `provider.unknown`,
                `secrets.*` and `outbound.forbidden` (none of them retried).
        """
        payload = call.payload if isinstance(call.payload, Mapping) else {}
        name, operation_name = payload.get("connection"), payload.get("operation")
        if not isinstance(name, str) or not isinstance(operation_name, str):
            raise failure(
                "connection.bad_input",
                "the step names no connection and operation",
                retryable=False,
            )
        try:
            opened = await load(self._store, self._providers, self._keys, call.tenant_id, name)
        except ServerError as exc:
            raise failure(exc.code, exc.message, retryable=False, details=exc.details) from None
        redactor = opened.redactor
        operation = opened.provider.operations.get(operation_name)
        if operation is None:
            raise failure(
                "operation.unknown",
                f"provider {opened.provider.name!r} has no operation {operation_name!r}",
                retryable=False,
                details={"connection": name, "operation": operation_name},
            )
        raw_input = payload.get("input")
        problems = problems_of(
            raw_input if raw_input is not None else {}, operation.input, "/input"
        )
        if problems:
            raise failure(
                "connection.bad_input",
                redactor.text(
                    f"the input of {opened.provider.name}.{operation_name} does not fit:"
                    f" {problems[0]['pointer']}: {problems[0]['message']}"
                ),
                retryable=False,
                details=redactor.value(problems),
            )
        decoded = msgspec.convert(raw_input or {}, operation.input)
        timeout = call.timeout_seconds or self._timeout
        context = self.context(
            opened,
            idempotency_key=call.idempotency_key,
            timeout=timeout,
            run_id=call.run_id,
            step_ref=call.step_ref,
        )
        started = time.perf_counter()

        def completed(output: Any, error: ErrorInfo | None) -> CompletedCall:
            return CompletedCall(
                tenant_id=call.tenant_id,
                connection=name,
                provider=opened.provider.name,
                operation=operation_name,
                input=decoded,
                output=output,
                error=error,
                latency_ms=round((time.perf_counter() - started) * 1000, 3),
                idempotency_key=call.idempotency_key,
                run_id=call.run_id,
                step_ref=call.step_ref,
            )

        try:
            output = await opened.provider.call(
                operation_name, opened.settings, opened.secrets, decoded, context
            )
        except (ProviderFailed, ActionFailed) as exc:
            error = _redacted(exc.error, redactor)
            if self._observers:
                await self._tell(completed(None, error))
            raise ActionFailed(error) from None
        except OutboundForbidden as exc:
            raise failure(
                "outbound.forbidden",
                redactor.text(str(exc)),
                retryable=False,
                details={"host": redactor.text(exc.host)},
            ) from None
        except httpx.TimeoutException:
            raise failure(
                "provider.timeout",
                f"{opened.provider.name}.{operation_name} timed out",
                retryable=True,
            ) from None
        except (Exception, SystemExit) as exc:  # a provider bug (one calling sys.exit() too):
            # retried, and said without its secrets
            message = redactor.text(fault_text(exc))
            log.warning(
                "provider %s crashed on %s.%s: %s",
                opened.provider.name,
                name,
                operation_name,
                message,
            )
            raise failure("provider.crashed", message, retryable=True) from None
        try:
            output = redactor.value(output)
        except RecursionError:
            raise failure(
                "handler.bad_output",
                f"the output of {opened.provider.name}.{operation_name} nests too deeply",
                retryable=False,
            ) from None
        if self._observers:
            await self._tell(completed(output, None))
        return output

    # --- tests -----------------------------------------------------------------------

    async def test(self, opened: Opened, *, idempotency_key: str) -> CheckResult:
        """Run the provider's test of `opened` within the timeout; never raises for
        what the remote end does (a refusal by the outbound guard included): the
        answer says `ok: false` and why, with `details.code`."""
        redactor = opened.redactor
        context = self.context(opened, idempotency_key=idempotency_key, timeout=self._timeout)
        started = time.monotonic()

        def failed(
            code: str, message: str, details: Mapping[str, Any] | None = None
        ) -> CheckResult:
            return CheckResult(
                ok=False,
                message=redactor.text(message),
                latency_ms=round((time.monotonic() - started) * 1000, 3),
                details=redactor.value({**(details or {}), "code": code}),
            )

        try:
            async with asyncio.timeout(self._timeout):
                result = await opened.provider.test(opened.settings, opened.secrets, context)
        except ProviderFailed as exc:
            details = exc.error.details if isinstance(exc.error.details, Mapping) else {}
            return failed(exc.error.code, exc.error.message, details)
        except OutboundForbidden as exc:
            return failed("outbound.forbidden", str(exc), {"host": exc.host})
        except (TimeoutError, httpx.TimeoutException):
            return failed("connection.timeout", f"the test did not finish in {self._timeout:g}s")
        except httpx.HTTPError as exc:
            return failed("connection.unreachable", f"{type(exc).__name__}: {exc}")
        except (Exception, SystemExit) as exc:  # a provider bug answers as a failed test
            message = fault_text(exc)
            log.warning(
                "provider %s crashed testing %s: %s",
                opened.provider.name,
                opened.record.name,
                redactor.text(message),
            )
            return failed("provider.crashed", message)
        return CheckResult(
            ok=result.ok,
            message=redactor.text(result.message),
            latency_ms=result.latency_ms or round((time.monotonic() - started) * 1000, 3),
            details=redactor.value(result.details),
        )


def _redacted(error: ErrorInfo, redactor: Redactor) -> ErrorInfo:
    return msgspec.structs.replace(
        error,
        message=redactor.text(error.message),
        details=redactor.value(error.details),
    )


__all__ = [
    "DEFAULT_TIMEOUT",
    "HANDLER",
    "CallObserver",
    "CompletedCall",
    "ConnectionCalls",
    "Opened",
    "ProviderUnavailable",
    "StoredConfigInvalid",
    "load",
    "open_record",
    "unseal",
]
