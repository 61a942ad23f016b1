"""docs/operations.md's backup and restore, under load, with real processes.

A `ductor serve` on a fresh PostgreSQL database (and Redis) holds runs asleep
on a timer and waiting for an event or a signal while quick runs keep
arriving; the doc's `pg_dump` block runs in the middle of that. The dump is
restored into a new database with the doc's `pg_restore` block, and a server
started there, on a Redis prefix of its own and with the old API key, finishes
every run the dump holds: the timers fire, and the events and signals sent
after the restore reach the runs waiting for them.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from ductor_server.pytest_plugin import create_database, drop_database

from .conftest import CHECKOUT, ServerProcess

DOC = CHECKOUT / "docs" / "operations.md"
WAITING = 4
"""Runs of each waiting kind (timer, event, signal)."""


def doc_block(heading: str, language: str = "sh") -> str:
    text = DOC.read_text()
    start = text.index(f"\n{heading}\n")
    end = text.find("\n#", start + 1)
    (block, *_) = re.findall(
        rf"^```{language}\n(.*?)^```", text[start:end], re.DOTALL | re.MULTILINE
    )
    return str(block)


def done(value: str) -> dict[str, str]:
    return {"operation": "project", "project": {"done": value}}


WORKFLOWS: list[dict[str, Any]] = [
    {
        "family_slug": "nap",
        "steps": [
            {"ref": "nap", "type": "STEP_TYPE_WAIT", "args": {"duration": "45s"}},
            {"ref": "wake", "type": "STEP_TYPE_DATAFLOW", "args": done("'rested'")},
        ],
        "edges": [{"source_ref": "nap", "target_ref": "wake"}],
    },
    {
        "family_slug": "ship",
        "steps": [
            {
                "ref": "shipped",
                "type": "STEP_TYPE_WAIT_FOR_EVENT",
                "args": {
                    "event": "order.shipped",
                    "match": "event.data.order == input.order",
                    "timeout": "1h",
                },
            },
            {
                "ref": "close",
                "type": "STEP_TYPE_DATAFLOW",
                "args": done("steps.shipped.output.data.carrier"),
            },
        ],
        "edges": [{"source_ref": "shipped", "target_ref": "close"}],
    },
    {
        "family_slug": "approve",
        "steps": [
            {
                "ref": "approval",
                "type": "STEP_TYPE_WAIT_FOR_SIGNAL",
                "args": {"signal": "approve", "timeout": "1h"},
            },
            {"ref": "close", "type": "STEP_TYPE_DATAFLOW", "args": done("'approved'")},
        ],
        "edges": [{"source_ref": "approval", "target_ref": "close"}],
    },
    {
        "family_slug": "quick",
        "steps": [{"ref": "only", "type": "STEP_TYPE_DATAFLOW", "args": done("'quick'")}],
        "edges": [],
    },
]


class Load:
    """Threads that start `quick` runs one after another until stopped."""

    def __init__(self, server: ServerProcess, threads: int = 2) -> None:
        self.server = server
        self.stopped = threading.Event()
        self.lock = threading.Lock()
        self.started: list[str] = []
        self.threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(threads)]

    def _loop(self) -> None:
        with self.server.client() as http:
            while not self.stopped.is_set():
                response = http.post("/v1/runs", json={"family_slug": "quick", "input": {}})
                assert response.status_code == 201, response.text
                with self.lock:
                    self.started.append(response.json()["id"])

    def count(self) -> int:
        with self.lock:
            return len(self.started)

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        for thread in self.threads:
            thread.join(timeout=60)


def waiting_step(run: dict[str, Any]) -> bool:
    return any(step["status"] == "STEP_STATUS_WAITING" for step in run["steps"])


def every_run(http: httpx.Client) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 500, **({"cursor": cursor} if cursor else {})}
        page = http.get("/v1/runs", params=params).json()
        runs += page["items"]
        cursor = page.get("next_cursor")
        if not cursor:
            return runs


def sh(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"{script}\n{result.stdout}\n{result.stderr}"
    return result


@pytest.mark.timeout(600)
def test_a_dump_taken_mid_load_restores_and_every_run_finishes(
    tmp_path: Path,
    postgres_url: str,
    redis_url: str,
    redis_prefix: str,
    make_server: Callable[..., ServerProcess],
    wait_until: Callable[..., None],
) -> None:
    original = make_server(
        "original",
        database_url=postgres_url,
        env={"DUCTOR_REDIS_URL": redis_url, "DUCTOR_REDIS_PREFIX": redis_prefix},
    ).start()
    with original.client() as http:
        for definition in WORKFLOWS:
            assert http.post("/v1/workflows", json=definition).status_code == 201

        def trigger(slug: str, run_input: dict[str, Any]) -> str:
            response = http.post("/v1/runs", json={"family_slug": slug, "input": run_input})
            assert response.status_code == 201, response.text
            return str(response.json()["id"])

        waiting = {
            slug: [trigger(slug, {"order": i}) for i in range(WAITING)]
            for slug in ("nap", "ship", "approve")
        }

        def all_waiting() -> bool:
            return all(
                waiting_step(http.get(f"/v1/runs/{run_id}").json())
                for ids in waiting.values()
                for run_id in ids
            )

        wait_until(all_waiting, timeout=120, what="every waiting run to wait")

        # The doc's backup, while quick runs keep being started.
        env = {"PATH": "/usr/bin:/bin", "DUCTOR_DATABASE_URL": postgres_url}
        with Load(original) as load:
            wait_until(lambda: load.count() >= 20, timeout=120, what="the load to start")
            before_dump = load.count()
            sh(doc_block("### Backing up"), tmp_path, env)
            after_dump = load.count()
            wait_until(lambda: load.count() >= after_dump + 10, timeout=120, what="more load")
    assert (tmp_path / "ductor.dump").stat().st_size > 0
    original.kill9()  # the machine is lost after the backup

    restore_url = create_database()
    try:
        # The doc's restore, with the `ductor` of this environment on the PATH.
        restore = sh(
            doc_block("### Restoring"),
            tmp_path,
            {
                **env,
                "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
                "RESTORE_URL": restore_url,
            },
        )
        assert restore.stdout.strip() == doc_block("### Restoring", "text").strip()

        # In the restored database, the waiting runs are waiting (on their timer,
        # event or signal), and the quick runs are those started before the dump.
        with psycopg.connect(restore_url) as conn:
            timers = {r[0] for r in conn.execute("SELECT run_id FROM timers").fetchall()}
            waits = {r[0]: r[1] for r in conn.execute("SELECT run_id, kind FROM waits").fetchall()}
            quick = {
                r[0]
                for r in conn.execute("SELECT id FROM runs WHERE family_slug = 'quick'").fetchall()
            }
        assert set(waiting["nap"]) <= timers
        assert {waits.get(run_id) for run_id in waiting["ship"]} == {"event"}
        assert {waits.get(run_id) for run_id in waiting["approve"]} == {"signal"}
        assert set(load.started[:before_dump]) <= quick <= set(load.started)
        assert len(quick) < len(load.started), "runs started after the dump are not in it"
        print(
            f"dump mid-load: {len(quick)} of {len(load.started)} quick runs in it "
            f"({before_dump} started before pg_dump, {after_dump} when it ended), "
            f"{3 * WAITING} runs waiting"
        )

        restored = make_server(
            "restored",
            database_url=restore_url,
            env={"DUCTOR_REDIS_URL": redis_url, "DUCTOR_REDIS_PREFIX": f"{redis_prefix}restored:"},
        )
        restored.api_key = original.api_key  # the keys are in the dump
        restored.start()
        with restored.client() as http:
            for i in range(WAITING):
                sent = http.post(
                    "/v1/events",
                    json={"name": "order.shipped", "data": {"order": i, "carrier": f"c{i}"}},
                )
                assert sent.status_code == 202, sent.text
                # The runs still waiting for the name hear of it; the match picks one.
                notified = set(sent.json()["runs_notified"])
                assert waiting["ship"][i] in notified
                assert notified <= set(waiting["ship"])
            for run_id in waiting["approve"]:
                signal = http.post(f"/v1/runs/{run_id}/signals/approve", json={"payload": "ops"})
                assert signal.status_code == 202, signal.text
        outputs = {
            slug: [restored.wait_for_run(run_id, timeout=180)["output"] for run_id in ids]
            for slug, ids in waiting.items()
        }
        assert outputs["nap"] == [{"wake": {"done": "rested"}}] * WAITING
        assert outputs["ship"] == [{"close": {"done": f"c{i}"}} for i in range(WAITING)]
        assert outputs["approve"] == [{"close": {"done": "approved"}}] * WAITING
        with restored.client() as http:
            for run in every_run(http):
                if run["family_slug"] == "quick" and run["status"] != "RUN_STATUS_SUCCEEDED":
                    assert restored.wait_for_run(run["id"], timeout=120)["status"] == (
                        "RUN_STATUS_SUCCEEDED"
                    )
            runs = every_run(http)
        assert {r["id"] for r in runs if r["family_slug"] == "quick"} == quick
        assert {r["status"] for r in runs} == {"RUN_STATUS_SUCCEEDED"}
        restored.stop()
    finally:
        drop_database(restore_url)
