"""The web dashboard at /ui, driven in a real browser (Debian's Chromium through
Playwright) against a real `ductor dev` process: sign in, publish and trigger a
workflow and watch it finish live, its DAG, cancel, signal and re-run, a routing
decision's explanation and a pool's shadow report, balances and a receipt
verified in the browser, a subscriber's inbox and the AI requests.

Every page is checked with axe-core (no serious or critical violation) and
photographed; the photographs go to a temporary folder and are compared with
docs/dashboard/*.png only loosely (same size). `DUCTOR_UI_SCREENSHOTS=update`
writes them to docs/dashboard/ instead, for docs/dashboard.md.

One server and one browser serve the whole module; each test signs in in a
fresh browser context (a fresh session storage).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ductor_server.pytest_plugin import unavailable

from .ai_upstream import UPSTREAM_KEY, ScriptedUpstream
from .conftest import ServerProcess, _create_key

CHROMIUM = Path(os.environ.get("DUCTOR_TEST_CHROMIUM", "/usr/bin/chromium"))
DOCS_SHOTS = Path(__file__).resolve().parents[1] / "docs" / "dashboard"
VIEWPORT = {"width": 1280, "height": 800}
UPDATE = os.environ.get("DUCTOR_UI_SCREENSHOTS") == "update"

if not CHROMIUM.exists():
    unavailable("Chromium", f"no {CHROMIUM} (.ci/run installs Debian's chromium)")

from axe_playwright_python.sync_playwright import Axe  # noqa: E402
from playwright.sync_api import Browser, BrowserContext, Page, expect, sync_playwright  # noqa: E402

# A loaded machine (the suite runs in parallel) answers slowly: wait, do not fail.
expect.set_options(timeout=20_000)

SCORE = {
    "family_slug": "scoring",
    "title": "Score a lead",
    "steps": [
        {
            "ref": "score",
            "type": "STEP_TYPE_DATAFLOW",
            "title": "Read the score",
            "args": {"operation": "project", "project": {"score": "input.score"}},
        },
        {
            "ref": "gold",
            "type": "STEP_TYPE_DATAFLOW",
            "title": "Gold tier",
            "args": {"operation": "project", "project": {"tier": "'gold'"}},
        },
        {
            "ref": "basic",
            "type": "STEP_TYPE_DATAFLOW",
            "title": "Basic tier",
            "args": {"operation": "project", "project": {"tier": "'basic'"}},
        },
        {"ref": "cool", "type": "STEP_TYPE_WAIT", "title": "Cool off", "args": {"duration": "2s"}},
        {
            "ref": "done",
            "type": "STEP_TYPE_DATAFLOW",
            "title": "Done",
            "args": {"operation": "project", "project": {"ok": "true"}},
        },
    ],
    "edges": [
        {
            "source_ref": "score",
            "target_ref": "gold",
            "type": "EDGE_TYPE_CONDITION",
            "condition": "output.score >= 50",
        },
        {
            "source_ref": "score",
            "target_ref": "basic",
            "type": "EDGE_TYPE_CONDITION",
            "condition": "output.score < 50",
        },
        {"source_ref": "gold", "target_ref": "cool"},
        {"source_ref": "basic", "target_ref": "cool"},
        {"source_ref": "cool", "target_ref": "done"},
    ],
}

APPROVAL = {
    "family_slug": "approval",
    "title": "Wait for an approval",
    "steps": [
        {
            "ref": "ask",
            "type": "STEP_TYPE_WAIT_FOR_SIGNAL",
            "title": "Ask",
            "args": {"signal": "approve", "timeout": "1h"},
        },
        {
            "ref": "record",
            "type": "STEP_TYPE_DATAFLOW",
            "title": "Record",
            "args": {"operation": "project", "project": {"approved": "true"}},
        },
    ],
    "edges": [{"source_ref": "ask", "target_ref": "record"}],
}

LEAD_KIND = {"attributes": {"state": {"type": "string", "required": True}}}
WORKERS = [
    {"id": "sunco", "kind": "system", "name": "SunCo"},
    {"id": "westsolar", "kind": "system", "name": "West Solar"},
    {"id": "brightpanel", "kind": "system", "name": "BrightPanel", "availability": "offline"},
]
POOL = {
    "id": "solar",
    "strategy": {"name": "round_robin"},
    "shadows": [{"name": "least_loaded"}, {"name": "waterfall"}],
    "members": [
        {"worker": "sunco", "priority": 1},
        {"worker": "westsolar", "priority": 2},
        {"worker": "brightpanel", "priority": 0},
        {"worker": "ny-only", "filters": [{"attribute": "state", "op": "eq", "value": "NY"}]},
    ],
}
RULES = {
    "id": "main",
    "kinds": {"lead": LEAD_KIND},
    "rules": [
        {
            "id": "no-texas",
            "priority": 1,
            "pool": "solar",
            "when": "attributes.state == 'TX'",
        },
        {
            "id": "west",
            "priority": 5,
            "pool": "solar",
            "match": [{"attribute": "state", "op": "in", "values": ["CA", "NV"]}],
        },
    ],
    "default_pool": "solar",
}


# --- the server, its data and the browser ---------------------------------------------


def _ok(answer: httpx.Response) -> Any:
    assert answer.status_code < 300, f"{answer.request.method} {answer.request.url}: {answer.text}"
    return answer.json() if answer.content else None


def _seed(http: httpx.Client, upstream: ScriptedUpstream) -> dict[str, Any]:
    """What the pages show: workflows, runs with receipts, routing decisions with
    shadows, ledger entries, a subscriber's notifications and priced AI requests."""
    for worker in [*WORKERS, {"id": "ny-only", "kind": "system"}]:
        _ok(http.post("/v1/workers", json=worker))
    _ok(http.post("/v1/pools", json=POOL))
    _ok(http.post("/v1/rules", json=RULES))
    decisions = [
        _ok(
            http.post(
                "/v1/route",
                json={"id": f"lead-{i}", "kind": "lead", "attributes": {"state": state}},
            )
        )
        for i, state in enumerate(["CA", "NV", "TX", "OR", "CA", "NV", "CA", "OR"])
    ]
    for account in (
        {"code": "cash", "currency": "USD", "kind": "asset", "name": "Cash"},
        {"code": "revenue", "currency": "USD", "kind": "revenue", "name": "Revenue"},
    ):
        _ok(http.post("/v1/accounts", json=account))
    for amount in (12_500_000, 3_250_000):
        _ok(
            http.post(
                "/v1/ledger/entries",
                json={
                    "description": "lead sale",
                    "postings": [
                        {"account": "cash", "amount": amount, "currency": "USD"},
                        {"account": "revenue", "amount": -amount, "currency": "USD"},
                    ],
                },
            )
        )
    for title in ("Your lead was accepted", "A lead needs review"):
        _ok(
            http.post(
                "/v1/inbox/notifications",
                json={"subscriber_id": "ana", "title": title, "body": "Lead lead-1 (CA)."},
            )
        )
    _ok(
        http.post(
            "/v1/connections",
            json={
                "name": "llm",
                "provider": "openai",
                "config": {"base_url": upstream.url},
                "secrets": {"api_key": UPSTREAM_KEY},
            },
        )
    )
    _ok(http.put("/v1/ai/settings", json={"default_connection": "llm"}))
    _ok(
        http.put(
            "/v1/ai/prices/echo",
            json={"input_per_million": 2_000_000, "output_per_million": 6_000_000},
        )
    )
    for text in ("hello", "summarize lead-1"):
        _ok(
            http.post(
                "/v1/ai/chat/completions",
                json={"model": "echo", "messages": [{"role": "user", "content": text}]},
            )
        )
    _ok(http.post("/v1/workflows", json=APPROVAL))
    return {"decisions": decisions}


class Dashboard:
    """The module's server, its seeded data and the browser."""

    def __init__(
        self, server: ServerProcess, browser: Browser, data: dict[str, Any], shots: Path
    ) -> None:
        self.server = server
        self.browser = browser
        self.data = data
        self.shots = shots
        self.violations: dict[str, list[str]] = {}

    def http(self) -> httpx.Client:
        return self.server.client()

    def context(self) -> BrowserContext:
        return self.browser.new_context(
            viewport=VIEWPORT, device_scale_factor=1, locale="en-US", reduced_motion="reduce"
        )

    def sign_in(self, context: BrowserContext, *, start: str = "") -> Page:
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
        page.errors = errors  # type: ignore[attr-defined]
        page.goto(f"{self.server.url}/ui/{start}")
        page.get_by_label("API key").fill(self.server.api_key)
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_role("button", name="Sign out")).to_be_visible()
        return page

    def check(self, page: Page, name: str) -> None:
        """axe-core on the page as it stands (no serious or critical violation), then a
        screenshot compared loosely with the committed one."""
        page.wait_for_load_state("networkidle")
        results = Axe().run(page, options={"resultTypes": ["violations"]})
        bad = [
            f"{v['id']} ({v['impact']}): {v['help']} at {[n['target'] for n in v['nodes']][:3]}"
            for v in results.response["violations"]
            if v["impact"] in ("serious", "critical")
        ]
        assert not bad, f"{name}: accessibility violations:\n" + "\n".join(bad)
        errors = getattr(page, "errors", [])
        assert not errors, f"{name}: errors in the page: {errors}"
        path = self.shots / f"{name}.png"
        page.screenshot(path=str(path))
        width, height = _png_size(path)
        assert (width, height) == (VIEWPORT["width"], VIEWPORT["height"]), (width, height)
        committed = DOCS_SHOTS / f"{name}.png"
        if UPDATE:
            DOCS_SHOTS.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, committed)
        else:
            assert committed.exists(), (
                f"{committed} is missing: run with DUCTOR_UI_SCREENSHOTS=update"
            )
            assert _png_size(committed) == (width, height), f"{committed} is another size"


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    width, height = struct.unpack(">II", head[16:24])
    return width, height


@pytest.fixture(scope="module")
def dash(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dashboard]:
    root = tmp_path_factory.mktemp("dashboard")
    server = ServerProcess(data_dir=root / "data", env={"DUCTOR_RECEIPTS_FOR_RUNS": "on"})
    upstream = ScriptedUpstream().start()
    try:
        server.start()
        with server.client() as http:
            data = _seed(http, upstream)
        # Minted before the browser starts: sync Playwright runs an event loop here.
        data["rival_key"] = asyncio.run(_create_key(str(server.data_dir / "ductor.db"), "rival"))
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
            try:
                yield Dashboard(server, browser, data, root)
            finally:
                browser.close()
    finally:
        upstream.stop()
        server.stop()


# --- the tests ------------------------------------------------------------------------------


def test_sign_in_by_keyboard_a_wrong_key_is_refused_and_the_key_stays_in_the_tab(
    dash: Dashboard,
) -> None:
    context = dash.context()
    page = context.new_page()
    page.goto(f"{dash.server.url}/ui/")
    expect(page).to_have_url(f"{dash.server.url}/ui/#/signin?next=%2Fruns")
    key_field = page.get_by_label("API key")
    expect(key_field).to_be_focused()
    page.keyboard.type("dk_not-a-key")
    page.keyboard.press("Tab")
    expect(page.get_by_role("button", name="Sign in")).to_be_focused()
    page.keyboard.press("Enter")
    alert = page.get_by_role("alert")
    expect(alert).to_contain_text("auth.unauthenticated")
    expect(alert).to_contain_text("refused this key")
    assert page.evaluate("sessionStorage.length") == 0
    dash.check(page, "signin")
    # A key no server could accept (the hint's "dk_…" pasted as is) is refused as
    # well, not taken for an unreachable server.
    key_field.fill("dk_…")
    key_field.press("Enter")
    expect(alert).to_contain_text("auth.unauthenticated")
    expect(alert).not_to_contain_text("network.unreachable")
    assert page.evaluate("sessionStorage.length") == 0

    key_field.fill(dash.server.api_key)
    key_field.press("Enter")
    expect(page.get_by_role("heading", name="Runs", exact=True)).to_be_visible()
    assert page.evaluate("Object.values(sessionStorage)") == [dash.server.api_key]
    assert page.evaluate("localStorage.length") == 0
    assert dash.server.api_key not in page.url
    # A page change moves focus to the content; on a fresh load the skip link comes
    # first in the tab order and moves it there.
    expect(page.locator("main")).to_be_focused()
    page.reload()
    expect(page.get_by_role("heading", name="Runs", exact=True)).to_be_visible()
    page.keyboard.press("Tab")
    expect(page.get_by_role("link", name="Skip to content")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator("main")).to_be_focused()

    # Signing out forgets the key; another tab (context) never had it.
    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_label("API key")).to_be_visible()
    assert page.evaluate("sessionStorage.length") == 0
    context.close()


def test_a_key_revoked_while_signed_in_sends_the_tab_back_to_sign_in(dash: Dashboard) -> None:
    with dash.http() as http:
        key = _ok(http.post("/v1/keys", json={"name": "dashboard", "scopes": ["read"]}))
    context = dash.context()
    page = context.new_page()
    page.goto(f"{dash.server.url}/ui/#/runs")
    page.get_by_label("API key").fill(key["key"])
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("button", name="Sign out")).to_be_visible()
    with dash.http() as http:
        assert http.delete(f"/v1/keys/{key['id']}").status_code == 204
    # The live runs list's next refresh is refused: the key is forgotten.
    expect(page.get_by_role("status")).to_contain_text("no longer accepts the key")
    expect(page.get_by_label("API key")).to_be_visible()
    assert page.evaluate("sessionStorage.length") == 0
    context.close()


def test_signing_in_leads_back_to_the_address_with_its_filters(dash: Dashboard) -> None:
    with dash.http() as http:
        producer = _ok(http.post("/v1/keys", json={"name": "producer", "scopes": ["events:send"]}))
    context = dash.context()
    page = context.new_page()
    page.goto(f"{dash.server.url}/ui/#/runs?status=RUN_STATUS_FAILED&family=approval")
    expect(page.get_by_label("API key")).to_be_visible()
    # A producer's key is a valid key that reads nothing: refused, and said why.
    page.get_by_label("API key").fill(producer["key"])
    page.get_by_role("button", name="Sign in").click()
    alert = page.get_by_role("alert")
    expect(alert).to_contain_text("auth.forbidden")
    expect(alert).to_contain_text("cannot read")
    assert page.evaluate("sessionStorage.length") == 0
    page.get_by_label("API key").fill(dash.server.api_key)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Runs", exact=True)).to_be_visible()
    expect(page).to_have_url(
        f"{dash.server.url}/ui/#/runs?status=RUN_STATUS_FAILED&family=approval"
    )
    expect(page.get_by_label("Workflow")).to_have_value("approval")
    expect(page.get_by_label("Status")).to_have_value("RUN_STATUS_FAILED")
    context.close()


def test_a_running_runs_page_keeps_keyboard_focus_through_its_refreshes(dash: Dashboard) -> None:
    with dash.http() as http:
        run = _ok(http.post("/v1/runs", json={"family_slug": "approval", "input": {"n": 1}}))
    context = dash.context()
    page = dash.sign_in(context)
    page.goto(f"{dash.server.url}/ui/#/runs/{run['id']}")
    expect(page.get_by_role("heading", name=f"Run {run['id']}")).to_be_visible()
    for target in (
        page.get_by_label("Run input"),
        page.locator("dl.meta").get_by_role("link", name="approval"),
    ):
        target.focus()
        # The page refreshes every second while the run waits for its signal.
        page.wait_for_timeout(2500)
        expect(target).to_be_focused()
    context.close()


def test_publish_trigger_watch_it_finish_live_and_read_its_dag(dash: Dashboard) -> None:
    context = dash.context()
    page = dash.sign_in(context, start="#/workflows/new")
    editor = page.get_by_label("Definition (JSON)")
    broken = {**SCORE, "edges": [*SCORE["edges"], {"source_ref": "done", "target_ref": "nowhere"}]}
    editor.fill(json.dumps(broken, indent=2))
    page.get_by_role("button", name="Validate").click()
    note = page.locator(".problem-note").first
    expect(note).to_contain_text("nowhere")
    # The problem is shown on the line of the edge it is about.
    expect(page.locator("li.has-problem").first).to_have_attribute(
        "data-pointer", "/edges/5/target_ref"
    )
    dash.check(page, "publish-problems")

    editor.fill(json.dumps(SCORE, indent=2))
    page.get_by_role("button", name="Publish").click()
    expect(page.get_by_role("status")).to_contain_text("Published scoring version 1")
    # A second version, to compare.
    second = {
        **SCORE,
        "steps": [
            *SCORE["steps"][:3],
            {**SCORE["steps"][3], "args": {"duration": "3s"}},
            SCORE["steps"][4],
        ],
    }
    with dash.http() as http:
        assert _ok(http.post("/v1/workflows", json=second))["version"] == 2
    page.get_by_role("link", name="Open scoring").click()
    expect(page.get_by_role("heading", name="Workflow scoring")).to_be_visible()
    page.get_by_label("From").select_option("1")
    page.get_by_label("To").select_option("2")
    page.get_by_role("button", name="Compare").click()
    expect(page.locator("table.diff caption")).to_contain_text(
        "1 changed line between version 1 and version 2"
    )
    expect(page.locator("table.diff td.add", has_text='"3s"')).to_be_visible()
    page.locator("table.diff").scroll_into_view_if_needed()
    dash.check(page, "workflow")

    trigger = page.get_by_role("form", name="Trigger a run")
    trigger.get_by_label("Version").select_option("1")
    trigger.get_by_label("Input (JSON)").fill('{"score": 80}')
    page.get_by_role("button", name="Trigger run").click()
    expect(page.get_by_role("heading", name="Run run_")).to_be_visible()
    run_id = page.url.rsplit("/", 1)[1]
    status = page.locator("#run-status .badge")
    # The run waits 2 s: the page shows it running, then finished, without a reload.
    expect(status).to_have_text("running")
    expect(status).to_have_text("succeeded", timeout=30_000)
    graph = page.locator("#run-graph svg")
    expect(graph.locator("[data-step=gold]")).to_have_attribute("data-status", "succeeded")
    expect(graph.locator("[data-step=basic]")).to_have_attribute("data-status", "skipped")
    states = {
        edge: graph.locator(f'[data-edge="{edge}"]').get_attribute("data-state")
        for edge in ("score->gold", "score->basic", "gold->cool", "basic->cool", "cool->done")
    }
    assert states == {
        "score->gold": "taken",
        "score->basic": "not-taken",
        "gold->cool": "taken",
        "basic->cool": "not-taken",
        "cool->done": "taken",
    }
    events = page.locator("#run-events")
    expect(events).to_contain_text("succeeded (attempt 1)")
    expect(events).to_contain_text("for timer")
    expect(page.locator("#run-history")).to_contain_text("run.succeeded")
    # A step in the graph takes the keyboard to its row.
    graph.locator("[data-step=cool]").focus()
    page.keyboard.press("Enter")
    expect(page.locator("#step-cool")).to_be_focused()
    page.locator("#step-cool").blur()
    page.evaluate("window.scrollTo(0, 0)")
    dash.check(page, "run")
    with dash.http() as http:
        assert _ok(http.get(f"/v1/runs/{run_id}"))["output"] == {"done": {"ok": True}}
    context.close()


def test_a_condition_edge_into_a_step_cancelled_before_it_ran_is_drawn_decided(
    dash: Dashboard,
) -> None:
    # `gold` also waits for `slow`; `boom` fails the run first, so `gold` is cancelled
    # without ever starting, and the page cannot know its condition's verdict.
    doomed = {
        "family_slug": "doomed",
        "title": "Fails before a branch runs",
        "steps": [
            {
                "ref": "score",
                "type": "STEP_TYPE_DATAFLOW",
                "args": {"operation": "project", "project": {"score": "input.score"}},
            },
            {"ref": "slow", "type": "STEP_TYPE_WAIT", "args": {"duration": "1h"}},
            {"ref": "pause", "type": "STEP_TYPE_WAIT", "args": {"duration": "1s"}},
            {
                "ref": "boom",
                "type": "STEP_TYPE_DATAFLOW",
                "args": {"operation": "project", "project": {"x": "input.missing"}},
            },
            {
                "ref": "gold",
                "type": "STEP_TYPE_DATAFLOW",
                "args": {"operation": "project", "project": {"tier": "'gold'"}},
            },
        ],
        "edges": [
            {
                "source_ref": "score",
                "target_ref": "gold",
                "type": "EDGE_TYPE_CONDITION",
                "condition": "output.score < 50",
            },
            {"source_ref": "slow", "target_ref": "gold"},
            {"source_ref": "pause", "target_ref": "boom"},
        ],
    }
    with dash.http() as http:
        _ok(http.post("/v1/workflows", json=doomed))
        run = _ok(http.post("/v1/runs", json={"family_slug": "doomed", "input": {"score": 80}}))
    ended = dash.server.wait_for_run(run["id"])
    steps = {s["ref"]: s for s in ended["steps"]}
    assert ended["status"] == "RUN_STATUS_FAILED"
    assert steps["score"]["status"] == "STEP_STATUS_SUCCEEDED"
    assert steps["gold"]["status"] == "STEP_STATUS_CANCELLED"
    assert steps["gold"]["started_at"] is None
    context = dash.context()
    page = dash.sign_in(context, start=f"#/runs/{run['id']}")
    graph = page.locator("#run-graph svg")
    expect(graph.locator("[data-step=gold]")).to_have_attribute("data-status", "cancelled")
    expect(graph.locator('[data-edge="score->gold"]')).to_have_attribute("data-state", "decided")
    expect(graph.locator('[data-edge="slow->gold"]')).to_have_attribute("data-state", "not-taken")
    context.close()


def test_runs_list_updates_live_and_a_run_is_signalled_cancelled_and_run_again(
    dash: Dashboard,
) -> None:
    context = dash.context()
    page = dash.sign_in(context)
    with dash.http() as http:
        to_signal = _ok(
            http.post("/v1/runs", json={"family_slug": "approval", "input": {"lead": "lead-1"}})
        )
        to_cancel = _ok(
            http.post("/v1/runs", json={"family_slug": "approval", "input": {"lead": "lead-2"}})
        )
    page.get_by_label("Workflow").select_option("approval")
    rows = page.locator("#runs-list tbody tr")
    # The filtered list is drawn once it shows both runs: count only then.
    expect(page.locator("#runs-list")).to_contain_text(to_signal["id"])
    expect(page.locator("#runs-list")).to_contain_text(to_cancel["id"])
    count = rows.count()
    with dash.http() as http:
        fresh = _ok(
            http.post("/v1/runs", json={"family_slug": "approval", "input": {"lead": "lead-3"}})
        )
    # Live: the new run appears on top without a reload.
    expect(rows.first).to_contain_text(fresh["id"], timeout=15_000)
    expect(rows).to_have_count(count + 1)
    page.get_by_label("Status").select_option("RUN_STATUS_RUNNING")
    expect(page.locator("#runs-list")).to_contain_text(to_cancel["id"])
    dash.check(page, "runs")

    page.goto(f"{dash.server.url}/ui/#/runs/{to_signal['id']}")
    status = page.locator("#run-status .badge")
    expect(status).to_have_text("running")
    expect(page.locator("#run-graph [data-step=ask]")).to_have_attribute("data-status", "waiting")
    expect(page.get_by_label("Signal name")).to_have_value("approve")
    # A running run cannot be re-run yet (409 run.not_ended): the button waits.
    expect(page.get_by_role("button", name="Run again with the same input")).to_be_hidden()
    page.get_by_label("Payload (JSON, optional)").fill('{"by": "ana"}')
    dash.check(page, "run-waiting")
    page.get_by_role("button", name="Send signal").click()
    expect(page.locator("#action-result")).to_contain_text('Signal "approve" sent')
    expect(status).to_have_text("succeeded", timeout=30_000)
    expect(page.locator("#run-events")).to_contain_text('signal "approve" received')

    page.get_by_role("button", name="Run again with the same input").click()
    expect(page).not_to_have_url(f"{dash.server.url}/ui/#/runs/{to_signal['id']}")
    again = page.url.rsplit("/", 1)[1]
    expect(page.get_by_role("heading", name=f"Run {again}")).to_be_visible()

    page.goto(f"{dash.server.url}/ui/#/runs/{to_cancel['id']}")
    expect(page.locator("#run-status .badge")).to_have_text("running")
    page.get_by_label("Reason").fill("duplicate lead")
    page.get_by_role("button", name="Cancel run").click()
    expect(page.locator("#run-status .badge")).to_have_text("cancelled", timeout=30_000)
    # An ended run offers only "run again".
    expect(page.get_by_role("button", name="Cancel run")).to_be_hidden()
    expect(page.get_by_role("button", name="Send signal")).to_be_hidden()
    expect(page.get_by_role("button", name="Run again with the same input")).to_be_visible()
    with dash.http() as http:
        assert _ok(http.get(f"/v1/runs/{again}"))["input"] == {"lead": "lead-1"}
        assert _ok(http.get(f"/v1/runs/{again}"))["family_slug"] == to_signal["family_slug"]
        assert _ok(http.get(f"/v1/runs/{to_cancel['id']}"))["status"] == "RUN_STATUS_CANCELLED"
    context.close()


def test_a_workflow_filter_from_the_address_is_cleared_by_any_workflow(dash: Dashboard) -> None:
    plain = {
        "family_slug": "plain",
        "title": "Plain",
        "steps": [
            {
                "ref": "only",
                "type": "STEP_TYPE_DATAFLOW",
                "args": {"operation": "project", "project": {"ok": "true"}},
            }
        ],
        "edges": [],
    }
    with dash.http() as http:
        _ok(http.post("/v1/workflows", json=plain))
        mine = _ok(http.post("/v1/runs", json={"family_slug": "plain", "input": {}}))
        other = _ok(http.post("/v1/runs", json={"family_slug": "approval", "input": {}}))
    context = dash.context()
    page = dash.sign_in(context)
    page.goto(f"{dash.server.url}/ui/#/runs?family=plain")
    runs = page.locator("#runs-list")
    expect(page.get_by_label("Workflow")).to_have_value("plain")
    expect(runs).to_contain_text(mine["id"])
    expect(runs).not_to_contain_text(other["id"])
    page.get_by_label("Workflow").select_option("")
    expect(runs).to_contain_text(other["id"])
    expect(runs).to_contain_text(mine["id"])
    context.close()


def test_a_decision_is_explained_the_shadow_report_is_charted_and_a_routable_is_tried(
    dash: Dashboard,
) -> None:
    context = dash.context()
    page = dash.sign_in(context, start="#/routing")
    expect(page.get_by_role("heading", name="Routing", exact=True)).to_be_visible()
    expect(page.get_by_role("table", name="Pools")).to_contain_text("least_loaded, waterfall")
    dash.check(page, "routing")

    texas = next(d for d in dash.data["decisions"] if d["routable_id"] == "lead-2")
    page.get_by_role("link", name=texas["id"]).click()
    expect(page.get_by_role("heading", name=f"Decision {texas['id']}")).to_be_visible()
    expect(page.locator(".explanation")).to_contain_text("Matched rule: no-texas")
    excluded = page.get_by_role("table", name="Members excluded, by reason")
    expect(excluded).to_contain_text("unavailable")
    expect(excluded).to_contain_text("brightpanel")
    expect(excluded).to_contain_text("ny-only")
    expect(page.get_by_role("table", name="The live strategy's scores")).to_contain_text("← pick")
    expect(
        page.get_by_role(
            "table", name="What each shadow strategy would have picked (never committed)"
        )
    ).to_contain_text("waterfall")
    dash.check(page, "decision")

    # A decision whose rules did not match, with the reasons.
    oregon = next(d for d in dash.data["decisions"] if d["routable_id"] == "lead-3")
    page.goto(f"{dash.server.url}/ui/#/decisions/{oregon['id']}")
    rules = page.get_by_role("table", name="Rules tried, in priority order")
    expect(rules).to_contain_text("its condition was false")
    expect(rules).to_contain_text("a match filter failed")

    page.goto(f"{dash.server.url}/ui/#/routing/pools/solar/shadow")
    chart = page.get_by_role("img", name="Agreement with the live strategy", exact=False)
    expect(chart).to_be_visible()
    expect(page.get_by_role("table", name="Agreement per shadow strategy")).to_contain_text(
        "waterfall"
    )
    with dash.http() as http:
        report = _ok(http.get("/v1/pools/solar/shadow-report"))
    for strategy in report["strategies"]:
        label = chart.get_attribute("aria-label") or ""
        assert f"{strategy['strategy']} {round(strategy['agreement_rate'] * 100)}%" in label
    dash.check(page, "shadow-report")

    page.goto(f"{dash.server.url}/ui/#/routing/try")
    page.get_by_label("Attributes (JSON)").fill('{"state": "NV"}')
    page.get_by_role("button", name="Route it").click()
    result = page.locator("#try-result")
    expect(result).to_contain_text("Matched rule: west")
    expect(result.locator(".badge")).to_have_text("assigned")
    dash.check(page, "try-routable")

    # The routing page lists the latest decisions first: this one heads the list.
    tried = result.locator("h2 a").inner_text()
    page.get_by_role("link", name="Routing", exact=True).click()
    decisions = page.get_by_role("table", name="Latest decisions that assigned work", exact=False)
    expect(decisions.locator("tbody tr").first).to_contain_text(tried)
    context.close()


def test_balances_a_receipt_verified_in_the_browser_an_inbox_and_ai_requests(
    dash: Dashboard,
) -> None:
    with dash.http() as http:
        run = _ok(http.post("/v1/runs", json={"family_slug": "approval", "input": {}}))
        _ok(http.post(f"/v1/runs/{run['id']}/signals/approve", json={}))
        dash.server.wait_for_run(run["id"])
        deadline = time.monotonic() + 30
        while not (
            receipts := _ok(http.get("/v1/receipts", params={"subject": f"run:{run['id']}"}))[
                "items"
            ]
        ):
            assert time.monotonic() < deadline, "no receipt for the run"
            time.sleep(0.2)
    context = dash.context()
    page = dash.sign_in(context, start="#/ledger")
    balances = page.get_by_role(
        "table", name="Accounts and their balances (in their normal direction)"
    )
    expect(balances.locator("tr", has_text="cash")).to_contain_text("15.75 USD")
    expect(page.get_by_role("table", name="Entries, newest first")).to_contain_text("lead sale")
    dash.check(page, "ledger")

    page.get_by_role("link", name="Receipts").click()
    page.get_by_role("link", name=receipts[0]["id"]).click()
    page.get_by_role("button", name="Verify signature").click()
    expect(page.locator("#verify-result .verdict")).to_contain_text("Verified", timeout=10_000)
    expect(page.locator("#verify-result")).to_contain_text("signature by a published key")
    dash.check(page, "receipt")
    # A receipt whose payload was changed does not verify.
    tampered = page.evaluate(
        """async (id) => {
            const { verifyReceipt } = await import('/ui/js/verify.js');
            const headers = { Authorization: 'Bearer ' + sessionStorage.getItem('ductor.api_key') };
            const r = await (await fetch('/v1/receipts/' + id, { headers })).json();
            const keys = await (await fetch('/.well-known/ductor-keys')).json();
            const payload = JSON.parse(atob(r.envelope.payload));
            payload.cost.micros += 1;
            r.envelope.payload = btoa(JSON.stringify(payload));
            return (await verifyReceipt(r, keys)).ok;
        }""",
        receipts[0]["id"],
    )
    assert tampered is False

    page.get_by_role("link", name="Inbox").click()
    page.get_by_label("Subscriber id").fill("ana")
    page.get_by_role("button", name="Show inbox").click()
    notifications = page.get_by_role("table", name="Notifications of ana, newest first")
    expect(notifications).to_contain_text("A lead needs review")
    expect(notifications).to_contain_text("Your lead was accepted")
    dash.check(page, "inbox")

    page.get_by_role("link", name="AI").click()
    requests = page.get_by_role("table", name="Model calls, newest first")
    expect(requests.locator("tbody tr")).to_have_count(2)
    expect(requests).to_contain_text("echo")
    # 11 tokens in at 2 USD and 7 out at 6 USD a million: 0.000064 each.
    expect(requests).to_contain_text("0.000064")
    dash.check(page, "ai")
    context.close()


def test_a_large_list_pages(dash: Dashboard) -> None:
    with dash.http() as http:
        _ok(
            http.post(
                "/v1/runs/batch",
                json={"runs": [{"family_slug": "approval", "input": {"n": i}} for i in range(30)]},
            )
        )
    context = dash.context()
    page = dash.sign_in(context)
    rows = page.locator("#runs-list tbody tr")
    expect(rows).to_have_count(25)
    first = rows.first.inner_text()
    # The first page is live: a keyboard user on "Next page" is still there after a
    # refresh has redrawn the pager (the marked button is gone once it has).
    next_page = page.get_by_role("button", name="Next page")
    next_page.focus()
    page.evaluate("document.activeElement.dataset.before = 'yes'")
    expect(page.locator("nav.pager [data-before]")).to_have_count(0)
    expect(next_page).to_be_focused()
    next_page.click()
    expect(page.locator(".page-no")).to_contain_text("Page 2")
    assert rows.first.inner_text() != first
    page.get_by_role("button", name="Previous page").click()
    expect(page.locator(".page-no")).to_contain_text("Page 1")
    context.close()


def test_another_tenants_key_sees_none_of_this_tenants_data(dash: Dashboard) -> None:
    with dash.http() as http:
        run = _ok(http.post("/v1/runs", json={"family_slug": "approval", "input": {}}))
    rival_key = dash.data["rival_key"]
    context = dash.context()
    page = context.new_page()
    page.goto(f"{dash.server.url}/ui/")
    page.get_by_label("API key").fill(rival_key)
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("#runs-list")).to_contain_text("No runs match these filters.")
    page.goto(f"{dash.server.url}/ui/#/runs/{run['id']}")
    expect(page.get_by_role("alert")).to_contain_text("run.not_found")
    page.goto(f"{dash.server.url}/ui/#/routing")
    expect(page.get_by_role("heading", name="Decisions")).to_be_visible()
    expect(page.locator("main")).to_contain_text("No assignments yet.")
    context.close()


def test_an_address_with_a_broken_escape_is_a_page_not_found(dash: Dashboard) -> None:
    context = dash.context()
    page = dash.sign_in(context, start="#/ai")
    expect(page.get_by_role("heading", name="AI requests")).to_be_visible()
    # Edited by hand, the address no longer decodes: the page says so, instead of
    # leaving the previous page on the screen under the new address.
    page.goto(f"{dash.server.url}/ui/#/runs/%E0%A4%A")
    expect(page.get_by_role("heading", name="Not found")).to_be_visible()
    expect(page.get_by_role("heading", name="AI requests")).to_have_count(0)
    assert not [e for e in page.errors if "Failed to load resource" not in e]  # type: ignore[attr-defined]
    context.close()


def test_a_live_run_page_keeps_the_readers_text_selection_through_its_refreshes(
    dash: Dashboard,
) -> None:
    with dash.http() as http:
        run = _ok(
            http.post("/v1/runs", json={"family_slug": "approval", "input": {"note": "copy me"}})
        )
    context = dash.context()
    page = dash.sign_in(context, start=f"#/runs/{run['id']}")
    expect(page.locator("#run-history")).to_contain_text("step.waiting")
    select = """(selector) => {
        const range = document.createRange();
        range.selectNodeContents(document.querySelector(selector));
        const selection = window.getSelection();
        selection.removeAllRanges();
        selection.addRange(range);
    }"""
    history = f"/v1/runs/{run['id']}/history"
    for selector, text in (
        ('[aria-label="Run input"]', "copy me"),
        ("#run-history tbody", "step.waiting"),
    ):
        page.evaluate(select, selector)
        assert text in page.evaluate("window.getSelection().toString()")
        # The run waits for a signal, so the page polls it; polls do not overlap, so
        # once a second one has started, a whole refresh has been drawn since the
        # text was selected (to copy it), and it is still selected.
        for _ in range(2):
            with page.expect_request(lambda request: request.url.endswith(history)):
                pass
        assert text in page.evaluate("window.getSelection().toString()"), selector
    context.close()


def test_the_live_runs_list_keeps_the_readers_text_selection_through_its_refreshes(
    dash: Dashboard,
) -> None:
    with dash.http() as http:
        _ok(http.post("/v1/runs", json={"family_slug": "approval", "input": {}}))
    context = dash.context()
    page = dash.sign_in(context)
    first = page.locator("#runs-list tbody tr").first.get_by_role("link")
    expect(first).to_be_visible()
    run_id = first.inner_text()
    first.evaluate(
        """(link) => {
            const range = document.createRange();
            range.selectNodeContents(link);
            window.getSelection().removeAllRanges();
            window.getSelection().addRange(range);
        }"""
    )
    # Polls do not overlap: once a second one has started, a whole refresh has been
    # drawn since the run id was selected (to copy it), and it is still selected.
    for _ in range(2):
        with page.expect_request(lambda request: "/v1/runs?" in request.url):
            pass
    assert page.evaluate("window.getSelection().toString()") == run_id
    context.close()


MARKUP = "<img src=x onerror=alert(1)>"


def test_markup_a_tenant_stored_is_shown_as_text_and_never_runs(dash: Dashboard) -> None:
    hostile = {
        "family_slug": "hostile",
        "title": MARKUP,
        "steps": [
            {
                "ref": "read",
                "type": "STEP_TYPE_DATAFLOW",
                "title": "<script>alert(2)</script>",
                "args": {"operation": "project", "project": {"v": f"input['{MARKUP}']"}},
            }
        ],
        "edges": [],
    }
    with dash.http() as http:
        _ok(http.post("/v1/workflows", json=hostile))
        failed = _ok(http.post("/v1/runs", json={"family_slug": "hostile", "input": {"a": MARKUP}}))
        waiting = _ok(http.post("/v1/runs", json={"family_slug": "approval", "input": {}}))
        _ok(http.post(f"/v1/runs/{waiting['id']}/signals/{MARKUP}", json={"payload": MARKUP}))
        _ok(http.post(f"/v1/runs/{waiting['id']}/cancel", json={"reason": MARKUP}))
        _ok(
            http.post(
                "/v1/inbox/notifications",
                json={
                    "subscriber_id": MARKUP,
                    "title": MARKUP,
                    "body": MARKUP,
                    "ctas": [{"label": MARKUP, "url": "https://example.com/"}],
                },
            )
        )
        _ok(http.post("/v1/workers", json={"id": "hostile", "kind": "system", "name": MARKUP}))
        decision = _ok(
            http.post(
                "/v1/route", json={"id": MARKUP, "kind": "lead", "attributes": {"state": MARKUP}}
            )
        )
        _ok(
            http.post(
                "/v1/accounts",
                json={"code": "hostile", "currency": "USD", "kind": "asset", "name": MARKUP},
            )
        )
        _ok(
            http.post(
                "/v1/ledger/entries",
                json={
                    "description": MARKUP,
                    "postings": [
                        {"account": "hostile", "amount": 1, "currency": "USD"},
                        {"account": "revenue", "amount": -1, "currency": "USD"},
                    ],
                },
            )
        )
        _ok(
            http.put(
                f"/v1/ai/prices/{MARKUP}", json={"input_per_million": 1, "output_per_million": 1}
            )
        )
    context = dash.context()
    page = dash.sign_in(context)
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    subscriber = MARKUP.replace(" ", "%20")
    for address in (
        f"#/runs/{failed['id']}",
        f"#/runs/{waiting['id']}",
        "#/workflows",
        "#/workflows/hostile",
        "#/routing",
        f"#/decisions/{decision['id']}",
        f"#/inbox?subscriber={subscriber}",
        "#/ledger",
        "#/ai",
    ):
        page.goto(f"{dash.server.url}/ui/{address}")
        expect(page.locator("main")).to_contain_text(MARKUP)
        assert page.locator("main img, main script, main [onerror]").count() == 0, address
    assert not dialogs
    context.close()


def test_the_age_filter_a_hidden_tab_and_a_double_click(dash: Dashboard) -> None:
    """`ductor dev` prints the page's address; the runs list's age filter stops at the
    first older run; a hidden tab stops polling until it is shown again; a double
    click on an action sends it once, with an Idempotency-Key of its own."""
    assert f"dashboard: {dash.server.url}/ui/ (sign in with the API key)" in dash.server.log()
    with dash.http() as http:
        run = _ok(http.post("/v1/runs", json={"family_slug": "approval", "input": {}}))
    context = dash.context()
    page = dash.sign_in(context)
    runs = page.locator("#runs-list")
    expect(runs).to_contain_text(run["id"])
    # Two hours from now, nothing started in the last hour; everything in the last 7 days.
    page.clock.set_fixed_time(time.time() + 2 * 3600)
    page.get_by_label("Started").select_option("1h")
    expect(page).to_have_url(f"{dash.server.url}/ui/#/runs?since=1h")
    expect(runs).to_contain_text("No runs match these filters.")
    page.get_by_label("Started").select_option("7d")
    expect(runs).to_contain_text(run["id"])

    polls: list[str] = []
    page.on("request", lambda r: polls.append(r.url) if "/v1/runs?" in r.url else None)
    page.evaluate(
        """() => {
            Object.defineProperty(document, "hidden", { configurable: true, get: () => true });
            document.dispatchEvent(new Event("visibilitychange"));
        }"""
    )
    page.wait_for_timeout(2500)  # let a poll already under way land
    polls.clear()
    page.wait_for_timeout(4500)  # two refresh periods and more
    assert polls == []
    page.evaluate(
        """() => {
            delete document.hidden;
            document.dispatchEvent(new Event("visibilitychange"));
        }"""
    )
    with page.expect_request(lambda r: "/v1/runs?" in r.url, timeout=10_000):
        pass

    cancels: list[dict[str, str]] = []
    page.on(
        "request",
        lambda r: cancels.append(r.headers) if r.url.endswith(f"/{run['id']}/cancel") else None,
    )
    page.goto(f"{dash.server.url}/ui/#/runs/{run['id']}")
    expect(page.locator("#run-status .badge")).to_have_text("running")
    page.get_by_role("button", name="Cancel run").dblclick()
    expect(page.locator("#run-status .badge")).to_have_text("cancelled", timeout=30_000)
    assert len(cancels) == 1, cancels
    assert cancels[0]["idempotency-key"].startswith("ui-")
    context.close()
