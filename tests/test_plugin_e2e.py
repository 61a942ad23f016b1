"""The example plugin (examples/plugin) end to end: built into a wheel, installed into a
fresh virtual environment beside the server, and driven through a real `ductor dev`
process started from that environment.

Everything is offline: the environment gets the locked third-party packages from
uv's cache (`uv sync --locked --offline --no-install-workspace`), and the
workspace's packages and the plugin as wheels built from this checkout
(`uv build --offline`). Each of the eight extension points is exercised through
the API: listed at /v1/extensions, a pool routed with the plugin's strategy and
enricher, CEL with the plugin's function (in the sandbox's child processes too),
a workflow with the plugin's step type, the middleware's audit log, the hook's
observations, and a routable refused by the plugin's kind validator.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from ductor_server.testing import free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "examples" / "plugin"
DIST = "ductor-example-plugin"
GROUPS = (
    "ductor.routing.strategies",
    "ductor.routing.enrichers",
    "ductor.cel.functions",
    "ductor.providers",
    "ductor.steps",
    "ductor.middleware",
    "ductor.hooks",
    "ductor.kinds",
)
NAMES = {
    "ductor.routing.strategies": "example_last",
    "ductor.routing.enrichers": "example_size",
    "ductor.cel.functions": "example_slug",
    "ductor.providers": "echo",
    "ductor.steps": "example_shout",
    "ductor.middleware": "example_audit",
    "ductor.hooks": "example_record",
    "ductor.kinds": "invoice",
}


def _run(command: list[str], *, env: dict[str, str] | None = None, cwd: Path = ROOT) -> str:
    result = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, f"{' '.join(command)}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment holding the server and the example plugin."""
    uv = shutil.which("uv")
    assert uv is not None, "uv is needed to build the plugin's environment (scripts/_uv.sh)"
    place = tmp_path_factory.mktemp("plugin-env")
    env_dir, wheels = place / "venv", place / "wheels"
    # uv's own settings (its cache above all) stay; the environment it targets is ours.
    drop = ("VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["UV_PYTHON_DOWNLOADS"] = "never"
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    # The locked third-party packages only, from uv's cache.
    sync = [uv, "sync", "--quiet", "--offline", "--locked", "--all-packages", "--no-dev"]
    _run(
        [*sync, "--no-install-workspace", "--python", python],
        env={**env, "UV_PROJECT_ENVIRONMENT": str(env_dir)},
    )
    # The workspace's packages as built from this checkout, then the plugin.
    build = [uv, "build", "--quiet", "--offline", "--wheel", "-o", str(wheels)]
    _run([*build, "--all-packages"], env=env)
    _run([*build, str(PLUGIN)], env=env)
    built = sorted(str(p) for p in wheels.glob("*.whl"))
    assert len(built) == 7, built  # six packages of the workspace, then the plugin
    install = [uv, "pip", "install", "--quiet", "--offline", "--no-deps"]
    _run([*install, "--python", str(env_dir / "bin" / "python"), *built], env=env)
    return env_dir


def _listing(venv: Path) -> dict[str, Any]:
    out = _run([str(venv / "bin" / "ductor"), "extensions", "list", "--json"])
    listing: dict[str, Any] = json.loads(out)
    return listing


def test_the_cli_lists_one_extension_of_each_point(venv: Path) -> None:
    listing = _listing(venv)
    assert listing["failures"] == []
    assert [p["group"] for p in listing["points"]] == list(GROUPS)
    for point in listing["points"]:
        [ext] = point["extensions"]
        assert ext["name"] == NAMES[point["group"]]
        assert (ext["distribution"], ext["version"]) == (DIST, "0.1.0")
        assert ext["object"].startswith("ductor_example_plugin.")


EQUIVALENCE = r"""
import json, sys
from ductor_core.errors import ExpressionError
from ductor_core.expressions import CelPyEngine, CelRustEngine, default_registry
from ductor_server.extensions import install_cel_functions
from ductor_example_plugin.functions import EXAMPLES

assert install_cel_functions() == ("example_slug",)
corpus = json.load(open(sys.argv[1]))
engines = (CelPyEngine(functions=default_registry()), CelRustEngine(functions=default_registry()))

def outcome(engine, expr, activation):
    try:
        return ["value", engine.evaluate(expr, activation)]
    except ExpressionError as exc:
        return ["error", exc.code]

def typed(value):
    return json.dumps(value, sort_keys=True) + type(value).__name__

differ = []
for case in corpus["cases"]:
    if "differs" in case:
        continue
    activation = corpus["activations"][case.get("activation", "default")]
    a, b = (outcome(e, case["expr"], activation) for e in engines)
    if typed(a) != typed(b):
        differ.append(case["id"])
answers = []
for expr, expected in EXAMPLES:
    found = [outcome(e, expr, {}) for e in engines]
    answers.append([expr, expected, found])
print(json.dumps({"differ": differ, "cases": len(corpus["cases"]), "examples": answers}))
"""


def test_the_plugins_cel_function_agrees_on_both_engines_over_the_corpus(venv: Path) -> None:
    corpus = ROOT / "packages" / "ductor-core" / "tests" / "data" / "cel_corpus.json"
    result = json.loads(_run([str(venv / "bin" / "python"), "-c", EQUIVALENCE, str(corpus)]))
    assert result["differ"] == []
    assert result["cases"] >= 150
    for expr, expected, found in result["examples"]:
        assert found == [["value", expected], ["value", expected]], expr


COMPOSED = r"""
import dataclasses, sys
from pathlib import Path
from ductor_server import Settings
from ductor_server.composition import build

settings = dataclasses.replace(
    Settings(data_dir=Path(sys.argv[1])),
    cel_engine="cel-rust",
    cel_sandbox=True,
    cel_sandbox_threshold=1,
)
c = build(settings)
provider = c.providers.get("echo")
print(provider.name, c.providers.origin("echo"), ",".join(sorted(provider.operations)))
# Sandboxed: evaluated by a child process, which registered the function itself.
print(c.expressions.evaluate('example_slug("Sand Box")', {}), len(c.expressions.pool.pids()))
c.expressions.close()
"""


def test_the_processes_composition_has_the_provider_and_the_sandbox_the_function(
    venv: Path, tmp_path: Path
) -> None:
    out = _run([str(venv / "bin" / "python"), "-c", COMPOSED, str(tmp_path)])
    assert out.splitlines() == [f"echo {DIST} echo", "sand-box 1"]


@dataclass
class Server:
    url: str
    key: str
    proc: subprocess.Popen[bytes]
    log: Path
    audit: Path
    hooks: Path

    def http(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {self.key}"}, timeout=30
        )

    def events(self) -> list[dict[str, Any]]:
        if not self.hooks.exists():
            return []
        return [json.loads(line) for line in self.hooks.read_text().splitlines()]

    def wait_for_event(self, name: str, **data: Any) -> dict[str, Any]:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            for event in self.events():
                if event["name"] == name and all(
                    event["data"].get(k) == v for k, v in data.items()
                ):
                    return event
            time.sleep(0.1)
        raise AssertionError(f"no {name} {data} in {self.events()}\n{self.log.read_text()[-3000:]}")


@pytest.fixture
def server(venv: Path, tmp_path: Path) -> Iterator[Server]:
    data = tmp_path / "data"
    port = free_port()
    audit, hooks, log = tmp_path / "audit.jsonl", tmp_path / "hooks.jsonl", tmp_path / "server.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DUCTOR_", "VIRTUAL_ENV"))}
    env.update(
        {
            "PYTHONUNBUFFERED": "1",
            "DUCTOR_POLL_INTERVAL": "0.1",
            "DUCTOR_CEL_ENGINE": "cel-rust",
            # Every expression above this (tiny) estimate runs in the sandbox's
            # child processes, which must know the plugin's function too.
            "DUCTOR_CEL_SANDBOX": "true",
            "DUCTOR_CEL_SANDBOX_THRESHOLD": "1",
            "DUCTOR_EXAMPLE_AUDIT_LOG": str(audit),
            "DUCTOR_EXAMPLE_HOOK_LOG": str(hooks),
        }
    )
    command = [str(venv / "bin" / "ductor"), "dev", "--port", str(port), "--data-dir", str(data)]
    with log.open("wb") as out:
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"not ready in 60 s:\n{log.read_text()}"
            time.sleep(0.1)
        key = (data / "api_key").read_text().strip()
        yield Server(url=url, key=key, proc=proc, log=log, audit=audit, hooks=hooks)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


SHOUT_FLOW = {
    "family_slug": "shouts",
    "title": "Shout a slug",
    "steps": [
        {
            "ref": "shout",
            "type": "STEP_TYPE_EXAMPLE_SHOUT",
            "title": "Shout",
            "args": {"text": "example_slug(input.title)", "times": 2},
        },
        {
            "ref": "check",
            "type": "STEP_TYPE_DATAFLOW",
            "title": "Slug again",
            "args": {
                "operation": "project",
                "project": {"slug": "example_slug(steps.shout.output.shouted)"},
            },
        },
    ],
    "edges": [{"source_ref": "shout", "target_ref": "check", "type": "EDGE_TYPE_SUCCESS"}],
}


def test_every_point_through_the_api(server: Server) -> None:
    with server.http() as http:
        # 1. The listing: all eight, from the plugin's distribution, nothing failed.
        listing = http.get("/v1/extensions")
        assert listing.status_code == 200, listing.text
        body = listing.json()
        assert body["failures"] == []
        assert {p["group"]: [e["name"] for e in p["extensions"]] for p in body["points"]} == {
            g: [NAMES[g]] for g in GROUPS
        }
        assert {e["distribution"] for p in body["points"] for e in p["extensions"]} == {DIST}

        # 5 and 3. A workflow with the plugin's step type and CEL function.
        published = http.post("/v1/workflows", json=SHOUT_FLOW)
        assert published.status_code == 201, published.text
        run = http.post("/v1/runs", json={"family_slug": "shouts", "input": {"title": "Hi, There"}})
        assert run.status_code == 201, run.text
        run_id = run.json()["id"]
        deadline = time.monotonic() + 30
        while True:
            found = http.get(f"/v1/runs/{run_id}").json()
            if found["status"] not in ("RUN_STATUS_PENDING", "RUN_STATUS_RUNNING"):
                break
            assert time.monotonic() < deadline, found
            time.sleep(0.1)
        assert found["status"] == "RUN_STATUS_SUCCEEDED", found
        [shout] = [s for s in found["steps"] if s["ref"] == "shout"]
        assert shout["output"] == {"shouted": "HI-THERE HI-THERE"}
        assert found["output"] == {"check": {"slug": "hi-there-hi-there"}}

        # 1, 2 and 3. A pool routed with the plugin's strategy; the plugin's enricher
        # sets `size`, and a rule reads it and calls the plugin's function.
        for worker in ("ana", "ben", "cy"):
            made = http.post("/v1/workers", json={"id": worker, "capacity": {"leads": 10}})
            assert made.status_code in (200, 201), made.text
        for pool, members in (("big", ["ana", "ben"]), ("small", ["cy"])):
            made = http.post(
                "/v1/pools",
                json={
                    "id": pool,
                    "channel": "leads",
                    "strategy": {"name": "example_last"},
                    "members": [{"worker": w} for w in members],
                },
            )
            assert made.status_code in (200, 201), made.text
        rules = http.post(
            "/v1/rules",
            json={
                "id": "main",
                "default_pool": "small",
                "rules": [
                    {
                        "id": "large-vip",
                        "when": "attributes.size == 'large'"
                        " && example_slug(attributes.name) == 'vip-lead'",
                        "pool": "big",
                    }
                ],
                "kinds": {"lead": {}, "invoice": {}},
                "enrichers": [{"plugin": "example_size", "options": {"threshold": 100}}],
            },
        )
        assert rules.status_code == 201, rules.text
        routed = http.post(
            "/v1/route",
            json={
                "id": "lead-1",
                "kind": "lead",
                "attributes": {"amount": 500, "name": "VIP Lead"},
            },
        )
        assert routed.status_code == 201, routed.text
        decision = routed.json()
        assert (decision["pool"], decision["worker"]) == ("big", "ben"), decision
        small = http.post(
            "/v1/route",
            json={"id": "lead-2", "kind": "lead", "attributes": {"amount": 5, "name": "VIP Lead"}},
        )
        assert small.status_code == 201, small.text
        assert (small.json()["pool"], small.json()["worker"]) == ("small", "cy")

        # 8. The plugin's validator refuses a bad invoice, every problem with a pointer.
        refused = http.post(
            "/v1/route",
            json={"id": "inv-1", "kind": "invoice", "attributes": {"amount": -3, "currency": "eu"}},
        )
        assert refused.status_code == 422, refused.text
        error = refused.json()
        assert error["code"] == "routing.routable_invalid"
        assert [p["pointer"] for p in error["details"]] == [
            "/attributes/amount",
            "/attributes/currency",
        ]
        good = http.post(
            "/v1/route",
            json={"id": "inv-2", "kind": "invoice", "attributes": {"amount": 3, "currency": "EUR"}},
        )
        assert good.status_code == 201, good.text

        # 7. A ledger entry, for the hook to see.
        for code, kind in (("cash", "asset"), ("wallet:b", "liability")):
            opened = http.post("/v1/accounts", json={"code": code, "currency": "USD", "kind": kind})
            assert opened.status_code == 201, opened.text
        posted = http.post(
            "/v1/ledger/entries",
            json={
                "description": "top-up",
                "postings": [
                    {"account": "cash", "amount": 5_000_000, "currency": "USD"},
                    {"account": "wallet:b", "amount": -5_000_000, "currency": "USD"},
                ],
            },
        )
        assert posted.status_code == 201, posted.text
        entry_id = posted.json()["id"]

        # 4. The provider `echo` (listed above) serves a connection, and an ACTION
        # step through that connection runs its operation.
        providers = {p["name"]: p for p in http.get("/v1/providers").json()}
        assert providers["echo"]["origin"] == "ductor-example-plugin", providers["echo"]
        assert [o["name"] for o in providers["echo"]["operations"]] == ["echo"]
        made = http.post(
            "/v1/connections",
            json={"name": "loud", "provider": "echo", "config": {"prefix": ">> "}},
        )
        assert made.status_code == 201, made.text
        checked = http.post("/v1/connections/loud/test").json()
        assert checked["ok"] is True, checked
        echoed = http.post(
            "/v1/workflows",
            json={
                "family_slug": "echo-through-a-connection",
                "steps": [
                    {
                        "ref": "say",
                        "type": "STEP_TYPE_ACTION",
                        "args": {
                            "connection": "loud",
                            "operation": "echo",
                            "input": {"message": "example_slug(input.text)"},
                        },
                    }
                ],
                "edges": [],
            },
        )
        assert echoed.status_code == 201, echoed.text
        unknown = http.post(
            "/v1/workflows/validate",
            json={
                "family_slug": "echo-wrong-operation",
                "steps": [
                    {
                        "ref": "say",
                        "type": "STEP_TYPE_ACTION",
                        "args": {"connection": "loud", "operation": "shout", "input": {}},
                    }
                ],
                "edges": [],
            },
        )
        assert "/steps/0/args/operation" in unknown.text, unknown.text
        started = http.post(
            "/v1/runs",
            json={"family_slug": "echo-through-a-connection", "input": {"text": "Hello There"}},
        )
        assert started.status_code == 201, started.text
        echo_run = started.json()["id"]
        deadline = time.monotonic() + 30
        while (said := http.get(f"/v1/runs/{echo_run}").json())["status"] in (
            "RUN_STATUS_PENDING",
            "RUN_STATUS_RUNNING",
        ):
            assert time.monotonic() < deadline, said
            time.sleep(0.1)
        assert said["status"] == "RUN_STATUS_SUCCEEDED", said
        [say] = said["steps"]
        assert say["output"] == {
            "message": ">> hello-there",
            "idempotency_key": f"{echo_run}:say:-1:{say['attempt']}",
        }

    # 7. The hook saw the server start, the run finish, the decisions and the entry.
    assert server.events()[0]["name"] == "server.started"
    finished = server.wait_for_event("run.finished", run_id=run_id)
    assert finished["data"]["status"] == "RUN_STATUS_SUCCEEDED"
    assert finished["tenant_id"]
    server.wait_for_event("routing.decision_made", id=decision["id"], worker="ben")
    server.wait_for_event("ledger.entry_posted", id=entry_id)
    assert not any(
        e["name"] == "routing.decision_made" and e["data"].get("routable_id") == "inv-1"
        for e in server.events()
    ), "a refused routable is no decision"

    # 6. The middleware's audit log: one line per /v1 request, with its status.
    audited = [json.loads(line) for line in server.audit.read_text().splitlines()]
    assert {"method": "GET", "path": "/v1/extensions", "status": 200} in [
        {k: a[k] for k in ("method", "path", "status")} for a in audited
    ]
    assert {"method": "POST", "path": "/v1/route", "status": 422} in [
        {k: a[k] for k in ("method", "path", "status")} for a in audited
    ]
    assert {a["key"] for a in audited} == {server.key[:12]}
    assert not any(a["path"] == "/readyz" for a in audited), "only /v1 routes are wrapped"

    # 7. Stopping: the hook is told before the process ends.
    server.proc.terminate()
    server.proc.wait(timeout=30)
    assert server.events()[-1]["name"] == "server.stopping", server.events()[-3:]
