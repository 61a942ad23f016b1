"""The provider contract: a kind of outside system, its named operations, and the
registry one server process fills (built-ins first, then `ductor.providers` plugins).

A provider never reads the store, the clock or the environment: it is handed a
connection's decoded settings and secrets and a `CallContext`, and it answers with
a JSON value or raises `ProviderFailed`. Every network call it makes goes through
the context's guarded HTTP client or `CallContext.resolve` (the outbound guard).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import httpx
import msgspec

from ductor_core.runs import ErrorInfo
from ductor_server.errors import ServerError

REDACTED = "***"
"""What a secret value is replaced with, unless a `Redactor` is given another mask."""

ANYWHERE_FROM = 8
"""A secret at least this long is replaced wherever it appears; a shorter one (which a
text holds by chance: `e` is in `content-type`) only where it stands alone."""


class Redactor:
    """Replaces a connection's secret values with a mask in text and JSON values.

    A secret of `ANYWHERE_FROM` characters or more is replaced wherever it appears,
    in object keys too. A shorter one is replaced only where it stands alone (no
    letter or digit right before or after it), and never in an object key, so
    field names stay whole.
    """

    __slots__ = ("_long", "_mask", "_short")

    def __init__(self, secrets: Iterable[str | None], *, mask: str = REDACTED) -> None:
        # Longest first, so a value that contains another is replaced whole.
        found = sorted({s for s in secrets if s}, key=len, reverse=True)
        self._long = [s for s in found if len(s) >= ANYWHERE_FROM]
        short = [re.escape(s) for s in found if len(s) < ANYWHERE_FROM]
        self._short = (
            re.compile(rf"(?<![A-Za-z0-9])(?:{'|'.join(short)})(?![A-Za-z0-9])") if short else None
        )
        self._mask = mask

    def text(self, text: str) -> str:
        """`text` without any secret value."""
        text = self._long_replaced(text)
        if self._short is not None:
            text = self._short.sub(lambda _: self._mask, text)
        return text

    def _long_replaced(self, text: str) -> str:
        for secret in self._long:
            if secret in text:
                text = text.replace(secret, self._mask)
        return text

    def value(self, value: Any) -> Any:
        """A copy of the JSON `value` without any secret value in its strings (nor a
        long one in its keys)."""
        if not self._long and self._short is None:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            return {self._long_replaced(str(k)): self.value(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.value(v) for v in value]
        return value


class ProviderFailed(Exception):
    """Raised by a provider to fail the attempt with `error` (retryable or not)."""

    def __init__(self, error: ErrorInfo) -> None:
        super().__init__(f"{error.code}: {error.message}")
        self.error = error


def provider_failure(code: str, message: str, *, retryable: bool, **extra: Any) -> ProviderFailed:
    """Build a `ProviderFailed` for `code` (e.g. `smtp.refused`, `http.503`)."""
    return ProviderFailed(ErrorInfo(code=code, message=message, retryable=retryable, **extra))


@dataclass(frozen=True, slots=True, kw_only=True)
class Operation:
    """One named operation of a provider.

    Attributes:
        name: the operation's name (`send`, `request`, `chat`).
        description: one line for `GET /v1/providers`.
        input: the msgspec Struct its input decodes into (unknown fields refused);
            its fields without defaults are required at publish time.
        output: the msgspec type of its output (documents it; JSON schema).
    """

    name: str
    description: str
    input: type[msgspec.Struct]
    output: Any = Any

    def input_schema(self) -> dict[str, Any]:
        """The input's JSON schema."""
        return _schema(self.input)

    def output_schema(self) -> dict[str, Any]:
        """The output's JSON schema."""
        return _schema(self.output)

    def required_inputs(self) -> frozenset[str]:
        """The input fields that have no default."""
        info = msgspec.inspect.type_info(self.input)
        assert isinstance(info, msgspec.inspect.StructType)
        return frozenset(f.encode_name for f in info.fields if f.required)

    def input_fields(self) -> frozenset[str]:
        """Every input field's name."""
        info = msgspec.inspect.type_info(self.input)
        assert isinstance(info, msgspec.inspect.StructType)
        return frozenset(f.encode_name for f in info.fields)


def _schema(tp: Any) -> dict[str, Any]:
    (schema,), components = msgspec.json.schema_components([tp])
    if components:
        schema = {**schema, "$defs": components}
    return dict(schema)


@dataclass(frozen=True, slots=True, kw_only=True)
class CallContext:
    """What one call of an operation (or a connection test) may use.

    Attributes:
        tenant_id: whose connection this is.
        connection: the connection's name.
        idempotency_key: the attempt key; a provider sends it as the key its
            system understands (`Idempotency-Key`, a webhook or message id).
        http: an HTTP client whose transport is the outbound guard (no
            redirects followed; `read_capped` for bodies).
        resolve: the outbound guard for non-HTTP protocols: `await
            resolve(host, port)` gives the allowed addresses or raises
            `OutboundForbidden` (SMTP connects to one of them).
        timeout_seconds: how long the call may take in all.
        now: the current time in seconds since the epoch (from the server's clock).
    """

    tenant_id: str
    connection: str
    idempotency_key: str
    http: httpx.AsyncClient
    resolve: Callable[[str, int], Awaitable[list[str]]]
    timeout_seconds: float
    now: float
    run_id: str | None = None
    step_ref: str | None = None


class CheckResult(msgspec.Struct, frozen=True, kw_only=True):
    """The answer of `POST /v1/connections/{name}/test`."""

    ok: bool
    message: str
    latency_ms: float = 0.0
    details: dict[str, Any] = {}


@runtime_checkable
class Provider(Protocol):
    """A kind of outside system (`http`, `webhook`, `smtp`, `slack`, `openai`, a plugin's).

    `settings` and `secrets` are the msgspec Structs a connection's `config` and
    `secrets` decode into (unknown fields refused); secrets are stored encrypted
    and never returned by the API.
    """

    name: str
    description: str
    settings: type[msgspec.Struct]
    secrets: type[msgspec.Struct]
    operations: Mapping[str, Operation]

    async def call(
        self,
        operation: str,
        settings: Any,
        secrets: Any,
        input: Any,
        context: CallContext,
    ) -> Any:
        """Run `operation` with its decoded `input`; the output (a JSON value).

        Raises:
            ProviderFailed: the call failed (retryable or not).
        """
        ...

    async def test(self, settings: Any, secrets: Any, context: CallContext) -> CheckResult:
        """Check that the connection works without side effects where the system allows."""
        ...


class ProviderSetupError(ServerError):
    """A provider registered twice, or one that does not keep the contract."""

    code = "provider.setup"
    retryable = False


@dataclass(slots=True)
class ProviderRegistry:
    """The providers of one process, by name. Built-ins first; a plugin may not take
    a built-in's name."""

    _providers: dict[str, Provider] = field(default_factory=dict)
    _origins: dict[str, str] = field(default_factory=dict)

    def register(self, provider: Provider, *, origin: str = "builtin") -> None:
        """Add `provider` (`origin` says where it came from: `builtin` or a distribution).

        Raises:
            ProviderSetupError: the name is taken or the provider breaks the contract.
        """
        if isinstance(provider, type) or not isinstance(provider, Provider):
            raise ProviderSetupError(f"{provider!r} is not a provider (ductor_server.providers)")
        if provider.name in self._providers:
            raise ProviderSetupError(
                f"a provider named {provider.name!r} is already registered"
                f" (by {self._origins[provider.name]})"
            )
        for name, operation in provider.operations.items():
            if name != operation.name:
                raise ProviderSetupError(
                    f"provider {provider.name!r}: operation key {name!r} != {operation.name!r}"
                )
        self._providers[provider.name] = provider
        self._origins[provider.name] = origin

    def get(self, name: str) -> Provider | None:
        """The provider called `name`, or None."""
        return self._providers.get(name)

    def origin(self, name: str) -> str:
        """Where the provider called `name` came from."""
        return self._origins[name]

    def __iter__(self) -> Iterator[Provider]:
        return iter(sorted(self._providers.values(), key=lambda p: p.name))

    def __len__(self) -> int:
        return len(self._providers)
