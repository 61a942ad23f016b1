"""The engine hands the heap's free memory back once it goes quiet after work."""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from collections.abc import Awaitable, Callable

from ductor_server.engine.clock import ManualClock
from ductor_server.engine.memory import release_free_memory
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
