"""The inbox over REST, in process on both backends: the tenant's API, the
subscriber's API with its token, isolation, states, bulk actions, counts, the
change log, preferences, and NOTIFY steps that await a clicked action."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from ductor_server import Settings
from ductor_server.composition import build
from ductor_server.services.inbox import subscriber_token
from ductor_server.storage.notifications import InboxTx, Notification
from ductor_server.testing import TenantApi, served

APPROVAL: dict[str, Any] = {
    "family_slug": "approval",
    "steps": [
        {
            "ref": "ask",
            "type": "STEP_TYPE_NOTIFY",
            "args": {
                "recipients": "input.approvers",
                "title": "'Approve order ' + input.order",
                "body": "'Total: ' + string(input.total)",
                "feed": "approvals",
                "data": "{'order': input.order}",
                "ctas": [
                    {"label": "'Approve'", "action": "approve"},
                    {"label": "'Open'", "url": "'https://shop.example/o/' + input.order"},
                ],
                "await_action": True,
                "timeout": "1h",
            },
        }
    ],
    "edges": [],
}


class Inbox(TenantApi):
    """The tenant API plus subscriber headers."""

    async def me(
        self, tenant: str, subscriber: str, *, secret: str | None = None
    ) -> dict[str, str]:
        if secret is None:
            secret = (await self.ok("GET", "/v1/inbox/secret", as_b=tenant == "tenant-b"))["secret"]
        return {
            "X-Ductor-Tenant": tenant,
            "X-Ductor-Subscriber": subscriber,
            "X-Ductor-Subscriber-Token": subscriber_token(secret, subscriber),
        }

    async def as_me(self, headers: dict[str, str], method: str, path: str, **kw: Any) -> Any:
        return await self.client.request(method, path, headers=headers, **kw)


@pytest.fixture(params=["sqlite", "postgres"])
async def api(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Inbox]:
    database_url = request.getfixturevalue("postgres_url") if request.param == "postgres" else None
    settings = Settings(data_dir=tmp_path, database_url=database_url, poll_interval=0.05)
    async with served(build(settings)) as (client, keys, store):
        yield Inbox(client, keys, store, request.param)


async def _send(api: Inbox, subscriber: str, title: str, **extra: Any) -> dict[str, Any]:
    body = {"subscriber_id": subscriber, "title": title, **extra}
    result = await api.ok("POST", "/v1/inbox/notifications", json=body)
    assert result["notification"] is not None
    return dict(result["notification"])


async def test_a_subscriber_reads_only_its_own_feed(api: Inbox) -> None:
    mine = await _send(api, "ann", "for ann", feed="alerts")
    await _send(api, "bob", "for bob")
    ann = await api.me("tenant-a", "ann")
    page = (await api.as_me(ann, "GET", "/v1/inbox/me/notifications")).json()
    assert [n["title"] for n in page["notifications"]] == ["for ann"]
    got = await api.as_me(ann, "GET", f"/v1/inbox/me/notifications/{mine['id']}")
    assert got.status_code == 200
    assert got.json()["feed"] == "alerts"
    # Bob's token, a token of another tenant's secret, no token: all 404.
    bob = await api.me("tenant-a", "bob")
    other = await api.as_me(bob, "GET", f"/v1/inbox/me/notifications/{mine['id']}")
    assert other.status_code == 404
    assert other.json()["code"] == "notification.not_found"
    forged = dict(ann, **{"X-Ductor-Subscriber-Token": bob["X-Ductor-Subscriber-Token"]})
    refused = await api.as_me(forged, "GET", "/v1/inbox/me/notifications")
    assert refused.status_code == 404
    assert refused.json()["code"] == "inbox.not_found"
    b_secret = (await api.ok("GET", "/v1/inbox/secret", as_b=True))["secret"]
    wrong_tenant = await api.me("tenant-a", "ann", secret=b_secret)
    assert (await api.as_me(wrong_tenant, "GET", "/v1/inbox/me/counts")).status_code == 404
    as_b = await api.me("tenant-b", "ann", secret=b_secret)
    assert (await api.as_me(as_b, "GET", "/v1/inbox/me/notifications")).json()[
        "notifications"
    ] == []
    assert (await api.as_me({}, "GET", "/v1/inbox/me/counts")).status_code == 404
    # The tenant's API: tenant B cannot see or delete tenant A's notification.
    await api.fails(
        "GET", f"/v1/inbox/notifications/{mine['id']}", 404, "notification.not_found", as_b=True
    )
    await api.fails(
        "DELETE", f"/v1/inbox/notifications/{mine['id']}", 404, "notification.not_found", as_b=True
    )
    # Rotating takes no body: a field in one is refused and the secret is kept.
    refused = await api.fails(
        "POST", "/v1/inbox/secret/rotate", 422, "request.invalid", json={"secret": "mine"}
    )
    assert refused["details"]["path"] == "$.secret", refused
    assert (await api.as_me(ann, "GET", "/v1/inbox/me/counts")).status_code == 200
    # Rotating the secret retires every token.
    await api.ok("POST", "/v1/inbox/secret/rotate")
    assert (await api.as_me(ann, "GET", "/v1/inbox/me/counts")).status_code == 404


async def test_states_bulk_counts_and_the_change_log(api: Inbox) -> None:
    ann = await api.me("tenant-a", "ann")
    made = [await _send(api, "ann", f"n{i}", feed="a" if i < 3 else "b") for i in range(5)]
    assert [n["seq"] for n in made] == [1, 2, 3, 4, 5]
    first = made[0]["id"]
    read = await api.as_me(ann, "PATCH", f"/v1/inbox/me/notifications/{first}", json={"read": True})
    assert read.json()["read"] is True
    assert read.json()["seen"] is True
    assert read.json()["seq"] == 6
    counts = (await api.as_me(ann, "GET", "/v1/inbox/me/counts")).json()
    assert counts["feeds"]["a"] == {"total": 3, "unseen": 2, "unread": 2}
    assert counts["all"] == {"total": 5, "unseen": 4, "unread": 4}
    assert counts["seq"] == 6
    bulk = await api.as_me(ann, "POST", "/v1/inbox/me/bulk", json={"action": "seen", "feed": "a"})
    assert bulk.json() == {"changed": 2, "more": False}
    archived = await api.as_me(ann, "POST", "/v1/inbox/me/bulk", json={"action": "archive_read"})
    assert archived.json()["changed"] == 1
    counts = (await api.as_me(ann, "GET", "/v1/inbox/me/counts")).json()
    assert counts["feeds"]["a"] == {"total": 2, "unseen": 0, "unread": 2}
    changes = (await api.as_me(ann, "GET", "/v1/inbox/me/changes", params={"after": 5})).json()
    assert [c["seq"] for c in changes["changes"]] == [6, 7, 8, 9]
    assert [c["kind"] for c in changes["changes"]] == ["updated"] * 4
    assert changes["changes"][-1]["notification"]["archived"] is True
    assert changes["cursor"] == 9
    assert not changes["more"]
    deleted = await api.call("DELETE", f"/v1/inbox/notifications/{made[4]['id']}")
    assert deleted.status_code == 204
    last = (await api.as_me(ann, "GET", "/v1/inbox/me/changes", params={"after": 9})).json()
    assert [(c["seq"], c["kind"]) for c in last["changes"]] == [(10, "deleted")]
    listed = await api.ok(
        "GET", "/v1/inbox/notifications", params={"subscriber_id": "ann", "limit": 2}
    )
    assert len(listed["notifications"]) == 2
    rest = await api.ok(
        "GET",
        "/v1/inbox/notifications",
        params={"subscriber_id": "ann", "cursor": listed["next_cursor"], "status": "all"},
    )
    assert [n["title"] for n in listed["notifications"] + rest["notifications"]] == [
        "n3",
        "n2",
        "n1",
    ]


async def test_bad_input_is_a_clear_422(api: Inbox) -> None:
    ann = await api.me("tenant-a", "ann")
    made = await _send(api, "ann", "x", ctas=[{"label": "Docs", "url": "https://d.example"}])
    body = await api.fails(
        "POST",
        "/v1/inbox/notifications",
        422,
        "request.invalid",
        json={"subscriber_id": "ann", "title": "t", "feed": "no spaces"},
    )
    assert body["details"]["pointer"] == "/feed"
    body = await api.fails(
        "POST",
        "/v1/inbox/notifications",
        422,
        "request.invalid",
        json={"subscriber_id": "ann", "title": "t", "ctas": [{"label": "x"}]},
    )
    assert body["details"]["pointer"] == "/ctas/0"
    await api.fails(
        "POST",
        "/v1/inbox/notifications",
        422,
        "request.invalid",
        json={"subscriber_id": "ann", "title": "t", "color": "red"},
    )
    snooze = await api.as_me(
        ann, "PATCH", f"/v1/inbox/me/notifications/{made['id']}", json={"snooze": "soon"}
    )
    assert snooze.status_code == 422
    assert snooze.json()["details"]["pointer"] == "/snooze"
    click = await api.as_me(ann, "POST", f"/v1/inbox/me/notifications/{made['id']}/ctas/0/click")
    assert click.status_code == 422
    assert click.json()["code"] == "notification.not_actionable"
    bad = await api.as_me(ann, "GET", "/v1/inbox/me/notifications", params={"status": "old"})
    assert bad.status_code == 422
    rules = await api.call(
        "PUT", "/v1/inbox/subscribers/ann/preferences", json={"rules": [{"email": False}]}
    )
    assert rules.status_code == 422
    assert rules.json()["details"]["pointer"] == "/rules/0"


async def test_preferences_turn_the_in_app_channel_off_per_feed(api: Inbox) -> None:
    rules = {"rules": [{"feed": "digest", "in_app": False, "email": False}]}
    await api.ok("PUT", "/v1/inbox/subscribers/ann/preferences", json=rules)
    assert await api.ok("GET", "/v1/inbox/subscribers/ann/preferences") == {
        "rules": [{"workflow": None, "feed": "digest", "in_app": False, "email": False}]
    }
    skipped = await api.ok(
        "POST",
        "/v1/inbox/notifications",
        json={"subscriber_id": "ann", "title": "t", "feed": "digest"},
    )
    assert skipped["notification"] is None
    assert skipped["suppressed"] is True
    sent = await api.ok(
        "POST", "/v1/inbox/notifications", json={"subscriber_id": "ann", "title": "t"}
    )
    assert sent["notification"]["feed"] == "default"
    assert sent["email"] is None


async def _wait_run(api: Inbox, run_id: str, *, status: str | None = None) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while True:
        run = await api.ok("GET", f"/v1/runs/{run_id}")
        if (
            status is None and run["status"] in ("RUN_STATUS_SUCCEEDED", "RUN_STATUS_FAILED")
        ) or run["status"] == status:
            return dict(run)
        assert time.monotonic() < deadline, run
        await asyncio.sleep(0.05)


async def _notification_of(api: Inbox, subscriber: str) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while True:
        page = await api.ok("GET", "/v1/inbox/notifications", params={"subscriber_id": subscriber})
        if page["notifications"]:
            return dict(page["notifications"][0])
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)


async def test_a_clicked_action_resumes_the_waiting_run_once(api: Inbox) -> None:
    await api.ok("POST", "/v1/workflows", json=APPROVAL)
    run = await api.ok(
        "POST",
        "/v1/runs",
        json={
            "family_slug": "approval",
            "input": {"approvers": ["ann", "bob"], "order": "o-7", "total": 12},
        },
    )
    ann_note = await _notification_of(api, "ann")
    bob_note = await _notification_of(api, "bob")
    assert ann_note["title"] == "Approve order o-7"
    assert ann_note["ctas"] == [
        {"label": "Approve", "url": None, "action": "approve"},
        {"label": "Open", "url": "https://shop.example/o/o-7", "action": None},
    ]
    assert ann_note["run_id"] == run["id"]
    assert (await api.ok("GET", f"/v1/runs/{run['id']}"))["status"] == "RUN_STATUS_RUNNING"
    ann = await api.me("tenant-a", "ann")
    bob = await api.me("tenant-a", "bob")
    path = f"/v1/inbox/me/notifications/{ann_note['id']}/ctas/0/click"
    # A click takes no body: a field in one is refused, and that click does nothing.
    refused = await api.as_me(ann, "POST", path, json={"action": "reject"})
    assert refused.status_code == 422, refused.text
    assert refused.json()["details"]["path"] == "$.action"
    clicks = await asyncio.gather(*(api.as_me(ann, "POST", path) for _ in range(3)))
    assert sorted(c.json()["duplicate"] for c in clicks) == [False, True, True]
    assert [c.json()["resumed"] for c in clicks].count(True) == 1
    late = await api.as_me(bob, "POST", f"/v1/inbox/me/notifications/{bob_note['id']}/ctas/0/click")
    assert late.json()["resumed"] is False
    done = await _wait_run(api, run["id"])
    assert done["status"] == "RUN_STATUS_SUCCEEDED"
    output = done["output"]["ask"]
    assert output["action"] == "approve"
    assert output["subscriber_id"] == "ann"
    assert output["notification_id"] == ann_note["id"]
    assert output["timed_out"] is False
    history = await api.ok("GET", f"/v1/runs/{run['id']}/history")
    sent = [h for h in history if h["kind"] == "notify.sent"]
    assert sent[0]["data"]["in_app"] == ["ann", "bob"]


async def test_a_later_click_on_another_cta_answers_the_first_clicks_action(api: Inbox) -> None:
    ctas = [{"label": "Approve", "action": "approve"}, {"label": "Reject", "action": "reject"}]
    sent = await api.ok(
        "POST", "/v1/inbox/notifications", json={"subscriber_id": "ann", "title": "t", "ctas": ctas}
    )
    note = sent["notification"]["id"]
    ann = await api.me("tenant-a", "ann")
    first = await api.as_me(ann, "POST", f"/v1/inbox/me/notifications/{note}/ctas/0/click")
    assert (first.json()["action"], first.json()["duplicate"]) == ("approve", False)
    later = await api.as_me(ann, "POST", f"/v1/inbox/me/notifications/{note}/ctas/1/click")
    assert later.status_code == 200, later.text
    assert (later.json()["action"], later.json()["duplicate"]) == ("approve", True)
    assert later.json()["notification"]["acted"]["action"] == "approve"


async def test_a_repeated_send_with_one_idempotency_key_sends_once(api: Inbox) -> None:
    body = {"subscriber_id": "ann", "title": "once"}
    first = await api.ok("POST", "/v1/inbox/notifications", json=body, key="k-1")
    again = await api.ok("POST", "/v1/inbox/notifications", json=body, key="k-1")
    assert again["notification"]["id"] == first["notification"]["id"]
    await api.fails(
        "POST",
        "/v1/inbox/notifications",
        422,
        "idempotency.conflict",
        json={"subscriber_id": "ann", "title": "other"},
        key="k-1",
    )
    ann = await api.me("tenant-a", "ann")
    changes = (await api.as_me(ann, "GET", "/v1/inbox/me/changes")).json()
    assert [c["seq"] for c in changes["changes"]] == [1]


async def test_an_action_cta_sends_its_signal_to_the_run_and_its_event(api: Inbox) -> None:
    flow = {
        "family_slug": "ack",
        "steps": [
            {
                "ref": "tell",
                "type": "STEP_TYPE_NOTIFY",
                "args": {
                    "recipients": "'ann'",
                    "title": "'Incident'",
                    "ctas": [
                        {
                            "label": "'Ack'",
                            "action": "ack",
                            "signal": "acked",
                            "event": "ack.clicked",
                        }
                    ],
                },
            },
            {"ref": "wait", "type": "STEP_TYPE_WAIT_FOR_SIGNAL", "args": {"signal": "acked"}},
        ],
        "edges": [{"source_ref": "tell", "target_ref": "wait"}],
    }
    audit = {
        "family_slug": "audit",
        "triggers": [{"event": "ack.clicked"}],
        "steps": [{"ref": "noop", "type": "STEP_TYPE_WAIT", "args": {"duration": "1s"}}],
        "edges": [],
    }
    await api.ok("POST", "/v1/workflows", json=flow)
    await api.ok("POST", "/v1/workflows", json=audit)
    run = await api.ok("POST", "/v1/runs", json={"family_slug": "ack", "input": {}})
    note = await _notification_of(api, "ann")
    ann = await api.me("tenant-a", "ann")
    path = f"/v1/inbox/me/notifications/{note['id']}/ctas/0/click"
    for _ in range(2):
        assert (await api.as_me(ann, "POST", path)).status_code == 200
    done = await _wait_run(api, run["id"])
    assert done["status"] == "RUN_STATUS_SUCCEEDED"
    assert done["output"]["wait"]["action"] == "ack"
    assert done["output"]["wait"]["subscriber_id"] == "ann"
    audits = await api.ok("GET", "/v1/runs", params={"family_slug": "audit"})
    assert len(audits["items"]) == 1


async def test_a_cursor_past_64_bits_is_a_clear_422(api: Inbox) -> None:
    ann = await api.me("tenant-a", "ann")
    await _send(api, "ann", "one")
    for after in (2**63, 2**64, 10**30):
        refused = await api.as_me(ann, "GET", "/v1/inbox/me/changes", params={"after": str(after)})
        assert refused.status_code == 422, refused.text
        assert refused.json()["code"] == "request.invalid"
    # The largest 64-bit cursor is a sequence number, refused only for being past
    # the subscriber's last change.
    last = await api.as_me(ann, "GET", "/v1/inbox/me/changes", params={"after": str(2**63 - 1)})
    assert last.status_code == 422, last.text
    assert last.json()["details"] == {"pointer": "after", "cursor": 1}


async def test_bulk_actions_leave_snoozed_notifications_alone(api: Inbox) -> None:
    ann = await api.me("tenant-a", "ann")
    shown = await _send(api, "ann", "shown")
    hidden = await _send(api, "ann", "hidden")
    snoozed = await api.as_me(
        ann, "PATCH", f"/v1/inbox/me/notifications/{hidden['id']}", json={"snooze": "1h"}
    )
    assert snoozed.status_code == 200, snoozed.text
    for action in ("seen", "read", "archive"):
        bulk = await api.as_me(ann, "POST", "/v1/inbox/me/bulk", json={"action": action})
        assert bulk.json() == {"changed": 1, "more": False}, (action, bulk.text)
    after = (await api.as_me(ann, "GET", f"/v1/inbox/me/notifications/{hidden['id']}")).json()
    assert (after["seen"], after["read"], after["archived"]) == (False, False, False)
    assert after["snoozed_until"] is not None
    assert (await api.as_me(ann, "GET", f"/v1/inbox/me/notifications/{shown['id']}")).json()[
        "archived"
    ]


async def test_a_snooze_with_unsnooze_is_refused_and_changes_nothing(api: Inbox) -> None:
    ann = await api.me("tenant-a", "ann")
    made = await _send(api, "ann", "x")
    path = f"/v1/inbox/me/notifications/{made['id']}"
    for body in (
        {"snooze": "1h", "unsnooze": True},
        {"snoozed_until": "2999-01-01T00:00:00Z", "unsnooze": True},
    ):
        refused = await api.as_me(ann, "PATCH", path, json=body)
        assert refused.status_code == 422, refused.text
        assert refused.json()["details"] == {"pointer": "/unsnooze"}
    after = (await api.as_me(ann, "GET", path)).json()
    assert (after["snoozed_until"], after["seq"]) == (None, made["seq"])


async def test_preference_rules_name_real_workflows_once(api: Inbox) -> None:
    path = "/v1/inbox/subscribers/ann/preferences"
    await api.ok("PUT", path, json={"rules": [{"feed": "digest", "in_app": False}]})
    for rules, pointer in (
        ([{"workflow": ""}], "/rules/0/workflow"),
        ([{"feed": "a"}, {"workflow": "Not A Slug!"}], "/rules/1/workflow"),
        ([{"workflow": "x" * 100_000}], "/rules/0/workflow"),
        ([{"feed": f"f{i}"} for i in range(101)], "/rules"),
        ([{"feed": "d", "in_app": False}, {"feed": "d", "in_app": True}], "/rules/1"),
        (
            [{"workflow": "w", "feed": "d"}, {"workflow": "w"}, {"feed": "d", "workflow": "w"}],
            "/rules/2",
        ),
    ):
        refused = await api.fails("PUT", path, 422, "request.invalid", json={"rules": rules})
        assert refused["details"] == {"pointer": pointer}, refused
    # Nothing was written: the earlier rules stand.
    assert (await api.ok("GET", path))["rules"] == [
        {"workflow": None, "feed": "digest", "in_app": False, "email": True}
    ]
    rules = [{"workflow": "approval"}, {"workflow": "approval", "feed": "d"}, {"feed": "d"}]
    assert len((await api.ok("PUT", path, json={"rules": rules}))["rules"]) == 3
    most = [{"feed": f"f{i}"} for i in range(100)]
    assert len((await api.ok("PUT", path, json={"rules": most}))["rules"]) == 100


async def test_a_subscriber_id_beyond_ascii_authenticates_in_its_headers(api: Inbox) -> None:
    for subscriber in ("日本", "josé", "ann👋"):
        made = await _send(api, subscriber, "hi")
        headers = await api.me("tenant-a", subscriber)
        # A server or app client sends the id's UTF-8 bytes.
        utf8 = {name: value.encode() for name, value in headers.items()}
        mine = await api.client.get("/v1/inbox/me/notifications", headers=utf8)
        assert mine.status_code == 200, (subscriber, mine.text)
        assert [n["id"] for n in mine.json()["notifications"]] == [made["id"]]
    # A browser can send only Latin-1 characters, each as one byte.
    latin1 = {k: v.encode("latin-1") for k, v in (await api.me("tenant-a", "josé")).items()}
    assert (await api.client.get("/v1/inbox/me/counts", headers=latin1)).status_code == 200
    # Latin-1 characters whose bytes happen to be UTF-8 (`Ã©` is é's): the token
    # says which subscriber it is, whichever of the two sends.
    for subscriber in ("Ã©", "é"):
        made = await _send(api, subscriber, f"for {subscriber}")
        headers = await api.me("tenant-a", subscriber)
        encoding = "latin-1" if subscriber == "Ã©" else "utf-8"
        as_sent = {name: value.encode(encoding) for name, value in headers.items()}
        mine = await api.client.get("/v1/inbox/me/notifications", headers=as_sent)
        assert mine.status_code == 200, (subscriber, mine.text)
        assert [n["id"] for n in mine.json()["notifications"]] == [made["id"]]
    # Another subscriber's token still fails, whatever the encoding.
    forged = dict(utf8, **{"X-Ductor-Subscriber": "josé".encode()})
    refused = await api.client.get("/v1/inbox/me/counts", headers=forged)
    assert refused.status_code == 404
    assert refused.json()["code"] == "inbox.not_found"


BAD_LINKS = [
    "javascript:alert(document.cookie)",
    "JAVASCRIPT:alert(1)",
    "data:text/html,<script>alert(1)</script>",
    "vbscript:msgbox(1)",
    "/o/1",
    "//evil.example/x",
    "https://shop.example/a b",
    "https://shop.example/\x1f",
    "https://shop.example/" + "x" * 2028,
    "",
]


async def test_a_sent_link_or_label_a_client_cannot_render_safely_is_a_clear_422(
    api: Inbox,
) -> None:
    def send(avatar: str | None = None, **cta: str) -> dict[str, Any]:
        body: dict[str, Any] = {"subscriber_id": "ann", "title": "t", "avatar": avatar}
        body["ctas"] = [{"label": "Go", "url": "https://shop.example/o/1"}, cta]
        return body

    for link in BAD_LINKS:
        for body, pointer in (
            (send(link, label="Ok", action="ok"), "/avatar"),
            (send(label="Open", url=link), "/ctas/1/url"),
        ):
            refused = await api.fails(
                "POST", "/v1/inbox/notifications", 422, "request.invalid", json=body
            )
            assert refused["details"] == {"pointer": pointer}, (link, refused)
            assert "absolute http or https URL" in refused["message"]
    for label in ("", "x" * 201, "Open\nnow", "Open\x1b[31m", "Open\x85"):
        for cta in ({"label": label, "action": "ok"}, {"label": label, "url": "https://a.b/"}):
            refused = await api.fails(
                "POST", "/v1/inbox/notifications", 422, "request.invalid", json=send(**cta)
            )
            assert refused["details"] == {"pointer": "/ctas/1/label"}, (label, refused)
    # Nothing refused was written; the limits themselves are taken.
    assert (await api.ok("GET", "/v1/inbox/notifications", params={"subscriber_id": "ann"}))[
        "notifications"
    ] == []
    longest = "HTTPS://[::1]:8443/" + "x" * (2048 - 19)
    made = await _send(api, "ann", "t", avatar=longest, ctas=[{"label": "é" * 200, "url": longest}])
    assert made["avatar"] == longest
    assert made["ctas"] == [{"label": "é" * 200, "url": longest, "action": None}]


async def test_a_notify_step_with_a_script_link_fails_and_sends_nothing(api: Inbox) -> None:
    def flow(url: str, label: str = "'Open'") -> dict[str, Any]:
        args = {
            "recipients": "'ann'",
            "title": "'t'",
            "avatar": "input.avatar",
            "ctas": [{"label": label, "url": url}],
        }
        step = {"ref": "tell", "type": "STEP_TYPE_NOTIFY", "args": args}
        return {"family_slug": "links", "steps": [step], "edges": []}

    # A literal is refused when the workflow is published (and validated).
    for url, label, pointer in (
        ("'javascript:alert(1)'", "'Open'", "/steps/0/args/ctas/0/url"),
        ("'https://shop.example/'", "'Open\\nnow'", "/steps/0/args/ctas/0/label"),
    ):
        refused = await api.fails(
            "POST", "/v1/workflows", 422, "definition.invalid", json=flow(url, label)
        )
        assert [(p["code"], p["pointer"]) for p in refused["details"]] == [
            ("definition.bad_args", pointer)
        ]
        report = await api.ok("POST", "/v1/workflows/validate", json=flow(url, label))
        assert [p["pointer"] for p in report["problems"]] == [pointer]
    # A value computed when the step runs fails the step.
    await api.ok("POST", "/v1/workflows", json=flow("input.url"))
    for given, pointer in (
        ({"url": "javascript:alert(1)", "avatar": "https://img.example/a.png"}, "/args/ctas/0/url"),
        ({"url": "https://shop.example/", "avatar": "data:image/svg+xml,<svg/>"}, "/args/avatar"),
    ):
        run = await api.ok("POST", "/v1/runs", json={"family_slug": "links", "input": given})
        done = await _wait_run(api, run["id"])
        assert done["status"] == "RUN_STATUS_FAILED"
        (step,) = done["steps"]
        assert step["error"]["code"] == "notify.bad_value", step
        assert step["error"]["details"] == {"pointer": pointer}
    page = await api.ok("GET", "/v1/inbox/notifications", params={"subscriber_id": "ann"})
    assert page["notifications"] == []
    good = {"url": "https://shop.example/o/1", "avatar": "https://img.example/a.png"}
    run = await api.ok("POST", "/v1/runs", json={"family_slug": "links", "input": good})
    assert (await _wait_run(api, run["id"]))["status"] == "RUN_STATUS_SUCCEEDED"
    note = await _notification_of(api, "ann")
    assert (note["avatar"], note["ctas"][0]["url"]) == (good["avatar"], good["url"])


async def test_a_profile_address_with_a_line_break_is_refused_and_changes_nothing(
    api: Inbox,
) -> None:
    # An address ends up in an email's To header, so a trailing line break is not
    # a "plain local@domain address" however it is written.
    await api.ok("PUT", "/v1/inbox/subscribers/ann", json={"email": "ann@example.com"})
    for address in ("ann@example.org\n", "ann@example.org\r\n", "ann@example.org\nBcc: x@y.z"):
        body = await api.fails(
            "PUT", "/v1/inbox/subscribers/ann", 422, "request.invalid", json={"email": address}
        )
        assert body["details"] == {"pointer": "/email"}
    profile = await api.ok("GET", "/v1/inbox/subscribers/ann")
    assert profile == {"subscriber_id": "ann", "email": "ann@example.com"}


async def test_a_notify_step_holds_a_notification_to_the_sizes_the_api_takes(api: Inbox) -> None:
    # A step copies its title, body and data to every recipient (and to each
    # change), so one run's input must not become up to 1000 copies of a megabyte.
    args = {"recipients": "input.to", "title": "input.title", "data": "input.data"}
    step = {"ref": "tell", "type": "STEP_TYPE_NOTIFY", "args": {**args, "body": "input.body"}}
    await api.ok("POST", "/v1/workflows", json={"family_slug": "big", "steps": [step], "edges": []})
    small = {"to": ["ann", "bob"], "title": "t", "body": "", "data": {}}
    for given, pointer in (
        ({"title": "x" * 10_001}, "/args/title"),
        ({"body": "é" * 10_001}, "/args/body"),
        ({"data": {"blob": "x" * 65_536}}, "/args/data"),
    ):
        run = await api.ok(
            "POST", "/v1/runs", json={"family_slug": "big", "input": {**small, **given}}
        )
        done = await _wait_run(api, run["id"])
        assert done["status"] == "RUN_STATUS_FAILED"
        (failed,) = done["steps"]
        assert failed["error"]["code"] == "notify.bad_value", failed
        assert failed["error"]["details"] == {"pointer": pointer}
    for who in ("ann", "bob"):
        page = await api.ok("GET", "/v1/inbox/notifications", params={"subscriber_id": who})
        assert page["notifications"] == []
    largest = {"title": "x" * 10_000, "body": "é" * 10_000, "data": {"blob": "x" * 65_000}}
    run = await api.ok(
        "POST", "/v1/runs", json={"family_slug": "big", "input": {**small, **largest}}
    )
    assert (await _wait_run(api, run["id"]))["status"] == "RUN_STATUS_SUCCEEDED"
    note = await _notification_of(api, "bob")
    assert (len(note["title"]), len(note["body"]), note["data"]) == (
        10_000,
        10_000,
        largest["data"],
    )


async def test_sent_data_over_64_kib_is_a_clear_422(api: Inbox) -> None:
    sent = {"subscriber_id": "ann", "title": "t", "data": {"blob": "x" * 65_536}}
    body = await api.fails("POST", "/v1/inbox/notifications", 422, "request.invalid", json=sent)
    assert body["details"] == {"pointer": "/data"}
    page = await api.ok("GET", "/v1/inbox/notifications", params={"subscriber_id": "ann"})
    assert page["notifications"] == []
    await _send(api, "ann", "t", data={"blob": "x" * 65_000})


async def test_empty_query_values_list_from_the_start(api: Inbox) -> None:
    # `?feed=&status=&cursor=&limit=` as docs/inbox.md writes the lists: a blank
    # value is the parameter left out (as GET /v1/runs takes it); a cursor the API
    # never gave is still refused.
    ann = await api.me("tenant-a", "ann")
    made = await _send(api, "ann", "hello", feed="alerts")
    mine = await api.as_me(ann, "GET", "/v1/inbox/me/notifications?feed=&status=&cursor=")
    assert mine.status_code == 200, mine.text
    assert [n["id"] for n in mine.json()["notifications"]] == [made["id"]]
    listed = await api.ok("GET", "/v1/inbox/notifications?subscriber_id=ann&feed=&cursor=")
    assert [n["id"] for n in listed["notifications"]] == [made["id"]]
    emails = await api.ok("GET", "/v1/inbox/emails?run_id=&subscriber_id=&status=&cursor=")
    assert emails == {"emails": [], "next_cursor": None}
    for path, pointer in (
        ("/v1/inbox/emails?cursor=zz", "cursor"),
        ("/v1/inbox/notifications?subscriber_id=a&cursor=zz", "cursor"),
        ("/v1/inbox/notifications?subscriber_id=a&feed=no%20spaces", "feed"),
    ):
        body = await api.fails("GET", path, 422, "request.invalid")
        assert body["details"] == {"pointer": pointer}


async def test_a_subscriber_id_with_a_control_character_is_refused_everywhere(
    api: Inbox,
) -> None:
    # One rule for every way an id comes in: 1 to 200 characters, none of them a
    # control character (U+0000-U+001F, U+007F-U+009F), as a CTA label's.
    step = {"ref": "tell", "type": "STEP_TYPE_NOTIFY", "args": {"recipients": "input.to"}}
    step["args"]["title"] = "'t'"
    await api.ok("POST", "/v1/workflows", json={"family_slug": "ids", "steps": [step], "edges": []})
    for bad in ("a\nb", "a\x7fb", "a\x85b"):
        run = await api.ok("POST", "/v1/runs", json={"family_slug": "ids", "input": {"to": bad}})
        done = await _wait_run(api, run["id"])
        assert done["status"] == "RUN_STATUS_FAILED", done
        assert done["steps"][0]["error"]["code"] == "notify.bad_recipients"
        body = {"subscriber_id": bad, "title": "t"}
        refused = await api.fails(
            "POST", "/v1/inbox/notifications", 422, "request.invalid", json=body
        )
        assert refused["details"] == {"pointer": "/subscriber_id"}
    for listed in ("", "x" * 201, "a\x85b"):
        refused = await api.fails(
            "GET",
            "/v1/inbox/notifications",
            422,
            "request.invalid",
            params={"subscriber_id": listed},
        )
        assert refused["details"] == {"pointer": "subscriber_id"}
        if listed:
            refused = await api.fails(
                "GET", "/v1/inbox/emails", 422, "request.invalid", params={"subscriber_id": listed}
            )
            assert refused["details"] == {"pointer": "subscriber_id"}
    missing = await api.fails("GET", "/v1/inbox/notifications", 422, "request.invalid")
    assert missing["details"] == {"pointer": "subscriber_id"}
    assert await api.count("SELECT count(*) FROM inbox_notifications") == 0


async def test_a_cursor_past_the_last_change_is_a_clear_422(api: Inbox) -> None:
    # A cursor ahead of the subscriber's changes (another subscriber's, one kept
    # from before a restore) would otherwise skip every change up to it, silently.
    ann = await api.me("tenant-a", "ann")
    await _send(api, "ann", "one")
    await _send(api, "ann", "two")
    caught_up = await api.as_me(ann, "GET", "/v1/inbox/me/changes", params={"after": 2})
    assert caught_up.json() == {"changes": [], "cursor": 2, "more": False}
    ahead = await api.as_me(ann, "GET", "/v1/inbox/me/changes", params={"after": 3})
    assert ahead.status_code == 422, ahead.text
    assert ahead.json()["code"] == "request.invalid"
    assert ahead.json()["details"] == {"pointer": "after", "cursor": 2}
    bob = await api.me("tenant-a", "bob")
    fresh = await api.as_me(bob, "GET", "/v1/inbox/me/changes", params={"after": 1})
    assert fresh.status_code == 422
    assert fresh.json()["details"] == {"pointer": "after", "cursor": 0}


async def test_a_notify_step_with_a_nul_fails_and_other_runs_go_on(api: Inbox) -> None:
    # CEL can make a NUL (`'\x00'`) though no body may hold one. A PostgreSQL text
    # column cannot store it: the tick that wrote it could never commit, and the
    # coordinator, retrying it first, ticked no other run of any tenant.
    mail = {"host": "127.0.0.1", "port": 2525, "from_address": "shop@example.com"}
    connection = {"name": "mail", "provider": "smtp", "config": {**mail, "starttls": False}}
    await api.ok("POST", "/v1/connections", json=connection)
    await api.ok("PUT", "/v1/inbox/subscribers/ann", json={"email": "ann@example.com"})
    wait = {"ref": "pause", "type": "STEP_TYPE_WAIT", "args": {"duration": "10ms"}}
    edge = {"source_ref": "pause", "target_ref": "tell", "type": "EDGE_TYPE_SUCCESS"}
    for args, pointer in (
        ({"title": "'Order\\x00'"}, "/args/title"),
        ({"title": "'t'", "body": "'a\\u0000b'"}, "/args/body"),
        ({"title": "'t'", "data": "{'k': 'a\\x00'}"}, "/args/data"),
        (
            {"title": "'t'", "email": {"connection": "mail", "subject": "'s\\x00'"}},
            "/args/email/subject",
        ),
    ):
        tell = {"ref": "tell", "type": "STEP_TYPE_NOTIFY", "args": {"recipients": "'ann'", **args}}
        workflow = {"family_slug": "nul", "steps": [wait, tell], "edges": [edge]}
        await api.ok("POST", "/v1/workflows", json=workflow)
        run = await api.ok("POST", "/v1/runs", json={"family_slug": "nul", "input": {}})
        done = await _wait_run(api, run["id"])
        assert done["status"] == "RUN_STATUS_FAILED", done
        failed = next(step for step in done["steps"] if step["ref"] == "tell")
        assert failed["error"]["code"] == "notify.bad_value", failed
        assert failed["error"]["details"] == {"pointer": pointer}
    page = await api.ok("GET", "/v1/inbox/notifications", params={"subscriber_id": "ann"})
    assert page["notifications"] == []
    assert (await api.ok("GET", "/v1/inbox/emails"))["emails"] == []
    await api.ok("POST", "/v1/workflows", json=APPROVAL)
    run = await api.ok(
        "POST",
        "/v1/runs",
        json={
            "family_slug": "approval",
            "input": {"approvers": ["bob"], "order": "o-1", "total": 5},
        },
    )
    assert (await _notification_of(api, "bob"))["title"] == "Approve order o-1"
    assert (await api.ok("GET", f"/v1/runs/{run['id']}"))["status"] == "RUN_STATUS_RUNNING"


async def test_subscriber_headers_that_cannot_match_are_a_404(api: Inbox) -> None:
    # The token is only compared: a header with non-ASCII bytes (a Latin-1 é, or
    # UTF-8) is wrong credentials like any other, not a 500.
    me = await api.me("tenant-a", "ann")
    for token in ("é".encode("latin-1") * 64, "é".encode() * 32):
        headers = {**me, "X-Ductor-Subscriber-Token": token}
        answer = await api.client.get("/v1/inbox/me/counts", headers=headers)
        assert answer.status_code == 404, answer.text
        assert answer.json()["code"] == "inbox.not_found"
    # An id with a tab (a header may carry one) is no subscriber id, whatever its token.
    secret = (await api.ok("GET", "/v1/inbox/secret"))["secret"]
    tabbed = {**me, "X-Ductor-Subscriber": "a\tb"}
    tabbed["X-Ductor-Subscriber-Token"] = subscriber_token(secret, "a\tb")
    answer = await api.client.get("/v1/inbox/me/counts", headers=tabbed)
    assert (answer.status_code, answer.json()["code"]) == (404, "inbox.not_found")
    assert (await api.as_me(me, "GET", "/v1/inbox/me/counts")).status_code == 200


async def test_a_key_used_again_after_its_retention_sends_a_new_notification(
    api: Inbox,
) -> None:
    # The key is remembered for a while (24 hours); once housekeeping forgot it, a
    # send with it is a new send. It made the id of the first send's notification
    # again, so the store skipped it: a 201 for a notification nobody got.
    await api.ok("PUT", "/v1/inbox/subscribers/ann", json={"email": "ann@example.com"})
    mail = {"host": "127.0.0.1", "port": 2525, "from_address": "shop@example.com"}
    connection = {"name": "mail", "provider": "smtp", "config": {**mail, "starttls": False}}
    await api.ok("POST", "/v1/connections", json=connection)
    body = {"subscriber_id": "ann", "title": "your daily digest", "email": {"connection": "mail"}}
    first = await api.ok("POST", "/v1/inbox/notifications", json=body, key="digest-ann")
    async with api.store.transaction() as tx:
        await tx.delete_idempotency_before(datetime.now(UTC) + timedelta(days=2))
    later = await api.ok(
        "POST",
        "/v1/inbox/notifications",
        json={**body, "title": "the next digest"},
        key="digest-ann",
    )
    assert later["notification"]["id"] != first["notification"]["id"]
    assert later["notification"]["seq"] == 2
    assert later["email"]["id"] != first["email"]["id"]
    page = await api.ok("GET", "/v1/inbox/notifications", params={"subscriber_id": "ann"})
    assert [n["title"] for n in page["notifications"]] == ["the next digest", "your daily digest"]
    emails = (await api.ok("GET", "/v1/inbox/emails"))["emails"]
    assert [e["subject"] for e in emails] == ["your daily digest", "the next digest"]


async def test_an_email_subject_falls_back_to_the_title_on_one_line(api: Inbox) -> None:
    # A blank subject gives the title, whose line breaks a mail header cannot
    # hold: the email would fail at its send (subject: may not contain CR, LF).
    await api.ok("PUT", "/v1/inbox/subscribers/ann", json={"email": "ann@example.com"})
    mail = {"host": "127.0.0.1", "port": 2525, "from_address": "shop@example.com"}
    connection = {"name": "mail", "provider": "smtp", "config": {**mail, "starttls": False}}
    await api.ok("POST", "/v1/connections", json=connection)
    for subject in (" ", "\n", None):
        email = {"connection": "mail", "subject": subject}
        body = {"subscriber_id": "ann", "title": "Order o-42\r\nshipped", "email": email}
        sent = await api.ok("POST", "/v1/inbox/notifications", json=body)
        queued = await api.ok("GET", f"/v1/inbox/emails/{sent['email']['id']}")
        assert queued["subject"] == "Order o-42 shipped", subject


async def test_a_snooze_is_up_to_365_days_and_an_absurd_one_is_a_clear_422(api: Inbox) -> None:
    ann = await api.me("tenant-a", "ann")
    made = await _send(api, "ann", "x")
    path = f"/v1/inbox/me/notifications/{made['id']}"
    for body, pointer in (
        ({"snooze": "366d"}, "/snooze"),
        ({"snooze": "8785h"}, "/snooze"),
        ({"snooze": "99999999999999999999999999d"}, "/snooze"),
        ({"snooze": "1e400s"}, "/snooze"),
        ({"snooze": "-1h"}, "/snooze"),
        ({"snooze": "0s"}, "/snooze"),
        ({"snooze": "1" * 5000 + "s"}, "/snooze"),
        ({"snoozed_until": "9999-12-31T23:59:59-14:00"}, "/snoozed_until"),
        ({"snoozed_until": "0001-01-01T00:00:00+14:00"}, "/snoozed_until"),
        ({"snoozed_until": "2030-01-01T00:00:00"}, "/snoozed_until"),  # no time zone
        ({"snooze": "1h", "snoozed_until": "2030-01-01T00:00:00Z"}, "/snooze"),
    ):
        refused = await api.as_me(ann, "PATCH", path, json=body)
        assert refused.status_code == 422, (body, refused.text)
        assert refused.json()["code"] == "request.invalid"
        assert refused.json()["details"] == {"pointer": pointer}, body
    after = (await api.as_me(ann, "GET", path)).json()
    assert (after["snoozed_until"], after["seq"]) == (None, made["seq"])
    year = await api.as_me(ann, "PATCH", path, json={"snooze": "365d"})
    assert year.status_code == 200, year.text
    until = datetime.fromisoformat(year.json()["snoozed_until"])
    assert timedelta(days=364) < until - datetime.now(UTC) <= timedelta(days=365)
    assert year.json()["seq"] == made["seq"] + 1


async def test_a_bulk_action_changes_1000_notifications_a_call_and_says_more(api: Inbox) -> None:
    now = datetime.now(UTC)
    async with api.store.transaction() as tx:
        await InboxTx(tx).insert(
            [
                Notification(
                    tenant_id="tenant-a",
                    id=f"ntf_bulk{i:04d}",
                    subscriber_id="ann",
                    feed="default",
                    title=f"n{i}",
                    created_at=now,
                )
                for i in range(1001)
            ],
            now=now,
        )
    ann = await api.me("tenant-a", "ann")
    first = await api.as_me(ann, "POST", "/v1/inbox/me/bulk", json={"action": "read"})
    assert first.json() == {"changed": 1000, "more": True}, first.text
    counts = (await api.as_me(ann, "GET", "/v1/inbox/me/counts")).json()
    assert counts["all"] == {"total": 1001, "unseen": 1, "unread": 1}
    again = await api.as_me(ann, "POST", "/v1/inbox/me/bulk", json={"action": "read"})
    assert again.json() == {"changed": 1, "more": False}
    done = await api.as_me(ann, "POST", "/v1/inbox/me/bulk", json={"action": "read"})
    assert done.json() == {"changed": 0, "more": False}


def _notify(ref: str, feed: str) -> dict[str, Any]:
    args = {"recipients": "'ann'", "title": f"'{ref}'", "feed": feed}
    return {"ref": ref, "type": "STEP_TYPE_NOTIFY", "args": args}


async def test_the_most_specific_preference_rule_decides(api: Inbox) -> None:
    # Workflow and feed, then workflow, then feed; with none, both channels on.
    alerts = {"family_slug": "alerts", "steps": [_notify("ops", "ops"), _notify("news", "news")]}
    reports = {"family_slug": "reports", "steps": [_notify("ops", "ops")]}
    for flow in (alerts, reports):
        await api.ok("POST", "/v1/workflows", json={**flow, "edges": []})
    rules = [
        {"feed": "ops", "in_app": False},
        {"workflow": "alerts", "in_app": False},
        {"workflow": "alerts", "feed": "ops", "in_app": True},
    ]
    await api.ok("PUT", "/v1/inbox/subscribers/ann/preferences", json={"rules": rules})
    sent: dict[tuple[str, str], list[str]] = {}
    for slug in ("alerts", "reports"):
        run = await api.ok("POST", "/v1/runs", json={"family_slug": slug, "input": {}})
        assert (await _wait_run(api, run["id"]))["status"] == "RUN_STATUS_SUCCEEDED"
        for entry in await api.ok("GET", f"/v1/runs/{run['id']}/history"):
            if entry["kind"] == "notify.sent":
                data = entry["data"]
                sent[slug, data["step_ref"]] = data["in_app"] or [
                    "-" + s for s in data["suppressed"]
                ]
    assert sent == {
        ("alerts", "ops"): ["ann"],  # workflow and feed: on
        ("alerts", "news"): ["-ann"],  # the workflow's rule: off
        ("reports", "ops"): ["-ann"],  # the feed's rule: off
    }
    titles = [n["title"] for n in (await _notification_page(api, "ann"))]
    assert titles == ["ops"]
    # A notification through the API has no workflow: only feed rules apply.
    by_feed = {"subscriber_id": "ann", "title": "api", "feed": "ops"}
    assert (await api.ok("POST", "/v1/inbox/notifications", json=by_feed))["suppressed"] is True
    other = await api.ok("POST", "/v1/inbox/notifications", json={**by_feed, "feed": "news"})
    assert other["notification"]["feed"] == "news"


async def _notification_page(api: Inbox, subscriber: str) -> list[dict[str, Any]]:
    page = await api.ok("GET", "/v1/inbox/notifications", params={"subscriber_id": subscriber})
    return list(page["notifications"])
