"""The `smtp` provider: email sent through a connection's SMTP server.

The server's host goes through the outbound guard (`CallContext.resolve`) and the
connection is made to one of the addresses it allowed; STARTTLS, when asked,
verifies the certificate against the configured host name. The Message-ID is
made from the attempt's idempotency key, so a repeated attempt is recognisable
to the receiving side. Every recipient must be accepted before the message is
sent: one refused recipient sends nothing.

It must not send a header the input could forge (CR or LF in any value, or a
header the provider sets itself), nor put the password in an error.
"""

from __future__ import annotations

import asyncio
import email.policy
import email.utils
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from email.message import EmailMessage
from typing import Annotated, Any, TypeVar
from urllib.parse import quote

import aiosmtplib
import msgspec

from ductor_server.engine.outbound import OutboundForbidden
from ductor_server.netaddr import host_name_problem
from ductor_server.providers._exchange import (
    Redactor,
    bad_input,
    elapsed_ms,
    failed_test,
    header_problems,
    unknown_operation,
)
from ductor_server.providers.base import (
    CallContext,
    CheckResult,
    Operation,
    ProviderFailed,
    provider_failure,
)

T = TypeVar("T")
Port = Annotated[int, msgspec.Meta(ge=1, le=65535)]
Timeout = Annotated[float, msgspec.Meta(gt=0, le=600)]

# An ASCII address `local@domain` (the WHATWG form's rule, no display name), matched
# whole: `$` would let a trailing line break through into a header.
_ADDRESS = re.compile(
    r"[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
)
_HOST = re.compile(r"^[A-Za-z0-9.\-:\[\]]+$")
_OWN_HEADERS = frozenset(
    {
        "from",
        "to",
        "cc",
        "bcc",
        "subject",
        "date",
        "message-id",
        "reply-to",
        "mime-version",
        "content-type",
        "content-transfer-encoding",
        "sender",
        "return-path",
    }
)


def is_address(value: str) -> bool:
    """Whether `value` is a plain ASCII email address (`local@domain`, at most 254)."""
    return len(value) <= 254 and _ADDRESS.fullmatch(value) is not None


def message_id(idempotency_key: str) -> str:
    """The Message-ID for an attempt: `<key@ductor>`, the key percent-encoded
    (every character but letters, digits, `-` and `_`)."""
    # `quote` never encodes `.` and `~`; they are encoded here.
    encoded = quote(idempotency_key, safe="-_").replace(".", "%2E").replace("~", "%7E")
    return f"<{encoded}@ductor>"


class SmtpSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A connection's `config`.

    Attributes:
        host: the SMTP server's host name or address.
        port: its port (587 by default, the submission port).
        from_address: the sender's address (envelope and `From`).
        starttls: upgrade to TLS with STARTTLS before anything else (the
            certificate must be valid for `host`).
        username: log in with this name and the secret password.
        timeout: seconds one send may take (at most the step's timeout).
    """

    host: str
    from_address: str
    port: Port = 587
    starttls: bool = True
    username: str | None = None
    timeout: Timeout = 30.0

    def __post_init__(self) -> None:
        if not self.host or not _HOST.fullmatch(self.host):
            raise ValueError("host must be a host name or an IP address")
        problem = host_name_problem(self.host)
        if problem is not None:
            raise ValueError(problem)
        if not is_address(self.from_address):
            raise ValueError("from_address must be an email address (local@domain)")
        if self.username is not None and (
            not self.username or any(c in self.username for c in "\r\n\0")
        ):
            raise ValueError("username may not be empty or contain CR, LF or NUL")


class SmtpSecrets(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A connection's `secrets`.

    Attributes:
        password: the password for `username` (required when a username is set).
    """

    password: str | None = None

    def __post_init__(self) -> None:
        if self.password is not None and any(c in self.password for c in "\r\n\0"):
            raise ValueError("password may not contain CR, LF or NUL")


class SendEmailInput(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The input of `send`.

    Attributes:
        to: the recipients (at least one).
        cc: copied recipients (in the `Cc` header).
        bcc: blind-copied recipients (in no header).
        subject: the subject (one line).
        text: the plain-text body.
        html: an HTML alternative of the body.
        reply_to: the `Reply-To` address.
        headers: extra headers (`X-...`); the ones the provider sets are refused.
    """

    to: list[str]
    subject: str
    text: str
    cc: list[str] = []
    bcc: list[str] = []
    html: str | None = None
    reply_to: str | None = None
    headers: dict[str, str] = {}


class SendEmailOutput(msgspec.Struct, frozen=True, kw_only=True):
    """The output of `send`.

    Attributes:
        message_id: the Message-ID sent (`<key@ductor>`).
        accepted: every recipient the server accepted (to, cc and bcc, in order).
    """

    message_id: str
    accepted: list[str]


def input_problems(input: SendEmailInput) -> list[dict[str, str]]:
    """Everything wrong with a `send` input, each with its JSON pointer."""
    problems: list[dict[str, str]] = []
    if not input.to:
        problems.append({"pointer": "/to", "message": "at least one recipient is needed"})
    for field in ("to", "cc", "bcc"):
        for i, address in enumerate(getattr(input, field)):
            if not is_address(address):
                problems.append(
                    {"pointer": f"/{field}/{i}", "message": "not an email address (local@domain)"}
                )
    if input.reply_to is not None and not is_address(input.reply_to):
        problems.append({"pointer": "/reply_to", "message": "not an email address"})
    if any(c in input.subject for c in "\r\n\0"):
        problems.append({"pointer": "/subject", "message": "may not contain CR, LF or NUL"})
    # A mail header may hold any text (it is encoded as RFC 2047 says), not a line break.
    problems.extend(header_problems(input.headers, "/headers", ascii_only=False))
    for name in input.headers:
        if name.lower() in _OWN_HEADERS:
            problems.append(
                {"pointer": f"/headers/{name}", "message": f"{name} is set by the provider"}
            )
    return problems


def build_message(
    settings: SmtpSettings, input: SendEmailInput, context: CallContext
) -> EmailMessage:
    """The message `send` sends (no `Bcc` header)."""
    message = EmailMessage(policy=email.policy.SMTP)
    message["From"] = settings.from_address
    message["To"] = ", ".join(input.to)
    if input.cc:
        message["Cc"] = ", ".join(input.cc)
    if input.reply_to is not None:
        message["Reply-To"] = input.reply_to
    message["Subject"] = input.subject
    message["Date"] = email.utils.formatdate(context.now, usegmt=True)
    message["Message-ID"] = message_id(context.idempotency_key)
    for name, value in input.headers.items():
        message[name] = value
    message.set_content(input.text)
    if input.html is not None:
        message.add_alternative(input.html, subtype="html")
    return message


class SmtpProvider:
    """The `smtp` provider (one instance serves every connection)."""

    name: str = "smtp"
    description: str = "Email through an SMTP server (STARTTLS, login)."
    settings: type[msgspec.Struct] = SmtpSettings
    secrets: type[msgspec.Struct] = SmtpSecrets
    operations: Mapping[str, Operation] = {
        "send": Operation(
            name="send",
            description="Send one email to every recipient or to none.",
            input=SendEmailInput,
            output=SendEmailOutput,
        )
    }

    async def call(
        self,
        operation: str,
        settings: SmtpSettings,
        secrets: SmtpSecrets,
        input: SendEmailInput,
        context: CallContext,
    ) -> Any:
        """Run `send`: `{message_id, accepted}` once the server took the message."""
        if operation != "send":
            raise unknown_operation(self.name, operation)
        problems = input_problems(input)
        if problems:
            raise bad_input("smtp", problems)
        message = build_message(settings, input, context)
        recipients = list(dict.fromkeys([*input.to, *input.cc, *input.bcc]))
        redactor = Redactor([secrets.password])

        async def send(client: aiosmtplib.SMTP) -> SendEmailOutput:
            await _step(
                client.mail(settings.from_address),
                "smtp.sender_refused",
                f"the server refused the sender {settings.from_address}",
                redactor,
            )
            for recipient in recipients:
                try:
                    await client.rcpt(recipient)
                except aiosmtplib.SMTPRecipientRefused as exc:
                    raise _refused(
                        "smtp.recipient_refused",
                        f"the server refused the recipient {recipient}",
                        exc,
                        redactor,
                        recipient=recipient,
                    ) from None
            await _step(
                client.data(message.as_bytes()),
                "smtp.message_refused",
                "the server refused the message",
                redactor,
            )
            return SendEmailOutput(
                message_id=message_id(context.idempotency_key), accepted=recipients
            )

        output = await _session(settings, secrets, context, redactor, send)
        return msgspec.to_builtins(output)

    async def test(
        self, settings: SmtpSettings, secrets: SmtpSecrets, context: CallContext
    ) -> CheckResult:
        """Connect, STARTTLS and log in as configured, then `NOOP` and quit; sends
        nothing."""
        started = time.perf_counter()
        redactor = Redactor([secrets.password])

        async def noop(client: aiosmtplib.SMTP) -> None:
            await _step(
                client.noop(),
                "smtp.refused",
                f"{settings.host}:{settings.port} refused NOOP",
                redactor,
            )

        try:
            await _session(settings, secrets, context, redactor, noop)
        except ProviderFailed as exc:
            return failed_test(exc, started)
        return CheckResult(
            ok=True,
            message=f"{settings.host}:{settings.port} accepted the session",
            latency_ms=elapsed_ms(started),
        )


async def _session(
    settings: SmtpSettings,
    secrets: SmtpSecrets,
    context: CallContext,
    redactor: Redactor,
    work: Callable[[aiosmtplib.SMTP], Awaitable[T]],
) -> T:
    """Open a session (guarded connect, EHLO, STARTTLS, login), run `work(client)`,
    quit; map every failure to a `ProviderFailed`."""
    if settings.username is not None and secrets.password is None:
        raise provider_failure(
            "smtp.bad_config", "smtp: username is set but no password", retryable=False
        )
    where = f"{settings.host}:{settings.port}"
    seconds = min(settings.timeout, context.timeout_seconds)
    try:
        async with asyncio.timeout(seconds):
            try:
                addresses = await context.resolve(settings.host, settings.port)
            except OSError as exc:
                raise provider_failure(
                    "smtp.connection", f"cannot resolve {settings.host}: {exc}", retryable=True
                ) from None
            client = await _connect(addresses, settings, seconds, where)
            try:
                if client.is_ehlo_or_helo_needed:
                    await _step(client.ehlo(), "smtp.refused", f"{where} refused EHLO", redactor)
                if settings.starttls:
                    await _starttls(client, settings, where)
                if settings.username is not None and secrets.password is not None:
                    await _login(client, settings.username, secrets.password, where, redactor)
                result = await work(client)
            except ProviderFailed:
                await _quit(client)  # the server answered: say goodbye properly
                raise
            except BaseException:
                client.close()  # a dead or slow server: do not wait for it again
                raise
            await _quit(client)
            return result
    except OutboundForbidden as exc:
        raise provider_failure(
            "outbound.forbidden", str(exc), retryable=False, details={"host": exc.host}
        ) from None
    except TimeoutError:
        raise provider_failure(
            "smtp.timeout", f"{where} did not finish within {seconds:g}s", retryable=True
        ) from None
    except aiosmtplib.SMTPServerDisconnected as exc:
        raise provider_failure(
            "smtp.connection", f"{where} closed the connection: {exc}", retryable=True
        ) from None
    except (aiosmtplib.SMTPException, OSError) as exc:
        reason = redactor.text(str(exc)) or type(exc).__name__
        raise provider_failure(
            "smtp.connection", f"the session with {where} failed: {reason}", retryable=True
        ) from None


async def _connect(
    addresses: list[str], settings: SmtpSettings, seconds: float, where: str
) -> aiosmtplib.SMTP:
    failure: Exception | None = None
    for address in addresses:
        client = aiosmtplib.SMTP(
            hostname=address,
            port=settings.port,
            timeout=seconds,
            use_tls=False,
            start_tls=False,
            validate_certs=True,
        )
        try:
            await client.connect()
        except TimeoutError:
            raise  # the whole session's time is up: smtp.timeout
        except aiosmtplib.SMTPConnectResponseError as exc:
            raise _refused("smtp.refused", f"{where} refused the session", exc) from None
        except (aiosmtplib.SMTPConnectError, OSError) as exc:
            failure = exc
            continue
        return client
    raise provider_failure(
        "smtp.connection", f"cannot connect to {where}: {failure}", retryable=True
    )


async def _starttls(client: aiosmtplib.SMTP, settings: SmtpSettings, where: str) -> None:
    if not client.supports_extension("starttls"):
        raise provider_failure("smtp.tls", f"{where} does not offer STARTTLS", retryable=False)
    try:
        await client.starttls(server_hostname=settings.host, validate_certs=True)
    except TimeoutError:
        raise
    except aiosmtplib.SMTPResponseException as exc:
        raise _refused("smtp.tls", f"{where} refused STARTTLS", exc) from None
    except (aiosmtplib.SMTPConnectError, aiosmtplib.SMTPException, OSError) as exc:
        raise provider_failure(
            "smtp.tls", f"the TLS handshake with {where} failed: {exc}", retryable=False
        ) from None


async def _login(
    client: aiosmtplib.SMTP, username: str, password: str, where: str, redactor: Redactor
) -> None:
    try:
        await client.login(username, password)
    except aiosmtplib.SMTPResponseException as exc:
        raise _refused(
            "smtp.auth_failed", f"{where} refused the login of {username}", exc, redactor
        ) from None
    except (TimeoutError, aiosmtplib.SMTPServerDisconnected):
        raise
    except aiosmtplib.SMTPException:
        # No AUTH at all, or no mechanism both sides know.
        raise provider_failure(
            "smtp.auth_failed", f"{where} offers no login this client can use", retryable=False
        ) from None


async def _step(command: Any, code: str, message: str, redactor: Redactor) -> Any:
    """Await one SMTP command; a refusal becomes `code` (a 4xx reply: `smtp.temporary`)."""
    try:
        return await command
    except aiosmtplib.SMTPResponseException as exc:
        raise _refused(code, message, exc, redactor) from None


def _refused(
    code: str,
    message: str,
    exc: aiosmtplib.SMTPResponseException,
    redactor: Redactor | None = None,
    **details: Any,
) -> ProviderFailed:
    """A refusal: a 4xx reply is temporary (`smtp.temporary`, retryable), a 5xx
    one is `code` (not retryable)."""
    reply = f"{exc.code} {exc.message}".strip()
    if redactor is not None:
        reply = redactor.text(reply)
    temporary = 400 <= exc.code < 500
    return provider_failure(
        "smtp.temporary" if temporary else code,
        f"{message}: {reply}",
        retryable=temporary,
        details={"reply_code": exc.code, **details},
    )


async def _quit(client: aiosmtplib.SMTP) -> None:
    try:
        await client.quit()
    except (aiosmtplib.SMTPException, OSError):
        client.close()


__all__ = [
    "SendEmailInput",
    "SendEmailOutput",
    "SmtpProvider",
    "SmtpSecrets",
    "SmtpSettings",
    "build_message",
    "is_address",
    "message_id",
]
