"""The providers through real server processes on both backends: one workflow sends
an email through an SMTP connection (a real aiosmtpd on 127.0.0.1), posts a signed
webhook (verified here with the `standardwebhooks` library, as a receiver would)
and calls an http connection with a bearer token, and the connections' secrets
appear in no API answer, run history, step output or server log line.
"""

from __future__ import annotations

import base64
import email
import email.policy
import json
import secrets
import threading
from collections.abc import Iterator
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword
from standardwebhooks.webhooks import Webhook

from ductor_server.connections import new_secret_key
from ductor_server.testing import free_port

from .conftest import ServerProcess

TOKEN = "tok-live-Hq2Vx8Lm4Np7Rs1Tu5Wy9Za3"
SMTP_PASSWORD = "smtp-pw-Jk6Lm2Nb8Vc4Xz0Q"
SLACK_TOKEN = "Xq7Lm2Vb9Nc4Zt6Rw1Yp8Ks3"
WEBHOOK_SECRET = "whsec_" + base64.b64encode(b"webhook-signing-key-of-32-bytes!").decode()


class Receiver:
    """A real HTTP server on 127.0.0.1 that keeps every request (path, headers, body);
    it answers `{"received": true}`, or what `answers` holds for the path and body."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.answers: dict[tuple[str, bytes], tuple[int, str, bytes]] = {}
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return None

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length)
                receiver.requests.append((self.path, dict(self.headers.items()), body))
                status, content_type, answer = receiver.answers.get(
                    (self.path, body),
                    (200, "application/json", json.dumps({"received": True}).encode()),
                )
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            do_HEAD = do_POST

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def on(self, path: str) -> list[tuple[dict[str, str], bytes]]:
        return [(headers, body) for p, headers, body in self.requests if p == path]


class Mailbox:
    """An aiosmtpd handler keeping every message it accepted, and the logins tried."""

    def __init__(self) -> None:
        self.messages: list[EmailMessage] = []
        self.logins: list[tuple[str, str]] = []

    def authenticate(
        self, server: Any, session: Any, envelope: Any, mechanism: str, data: Any
    ) -> AuthResult:
        assert isinstance(data, LoginPassword)
        login, password = data.login.decode(), data.password.decode()
        self.logins.append((login, password))
        return AuthResult(success=(login, password) == ("shop", SMTP_PASSWORD), handled=False)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        parsed = email.message_from_bytes(envelope.content, policy=email.policy.default)
        assert isinstance(parsed, EmailMessage)
        self.messages.append(parsed)
        return "250 OK"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    threading.Thread(target=r.server.serve_forever, daemon=True).start()
    try:
        yield r
    finally:
        r.server.shutdown()
        r.server.server_close()


@pytest.fixture
def mailbox() -> Iterator[tuple[Mailbox, int]]:
    box = Mailbox()
    port = free_port()
    controller = Controller(
        box,
        hostname="127.0.0.1",
        port=port,
        authenticator=box.authenticate,
        auth_required=True,
        auth_require_tls=False,  # loopback only; the provider's STARTTLS is tested on its own
    )
    controller.start()
    try:
        yield box, port
    finally:
        controller.stop()


def _workflow() -> dict[str, Any]:
    return {
        "family_slug": "order-confirmed",
        "steps": [
            {
                "ref": "email",
                "type": "STEP_TYPE_ACTION",
                "args": {
                    "connection": "mail",
                    "operation": "send",
                    "input": {
                        "to": "[input.customer]",
                        "subject": "'Order ' + string(input.order) + ' confirmed'",
                        "text": "'Thank you for order ' + string(input.order)",
                    },
                },
            },
            {
                "ref": "hook",
                "type": "STEP_TYPE_ACTION",
                "args": {
                    "connection": "partner",
                    "operation": "send",
                    "input": {"type": "'order.confirmed'", "data": "input"},
                },
            },
            {
                "ref": "call",
                "type": "STEP_TYPE_ACTION",
                "args": {
                    "connection": "crm",
                    "operation": "request",
                    "input": {"method": "'POST'", "path": "'/orders'", "body": "input"},
                },
            },
        ],
        "edges": [
            {"source_ref": "email", "target_ref": "hook"},
            {"source_ref": "hook", "target_ref": "call"},
        ],
    }


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_email_webhook_and_http_through_connections(
    backend: str,
    request: pytest.FixtureRequest,
    receiver: Receiver,
    mailbox: tuple[Mailbox, int],
) -> None:
    box, smtp_port = mailbox
    server: ServerProcess = request.getfixturevalue(f"{backend}_server")
    server.extra_env["DUCTOR_LOG_LEVEL"] = "debug"
    if backend == "postgres":
        server.extra_env["DUCTOR_SECRET_KEYS"] = new_secret_key("k1")
    server.start()
    answers: list[str] = []
    with server.client() as http:

        def call(method: str, path: str, status: int, **kwargs: Any) -> Any:
            response = http.request(method, path, **kwargs)
            answers.append(response.text)
            assert response.status_code == status, response.text
            return response.json() if response.content else None

        connections = [
            {
                "name": "mail",
                "provider": "smtp",
                "config": {
                    "host": "127.0.0.1",
                    "port": smtp_port,
                    "from_address": "shop@example.com",
                    "starttls": False,
                    "username": "shop",
                },
                "secrets": {"password": SMTP_PASSWORD},
            },
            {
                "name": "partner",
                "provider": "webhook",
                "config": {"url": f"{receiver.url}/hooks"},
                "secrets": {"signing_secret": WEBHOOK_SECRET},
            },
            {
                "name": "crm",
                "provider": "http",
                "config": {"base_url": f"{receiver.url}/api"},
                "secrets": {"bearer_token": TOKEN},
            },
        ]
        for body in connections:
            call("POST", "/v1/connections", 201, json=body)
        call("GET", "/v1/connections", 200)
        call("GET", "/v1/providers", 200)
        call("POST", "/v1/workflows", 201, json=_workflow())
        customer = f"buyer-{secrets.token_hex(3)}@example.com"
        run = call(
            "POST",
            "/v1/runs",
            201,
            json={"family_slug": "order-confirmed", "input": {"order": 42, "customer": customer}},
        )
        ended = server.wait_for_run(run["id"])
        answers.append(json.dumps(ended))
        assert ended["status"] == "RUN_STATUS_SUCCEEDED", ended
        call("GET", f"/v1/runs/{run['id']}", 200)
        call("GET", f"/v1/runs/{run['id']}/history", 200)
    steps = {s["ref"]: s for s in ended["steps"]}

    # The email reached the SMTP server, logged in, with a Message-ID made from the attempt key.
    assert box.logins == [("shop", SMTP_PASSWORD)]
    assert len(box.messages) == 1
    mail = box.messages[0]
    assert mail["To"] == customer
    assert mail["Subject"] == "Order 42 confirmed"
    assert mail.get_content().strip() == "Thank you for order 42"
    email_key = f"{run['id']}:email:-1:{steps['email']['attempt']}"
    assert email_key.replace(":", "%3A") in mail["Message-ID"] or email_key in mail["Message-ID"]

    # The webhook verifies with the standard library of the specification.
    (hook_headers, hook_body), *more = receiver.on("/hooks")
    assert not more
    verified = Webhook(WEBHOOK_SECRET).verify(hook_body, hook_headers)
    assert verified["type"] == "order.confirmed"
    assert verified["data"] == {"order": 42, "customer": customer}
    assert hook_headers["webhook-id"] == f"{run['id']}:hook:-1:{steps['hook']['attempt']}"
    with pytest.raises(Exception, match=r"(?i)signature"):
        Webhook(WEBHOOK_SECRET).verify(hook_body.replace(b"42", b"43"), hook_headers)

    # The http call carried the token and the attempt's idempotency key.
    (api_headers, api_body), *more = receiver.on("/api/orders")
    assert not more
    assert api_headers["Authorization"] == f"Bearer {TOKEN}"
    assert api_headers["Idempotency-Key"] == f"{run['id']}:call:-1:{steps['call']['attempt']}"
    assert json.loads(api_body) == {"order": 42, "customer": customer}

    # No secret came back: not in an answer, the history, a step's output or a log line.
    server.stop()
    log = server.log()
    assert "order-confirmed" in log or "ductor" in log
    for secret in (TOKEN, SMTP_PASSWORD, WEBHOOK_SECRET, WEBHOOK_SECRET.removeprefix("whsec_")):
        for text in answers:
            assert secret not in text
        assert secret not in log


def test_a_slack_webhook_url_reaches_no_log_line(
    sqlite_server: ServerProcess, receiver: Receiver
) -> None:
    hook = "/services/T0AAA/B0BBB/" + SLACK_TOKEN
    # What Slack answers: an empty message is `no_text`, a message is `ok`.
    receiver.answers[(hook, b"{}")] = (400, "text/plain", b"no_text")
    receiver.answers[(hook, b'{"text":"deployed"}')] = (200, "text/plain", b"ok")
    sqlite_server.extra_env["DUCTOR_LOG_LEVEL"] = "debug"
    sqlite_server.start()
    with sqlite_server.client() as http:
        created = http.post(
            "/v1/connections",
            json={
                "name": "team",
                "provider": "slack",
                "secrets": {"webhook_url": receiver.url + hook},
            },
        )
        assert created.status_code == 201, created.text
        tested = http.post("/v1/connections/team/test")
        assert tested.json()["ok"] is True, tested.text
        published = http.post(
            "/v1/workflows",
            json={
                "family_slug": "deployed",
                "steps": [
                    {
                        "ref": "say",
                        "type": "STEP_TYPE_ACTION",
                        "args": {
                            "connection": "team",
                            "operation": "post_message",
                            "input": {"text": "'deployed'"},
                        },
                    }
                ],
                "edges": [],
            },
        )
        assert published.status_code == 201, published.text
        run = http.post("/v1/runs", json={"family_slug": "deployed", "input": {}}).json()
    ended = sqlite_server.wait_for_run(run["id"])
    assert ended["status"] == "RUN_STATUS_SUCCEEDED", ended
    assert [path for path, _, _ in receiver.requests] == [hook, hook]
    sqlite_server.stop()
    log = sqlite_server.log()
    assert "ductor" in log  # the server's output was captured
    assert SLACK_TOKEN not in log
