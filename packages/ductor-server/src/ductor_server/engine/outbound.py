"""The outbound guard: every call the server makes on a tenant's behalf (the `http`
action, bridge calls to app URLs, app probes) goes to a public address only.

A tenant names a URL; without a guard it could make the server read its own
database port, a cloud metadata service or anything else on the private
network. `OutboundPolicy` refuses loopback, private, link-local, shared,
reserved, multicast and unspecified addresses (anything not globally
routable), unless the operator allows a range (`DUCTOR_OUTBOUND_ALLOW`).

The check happens where the connection is made, in the network backend of the
HTTP client (`guarded_transport`): the host is resolved there, every address it
resolves to must be allowed, and the connection goes to a checked address, so
a DNS answer cannot change between the check and the connect, and a redirect
to a forbidden host is refused like a first request. Numeric spellings of an
address (decimal, octal, and IPv6 forms that carry an IPv4 address: mapped,
compatible, translated, 6to4, NAT64) are resolved to the address they mean
before they are checked.
"""

from __future__ import annotations

import asyncio
import ipaddress
import math
import socket
import ssl
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import httpcore
import httpx
import msgspec
from opentelemetry.trace import SpanKind, StatusCode

from ductor_core.durations import MAX_DURATION
from ductor_server.json_depth import MAX_DEPTH, nesting_depth
from ductor_server.netaddr import IPNetwork, parse_networks
from ductor_server.telemetry import has_client_span, inject_headers, tracer

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

MAX_RESPONSE_BYTES = 10 * 1024 * 1024
"""The most of a response body an outbound call reads (10 MiB)."""


_EMBEDDING_IPV4 = tuple(
    ipaddress.IPv6Network(n)
    for n in (
        "::/96",  # IPv4-compatible (deprecated): ::a.b.c.d
        "::ffff:0:0:0/96",  # IPv4-translated (SIIT): ::ffff:0:a.b.c.d
        "64:ff9b::/96",  # the NAT64 well-known prefix: 64:ff9b::a.b.c.d
    )
)
"""IPv6 ranges whose last 32 bits are an IPv4 address the packet may end up at."""

_NOT_GLOBAL: tuple[IPNetwork, ...] = tuple(
    ipaddress.ip_network(n)
    for n in (
        # Special-purpose ranges that are not globally reachable (IANA registries)
        # but that `is_global` of older Pythons lets through.
        "192.0.0.0/24",  # IETF protocol assignments
        "192.88.99.0/24",  # 6to4 relay anycast (deprecated)
        "64:ff9b:1::/48",  # local-use NAT64 prefixes
        "fec0::/10",  # site-local (deprecated)
        "5f00::/16",  # SRv6 SIDs
        "3fff::/20",  # documentation
    )
)


def embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 `address` stands for (IPv4-mapped, 6to4,
    IPv4-compatible, IPv4-translated or NAT64), or None. `::` and `::1` stand
    for none."""
    mapped = address.ipv4_mapped or address.sixtofour
    if mapped is not None:
        return mapped
    if int(address) > 1 and any(address in net for net in _EMBEDDING_IPV4):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


class OutboundForbidden(Exception):
    """A call to an address the policy refuses; names the host and the address."""

    def __init__(self, host: str, address: str | None, reason: str) -> None:
        where = host if address is None or address == host else f"{host} ({address})"
        super().__init__(f"outbound calls to {where} are not allowed: {reason}")
        self.host = host
        self.address = address


class OutboundPolicy:
    """Which addresses outbound calls may reach: public ones, and `allow`ed ranges."""

    def __init__(self, allow: Iterable[IPNetwork | str] = ()) -> None:
        self.allow: tuple[IPNetwork, ...] = tuple(
            ipaddress.ip_network(n, strict=False) if isinstance(n, str) else n for n in allow
        )

    def refusal(self, address: IPAddress) -> str | None:
        """Why `address` may not be reached, or None if it may."""
        if isinstance(address, ipaddress.IPv6Address):
            embedded = embedded_ipv4(address)
            if embedded is not None:
                address = embedded
        if any(address in network for network in self.allow):
            return None
        if address.is_multicast:
            return "it is a multicast address"
        if address.is_loopback:
            return "it is a loopback address"
        if address.is_unspecified:
            return "it is the unspecified address"
        if address.is_link_local:
            return "it is a link-local address"
        if not address.is_global or any(address in net for net in _NOT_GLOBAL):
            return "it is not a public address"
        return None

    async def resolve(self, host: str, port: int) -> list[str]:
        """Every address `host` resolves to, if all of them are allowed.

        Raises:
            OutboundForbidden: one of them is refused (or the host is empty).
            OSError: the name does not resolve.
        """
        if not host:
            raise OutboundForbidden(host, None, "no host")
        name = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                name, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
            )
        except UnicodeError:  # an empty label, or one too long to encode: no such name
            raise socket.gaierror(socket.EAI_NONAME, "not a valid host name") from None
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        for text in addresses:
            address = ipaddress.ip_address(text.split("%", 1)[0])
            reason = self.refusal(address)
            if reason is not None:
                raise OutboundForbidden(host, text, reason)
        return addresses


class _GuardedBackend(httpcore.AsyncNetworkBackend):
    """Resolves and checks the host, then connects to a checked address."""

    def __init__(self, policy: OutboundPolicy, inner: httpcore.AsyncNetworkBackend) -> None:
        self._policy = policy
        self._inner = inner

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's signature)
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            addresses = await asyncio.wait_for(self._policy.resolve(host, port), timeout)
        except (OSError, TimeoutError) as exc:
            raise httpcore.ConnectError(f"cannot resolve {host}: {exc}") from exc
        failure: Exception | None = None
        for address in addresses:
            try:
                return await self._inner.connect_tcp(
                    address,
                    port,
                    timeout=timeout,
                    local_address=local_address,
                    socket_options=socket_options,
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failure = exc
        assert failure is not None
        raise failure

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's signature)
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise OutboundForbidden(path, None, "unix sockets are not reachable")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class GuardedTransport(httpx.AsyncHTTPTransport):
    """An httpx transport whose connections go through `OutboundPolicy` (no proxy,
    no environment settings: a proxy would reach what the guard refuses).

    Every request is a CLIENT span (`POST`, `GET`, ...) unless its caller made one
    (`telemetry.client_span`), and carries the trace context (`traceparent`) to
    the host it calls.
    """

    def __init__(self, policy: OutboundPolicy, *, max_connections: int = 100) -> None:
        super().__init__(trust_env=False)
        # The pool httpx built has the default network backend; this one checks every
        # address before it connects. (httpx takes no backend of its own.)
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=ssl.create_default_context(),
            max_connections=max_connections,
            max_keepalive_connections=20,
            keepalive_expiry=5.0,
            network_backend=_GuardedBackend(policy, httpcore.AnyIOBackend()),
        )
        self.policy = policy

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if has_client_span():
            inject_headers(request.headers)
            return await super().handle_async_request(request)
        url = request.url
        with tracer.start_as_current_span(
            request.method,
            kind=SpanKind.CLIENT,
            attributes={
                "http.request.method": request.method,
                "server.address": url.host,
                "server.port": url.port or (443 if url.scheme == "https" else 80),
                "url.scheme": url.scheme,
            },
        ) as span:
            inject_headers(request.headers)
            response = await super().handle_async_request(request)
            span.set_attribute("http.response.status_code", response.status_code)
            if response.status_code >= 400:
                span.set_attribute("error.type", str(response.status_code))
                span.set_status(StatusCode.ERROR)
            return response


def guarded_transport(policy: OutboundPolicy | None) -> httpx.AsyncBaseTransport | None:
    """The transport outbound clients use under `policy` (None: unguarded, for tests
    that bring their own transport)."""
    return None if policy is None else GuardedTransport(policy)


async def read_capped(response: httpx.Response, limit: int = MAX_RESPONSE_BYTES) -> bytes | None:
    """The (decoded) body of a streamed `response`, or None when it is longer than
    `limit` bytes; the rest is not read, so neither a huge body nor a compression
    bomb fills the memory."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


KEPT_RESPONSE_HEADERS = ("content-type", "content-length", "location", "etag", "retry-after")
"""The response headers an outbound call reports back (the rest may carry cookies)."""

RETRYABLE_4XX = frozenset({408, 425, 429})
"""The 4xx statuses a retry may cure (timeout, too early, too many requests)."""


def is_retryable_status(status: int) -> bool:
    """Whether an answer with `status` may succeed if sent again (5xx, 408, 425, 429)."""
    return status >= 500 or status in RETRYABLE_4XX


def kept_headers(response: httpx.Response) -> dict[str, str]:
    """The `KEPT_RESPONSE_HEADERS` of `response`."""
    return {k: response.headers[k] for k in KEPT_RESPONSE_HEADERS if k in response.headers}


def retry_after(response: httpx.Response) -> float | None:
    """The response's `Retry-After` in seconds: a number of seconds or an HTTP date
    (RFC 9110), at least 0 and at most `MAX_DURATION`; None when it is absent or
    neither (`inf` and `nan` are not a wait: the step's own backoff applies)."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - datetime.now(UTC)).total_seconds()
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), MAX_DURATION.total_seconds())


def response_body(response: httpx.Response, content: bytes) -> Any:
    """`content` as JSON when the response says it is JSON (and it parses, nested at
    most `MAX_DEPTH` levels deep, as a request body may be), else as text; None when
    empty. A deeper value would crash what walks it later (the redaction of secrets,
    CEL, the store), on every retry."""
    if not content:
        return None
    if "json" in response.headers.get("content-type", "") and nesting_depth(content) <= MAX_DEPTH:
        try:
            return msgspec.json.decode(content)
        except msgspec.DecodeError:
            pass
    return content.decode(response.encoding or "utf-8", errors="replace")


def loopback_networks() -> Sequence[IPNetwork]:
    """127.0.0.0/8 and ::1: what `ductor dev` allows by default, so a local app works."""
    return parse_networks("127.0.0.0/8,::1")


__all__ = [
    "KEPT_RESPONSE_HEADERS",
    "MAX_RESPONSE_BYTES",
    "RETRYABLE_4XX",
    "GuardedTransport",
    "OutboundForbidden",
    "OutboundPolicy",
    "guarded_transport",
    "is_retryable_status",
    "kept_headers",
    "loopback_networks",
    "parse_networks",
    "read_capped",
    "response_body",
    "retry_after",
]
