"""The TypeScript SDK (`packages/ductor-sdk-ts`) against the real thing.

A Ductor server, the Python SDK's example app and the TypeScript example shop
(`examples/shop`, built with `tsc`) run as real processes on 127.0.0.1. The
Node app registers with a signing key of its own; the typed REST client
(`examples/shop/ops.ts`) triggers a workflow that runs steps (two of them in
parallel), sleeps, waits for an event and a signal and invokes a workflow of
the Python app. The Node app is SIGKILLed while the run waits for the event
and started again: the run completes and no step body that completed runs
again. A differential test feeds msgspec's JSON to the SDK's reader and writer
and expects the same bytes back.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from ductor.protocol import INLINE_LIMIT_BYTES
from ductor_server.pytest_plugin import unavailable
from ductor_server.testing import free_port

from .conftest import ChildProcess, ServerProcess

ROOT = Path(__file__).resolve().parent.parent
TS = ROOT / "packages" / "ductor-sdk-ts"
PY_APP = ROOT / "examples" / "bridge_app" / "app.py"
PY_KEY = "signkey-ts-e2e-0001"
TIMEOUT = 60.0


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        unavailable("Node.js", "node (Node 20+) runs the TypeScript SDK's app")
    return node


def _newest(*parts: str) -> float:
    return max(
        (p.stat().st_mtime for part in parts for p in (TS / part).rglob("*.ts")), default=0.0
    )


def _built(node: str) -> None:
    """Build the package (dist/) and the examples (build/) unless they are up to date."""
    npm = shutil.which("npm")
    outputs = [TS / "dist" / "index.js", TS / "build" / "examples" / "shop" / "app.js"]
    fresh = all(p.exists() for p in outputs) and min(p.stat().st_mtime for p in outputs) >= _newest(
        "src", "examples"
    )
    if fresh:
        return
    assert npm is not None, "npm is needed to build packages/ductor-sdk-ts"
    if not (TS / "node_modules").is_dir():
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=TS, check=True)
    subprocess.run([npm, "run", "build"], cwd=TS, check=True)
    subprocess.run([npm, "run", "build:test"], cwd=TS, check=True)


class Process(ChildProcess):
    """A restartable app process whose output goes to a log file."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], log: Path, health: str):
        self.name, self.args, self.env, self.log_path, self.health = name, args, env, log, health
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Process:
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(self.args, env=self.env, stdout=out, stderr=out)
        deadline = time.monotonic() + TIMEOUT
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.health, timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name} not up in {TIMEOUT}s:\n{self.log()}")
            time.sleep(0.05)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class Stack:
    """The server, the Python app, the Node app, and the Node ops script."""

    def __init__(self, node: str, server: ServerProcess, tmp: Path) -> None:
        self.node, self.server, self.tmp = node, server, tmp
        self.steps_log = tmp / "ts-steps.log"
        self.py_log = tmp / "py-steps.log"
        base = {k: v for k, v in os.environ.items() if not k.startswith(("DUCTOR_", "BRIDGE_"))}
        self.env = {**base, "DUCTOR_URL": server.url, "DUCTOR_API_KEY": server.api_key}
        py_port, ts_port = free_port(), free_port()
        py_url = f"http://127.0.0.1:{py_port}/api/ductor"
        self.py = Process(
            "python app",
            [sys.executable, str(PY_APP), "--port", str(py_port)],
            {
                **self.env,
                "DUCTOR_BRIDGE_SIGNING_KEY": PY_KEY,
                "BRIDGE_APP_URL": py_url,
                "BRIDGE_APP_LOG": str(self.py_log),
                "PYTHONUNBUFFERED": "1",
            },
            tmp / "py-app.out",
            py_url,
        )
        with server.client() as http:
            created = http.post("/v1/bridge/apps/ts-shop/keys")
            assert created.status_code == 201, created.text
            ts_key: str = created.json()["signing_key"]
        ts_url = f"http://127.0.0.1:{ts_port}/api/ductor"
        self.ts = Process(
            "node app",
            [node, str(TS / "build" / "examples" / "shop" / "app.js")],
            {
                **self.env,
                "DUCTOR_SIGNING_KEY": ts_key,
                "APP_URL": ts_url,
                "APP_PORT": str(ts_port),
                "APP_LOG": str(self.steps_log),
                "PY_APP_ID": "shop",
            },
            tmp / "ts-app.out",
            ts_url,
        )

    def ops(self, *args: str) -> str:
        """Run the typed REST client (`examples/shop/ops.ts`); its standard output."""
        done = subprocess.run(
            [self.node, str(TS / "build" / "examples" / "shop" / "ops.js"), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=150,
        )
        assert done.returncode == 0, f"ops {args}: {done.stdout}\n{done.stderr}"
        return done.stdout.strip()

    def step_bodies(self) -> list[str]:
        if not self.steps_log.exists():
            return []
        return self.steps_log.read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    node = _node()
    _built(node)
    tmp = tmp_path_factory.mktemp("ts-sdk")
    server = ServerProcess(data_dir=tmp / "data", env={"DUCTOR_BRIDGE_SIGNING_KEY": PY_KEY})
    started = Stack(node, server.start(), tmp)
    try:
        started.py.start()
        started.ts.start()
        yield started
    finally:
        started.ts.stop()
        started.py.stop()
        server.stop()


def _wait(what: str, check: Callable[[], Any], stack: Stack) -> Any:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        if got := check():
            return got
        time.sleep(0.1)
    raise AssertionError(
        f"never got {what}\n--- node app\n{stack.ts.log()[-3000:]}\n"
        f"--- server\n{stack.server.log()[-3000:]}"
    )


def _waiting_for(stack: Stack, run_id: str, what: str) -> bool:
    with stack.server.client() as http:
        run = http.get(f"/v1/runs/{run_id}").json()
    return any(step.get("waiting_for") == what for step in run["steps"])


def test_a_node_app_runs_every_primitive_and_survives_sigkill(stack: Stack) -> None:
    def registered() -> list[dict[str, Any]] | None:
        with stack.server.client() as http:
            listed: list[dict[str, Any]] = http.get("/v1/bridge/apps").json()
        return listed if {a["app_id"] for a in listed} >= {"shop", "ts-shop"} else None

    apps = _wait("both apps registered", registered, stack)
    ts_app = next(a for a in apps if a["app_id"] == "ts-shop")
    assert ts_app["sdk"] == "ductor-typescript"
    assert sorted(ts_app["workflows"]) == ["fulfil", "shout"]

    run_id = stack.ops("trigger", '{"id": 7, "total": 500}', "order-7")
    assert stack.ops("trigger", '{"id": 7, "total": 500}', "order-7") == run_id  # deduped

    _wait("the event wait", lambda: _waiting_for(stack, run_id, "event ts.order.shipped"), stack)
    done_before = stack.step_bodies()
    assert sorted(done_before) == ["charge", "label-box", "label-invoice"], done_before

    stack.ts.kill9()  # no shutdown code runs
    stack.ts.start()

    other = stack.ops("event", "ts.order.shipped", '{"order_id": 8, "carrier": "dhl"}')
    assert json.loads(other)["name"] == "ts.order.shipped"  # its match does not hold: ignored
    stack.ops("event", "ts.order.shipped", '{"order_id": 7, "carrier": "ups"}')
    _wait("the signal wait", lambda: _waiting_for(stack, run_id, "signal approve"), stack)
    signalled = json.loads(stack.ops("signal", run_id, "approve", '"ops"'))
    assert (signalled["run_id"], signalled["name"]) == (run_id, "approve")

    run = json.loads(stack.ops("wait", run_id))
    assert run["status"] == "RUN_STATUS_SUCCEEDED", run
    assert run["family_slug"] == "bridge:ts-shop:fulfil"
    assert run["output"] == {
        "charge": {"charge_id": "ch_7", "amount": 500},
        "labels": ["box-7", "invoice-7"],
        "carrier": "ups",
        "approvedBy": "ops",
        "receipt": {"sent": True, "charge_id": "ch_7"},
        "done": "order 7 done",
    }
    bodies = stack.step_bodies()
    assert sorted(bodies) == ["charge", "finish", "label-box", "label-invoice"], bodies
    python_bodies = stack.py_log.read_text(encoding="utf-8").splitlines()
    assert python_bodies.count("done send") == 1, python_bodies
    steps = {s["ref"]: s["status"] for s in run["steps"]}
    for ref in ("charge", "label-box", "cool-off", "shipped", "approval", "receipt", "finish"):
        assert steps[ref] == "STEP_STATUS_SUCCEEDED", steps


def test_a_large_run_travels_by_reference_to_the_node_app(stack: Stack) -> None:
    text = "x" * (INLINE_LIMIT_BYTES * 6 // 10)  # under the API's body limit
    assert 2 * len(text) > INLINE_LIMIT_BYTES  # input + the first result: by reference
    with stack.server.client() as http:
        started = http.post("/v1/runs", json={"family_slug": "bridge:ts-shop:shout", "input": text})
        assert started.status_code == 201, started.text
        run_id = started.json()["id"]
        # The second execute (input + the first step's result) is above the inline
        # limit: the Node app fetches it, signed with its own key and a nonce.
        run = stack.server.wait_for_run(run_id, timeout=TIMEOUT)
        assert run["status"] == "RUN_STATUS_SUCCEEDED", run["error"]
        assert run["output"] == len(text)
        history = http.get(f"/v1/runs/{run_id}/history").json()
    assert [s["ref"] for s in run["steps"] if s["ref"] != "_bridge"] == ["upper", "length"]
    assert history


# ---------------------------------------------------------------- JSON, byte for byte

_READ_WRITE = """
import { createInterface } from "node:readline";
import { parseJson, stringifyJson } from "%s";
const out = [];
for await (const line of createInterface({ input: process.stdin })) {
  out.push(stringifyJson(parseJson(JSON.parse(line))));
}
process.stdout.write(JSON.stringify(out));
"""


def _values(rng: random.Random) -> list[Any]:
    """Values msgspec writes: floats of every magnitude, big integers, hard strings, nesting."""
    floats = [rng.uniform(-1, 1) * 10.0 ** rng.randint(-320, 308) for _ in range(1500)]
    floats += [rng.random() for _ in range(300)] + [5e-324, 1.7976931348623157e308, 1e16, 1e-5]
    floats += [2.0**60, -9.5e15, 1e300]
    # A double with a small integral value (1.0) comes back as an integer: JavaScript
    # has one number type (docs/sdk-typescript.md says so); the test covers the rest.
    floats = [f for f in floats if not (f.is_integer() and abs(f) <= 2**53)]
    ints = [rng.randint(-(2**70), 2**70) for _ in range(200)] + [2**53, -(2**53) + 1, 0]
    chars = 'aé\u2028\u2029\x00\x1f\x7f"\\/\n\t😀\ufeff'
    strings = ["".join(rng.choice(chars) for _ in range(rng.randint(0, 12))) for _ in range(200)]
    nested = [
        {"k": f, "list": [i, s, None, True]} for f, i, s in zip(floats, ints, strings, strict=False)
    ]
    return [*floats, *ints, *strings, *nested[:100]]


def test_the_json_writer_matches_msgspec_byte_for_byte(tmp_path: Path) -> None:
    node = _node()
    _built(node)
    values = _values(random.Random(20_261_129))
    wires = [msgspec.json.encode(v).decode() for v in values]
    script = tmp_path / "read_write.mjs"
    script.write_text(_READ_WRITE % (TS / "dist" / "json.js").as_uri(), encoding="utf-8")
    done = subprocess.run(
        [node, str(script)],
        input="\n".join(json.dumps(w) for w in wires),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    again: list[str] = json.loads(done.stdout)
    mismatches = [(w, a) for w, a in zip(wires, again, strict=True) if w != a]
    assert not mismatches, mismatches[:10]
    assert len(wires) > 2000


def test_an_app_installs_the_package_by_path_as_the_docs_say(tmp_path: Path) -> None:
    """docs/sdk-typescript.md: `npm install "$DUCTOR/packages/ductor-sdk-ts"` in an app."""
    node = _node()
    _built(node)
    npm = shutil.which("npm")
    assert npm is not None
    app = tmp_path / "app"
    app.mkdir()
    (app / "package.json").write_text('{"name": "app", "private": true, "type": "module"}')
    subprocess.run(
        [npm, "install", str(TS), "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=app,
        check=True,
        timeout=120,
    )
    (app / "index.js").write_text(
        'import { Ductor, SDK_NAME } from "@ductor/sdk";\n'
        'import { fetchHandler } from "@ductor/sdk/fetch";\n'
        'const ductor = new Ductor({ appId: "a", signingKey: "k" });\n'
        "const health = await fetchHandler(ductor)(new Request('http://x/api/ductor'));\n"
        "console.log(SDK_NAME, (await health.json()).status);\n"
    )
    done = subprocess.run(
        [node, "index.js"], cwd=app, capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "ductor-typescript ok"
