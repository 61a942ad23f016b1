"""The outbound guard: which addresses a tenant's calls may reach, however they are
spelled, resolved or redirected to; against real HTTP servers on loopback."""

from __future__ import annotations

import ipaddress
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from ductor_server.engine.actions import ActionCall, ActionFailed, HttpAction
from ductor_server.engine.outbound import (
    GuardedTransport,
    OutboundForbidden,
    OutboundPolicy,
    retry_after,
)
from ductor_server.settings import Settings, parse_networks


class Sink:
    """An HTTP server on `host` that counts requests; `/big` answers `big` bytes,
    `/redirect` sends the caller to `redirect_to`."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.hits = 0
        self.big = 0
        self.redirect_to = ""
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None:
                pass

            def do_GET(self) -> None:
                sink.hits += 1
                if self.path == "/redirect":
                    self.send_response(302)
                    self.send_header("Location", sink.redirect_to)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = b"x" * sink.big if self.path == "/big" else b'{"ok": true}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}"
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def sink() -> Iterator[Sink]:
    s = Sink()
    try:
        yield s
    finally:
        s.close()


@pytest.mark.parametrize(
    ("address", "refused"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),  # IPv4-mapped IPv6
        ("2002:7f00:1::", True),  # 6to4 of 127.0.0.1
        ("10.0.0.1", True),
        ("172.16.5.4", True),
        ("192.168.1.1", True),
        ("169.254.169.254", True),  # cloud metadata
        ("100.64.0.1", True),  # shared address space
        ("0.0.0.0", True),
        ("::", True),
        ("224.0.0.1", True),
        ("ff02::1", True),
        ("fe80::1", True),
        ("fc00::1", True),
        ("192.0.2.1", True),  # documentation range
        ("::127.0.0.1", True),  # IPv4-compatible IPv6
        ("::169.254.169.254", True),
        ("::ffff:0:127.0.0.1", True),  # IPv4-translated (SIIT)
        ("64:ff9b::127.0.0.1", True),  # NAT64 of 127.0.0.1
        ("64:ff9b::169.254.169.254", True),  # NAT64 of cloud metadata
        ("64:ff9b::10.0.0.1", True),
        ("64:ff9b:1::a9fe:a9fe", True),  # local-use NAT64
        ("fec0::1", True),  # site-local
        ("192.0.0.8", True),  # IETF protocol assignments
        ("192.88.99.1", True),  # 6to4 relay anycast
        ("3fff::1", True),  # documentation range
        ("64:ff9b::8.8.8.8", False),  # NAT64 of a public address
        ("::8.8.8.8", False),
        ("8.8.8.8", False),
        ("1.1.1.1", False),
        ("2001:4860:4860::8888", False),
    ],
)
def test_which_addresses_are_refused(address: str, refused: bool) -> None:
    reason = OutboundPolicy().refusal(ipaddress.ip_address(address))
    assert (reason is not None) is refused, (address, reason)


def test_an_allowed_range_opens_only_itself() -> None:
    policy = OutboundPolicy(parse_networks("127.0.0.0/8, 10.1.0.0/16"))
    assert policy.refusal(ipaddress.ip_address("127.0.0.1")) is None
    assert policy.refusal(ipaddress.ip_address("::ffff:127.0.0.1")) is None
    assert policy.refusal(ipaddress.ip_address("10.1.2.3")) is None
    assert policy.refusal(ipaddress.ip_address("10.2.0.1")) is not None
    assert policy.refusal(ipaddress.ip_address("::1")) is not None
    with pytest.raises(ValueError, match="not an IP"):
        parse_networks("127.0.0.1, example.com")


@pytest.mark.parametrize(
    "host",
    ["127.0.0.1", "localhost", "2130706433", "0177.0.0.1", "0x7f.0.0.1", "127.1", "[::1]"],
)
async def test_every_spelling_of_loopback_is_resolved_then_refused(host: str) -> None:
    with pytest.raises(OutboundForbidden) as refused:
        await OutboundPolicy().resolve(host, 80)
    assert host in str(refused.value)
    allowed = await OutboundPolicy(parse_networks("127.0.0.0/8,::1")).resolve(host, 80)
    assert allowed
    assert all(ipaddress.ip_address(a).is_loopback for a in allowed)


@pytest.mark.parametrize("host", ["a..b.example", "a" * 64 + ".example", "b" * 300])
async def test_a_host_name_that_cannot_exist_does_not_resolve(host: str) -> None:
    # An empty label, or one over 63 characters, is no name: it does not resolve
    # (an OSError, as for any unknown name), and nothing crashes on the way.
    with pytest.raises(OSError, match="not a valid host name"):
        await OutboundPolicy().resolve(host, 80)


def _call(url: str) -> ActionCall:
    return ActionCall(
        tenant_id="t",
        run_id="run_1",
        step_ref="call",
        attempt=1,
        handler="action:http",
        idempotency_key="run_1:call:-1:1",
        payload={"params": {"url": url}},
    )


@pytest.mark.parametrize("spelling", ["127.0.0.1", "localhost", "2130706433", "[::ffff:127.0.0.1]"])
async def test_the_http_action_never_reaches_a_refused_address(sink: Sink, spelling: str) -> None:
    action = HttpAction(policy=OutboundPolicy())
    try:
        with pytest.raises(ActionFailed) as failed:
            await action(_call(f"http://{spelling}:{sink.port}/"))
    finally:
        await action.aclose()
    error = failed.value.error
    assert error.code == "outbound.forbidden"
    assert error.retryable is False
    assert spelling.strip("[]") in error.message
    assert sink.hits == 0


async def test_a_url_httpx_cannot_read_is_a_bad_param(sink: Sink) -> None:
    action = HttpAction(policy=OutboundPolicy())
    try:
        with pytest.raises(ActionFailed) as failed:
            await action(_call(f"http://0177.0.0.1:{sink.port}/"))
    finally:
        await action.aclose()
    assert failed.value.error.code == "action.bad_params"
    assert sink.hits == 0


async def test_the_http_action_reaches_an_allowed_address(sink: Sink) -> None:
    action = HttpAction(policy=OutboundPolicy(parse_networks("127.0.0.0/8")))
    try:
        output = await action(_call(f"{sink.url}/"))
    finally:
        await action.aclose()
    assert output["status"] == 200
    assert output["body"] == {"ok": True}
    assert sink.hits == 1


async def test_a_redirect_to_a_refused_address_is_refused() -> None:
    # 127.0.0.2 is allowed and redirects to 127.0.0.1, which is not.
    allowed, target = Sink("127.0.0.2"), Sink("127.0.0.1")
    allowed.redirect_to = f"{target.url}/"
    policy = OutboundPolicy(parse_networks("127.0.0.2/32"))
    try:
        async with httpx.AsyncClient(
            transport=GuardedTransport(policy), follow_redirects=True
        ) as http:
            with pytest.raises(OutboundForbidden, match=r"127\.0\.0\.1"):
                await http.get(f"{allowed.url}/redirect")
        assert (allowed.hits, target.hits) == (1, 0)
    finally:
        allowed.close()
        target.close()


async def test_a_huge_answer_is_cut_off(sink: Sink) -> None:
    sink.big = 3 * 1024 * 1024
    action = HttpAction(
        policy=OutboundPolicy(parse_networks("127.0.0.0/8")), max_response_bytes=1024 * 1024
    )
    try:
        with pytest.raises(ActionFailed) as failed:
            await action(_call(f"{sink.url}/big"))
        small = await action(_call(f"{sink.url}/"))
    finally:
        await action.aclose()
    assert failed.value.error.code == "http.response_too_large"
    assert failed.value.error.retryable is False
    assert small["status"] == 200


def test_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DUCTOR_OUTBOUND_ALLOW", "127.0.0.0/8, ::1")
    assert Settings.from_env().outbound_allow == ("127.0.0.0/8", "::1/128")
    monkeypatch.setenv("DUCTOR_OUTBOUND_ALLOW", "")
    assert Settings.from_env().outbound_allow == ()
    monkeypatch.setenv("DUCTOR_OUTBOUND_ALLOW", "localhost")
    with pytest.raises(ValueError, match="DUCTOR_OUTBOUND_ALLOW"):
        Settings.from_env()
    monkeypatch.delenv("DUCTOR_OUTBOUND_ALLOW")
    assert Settings.from_env().outbound_allow is None


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("120", 120.0),
        ("1.5", 1.5),
        ("-3", 0.0),
        ("1e20", 36_500 * 86_400.0),
        ("inf", None),
        ("nan", None),
        ("soon", None),
        ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),
    ],
)
def test_retry_after_is_a_finite_wait_on_the_clock(header: str, seconds: float | None) -> None:
    answer = httpx.Response(503, headers={"Retry-After": header})
    assert retry_after(answer) == seconds


def test_retry_after_as_an_http_date_waits_until_then() -> None:
    later = datetime.now(UTC) + timedelta(seconds=90)
    answer = httpx.Response(429, headers={"Retry-After": format_datetime(later, usegmt=True)})
    waited = retry_after(answer)
    assert waited is not None
    assert 80.0 <= waited <= 90.0
