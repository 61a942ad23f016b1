"""The extension mechanism in one process: a distribution with good and bad plugins is
loaded, its failures are reported and skipped, and the good ones plug in: a kind
validator refuses a routable, middleware wraps /v1, and hooks hear of runs,
decisions and entries after commit while raising and hanging hooks change nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx
import pytest
from litestar.testing import AsyncTestClient

from ductor_server import Settings, create_app
from ductor_server.cli import main as cli_main
from ductor_server.cli_server import create_key
from ductor_server.composition import build
from ductor_server.engine.offload import VALIDATION
from ductor_server.extensions import (
    HookDispatcher,
    HookEvent,
    load_extensions,
)
from ductor_server.extensions.wiring import plugin_middleware, plugin_providers
from ductor_server.providers.base import ProviderRegistry
from ductor_server.storage import open_store
from ductor_server.testing import serve_process

PLUGIN = textwrap.dedent(
    """
    import asyncio
    from ductor_routing import Problem

    SEEN = []

    async def record(event):
        SEEN.append(event)

    async def boom(event):
        raise RuntimeError("this hook always fails")

    async def hang(event):
        await asyncio.sleep(3600)

    def not_async(event):
        pass

    def invoice(routable):
        if not isinstance(routable.attributes.get("amount"), int):
            yield Problem(pointer="/attributes/amount", message="an integer amount")

    def tagged(app):
        async def wrapped(scope, receive, send):
            async def sending(message):
                if message["type"] == "http.response.start":
                    message = {**message, "headers": [*message["headers"], (b"x-tagged", b"1")]}
                await send(message)
            await app(scope, receive, sending)
        return wrapped

    not_a_step = object()

    def no_app():
        return None
    """
)

ENTRY_POINTS = textwrap.dedent(
    """
    [ductor.hooks]
    a_record = probe_plugin:record
    b_boom = probe_plugin:boom
    c_hang = probe_plugin:hang
    d_not_async = probe_plugin:not_async

    [ductor.kinds]
    invoice = probe_plugin:invoice

    [ductor.middleware]
    broken = probe_plugin:no_app
    tagged = probe_plugin:tagged

    [ductor.steps]
    broken = probe_plugin:not_a_step

    [ductor.cel.functions]
    lower = probe_plugin:record
    gone = probe_plugin_missing:thing
    """
)


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """An installed distribution `probe-plugins 2.0` holding good and bad plugins."""
    (tmp_path / "probe_plugin.py").write_text(PLUGIN)
    dist = tmp_path / "probe_plugins-2.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: probe-plugins\nVersion: 2.0\n")
    (dist / "entry_points.txt").write_text(ENTRY_POINTS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "probe_plugin", raising=False)
    found = metadata.distribution("probe-plugins")
    extensions = load_extensions(found.entry_points)
    import probe_plugin  # type: ignore[import-not-found]

    return extensions, probe_plugin


def test_bad_plugins_are_reported_with_their_distribution_and_skipped(plugin: Any) -> None:
    extensions, _ = plugin
    failures = {(f.group, f.name): f for f in extensions.failures}
    assert set(failures) == {
        ("ductor.hooks", "d_not_async"),
        ("ductor.steps", "broken"),
        ("ductor.cel.functions", "lower"),
        ("ductor.cel.functions", "gone"),
    }
    for failure in failures.values():
        assert (failure.distribution, failure.version) == ("probe-plugins", "2.0")
    assert failures["ductor.cel.functions", "gone"].code == "extension.load_failed"
    assert "ModuleNotFoundError" in failures["ductor.cel.functions", "gone"].error
    assert failures["ductor.hooks", "d_not_async"].code == "extension.contract"
    assert "async function" in failures["ductor.hooks", "d_not_async"].error
    assert "StepExtension" in failures["ductor.steps", "broken"].error
    assert "already registered" in failures["ductor.cel.functions", "lower"].error
    view = extensions.view()
    loaded = {p.group: [e.name for e in p.extensions] for p in view.points}
    assert loaded["ductor.hooks"] == ["a_record", "b_boom", "c_hang"]
    assert loaded["ductor.kinds"] == ["invoice"]
    assert loaded["ductor.steps"] == []
    assert len(view.points) == 8


async def test_a_raising_or_hanging_hook_is_bounded_and_the_others_still_hear() -> None:
    heard: list[str] = []

    async def record(event: HookEvent) -> None:
        heard.append(event.name)

    async def boom(event: HookEvent) -> None:
        raise RuntimeError("no")

    async def hang(event: HookEvent) -> None:
        await asyncio.sleep(3600)

    hooks = HookDispatcher([("boom", boom), ("hang", hang), ("record", record)], timeout=0.2)
    started = time.monotonic()
    hooks.emit(HookEvent(name="run.finished", at=datetime.now(UTC)))
    await hooks.drain()
    assert time.monotonic() - started < 2
    assert heard == ["run.finished"]


def test_a_hook_that_exits_is_logged_and_the_process_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A hook calling sys.exit() must not end the server's event loop: it fails
    # only its own delivery, as a hook that raises does.
    heard: list[str] = []

    async def exits(event: HookEvent) -> None:
        sys.exit("a hook's exit")

    async def record(event: HookEvent) -> None:
        heard.append(event.name)

    async def main() -> str:
        hooks = HookDispatcher([("exits", exits), ("record", record)], timeout=1.0)
        hooks.emit(HookEvent(name="run.finished", at=datetime.now(UTC), tenant_id="t1"))
        await hooks.drain()
        await hooks.deliver(HookEvent(name="server.stopping", at=datetime.now(UTC)))
        return "went on"

    try:
        outcome = asyncio.run(main())
    except SystemExit as exc:
        outcome = f"the process exited: {exc}"
    assert outcome == "went on"
    assert heard == ["run.finished", "server.stopping"]
    assert "hook exits failed with run.finished" in caplog.text


FLOW = {
    "family_slug": "plain",
    "title": "Plain",
    "steps": [
        {
            "ref": "only",
            "type": "STEP_TYPE_DATAFLOW",
            "title": "Project",
            "args": {"operation": "project", "project": {"n": "input.n + 1"}},
        }
    ],
    "edges": [],
}


@contextlib.asynccontextmanager
async def _served(
    extensions: Any, tmp_path: Path, tenant: str, **build_options: Any
) -> AsyncIterator[tuple[AsyncTestClient[Any], dict[str, str]]]:
    """An in-process server with `extensions` on SQLite, and a key of `tenant`'s."""
    settings = Settings(data_dir=tmp_path / "data", poll_interval=0.05)
    composition = build(settings, extensions=extensions, **build_options)
    async with AsyncTestClient(app=create_app(composition=composition)) as client:
        store = open_store(settings.store_target)
        await store.open()
        try:
            key = await create_key(store, tenant, name=tenant)
        finally:
            await store.close()
        yield client, {"Authorization": f"Bearer {key}"}


@pytest.fixture
async def api(
    plugin: Any, tmp_path: Path
) -> AsyncIterator[tuple[AsyncTestClient[Any], dict[str, str], list[HookEvent]]]:
    extensions, module = plugin
    module.SEEN.clear()
    async with _served(extensions, tmp_path, "t-ext", hook_timeout=0.5) as (client, auth):
        yield client, auth, module.SEEN


async def _until(seen: list[HookEvent], name: str) -> HookEvent:
    for _ in range(200):
        for event in seen:
            if event.name == name:
                return event
        await asyncio.sleep(0.02)
    raise AssertionError(f"no {name} in {[e.name for e in seen]}")


async def test_plugins_plug_in_and_failing_hooks_change_nothing(
    api: tuple[AsyncTestClient[Any], dict[str, str], list[HookEvent]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    client, auth, seen = api
    caplog.set_level(logging.ERROR)
    assert seen[0].name == "server.started"

    listing = await client.get("/v1/extensions", headers=auth)
    assert listing.status_code == 200
    assert listing.headers["x-tagged"] == "1"  # the middleware wraps /v1
    body = listing.json()
    # The middleware that takes no app is refused when the app is built; it starts.
    assert len(body["failures"]) == 5
    assert {f["distribution"] for f in body["failures"]} == {"probe-plugins"}
    [broken] = [f for f in body["failures"] if f["group"] == "ductor.middleware"]
    assert (broken["name"], broken["code"]) == ("broken", "extension.contract")
    [middleware] = [p for p in body["points"] if p["group"] == "ductor.middleware"]
    assert [e["name"] for e in middleware["extensions"]] == ["tagged"]
    assert "x-tagged" not in (await client.get("/healthz")).headers

    # A run finishes although one hook raises and another hangs.
    assert (await client.post("/v1/workflows", json=FLOW, headers=auth)).status_code == 201
    started = await client.post(
        "/v1/runs", json={"family_slug": "plain", "input": {"n": 1}}, headers=auth
    )
    run_id = started.json()["id"]
    finished = await _until(seen, "run.finished")
    assert finished.data["run_id"] == run_id
    assert finished.data["status"] == "RUN_STATUS_SUCCEEDED"
    assert finished.tenant_id == "t-ext"
    run = (await client.get(f"/v1/runs/{run_id}", headers=auth)).json()
    assert run["output"] == {"only": {"n": 2}}

    # The kind validator refuses; nothing is decided.
    await client.post("/v1/workers", json={"id": "ana"}, headers=auth)
    await client.post(
        "/v1/pools",
        json={"id": "desk", "strategy": {"name": "round_robin"}, "members": [{"worker": "ana"}]},
        headers=auth,
    )
    rules = {"id": "r", "default_pool": "desk", "kinds": {"invoice": {}}}
    assert (await client.post("/v1/rules", json=rules, headers=auth)).status_code == 201
    refused = await client.post(
        "/v1/route", json={"id": "i1", "kind": "invoice", "attributes": {}}, headers=auth
    )
    assert refused.status_code == 422
    assert refused.json()["code"] == "routing.routable_invalid"
    assert refused.json()["details"] == [
        {"pointer": "/attributes/amount", "message": "an integer amount"}
    ]
    routed = await client.post(
        "/v1/route", json={"id": "i2", "kind": "invoice", "attributes": {"amount": 3}}, headers=auth
    )
    assert routed.status_code == 201, routed.text
    decided = await _until(seen, "routing.decision_made")
    assert decided.data["id"] == routed.json()["id"]
    assert decided.data["routable_id"] == "i2"

    # An entry is heard of; a refused one is not.
    for code, kind in (("cash", "asset"), ("wallet", "liability")):
        await client.post(
            "/v1/accounts", json={"code": code, "currency": "USD", "kind": kind}, headers=auth
        )
    lines = [
        {"account": "cash", "amount": 5, "currency": "USD"},
        {"account": "wallet", "amount": -4, "currency": "USD"},
    ]
    bad = await client.post("/v1/ledger/entries", json={"postings": lines}, headers=auth)
    assert bad.status_code == 422
    lines[1]["amount"] = -5
    good = await client.post("/v1/ledger/entries", json={"postings": lines}, headers=auth)
    assert good.status_code == 201, good.text
    posted = await _until(seen, "ledger.entry_posted")
    assert posted.data["id"] == good.json()["id"]
    assert [e.name for e in seen].count("ledger.entry_posted") == 1
    assert "this hook always fails" in caplog.text


def test_the_cli_lists_the_points(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["extensions", "list"]) == 0
    out = capsys.readouterr().out
    for group in ("ductor.routing.strategies", "ductor.cel.functions", "ductor.kinds"):
        assert f"{group} (" in out


def _dist(root: Path, name: str, module: str, source: str, entry_points: str) -> None:
    (root / f"{module}.py").write_text(textwrap.dedent(source))
    info = root / f"{module}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))


def test_a_second_plugin_of_one_name_is_a_duplicate_and_groups_load_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = """
        def invoice(routable):
            return ()

        def twice(x):
            return 2 * x
        """
    _dist(
        tmp_path,
        "first-kinds",
        "first_kinds",
        source,
        "[ductor.kinds]\ninvoice = first_kinds:invoice\n",
    )
    _dist(
        tmp_path,
        "second-kinds",
        "second_kinds",
        source,
        "[ductor.kinds]\ninvoice = second_kinds:invoice\n"
        "[ductor.cel.functions]\ntwice = second_kinds:twice\n",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    eps = [
        ep
        for name in ("first-kinds", "second-kinds")
        for ep in metadata.distribution(name).entry_points
    ]
    extensions = load_extensions(eps)
    [kind] = extensions.values("ductor.kinds")
    assert (kind[0].name, kind[0].distribution) == ("invoice", "first-kinds")
    [failure] = extensions.failures
    assert (failure.code, failure.distribution) == ("extension.duplicate", "second-kinds")
    assert "already provided by first-kinds" in failure.error
    only = load_extensions(eps, groups=["ductor.cel.functions"])
    assert [e.name for e, _ in only.values("ductor.cel.functions")] == ["twice"]
    assert only.values("ductor.kinds") == []
    assert only.failures == []


REFUSED_SOURCE = """
    from ductor_core.step_args import DefinitionStruct
    from ductor_core.step_specs import OnWorker, StepSpec
    from ductor_server.extensions import StepExtension

    def strategy(options, registry):
        raise AssertionError("never built")

    class Args(DefinitionStruct, frozen=True, kw_only=True):
        pass

    async def act(call):
        return {}

    ACTION = StepExtension(
        spec=StepSpec(type="STEP_TYPE_ACTION", args=Args, start=OnWorker(handler="plugin_act")),
        handler=act,
    )

    def raising(app):
        raise RuntimeError("no app for me")

    def no_app(app):
        return None
"""

REFUSED_ENTRY_POINTS = """
    [ductor.routing.strategies]
    round_robin = refused_plugin:strategy

    [ductor.providers]
    http = ductor_server.providers.http:HttpProvider

    [ductor.steps]
    action = refused_plugin:ACTION

    [ductor.middleware]
    raising = refused_plugin:raising
    none = refused_plugin:no_app
"""


def test_the_cli_refuses_what_the_server_refuses(tmp_path: Path) -> None:
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    _dist(plugins, "refused-plugins", "refused_plugin", REFUSED_SOURCE, REFUSED_ENTRY_POINTS)
    env = {"PYTHONPATH": os.pathsep.join([str(plugins), os.environ.get("PYTHONPATH", "")])}
    listed = subprocess.run(
        [sys.executable, "-m", "ductor_server.cli", "extensions", "list", "--json"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 1, listed
    cli = json.loads(listed.stdout)
    # Each refusal is logged with the entry point's object path.
    assert "(refused-plugins 1.0, refused_plugin:no_app) skipped" in listed.stderr
    with serve_process(tmp_path / "data", tenants=["t"], env=env) as server:
        answer = httpx.get(
            f"{server.url}/v1/extensions",
            headers={"Authorization": f"Bearer {server.keys['t']}"},
            timeout=10,
        )
    assert answer.status_code == 200, answer.text
    assert cli == answer.json()
    codes = {(f["group"], f["name"]): f["code"] for f in cli["failures"]}
    assert codes == {
        ("ductor.routing.strategies", "round_robin"): "extension.refused",
        ("ductor.providers", "http"): "extension.refused",
        ("ductor.steps", "action"): "extension.refused",
        ("ductor.middleware", "raising"): "extension.contract",
        ("ductor.middleware", "none"): "extension.contract",
    }


MISBEHAVING_SOURCE = """
    import sys

    from ductor_core.step_args import DefinitionStruct
    from ductor_core.step_specs import OnWorker, StepSpec
    from ductor_routing import Selection
    from ductor_server.extensions import StepExtension

    class Picky:
        name = "picky"

        def __init__(self, mode):
            self.mode = mode

        def select(self, ctx):
            if self.mode == "raise":
                raise RuntimeError("select broke")
            if self.mode == "garbage":
                return "ana"
            return Selection(pick=ctx.candidates[0].worker.id)

    def strategy(options, registry):
        if options.get("build") == "raise":
            raise RuntimeError("factory broke")
        if options.get("build") == "none":
            return None
        return Picky(options.get("mode", "ok"))

    class Adds:
        name = "adds"

        def __init__(self, mode):
            self.mode = mode

        def enrich(self, routable, now):
            if self.mode == "list":
                return [1, 2]
            if self.mode == "object":
                return {"x": object()}
            return {"x": 1}

    def enricher(options):
        if options.get("build") == "raise":
            raise RuntimeError("factory broke")
        return Adds(options.get("mode", "ok"))

    def leaves(x):
        sys.exit(3)

    class Args(DefinitionStruct, frozen=True, kw_only=True):
        pass

    async def exits(call):
        sys.exit(2)

    EXITS = StepExtension(
        spec=StepSpec(type="STEP_TYPE_EXITS", args=Args, start=OnWorker(handler="exits")),
        handler=exits,
    )
"""

MISBEHAVING_ENTRY_POINTS = """
    [ductor.routing.strategies]
    picky = misbehaving_plugin:strategy

    [ductor.routing.enrichers]
    adds = misbehaving_plugin:enricher

    [ductor.cel.functions]
    leaves = misbehaving_plugin:leaves

    [ductor.steps]
    exits = misbehaving_plugin:EXITS
"""


@pytest.fixture
def misbehaving(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The loaded extensions of `misbehaving-plugin 1.0`, whose plugins raise, exit and
    answer garbage."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    _dist(
        plugins,
        "misbehaving-plugin",
        "misbehaving_plugin",
        MISBEHAVING_SOURCE,
        MISBEHAVING_ENTRY_POINTS,
    )
    monkeypatch.syspath_prepend(str(plugins))
    # Decisions may be made in the routing lane's processes, which import the plugin too.
    paths = [str(plugins), *filter(None, [os.environ.get("PYTHONPATH")])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))
    monkeypatch.delitem(sys.modules, "misbehaving_plugin", raising=False)
    VALIDATION.close()  # its next processes start with the plugin's path
    extensions = load_extensions(metadata.distribution("misbehaving-plugin").entry_points)
    assert extensions.failures == []
    yield extensions
    VALIDATION.close()


async def test_a_failing_strategy_or_enricher_fails_only_its_call_with_a_code(
    misbehaving: Any, tmp_path: Path
) -> None:
    async with _served(misbehaving, tmp_path, "t-bad") as (client, auth):
        for worker in ("ana", "ben"):
            assert (await client.post("/v1/workers", json={"id": worker}, headers=auth)).is_success

        async def pool(**options: str) -> httpx.Response:
            body = {
                "id": "desk",
                "strategy": {"name": "picky", "options": options},
                "members": [{"worker": "ana"}, {"worker": "ben"}],
            }
            return await client.post("/v1/pools", json=body, headers=auth)

        async def rules(**options: str) -> httpx.Response:
            body = {
                "id": "r",
                "default_pool": "desk",
                "kinds": {"lead": {}},
                "enrichers": [{"plugin": "adds", "options": options}] if options else [],
            }
            return await client.post("/v1/rules", json=body, headers=auth)

        async def route(n: int) -> httpx.Response:
            body = {"id": f"lead-{n}", "kind": "lead", "attributes": {}}
            return await client.post("/v1/route", json=body, headers=auth)

        # A factory that raises or answers no strategy is a problem of the pool.
        for build_mode, said in (("raise", "RuntimeError: factory broke"), ("none", "NoneType")):
            refused = await pool(build=build_mode)
            assert refused.status_code == 422, refused.text
            assert refused.json()["code"] == "routing.config"
            [problem] = refused.json()["details"]
            assert problem["pointer"] == "/strategy"
            assert said in problem["message"]
        assert (await pool()).status_code == 201
        assert (await rules()).status_code == 201
        assert (await route(1)).status_code == 201

        # A select that raises or answers no Selection fails that decision, with a code.
        for n, (mode, said) in enumerate(
            (("raise", "RuntimeError: select broke"), ("garbage", "str")), 2
        ):
            assert (await pool(mode=mode)).status_code == 200
            failed = await route(n)
            assert failed.status_code == 422, failed.text
            assert failed.json()["code"] == "routing.strategy_failed"
            assert said in failed.json()["message"]
        assert (await pool()).status_code == 200

        # As a shadow, a failing strategy is a note on its pick: the live decision stands.
        shadowed = {
            "id": "desk",
            "strategy": {"name": "round_robin"},
            "shadows": [{"name": "picky", "options": {"mode": "raise"}}],
            "members": [{"worker": "ana"}, {"worker": "ben"}],
        }
        assert (await client.post("/v1/pools", json=shadowed, headers=auth)).status_code == 200
        kept = await route(5)
        assert kept.status_code == 201, kept.text
        assert kept.json()["outcome"] == "assigned", kept.json()
        [shadow] = kept.json()["explanation"]["shadows"]
        assert (shadow["pick"], shadow["agrees"]) == (None, False)
        assert "RuntimeError: select broke" in shadow["note"]
        assert (await pool()).status_code == 200

        # An enricher factory that raises is a problem of the rule set.
        refused = await rules(build="raise")
        assert refused.status_code == 422, refused.text
        assert refused.json()["code"] == "routing.config"
        assert refused.json()["details"][0]["pointer"] == "/enrichers/0/plugin"

        # An enricher that answers no mapping, or a value that is not JSON, refuses the
        # routable as one that raises does.
        for n, mode in enumerate(("list", "object"), 10):
            assert (await rules(mode=mode)).status_code == 201
            invalid = await route(n)
            assert invalid.status_code == 422, invalid.text
            assert invalid.json()["code"] == "routing.routable_invalid"
            assert invalid.json()["details"][0]["pointer"] == "/enrich/adds"
        assert (await rules(mode="ok")).status_code == 201
        routed = await route(20)
        assert routed.status_code == 201, routed.text


def test_a_cel_function_that_exits_is_an_evaluation_error_on_both_engines(
    misbehaving: Any,
) -> None:
    from ductor_core.errors import DuctorError
    from ductor_core.expressions import CelPyEngine, CelRustEngine, FunctionRegistry
    from ductor_server.extensions import register_cel_functions

    registry = FunctionRegistry()
    register_cel_functions(misbehaving, registry)
    for engine in (CelPyEngine(functions=registry), CelRustEngine(functions=registry)):
        with pytest.raises(DuctorError) as failed:
            engine.evaluate("leaves(1)", {})
        assert failed.value.code == "expression.evaluation", engine.name
        assert "SystemExit" in failed.value.message


async def test_a_step_handler_that_exits_fails_its_attempt_not_the_server(
    misbehaving: Any, tmp_path: Path
) -> None:
    async with _served(misbehaving, tmp_path, "t-exit") as (client, auth):
        flow = {
            "family_slug": "exits",
            "steps": [
                {"ref": "s", "type": "STEP_TYPE_EXITS", "args": {}, "retry": {"max_attempts": 1}}
            ],
            "edges": [],
        }
        assert (await client.post("/v1/workflows", json=flow, headers=auth)).status_code == 201
        started = await client.post(
            "/v1/runs", json={"family_slug": "exits", "input": {}}, headers=auth
        )
        run_id = started.json()["id"]
        for _ in range(300):
            run = (await client.get(f"/v1/runs/{run_id}", headers=auth)).json()
            if run["status"] not in ("RUN_STATUS_PENDING", "RUN_STATUS_RUNNING"):
                break
            await asyncio.sleep(0.05)
        assert run["status"] == "RUN_STATUS_FAILED", run
        assert run["error"]["details"]["error"] == "handler.crashed"
        assert "SystemExit" in run["error"]["message"]
        assert (await client.get("/v1/extensions", headers=auth)).status_code == 200


HOSTILE_SOURCE = """
    import sys


    class Unprintable(Exception):
        def __str__(self):
            raise RuntimeError("no text for you")


    class Prickly:
        # Every attribute read raises something other than AttributeError.
        def __getattribute__(self, name):
            raise RuntimeError(f"touched {name}")


    class PricklyFactory:
        def __call__(self):
            return Prickly()


    def good(routable):
        return ()


    prickly = Prickly()
    make_prickly = PricklyFactory()


    def exiting_middleware(app):
        sys.exit(3)


    def unprintable_middleware(app):
        raise Unprintable()

    if "hostile_exit" in __name__:
        sys.exit("a plugin that exits at import")
    if "hostile_unprintable" in __name__:
        raise Unprintable()
"""

HOSTILE_ENTRY_POINTS = """
    [ductor.kinds]
    a_exits = hostile_exit:good
    b_unprintable = hostile_unprintable:good
    c_good = hostile_plugin:good

    [ductor.hooks]
    prickly = hostile_plugin:prickly

    [ductor.providers]
    prickly = hostile_plugin:prickly
    made_prickly = hostile_plugin:make_prickly

    [ductor.cel.functions]
    prickly_fn = hostile_plugin:prickly

    [ductor.middleware]
    exits = hostile_plugin:exiting_middleware
    unprintable = hostile_plugin:unprintable_middleware
"""


def test_a_plugin_that_exits_or_raises_oddly_is_a_listed_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A module that calls sys.exit() at import, an exception whose text cannot be
    # read, objects whose every attribute raises: each is a failure in the listing,
    # and loading goes on to the next.
    for module in ("hostile_exit", "hostile_unprintable"):
        (tmp_path / f"{module}.py").write_text(textwrap.dedent(HOSTILE_SOURCE))
        monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.delitem(sys.modules, "hostile_plugin", raising=False)
    _dist(tmp_path, "hostile-plugin", "hostile_plugin", HOSTILE_SOURCE, HOSTILE_ENTRY_POINTS)
    monkeypatch.syspath_prepend(str(tmp_path))
    extensions = load_extensions(metadata.distribution("hostile-plugin").entry_points)
    failures = {(f.group, f.name): f for f in extensions.failures}
    assert set(failures) == {
        ("ductor.kinds", "a_exits"),
        ("ductor.kinds", "b_unprintable"),
        ("ductor.hooks", "prickly"),
        ("ductor.providers", "prickly"),
        ("ductor.providers", "made_prickly"),
        ("ductor.cel.functions", "prickly_fn"),
    }
    exits = failures["ductor.kinds", "a_exits"]
    assert exits.code == "extension.load_failed"
    assert "SystemExit" in exits.error
    assert "a plugin that exits at import" in exits.error
    unprintable = failures["ductor.kinds", "b_unprintable"]
    assert unprintable.code == "extension.load_failed"
    assert unprintable.error.startswith("Unprintable")
    for name in (("ductor.hooks", "prickly"), ("ductor.providers", "prickly")):
        assert failures[name].code == "extension.contract", failures[name]
        assert "touched" in failures[name].error
    assert [e.name for e, _ in extensions.values("ductor.kinds")] == ["c_good"]
    assert "prickly_fn" not in [e.name for e, _ in extensions.values("ductor.cel.functions")]
    # Middleware is tried once on a stand-in app: one that exits or raises
    # unreadably is refused, not the end of the server's start.
    assert plugin_middleware(extensions) == []
    refused = {f.name: f for f in extensions.failures if f.group == "ductor.middleware"}
    assert set(refused) == {"exits", "unprintable"}
    assert "SystemExit: 3" in refused["exits"].error
    assert "Unprintable" in refused["unprintable"].error


def test_a_distribution_whose_entry_points_do_not_parse_is_listed_not_fatal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Any installed distribution's entry_points.txt is read when the server starts:
    # one that does not parse fails its own ductor entry points, listed, and the
    # other distributions' plugins still load.
    _dist(
        tmp_path,
        "broken-manifest",
        "broken_manifest",
        "def invoice(routable):\n    return ()\n",
        "[console_scripts]\nnot a pair\n\n[ductor.kinds]\ninvoice = broken_manifest:invoice\n"
        "also not a pair\n\n[ductor.hooks]\nheard = broken_manifest:invoice\n",
    )
    _dist(
        tmp_path,
        "fine-kinds",
        "fine_kinds",
        "def receipt(routable):\n    return ()\n",
        "[ductor.kinds]\nreceipt = fine_kinds:receipt\n",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    extensions = load_extensions(groups=["ductor.kinds"])
    names = [e.name for e, _ in extensions.values("ductor.kinds")]
    assert "receipt" in names
    assert "invoice" not in names
    broken = [f for f in extensions.failures if f.distribution == "broken-manifest"]
    assert {(f.group, f.name) for f in broken} == {
        ("ductor.kinds", "invoice"),
        ("ductor.kinds", "also not a pair"),
    }
    for failure in broken:
        assert failure.code == "extension.load_failed"
        assert failure.version == "1.0"
        assert "entry_points.txt of broken-manifest does not parse" in failure.error
    [invoice] = [f for f in broken if f.name == "invoice"]
    assert invoice.object == "broken_manifest:invoice"
    # Loading every group lists the manifest's lines in every group.
    everything = load_extensions()
    assert ("ductor.hooks", "heard") in {
        (f.group, f.name) for f in everything.failures if f.distribution == "broken-manifest"
    }


BROKEN_PROVIDERS_SOURCE = """
    import msgspec

    from ductor_server.providers import Operation


    class Nothing(msgspec.Struct, frozen=True):
        pass


    class Base:
        description = "a provider that breaks the contract"
        settings = Nothing
        secrets = Nothing

        async def call(self, operation, settings, secrets, input, context):
            return None

        async def test(self, settings, secrets, context):
            return None


    class Mismatched(Base):
        name = "mismatched"
        operations = {"a": Operation(name="b", description="", input=Nothing, output=Nothing)}


    class NoOperations(Base):
        name = "no_ops"
        operations = None


    class Fine(Base):
        name = "fine"
        operations = {}
"""


def test_a_plugin_provider_that_breaks_the_contract_is_listed_not_fatal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _dist(
        tmp_path,
        "broken-providers",
        "broken_providers",
        BROKEN_PROVIDERS_SOURCE,
        "[ductor.providers]\nmismatched = broken_providers:Mismatched\n"
        "no_ops = broken_providers:NoOperations\nfine = broken_providers:Fine\n",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "broken_providers", raising=False)
    extensions = load_extensions(metadata.distribution("broken-providers").entry_points)
    registry = ProviderRegistry()
    plugin_providers(extensions, registry)
    assert [p.name for p in registry] == ["fine"]
    failures = {f.name: f for f in extensions.failures}
    assert set(failures) == {"mismatched", "no_ops"}
    for failure in failures.values():
        assert failure.code == "extension.contract"
        assert failure.distribution == "broken-providers"
    assert "operation key 'a' != 'b'" in failures["mismatched"].error
    assert [e.name for e, _ in extensions.values("ductor.providers")] == ["fine"]


EXITING_KINDS_SOURCE = """
    import sys


    class Unprintable(Exception):
        def __str__(self):
            raise RuntimeError("no text for you")


    def exiting(routable):
        sys.exit("a validator's exit")


    def unprintable(routable):
        raise Unprintable()
"""


async def test_a_kind_validator_that_exits_or_raises_oddly_refuses_the_routable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _dist(
        tmp_path,
        "exiting-kinds",
        "exiting_kinds",
        EXITING_KINDS_SOURCE,
        "[ductor.kinds]\nexiting = exiting_kinds:exiting\n"
        "unprintable = exiting_kinds:unprintable\n",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "exiting_kinds", raising=False)
    extensions = load_extensions(metadata.distribution("exiting-kinds").entry_points)
    assert [e.name for e, _ in extensions.values("ductor.kinds")] == ["exiting", "unprintable"]
    async with _served(extensions, tmp_path, "t-kinds") as (client, auth):
        await client.post("/v1/workers", json={"id": "ana"}, headers=auth)
        pool = {"id": "desk", "strategy": {"name": "round_robin"}, "members": [{"worker": "ana"}]}
        await client.post("/v1/pools", json=pool, headers=auth)
        rules = {"id": "r", "default_pool": "desk", "kinds": {"exiting": {}, "unprintable": {}}}
        assert (await client.post("/v1/rules", json=rules, headers=auth)).status_code == 201
        for kind in ("exiting", "unprintable"):
            refused = await client.post(
                "/v1/route", json={"id": f"r-{kind}", "kind": kind, "attributes": {}}, headers=auth
            )
            assert refused.status_code == 422, refused.text
            assert refused.json()["code"] == "routing.routable_invalid"
            [problem] = refused.json()["details"]
            assert problem["pointer"] == "/kind"
            assert f"the validator of kind '{kind}' failed" in problem["message"]
        assert (await client.get("/v1/assignments", headers=auth)).json() == []


CONTRACT_SOURCE = """
    import msgspec

    from ductor_routing import Problem, Selection
    from ductor_server.providers import Operation
    from ductor_core.step_args import DefinitionStruct
    from ductor_core.step_specs import OnWorker, StepSpec
    from ductor_server.extensions import StepExtension


    def twice(x):
        return 2 * x


    class Nothing(msgspec.Struct, frozen=True):
        pass


    class Misnamed:
        name = "called_otherwise"
        description = "a provider whose name is not its entry point's"
        settings = Nothing
        secrets = Nothing
        operations = {}

        async def call(self, operation, settings, secrets, input, context):
            return None

        async def test(self, settings, secrets, context):
            return None


    class Stray:
        name = "stray"

        def select(self, ctx):
            return Selection(pick="nobody-of-the-pool")


    def stray(options, registry):
        return Stray()


    def chatty(routable):
        return "not problems"


    def empty(routable):
        return [Problem(pointer="/attributes/x", message="first"), None]


    class Args(DefinitionStruct, frozen=True, kw_only=True):
        pass


    async def act(call):
        return {}


    # A new type whose handler name is a built-in handler's.
    TAKES_ROUTE = StepExtension(
        spec=StepSpec(type="STEP_TYPE_TAKES_ROUTE", args=Args, start=OnWorker(handler="route")),
        handler=act,
    )


    def tag(label):
        def factory(app):
            async def wrapped(scope, receive, send):
                async def sending(message):
                    if message["type"] == "http.response.start":
                        headers = [*message["headers"], (b"x-order", label.encode())]
                        message = {**message, "headers": headers}
                    await send(message)
                await app(scope, receive, sending)
            return wrapped
        return factory


    b_second = tag("b")
    a_first = tag("a")

    HEARD = []


    async def hear(event):
        HEARD.append(event)
"""

CONTRACT_ENTRY_POINTS = """
    [ductor.cel.functions]
    has = contract_plugin:twice
    size = contract_plugin:twice
    in = contract_plugin:twice
    true = contract_plugin:twice
    matches = contract_plugin:twice
    exists_one = contract_plugin:twice
    doubled = contract_plugin:twice

    [ductor.providers]
    misnamed = contract_plugin:Misnamed

    [ductor.routing.strategies]
    stray = contract_plugin:stray

    [ductor.kinds]
    chatty = contract_plugin:chatty
    half = contract_plugin:empty

    [ductor.steps]
    takes_route = contract_plugin:TAKES_ROUTE

    [ductor.middleware]
    b_second = contract_plugin:b_second
    a_first = contract_plugin:a_first

    [ductor.hooks]
    hear = contract_plugin:hear
"""


@pytest.fixture
def contract_plugin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> Any:
    """`contract-plugin 1.0` loaded: reserved CEL names, a misnamed provider, a strategy
    picking outside the pool, validators answering no Problems, a step taking a
    built-in handler's name, two middlewares, a hook."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    _dist(plugins, "contract-plugin", "contract_plugin", CONTRACT_SOURCE, CONTRACT_ENTRY_POINTS)
    monkeypatch.syspath_prepend(str(plugins))
    paths = [str(plugins), *filter(None, [os.environ.get("PYTHONPATH")])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))
    monkeypatch.delitem(sys.modules, "contract_plugin", raising=False)
    VALIDATION.close()
    caplog.set_level(logging.ERROR, logger="ductor.extensions")
    extensions = load_extensions(metadata.distribution("contract-plugin").entry_points)
    import contract_plugin  # type: ignore[import-not-found]

    yield extensions, contract_plugin
    VALIDATION.close()


def test_a_cel_name_cel_reserves_or_a_misnamed_provider_breaks_the_contract(
    contract_plugin: Any, caplog: pytest.LogCaptureFixture
) -> None:
    extensions, _ = contract_plugin
    failures = {(f.group, f.name): f for f in extensions.failures}
    for name in ("has", "size", "in", "true", "matches", "exists_one"):
        failure = failures.pop(("ductor.cel.functions", name))
        assert failure.code == "extension.contract", failure
        assert "reserved by CEL" in failure.error, failure
    assert [e.name for e, _ in extensions.values("ductor.cel.functions")] == ["doubled"]
    misnamed = failures.pop(("ductor.providers", "misnamed"))
    assert misnamed.code == "extension.contract"
    assert "'called_otherwise'" in misnamed.error
    assert failures == {}
    # Each failure is logged at ERROR on `ductor.extensions`, with its group, name,
    # distribution, version and object path.
    # (Loaded by the fixture: its log records are the setup's.)
    logged = [r for r in caplog.get_records("setup") if r.name == "ductor.extensions"]
    assert all(r.levelno == logging.ERROR for r in logged)
    assert any(
        "ductor.providers 'misnamed' (contract-plugin 1.0, contract_plugin:Misnamed) skipped"
        in r.getMessage()
        for r in logged
    ), [r.getMessage() for r in logged]
    assert len(logged) == len(extensions.failures)


def test_the_first_of_one_name_by_name_and_distribution_loads_whatever_the_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = "def invoice(routable):\n    return ()\n"
    for dist in ("b-kinds", "a-kinds"):
        module = dist.replace("-", "_")
        _dist(tmp_path, dist, module, source, f"[ductor.kinds]\ninvoice = {module}:invoice\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    eps = [ep for d in ("b-kinds", "a-kinds") for ep in metadata.distribution(d).entry_points]
    for given in (eps, list(reversed(eps))):
        extensions = load_extensions(given)
        [(kind, _)] = extensions.values("ductor.kinds")
        assert kind.distribution == "a-kinds"
        [failure] = extensions.failures
        assert (failure.code, failure.distribution) == ("extension.duplicate", "b-kinds")


async def test_plugins_that_misbehave_where_they_plug_in_fail_only_their_calls(
    contract_plugin: Any, tmp_path: Path
) -> None:
    extensions, module = contract_plugin
    module.HEARD.clear()
    async with _served(extensions, tmp_path, "t-one") as (client, auth):
        # Started: the hook heard it, with the roles.
        started = await _until(module.HEARD, "server.started")
        assert started.tenant_id is None
        assert "api" in started.data["roles"]

        # A step whose handler name is taken is refused when it plugs in.
        listing = await client.get("/v1/extensions", headers=auth)
        assert listing.status_code == 200
        body = listing.json()
        [refused] = [f for f in body["failures"] if f["group"] == "ductor.steps"]
        assert (refused["name"], refused["code"]) == ("takes_route", "extension.refused")
        assert "'route'" in refused["error"]
        assert [p["group"] for p in body["points"]] == [
            "ductor.routing.strategies",
            "ductor.routing.enrichers",
            "ductor.cel.functions",
            "ductor.providers",
            "ductor.steps",
            "ductor.middleware",
            "ductor.hooks",
            "ductor.kinds",
        ]
        # Middleware wraps /v1 in entry-point name order: `a_first` outermost, so it
        # sees the answer last.
        assert listing.headers.get_list("x-order") == ["b", "a"]
        for path in ("/healthz", "/readyz"):
            assert "x-order" not in (await client.get(path)).headers, path

        # The listing needs `read` and is the same for every tenant.
        made = await client.post(
            "/v1/keys", json={"name": "p", "scopes": ["events:send"]}, headers=auth
        )
        producer = {"Authorization": f"Bearer {made.json()['key']}"}
        forbidden = await client.get("/v1/extensions", headers=producer)
        assert forbidden.status_code == 403
        assert forbidden.json()["code"] == "auth.forbidden"
        made = await client.post("/v1/keys", json={"name": "r", "scopes": ["read"]}, headers=auth)
        reader = {"Authorization": f"Bearer {made.json()['key']}"}
        assert (await client.get("/v1/extensions", headers=reader)).json() == body
        store = open_store(Settings(data_dir=tmp_path / "data").store_target)
        await store.open()
        try:
            other = {"Authorization": f"Bearer {await create_key(store, 't-two', name='two')}"}
        finally:
            await store.close()
        assert (await client.get("/v1/extensions", headers=other)).json() == body

        # A strategy picking a worker outside the pool fails that decision; nothing stored.
        for worker in ("ana", "ben"):
            assert (await client.post("/v1/workers", json={"id": worker}, headers=auth)).is_success
        pool = {
            "id": "desk",
            "strategy": {"name": "stray"},
            "members": [{"worker": "ana"}, {"worker": "ben"}],
        }
        assert (await client.post("/v1/pools", json=pool, headers=auth)).status_code == 201
        rules = {
            "id": "r",
            "default_pool": "desk",
            "kinds": {"lead": {}, "chatty": {}, "half": {}},
        }
        assert (await client.post("/v1/rules", json=rules, headers=auth)).status_code == 201
        failed = await client.post(
            "/v1/route", json={"id": "l-1", "kind": "lead", "attributes": {}}, headers=auth
        )
        assert failed.status_code == 422, failed.text
        assert failed.json()["code"] == "routing.strategy_failed"
        assert "not a candidate" in failed.json()["message"]

        # A validator answering something other than Problems refuses at /kind.
        for kind in ("chatty", "half"):
            refused_routable = await client.post(
                "/v1/route", json={"id": f"k-{kind}", "kind": kind, "attributes": {}}, headers=auth
            )
            assert refused_routable.status_code == 422, refused_routable.text
            assert refused_routable.json()["code"] == "routing.routable_invalid"
            [problem] = refused_routable.json()["details"]
            assert problem["pointer"] == "/kind"
            assert "non-Problem" in problem["message"]
        assert (await client.get("/v1/assignments", headers=auth)).json() == []
        assert not [e for e in module.HEARD if e.name == "routing.decision_made"]
