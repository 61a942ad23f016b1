"""The `smtp` provider against a real aiosmtpd server on 127.0.0.1: what it sends,
how it logs in, and how each refusal, outage and injection attempt fails."""

from __future__ import annotations

import email.utils
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from ductor_server.providers import ProviderFailed, builtin_providers
from ductor_server.providers.smtp import (
    SendEmailInput,
    SmtpProvider,
    SmtpSecrets,
    SmtpSettings,
    message_id,
)
from ductor_server.testing import free_port

from .conftest import KEY, NOW, MakeContext
from .smtpsink import PASSWORD, USER, SmtpSink, self_signed_context

pytestmark = pytest.mark.filterwarnings("ignore:Requiring AUTH while not requiring TLS:UserWarning")


@pytest.fixture
def smtp() -> Iterator[SmtpSink]:
    with SmtpSink() as sink:
        yield sink


@pytest.fixture
def smtp_auth() -> Iterator[SmtpSink]:
    with SmtpSink(auth=True) as sink:
        yield sink


def settings(port: int, **extra: Any) -> SmtpSettings:
    fields = {"host": "127.0.0.1", "port": port, "from_address": "ops@acme.test", "starttls": False}
    return msgspec.convert({**fields, **extra}, SmtpSettings)


def secrets(password: str | None = None) -> SmtpSecrets:
    return SmtpSecrets(password=password)


def mail(**extra: Any) -> SendEmailInput:
    fields = {"to": ["ada@example.test"], "subject": "Invoice 7", "text": "Paid, thanks."}
    return msgspec.convert({**fields, **extra}, SendEmailInput)


async def fail(coro: Any) -> ProviderFailed:
    with pytest.raises(ProviderFailed) as info:
        await coro
    return info.value


async def test_sends_one_message_to_every_recipient(
    smtp: SmtpSink, make_context: MakeContext
) -> None:
    assert isinstance(builtin_providers().get("smtp"), SmtpProvider)
    out = await SmtpProvider().call(
        "send",
        settings(smtp.port),
        secrets(),
        mail(
            to=["ada@example.test", "bob@example.test"],
            cc=["cy@example.test"],
            bcc=["audit@acme.test"],
            subject="Invoice 7 — paid",
            html="<p>Paid, thanks.</p>",
            reply_to="billing@acme.test",
            headers={"X-Run": "run_1"},
        ),
        make_context(),
    )
    expected_id = message_id(KEY)
    assert out == {
        "message_id": expected_id,
        "accepted": ["ada@example.test", "bob@example.test", "cy@example.test", "audit@acme.test"],
    }
    (got,) = smtp.messages
    assert got.mail_from == "ops@acme.test"
    assert got.rcpt_tos == out["accepted"]
    m = got.message
    assert m["Message-ID"] == expected_id == "<run_1%3Afetch%3A1@ductor>"
    assert m["From"] == "ops@acme.test"
    assert m["To"] == "ada@example.test, bob@example.test"
    assert m["Cc"] == "cy@example.test"
    assert m["Bcc"] is None
    assert b"audit@acme.test" not in got.raw
    assert m["Reply-To"] == "billing@acme.test"
    assert m["Subject"] == "Invoice 7 — paid"
    assert m["X-Run"] == "run_1"
    assert email.utils.parsedate_to_datetime(m["Date"]).timestamp() == NOW  # the context's
    plain = m.get_body(("plain",))
    html = m.get_body(("html",))
    assert plain is not None
    assert plain.get_content().strip() == "Paid, thanks."
    assert html is not None
    assert "<p>Paid, thanks.</p>" in html.get_content()


async def test_a_repeated_attempt_has_the_same_message_id(
    smtp: SmtpSink, make_context: MakeContext
) -> None:
    provider = SmtpProvider()
    for _ in range(2):
        await provider.call("send", settings(smtp.port), secrets(), mail(), make_context())
    first, second = smtp.messages
    assert first.message["Message-ID"] == second.message["Message-ID"] == message_id(KEY)


def test_the_message_id_encodes_every_character_but_letters_digits_dash_and_underscore() -> None:
    assert message_id("run_1:push-it.v2~x:0:1") == "<run_1%3Apush-it%2Ev2%7Ex%3A0%3A1@ductor>"
    assert message_id("a b/c@d") == "<a%20b%2Fc%40d@ductor>"


async def test_login(smtp_auth: SmtpSink, make_context: MakeContext) -> None:
    out = await SmtpProvider().call(
        "send", settings(smtp_auth.port, username=USER), secrets(PASSWORD), mail(), make_context()
    )
    assert out["accepted"] == ["ada@example.test"]
    assert smtp_auth.logins == [(USER, PASSWORD)]
    assert len(smtp_auth.messages) == 1


async def test_auth_failure_is_not_retryable_and_hides_the_password(
    smtp_auth: SmtpSink, make_context: MakeContext
) -> None:
    wrong = "wrong-Pw-123456"
    failed = await fail(
        SmtpProvider().call(
            "send", settings(smtp_auth.port, username=USER), secrets(wrong), mail(), make_context()
        )
    )
    assert failed.error.code == "smtp.auth_failed"
    assert failed.error.retryable is False
    assert failed.error.details == {"reply_code": 535}
    assert wrong not in str(failed) + repr(failed.error)
    assert smtp_auth.messages == []


async def test_server_demanding_login_without_credentials(
    smtp_auth: SmtpSink, make_context: MakeContext
) -> None:
    failed = await fail(
        SmtpProvider().call("send", settings(smtp_auth.port), secrets(), mail(), make_context())
    )
    assert failed.error.code == "smtp.sender_refused"
    assert failed.error.retryable is False


async def test_username_without_password(smtp: SmtpSink, make_context: MakeContext) -> None:
    failed = await fail(
        SmtpProvider().call(
            "send", settings(smtp.port, username=USER), secrets(), mail(), make_context()
        )
    )
    assert (failed.error.code, failed.error.retryable) == ("smtp.bad_config", False)


async def test_a_refused_recipient_sends_nothing(smtp: SmtpSink, make_context: MakeContext) -> None:
    smtp.refuse.add("nobody@example.test")
    failed = await fail(
        SmtpProvider().call(
            "send",
            settings(smtp.port),
            secrets(),
            mail(to=["ada@example.test"], cc=["nobody@example.test"]),
            make_context(),
        )
    )
    assert failed.error.code == "smtp.recipient_refused"
    assert failed.error.retryable is False
    assert failed.error.details == {"reply_code": 550, "recipient": "nobody@example.test"}
    assert "nobody@example.test" in failed.error.message
    assert smtp.messages == []


async def test_a_deferred_recipient_is_retryable(smtp: SmtpSink, make_context: MakeContext) -> None:
    smtp.defer.add("busy@example.test")
    failed = await fail(
        SmtpProvider().call(
            "send", settings(smtp.port), secrets(), mail(to=["busy@example.test"]), make_context()
        )
    )
    assert (failed.error.code, failed.error.retryable) == ("smtp.temporary", True)
    assert smtp.messages == []


async def test_a_server_that_is_down_is_retryable(make_context: MakeContext) -> None:
    failed = await fail(
        SmtpProvider().call("send", settings(free_port()), secrets(), mail(), make_context())
    )
    assert failed.error.code == "smtp.connection"
    assert failed.error.retryable is True


async def test_a_server_that_never_greets_times_out(make_context: MakeContext) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        failed = await fail(
            SmtpProvider().call(
                "send", settings(port), secrets(), mail(), make_context(timeout=0.5)
            )
        )
    assert (failed.error.code, failed.error.retryable) == ("smtp.timeout", True)


async def test_starttls_not_offered_is_refused(smtp: SmtpSink, make_context: MakeContext) -> None:
    failed = await fail(
        SmtpProvider().call(
            "send", settings(smtp.port, starttls=True), secrets(), mail(), make_context()
        )
    )
    assert (failed.error.code, failed.error.retryable) == ("smtp.tls", False)
    assert smtp.messages == []


async def test_starttls_checks_the_certificate(tmp_path: Path, make_context: MakeContext) -> None:
    """The server offers STARTTLS with a certificate nobody vouches for: the
    handshake fails before anything is sent, and a retry would not help."""
    with SmtpSink(tls_context=self_signed_context(tmp_path)) as smtp:
        failed = await fail(
            SmtpProvider().call(
                "send", settings(smtp.port, starttls=True), secrets(), mail(), make_context()
            )
        )
    assert (failed.error.code, failed.error.retryable) == ("smtp.tls", False)
    assert "certificate" in failed.error.message.lower()
    assert smtp.messages == []


async def test_loopback_refused_by_the_guard(smtp: SmtpSink, make_context: MakeContext) -> None:
    failed = await fail(
        SmtpProvider().call(
            "send", settings(smtp.port), secrets(), mail(), make_context(allow=["10.0.0.0/8"])
        )
    )
    assert failed.error.code == "outbound.forbidden"
    assert failed.error.retryable is False
    assert failed.error.details == {"host": "127.0.0.1"}
    assert smtp.messages == []


@pytest.mark.parametrize(
    ("fields", "pointer"),
    [
        ({"subject": "Hi\r\nBcc: victim@example.test"}, "/subject"),
        ({"subject": "Hi\nX-Evil: 1"}, "/subject"),
        ({"to": ["ada@example.test\r\nBcc: victim@example.test"]}, "/to/0"),
        ({"to": ["ada@example.test", "Ada <ada@example.test>"]}, "/to/1"),
        ({"cc": ["not-an-address"]}, "/cc/0"),
        ({"bcc": ["a@b.test,c@d.test"]}, "/bcc/0"),
        ({"reply_to": "x@y.test\r\nTo: z@w.test"}, "/reply_to"),
        ({"headers": {"X-Note": "a\r\nBcc: victim@example.test"}}, "/headers/X-Note"),
        ({"headers": {"Bcc": "victim@example.test"}}, "/headers/Bcc"),
        ({"headers": {"Message-ID": "<forged@x>"}}, "/headers/Message-ID"),
        ({"to": []}, "/to"),
    ],
)
async def test_injection_and_bad_input_refused_cleanly(
    smtp: SmtpSink, make_context: MakeContext, fields: dict[str, Any], pointer: str
) -> None:
    failed = await fail(
        SmtpProvider().call("send", settings(smtp.port), secrets(), mail(**fields), make_context())
    )
    assert failed.error.code == "smtp.bad_input"
    assert failed.error.retryable is False
    assert pointer in [p["pointer"] for p in failed.error.details["problems"]]
    assert smtp.messages == []


def test_settings_validation() -> None:
    for bad in (
        {"host": "", "from_address": "a@b.test"},
        {"host": "smtp.example.test\r\n", "from_address": "a@b.test"},
        {"host": "smtp.example.test\n", "from_address": "a@b.test"},
        {"host": "smtp.example.test", "from_address": "nobody"},
        {"host": "smtp.example.test", "from_address": "a@b.test", "port": 0},
        {"host": "smtp.example.test", "from_address": "a@b.test", "password": "x"},
    ):
        with pytest.raises(msgspec.ValidationError):
            msgspec.convert(bad, SmtpSettings)
    ok = msgspec.convert({"host": "smtp.example.test", "from_address": "a@b.test"}, SmtpSettings)
    assert (ok.port, ok.starttls, ok.timeout) == (587, True, 30.0)


async def test_check(smtp_auth: SmtpSink, make_context: MakeContext) -> None:
    provider = SmtpProvider()
    good = await provider.test(
        settings(smtp_auth.port, username=USER), secrets(PASSWORD), make_context()
    )
    assert good.ok is True
    bad = await provider.test(
        settings(smtp_auth.port, username=USER), secrets("nope-nope"), make_context()
    )
    assert bad.ok is False
    assert bad.details == {"code": "smtp.auth_failed", "reply_code": 535}
    assert smtp_auth.messages == []
    down = await provider.test(settings(free_port()), secrets(), make_context())
    assert (down.ok, down.details) == (False, {"code": "smtp.connection"})
