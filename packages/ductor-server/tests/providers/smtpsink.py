"""A real SMTP server (aiosmtpd) on 127.0.0.1 for the smtp provider tests.

It accepts mail for anyone but the addresses in `refuse` (550) and `defer`
(450), logs in `USER`/`PASSWORD` (PLAIN or LOGIN, without TLS), and keeps every
message it took in `messages`.
"""

from __future__ import annotations

import email
import email.policy
import ipaddress
import ssl
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from pathlib import Path
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ductor_server.testing import free_port

USER = "mailer"
PASSWORD = "pw-Zq8!secret"


@dataclass(frozen=True)
class Received:
    mail_from: str
    rcpt_tos: list[str]
    message: EmailMessage
    raw: bytes


def self_signed_context(tmp: Path) -> ssl.SSLContext:
    """A server TLS context with a fresh self-signed certificate for 127.0.0.1
    (which no client trusts)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=1))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    (tmp / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp / "key.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tmp / "cert.pem", tmp / "key.pem")
    return context


class SmtpSink:
    def __init__(self, *, auth: bool = False, tls_context: ssl.SSLContext | None = None) -> None:
        self.messages: list[Received] = []
        self.refuse: set[str] = set()
        self.defer: set[str] = set()
        self.logins: list[tuple[str, str]] = []
        sink = self

        class Handler:
            async def handle_RCPT(
                self, server: Any, session: Any, envelope: Any, address: str, options: Any
            ) -> str:
                if address in sink.refuse:
                    return "550 5.1.1 no such user here"
                if address in sink.defer:
                    return "450 4.2.1 mailbox busy, try later"
                envelope.rcpt_tos.append(address)
                return "250 OK"

            async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
                raw = bytes(envelope.original_content or envelope.content)
                parsed = email.message_from_bytes(raw, policy=email.policy.default)
                assert isinstance(parsed, EmailMessage)
                sink.messages.append(
                    Received(envelope.mail_from, list(envelope.rcpt_tos), parsed, raw)
                )
                return "250 2.0.0 accepted"

        def authenticator(
            server: Any, session: Any, envelope: Any, mechanism: str, data: Any
        ) -> AuthResult:
            assert isinstance(data, LoginPassword)
            login, password = data.login.decode(), data.password.decode()
            sink.logins.append((login, password))
            return AuthResult(success=(login, password) == (USER, PASSWORD), handled=False)

        self.port = free_port()
        options: dict[str, Any] = {}
        if auth:
            options = {
                "authenticator": authenticator,
                "auth_required": True,
                "auth_require_tls": False,
            }
        if tls_context is not None:
            options["tls_context"] = tls_context
        self.controller = Controller(Handler(), hostname="127.0.0.1", port=self.port, **options)

    def __enter__(self) -> SmtpSink:
        self.controller.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.controller.stop()
