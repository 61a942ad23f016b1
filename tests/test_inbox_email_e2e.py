"""Inbox email end to end: real `ductor` processes on both backends and a real
aiosmtpd server on 127.0.0.1 (with a login, so the connection's secret is
decrypted for every send). A NOTIFY step emails exactly the recipients whose
preferences allow it and whose profile has an address; an SMTP server that is
down at first gets the email once after a retry; a server killed (-9) between
the outbox write and the send delivers it exactly once after its restart; a
refusal (5xx) is a final `failed`; bad, non-SMTP and other tenants' connections
are refused at publish and at send, with a pointer."""

from __future__ import annotations

import asyncio
import email
import email.policy
import threading
import time
from collections.abc import Callable, Iterator
from email.message import EmailMessage
from typing import Any

import httpx
import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from ductor_server.cli_server import create_key
from ductor_server.connections import new_secret_key
from ductor_server.storage import open_store
from ductor_server.testing import free_port

from .conftest import ServerProcess

pytestmark = pytest.mark.timeout(120)

PASSWORD = "smtp-pw-Qx3Lm9Tb2Vc7Nz5R"


class Mailbox:
    """An aiosmtpd server on a fixed port that can be started and stopped; keeps
    every message it accepted. A recipient whose address starts with `bounce`
    is refused with 550."""

    def __init__(self) -> None:
        self.port = free_port()
        self.messages: list[EmailMessage] = []
        self._lock = threading.Lock()
        self._controller: Controller | None = None

    def authenticate(
        self, server: Any, session: Any, envelope: Any, mechanism: str, data: Any
    ) -> AuthResult:
        assert isinstance(data, LoginPassword)
        ok = (data.login.decode(), data.password.decode()) == ("shop", PASSWORD)
        return AuthResult(success=ok, handled=False)

    async def handle_RCPT(
        self, server: Any, session: Any, envelope: Any, address: str, options: Any
    ) -> str:
        if address.startswith("bounce"):
            return "550 5.1.1 no such mailbox"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        parsed = email.message_from_bytes(envelope.content, policy=email.policy.default)
        assert isinstance(parsed, EmailMessage)
        with self._lock:
            self.messages.append(parsed)
        return "250 OK"

    def start(self) -> None:
        self._controller = Controller(
            self,
            hostname="127.0.0.1",
            port=self.port,
            authenticator=self.authenticate,
            auth_required=True,
            auth_require_tls=False,  # loopback only
        )
        self._controller.start()

    def stop(self) -> None:
        if self._controller is not None:
            self._controller.stop()
            self._controller = None

    def to(self, address: str) -> list[EmailMessage]:
        with self._lock:
            return [m for m in self.messages if m["To"] == address]


@pytest.fixture
def mailbox() -> Iterator[Mailbox]:
    box = Mailbox()
    try:
        yield box
    finally:
        box.stop()


def _connection(port: int, name: str = "mail", sender: str = "shop@example.com") -> dict[str, Any]:
    return {
        "name": name,
        "provider": "smtp",
        "config": {
            "host": "127.0.0.1",
            "port": port,
            "from_address": sender,
            "starttls": False,
            "username": "shop",
        },
        "secrets": {"password": PASSWORD},
    }


def _workflow(recipients: str, *, connection: str = "mail") -> dict[str, Any]:
    return {
        "family_slug": "order-shipped",
        "steps": [
            {
                "ref": "tell",
                "type": "STEP_TYPE_NOTIFY",
                "args": {
                    "recipients": recipients,
                    "title": "'Order ' + input.order + ' shipped'",
                    "body": "'It left the warehouse today.'",
                    "feed": "orders",
                    "ctas": [
                        {"label": "'Track'", "url": "'https://shop.example/t/' + input.order"}
                    ],
                    "email": {"connection": connection, "subject": "'Shipped: ' + input.order"},
                },
            }
        ],
        "edges": [],
    }


def _start(server: ServerProcess) -> ServerProcess:
    if server.database_url:
        server.extra_env.setdefault("DUCTOR_SECRET_KEYS", new_secret_key("k1"))
    return server.start()


def _ok(response: httpx.Response, *statuses: int) -> Any:
    assert response.status_code in (statuses or (200, 201)), response.text
    return response.json() if response.content else None


def _setup(http: httpx.Client, port: int, profiles: dict[str, str | None]) -> None:
    _ok(http.post("/v1/connections", json=_connection(port)), 201)
    for subscriber, address in profiles.items():
        answer = _ok(http.put(f"/v1/inbox/subscribers/{subscriber}", json={"email": address}))
        assert answer == {"subscriber_id": subscriber, "email": address}


def _run(
    server: ServerProcess, http: httpx.Client, input: dict[str, Any], key: str | None = None
) -> str:
    run = _ok(http.post("/v1/runs", json={"family_slug": "order-shipped", "input": input}))
    done = server.wait_for_run(run["id"], api_key=key)
    assert done["status"] == "RUN_STATUS_SUCCEEDED", done
    return str(run["id"])


def _emails(http: httpx.Client, run_id: str) -> list[dict[str, Any]]:
    page = _ok(http.get("/v1/inbox/emails", params={"run_id": run_id}))
    return list(page["emails"])


def _until(
    what: str, probe: Callable[[], Any], *, timeout: float = 30.0, server: ServerProcess
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}\n{server.log()[-3000:]}")
        time.sleep(0.1)


def _history(http: httpx.Client, run_id: str, kind: str) -> list[dict[str, Any]]:
    entries = _ok(http.get(f"/v1/runs/{run_id}/history"))
    items = entries["entries"] if isinstance(entries, dict) else entries
    return [e["data"] for e in items if e["kind"] == kind]


def test_a_notify_step_emails_whom_the_preferences_allow(
    server: ServerProcess, mailbox: Mailbox
) -> None:
    mailbox.start()
    _start(server)
    with server.client() as http:
        _setup(
            http,
            mailbox.port,
            {
                "ann": "ann@example.com",
                "bob": "bob@example.com",
                "cat": "cat@example.com",
                "dan": None,
                "eve": "bounce-eve@example.com",
                "fay": "fay@example.com",
            },
        )
        rules = {
            # ann: no in-app for orders, but email stays on.
            "ann": [{"feed": "orders", "in_app": False}],
            "bob": [{"workflow": "order-shipped", "email": False}],
            "cat": [{"feed": "orders", "email": False}],
            # fay: off for the feed, on again for this workflow in this feed.
            "fay": [
                {"feed": "orders", "email": False},
                {"workflow": "order-shipped", "feed": "orders", "email": True},
            ],
        }
        for subscriber, rule in rules.items():
            _ok(http.put(f"/v1/inbox/subscribers/{subscriber}/preferences", json={"rules": rule}))
        _ok(http.post("/v1/workflows", json=_workflow("input.to")))
        run_id = _run(
            server, http, {"order": "o-7", "to": ["ann", "bob", "cat", "dan", "eve", "fay"]}
        )
        [sent] = _history(http, run_id, "notify.sent")
        assert sent["email"] == {
            "connection": "mail",
            "queued": ["ann", "eve", "fay"],
            "no_address": ["dan"],
            "opted_out": ["bob", "cat"],
        }
        assert sent["in_app"] == ["bob", "cat", "dan", "eve", "fay"]

        def settled() -> list[dict[str, Any]] | None:
            emails = _emails(http, run_id)
            return emails if all(e["status"] != "pending" for e in emails) else None

        emails = {e["subscriber_id"]: e for e in _until("3 emails settle", settled, server=server)}
        assert sorted(emails) == ["ann", "eve", "fay"]
        for who in ("ann", "fay"):
            view = emails[who]
            assert view["status"] == "sent", view
            assert view["attempts"] == 1
            assert view["to"] == f"{who}@example.com"
            [message] = mailbox.to(f"{who}@example.com")
            assert message["Subject"] == "Shipped: o-7"
            assert message["From"] == "shop@example.com"
            assert message["Message-ID"] == view["message_id"] == f"<{view['id']}@ductor>"
            text = message.get_content()
            assert "It left the warehouse today." in text
            assert "Track: https://shop.example/t/o-7" in text
        assert emails["ann"]["notification_id"] is None  # in-app was off for ann
        assert emails["fay"]["notification_id"] is not None
        bounced = emails["eve"]
        assert bounced["status"] == "failed"
        assert bounced["attempts"] == 1  # a 5xx refusal is final at once
        assert bounced["error"]["code"] == "smtp.recipient_refused"
        assert PASSWORD not in str(bounced)
        outcomes = {d["subscriber_id"]: d for d in _history(http, run_id, "notify.email")}
        assert {k: v["status"] for k, v in outcomes.items()} == {
            "ann": "sent",
            "eve": "failed",
            "fay": "sent",
        }
        assert outcomes["ann"]["message_id"] == emails["ann"]["message_id"]
        one = _ok(http.get(f"/v1/inbox/emails/{emails['ann']['id']}"))
        assert one == emails["ann"]
        time.sleep(1.5)  # nothing more comes
        assert len(mailbox.messages) == 2
        for who in ("bob", "cat", "dan", "eve"):
            assert mailbox.to(f"{who}@example.com") == []


def test_an_smtp_server_down_at_first_gets_the_email_once_after_a_retry(
    server: ServerProcess, mailbox: Mailbox
) -> None:
    _start(server)  # the mailbox is not listening yet
    with server.client() as http:
        _setup(http, mailbox.port, {"ann": "ann@example.com"})
        _ok(http.post("/v1/workflows", json=_workflow("'ann'")))
        run_id = _run(server, http, {"order": "o-8"})

        def refused() -> dict[str, Any] | None:
            [view] = _emails(http, run_id)
            return view if view["attempts"] >= 1 and view["error"] else None

        view = _until("a first attempt fails", refused, server=server)
        assert view["status"] == "pending"
        assert view["error"]["code"] == "smtp.connection"
        assert view["error"]["retryable"] is True
        assert view["next_attempt_at"] is not None
        mailbox.start()

        def sent() -> dict[str, Any] | None:
            [view] = _emails(http, run_id)
            return view if view["status"] == "sent" else None

        view = _until("the retry delivers", sent, server=server)
        assert view["attempts"] >= 2
        assert view["error"] is None
        time.sleep(1.5)
        [message] = mailbox.to("ann@example.com")
        assert message["Message-ID"] == f"<{view['id']}@ductor>"
        assert len(mailbox.messages) == 1


def test_a_kill_between_the_outbox_write_and_the_send_delivers_once(
    server: ServerProcess, mailbox: Mailbox
) -> None:
    mailbox.start()
    # No worker role: the step commits its outbox row, and nothing sends it.
    server.extra_env["DUCTOR_ROLES"] = "api,coordinator,timer"
    _start(server)
    with server.client() as http:
        _setup(http, mailbox.port, {"ann": "ann@example.com", "bob": "bob@example.com"})
        _ok(http.post("/v1/workflows", json=_workflow("['ann', 'bob']")))
        run_id = _run(server, http, {"order": "o-9"})
        waiting = _emails(http, run_id)
        assert sorted((e["subscriber_id"], e["status"], e["attempts"]) for e in waiting) == [
            ("ann", "pending", 0),
            ("bob", "pending", 0),
        ]
    time.sleep(1.0)
    assert mailbox.messages == []
    server.kill9()
    del server.extra_env["DUCTOR_ROLES"]
    server.start()
    with server.client() as http:

        def sent() -> list[dict[str, Any]] | None:
            emails = _emails(http, run_id)
            return emails if all(e["status"] == "sent" for e in emails) else None

        emails = _until("both are sent after the restart", sent, server=server)
        assert [e["attempts"] for e in emails] == [1, 1]
        time.sleep(2.0)
        assert len(mailbox.to("ann@example.com")) == 1
        assert len(mailbox.to("bob@example.com")) == 1
        assert len(mailbox.messages) == 2


async def _mint(server: ServerProcess, tenant: str) -> str:
    store = open_store(server.database_url or str(server.data_dir / "ductor.db"))
    await store.open()
    try:
        return await create_key(store, tenant, name="other")
    finally:
        await store.close()


def test_bad_foreign_and_non_smtp_connections_are_refused(
    server: ServerProcess, mailbox: Mailbox
) -> None:
    mailbox.start()
    _start(server)
    other_key = asyncio.run(_mint(server, "other"))
    with server.client() as http, server.client(other_key) as other:
        _setup(http, mailbox.port, {"ann": "ann@example.com"})
        _ok(
            http.post(
                "/v1/connections",
                json={
                    "name": "crm",
                    "provider": "http",
                    "config": {"base_url": "https://x.example"},
                },
            ),
            201,
        )
        for name, code in (
            ("nope", "definition.unknown_connection"),
            ("crm", "definition.not_email_connection"),
        ):
            refused = http.post("/v1/workflows", json=_workflow("'ann'", connection=name))
            assert refused.status_code == 422, refused.text
            [problem] = refused.json()["details"]
            assert problem["code"] == code
            assert problem["pointer"] == "/steps/0/args/email/connection"
            report = _ok(
                http.post("/v1/workflows/validate", json=_workflow("'ann'", connection=name))
            )
            assert report["valid"] is False
            assert report["problems"][0]["pointer"] == "/steps/0/args/email/connection"
        # Another tenant cannot name this tenant's connection, at publish or at send.
        _ok(other.put("/v1/inbox/subscribers/ann", json={"email": "ann@example.com"}))
        refused = other.post("/v1/workflows", json=_workflow("'ann'"))
        assert refused.status_code == 422, refused.text
        assert refused.json()["details"][0]["code"] == "definition.unknown_connection"
        for client, name in ((other, "mail"), (http, "nope"), (http, "crm")):
            bad = client.post(
                "/v1/inbox/notifications",
                json={"subscriber_id": "ann", "title": "t", "email": {"connection": name}},
            )
            assert bad.status_code == 422, bad.text
            assert bad.json()["code"] == "request.invalid"
            assert bad.json()["details"]["pointer"] == "/email/connection"
        for client in (http, other):  # nothing was half-written
            page = _ok(client.get("/v1/inbox/notifications", params={"subscriber_id": "ann"}))
            assert page["notifications"] == []
            assert _ok(client.get("/v1/inbox/emails"))["emails"] == []
        # The other tenant's own connection named "mail" sends from its own server
        # account; it never sees this tenant's emails.
        _ok(
            other.post(
                "/v1/connections",
                json=_connection(mailbox.port, sender="other@example.com"),
            ),
            201,
        )
        _ok(other.post("/v1/workflows", json=_workflow("'ann'")))
        _ok(http.post("/v1/workflows", json=_workflow("'ann'")))
        mine = _run(server, http, {"order": "o-1"})
        theirs = _run(server, other, {"order": "o-2"}, other_key)

        def both_sent() -> bool:
            return len(mailbox.messages) == 2

        _until("both tenants' emails arrive", both_sent, server=server)
        senders = sorted((m["From"], m["Subject"]) for m in mailbox.messages)
        assert senders == [
            ("other@example.com", "Shipped: o-2"),
            ("shop@example.com", "Shipped: o-1"),
        ]
        [my_email] = _emails(http, mine)
        assert _emails(other, mine) == []
        assert _emails(http, theirs) == []
        gone = other.get(f"/v1/inbox/emails/{my_email['id']}")
        assert gone.status_code == 404
        assert gone.json()["code"] == "email.not_found"
        # A send through the API queues the email too, when the option names it.
        sent = _ok(
            http.post(
                "/v1/inbox/notifications",
                json={
                    "subscriber_id": "ann",
                    "title": "Welcome",
                    "body": "Hello Ann",
                    "email": {"connection": "mail"},
                },
            ),
            201,
        )
        assert sent["email"]["queued"] is True
        assert sent["email"]["to"] == "ann@example.com"

        def welcome() -> dict[str, Any] | None:
            view = _ok(http.get(f"/v1/inbox/emails/{sent['email']['id']}"))
            return view if view["status"] == "sent" else None

        view = _until("the API's email is sent", welcome, server=server)
        assert view["notification_id"] == sent["notification"]["id"]
        [message] = [m for m in mailbox.messages if m["Subject"] == "Welcome"]
        assert message["Message-ID"] == view["message_id"]
