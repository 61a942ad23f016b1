"""The `webhook` provider against a real HTTP receiver on 127.0.0.1; every request
is verified with the `standardwebhooks` library, as a receiver would."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import time

import msgspec
import pytest
from standardwebhooks import Webhook, WebhookVerificationError

from ductor_server.providers import ProviderFailed, builtin_providers
from ductor_server.providers.webhook import (
    SendEventInput,
    WebhookProvider,
    WebhookSecrets,
    WebhookSettings,
)

from .conftest import KEY, MakeContext
from .sink import HttpSink

SECRET = "whsec_" + base64.b64encode(os.urandom(32)).decode()


def settings(sink: HttpSink, path: str = "/hooks?source=ductor") -> WebhookSettings:
    return msgspec.convert({"url": sink.url + path}, WebhookSettings)


def secrets(secret: str = SECRET) -> WebhookSecrets:
    return msgspec.convert({"signing_secret": secret}, WebhookSecrets)


def event(type: str = "order.paid", data: object = None) -> SendEventInput:
    return msgspec.convert({"type": type, "data": data or {"order": 7}}, SendEventInput)


async def test_send_is_signed_per_standard_webhooks(
    sink: HttpSink, make_context: MakeContext
) -> None:
    now = time.time()
    assert isinstance(builtin_providers().get("webhook"), WebhookProvider)
    out = await WebhookProvider().call(
        "send", settings(sink), secrets(), event(), make_context(now=now)
    )
    assert out == {"status": 200, "webhook_id": KEY}
    seen = sink.last
    assert (seen.method, seen.path) == ("POST", "/hooks?source=ductor")
    assert seen.headers["webhook-id"] == KEY
    assert seen.headers["webhook-timestamp"] == str(int(now))
    assert seen.headers["content-type"] == "application/json"
    payload = Webhook(SECRET).verify(seen.body, seen.headers)
    assert payload["type"] == "order.paid"
    assert payload["data"] == {"order": 7}
    assert payload["timestamp"].endswith("Z")
    # The signature, computed by hand from the specification.
    key = base64.b64decode(SECRET.removeprefix("whsec_"))
    signed = f"{KEY}.{int(now)}.".encode() + seen.body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    assert seen.headers["webhook-signature"] == f"v1,{expected}"
    # Another secret does not verify it.
    other = "whsec_" + base64.b64encode(os.urandom(32)).decode()
    with pytest.raises(WebhookVerificationError):
        Webhook(other).verify(seen.body, seen.headers)


async def test_a_retried_attempt_sends_the_same_id(
    sink: HttpSink, make_context: MakeContext
) -> None:
    provider = WebhookProvider()
    now = time.time()
    for later in (0, 30):
        await provider.call(
            "send", settings(sink), secrets(), event(), make_context(now=now + later)
        )
    first, second = sink.seen
    assert first.headers["webhook-id"] == second.headers["webhook-id"] == KEY
    assert int(second.headers["webhook-timestamp"]) - int(first.headers["webhook-timestamp"]) == 30
    for seen in sink.seen:
        Webhook(SECRET).verify(seen.body, seen.headers)


@pytest.mark.parametrize(
    ("status", "retryable"), [(500, True), (503, True), (429, True), (400, False), (410, False)]
)
async def test_receiver_answers(
    sink: HttpSink, make_context: MakeContext, status: int, retryable: bool
) -> None:
    sink.answer(status, "go away")
    with pytest.raises(ProviderFailed) as info:
        await WebhookProvider().call("send", settings(sink), secrets(), event(), make_context())
    assert info.value.error.code == f"webhook.{status}"
    assert info.value.error.retryable is retryable
    assert info.value.error.details["webhook_id"] == KEY
    assert info.value.error.details["body"] == "go away"


async def test_a_redirect_is_not_followed(sink: HttpSink, make_context: MakeContext) -> None:
    sink.answer(307, b"", Location=sink.url + "/other")
    with pytest.raises(ProviderFailed) as info:
        await WebhookProvider().call("send", settings(sink), secrets(), event(), make_context())
    assert info.value.error.code == "webhook.307"
    assert info.value.error.retryable is False
    assert len(sink.seen) == 1


async def test_loopback_refused_and_timeout_retryable(
    sink: HttpSink, make_context: MakeContext
) -> None:
    provider = WebhookProvider()
    with pytest.raises(ProviderFailed) as info:
        await provider.call("send", settings(sink), secrets(), event(), make_context(allow=[]))
    assert info.value.error.code == "outbound.forbidden"
    assert sink.seen == []
    sink.delay = 2.0
    with pytest.raises(ProviderFailed) as info:
        await provider.call("send", settings(sink), secrets(), event(), make_context(timeout=0.3))
    assert (info.value.error.code, info.value.error.retryable) == ("webhook.timeout", True)


async def test_secret_never_in_errors_or_outputs(sink: HttpSink, make_context: MakeContext) -> None:
    raw = SECRET.removeprefix("whsec_")
    sink.answer(500, {"echo": SECRET, "raw": raw})
    with pytest.raises(ProviderFailed) as info:
        await WebhookProvider().call("send", settings(sink), secrets(), event(), make_context())
    text = repr(info.value.error) + str(info.value)
    assert raw not in text
    assert info.value.error.details["body"] == {"echo": "***", "raw": "***"}
    assert raw not in json.dumps(sink.last.headers) + sink.last.body.decode()


def test_validation() -> None:
    for bad in (
        "s3cr3t-value",
        "whsec_not base64!",
        "whsec_" + base64.b64encode(b"short").decode(),
        "whsec_" + base64.b64encode(os.urandom(65)).decode(),
    ):
        with pytest.raises(msgspec.ValidationError) as info:
            msgspec.convert({"signing_secret": bad}, WebhookSecrets)
        assert bad not in str(info.value)
    for url in ("ftp://x.example", "https://u:p@x.example", "https://x.example/#f", "hooks"):
        with pytest.raises(msgspec.ValidationError):
            msgspec.convert({"url": url}, WebhookSettings)
    # A trailing line break too: `$` alone would let one through.
    for type_ in ("", "a b", "a\r\nb", "x" * 201, "order.paid\n"):
        with pytest.raises(msgspec.ValidationError):
            msgspec.convert({"type": type_}, SendEventInput)


async def test_check_sends_a_signed_ping(sink: HttpSink, make_context: MakeContext) -> None:
    provider = WebhookProvider()
    result = await provider.test(settings(sink), secrets(), make_context(now=time.time()))
    assert result.ok is True
    payload = Webhook(SECRET).verify(sink.last.body, sink.last.headers)
    assert payload["type"] == "ductor.test"
    assert payload["data"] == {"connection": "api"}
    sink.answer(404)
    result = await provider.test(settings(sink), secrets(), make_context())
    assert result.ok is False
    assert result.details == {
        "code": "webhook.404",
        "status": 404,
        "webhook_id": KEY,
        "headers": {"content-length": "0"},
        "body": None,
    }
