"""The engine hands the heap's free memory back once it goes quiet after work."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

from ductor_server.engine.clock import ManualClock
from ductor_server.engine.memory import YOUNG_COLLECTION_THRESHOLD, release_free_memory
from ductor_server.engine.runtime import Runtime
from ductor_server.storage import Store

from .conftest import SUCCEEDED, TEST_CONFIG, Engine

ONE_STEP = {
    "family_slug": "one",
    "steps": [{"ref": "a", "type": "STEP_TYPE_ACTION", "args": {"action": "noop"}}],
    "edges": [],
}


def test_release_free_memory_reaches_the_c_library_where_it_has_malloc_trim() -> None:
    # glibc (Linux) has malloc_trim; elsewhere the call says it could do nothing.
    assert release_free_memory() is sys.platform.startswith("linux")


def _trims_reach(runtime: Runtime, count: int) -> Callable[[], Awaitable[bool]]:
    async def reached() -> bool:
        return runtime.trims >= count

    return reached


async def test_the_runtime_trims_after_start_and_after_work_never_while_idle(
    store: Store,
) -> None:
    clock = ManualClock()
    config = dataclasses.replace(TEST_CONFIG, trim_interval=0.05)
    async with Runtime.start(store, config=config, clock=clock) as runtime:
        engine = Engine(store=store, clock=clock, actions=runtime.actions, runtime=runtime)
        await engine.until(_trims_reach(runtime, 1), "the trim after start")
        after_start = runtime.trims
        await engine.publish(ONE_STEP)
        run = await engine.trigger("one", {})
        assert (await engine.wait_run(run.id)).status == SUCCEEDED
        await engine.until(_trims_reach(runtime, after_start + 1), "the trim after the run")
        quiet = runtime.trims
        await asyncio.sleep(0.4)  # eight looks at a quiet engine
        assert runtime.trims == quiet


SERVE_AND_REPORT = """
import gc, json, sys, weakref
import uvicorn
from pathlib import Path
from ductor_server.cli_server import _serve
from ductor_server.settings import Settings

before = {"frozen": gc.get_freeze_count(), "threshold": gc.get_threshold()}

def run(server, sockets=None):
    # Where the server would start serving: what did `_serve` leave the collector?
    class Cycle:
        pass

    a, b = Cycle(), Cycle()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b
    gc.collect()
    print(json.dumps({
        "before": before,
        "frozen": gc.get_freeze_count(),
        "threshold": gc.get_threshold(),
        "cycle_collected": gone() is None,
    }))
    server.started = True

uvicorn.Server.run = run
settings = Settings(data_dir=Path(sys.argv[1]), cel_sandbox=False)
sys.exit(_serve(settings, sockets=[], announce=lambda where: []))
"""


def test_a_server_process_keeps_the_collector_off_its_startup_heap(tmp_path: Path) -> None:
    # In a process of its own (freezing this test process's heap would outlive
    # the test): `_serve` (`ductor serve` and `ductor dev`) freezes what it built
    # before serving and collects the young less often; garbage made after that
    # is still collected.
    done = subprocess.run(
        [sys.executable, "-c", SERVE_AND_REPORT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["before"]["frozen"] == 0
    assert report["before"]["threshold"][0] == 700
    assert report["frozen"] > 10_000  # the modules, classes and functions imported
    assert report["threshold"][0] == YOUNG_COLLECTION_THRESHOLD
    assert report["threshold"][1:] == report["before"]["threshold"][1:]
    assert report["cycle_collected"]
