"""Lanes that run CPU-heavy pure work (validating definitions, compiling and
evaluating CEL, the tick) off the event loop, a few calls at a time.

A call that can be pickled runs in one of the lane's worker processes: the CEL
engines hold the GIL while they evaluate (cel-rust for a whole evaluation), so
a thread alone would still stall the loop. Anything else runs in a worker
thread. A lane only bounds and runs; it opens no transaction and keeps no
state beyond its slots and processes, so callers decide what runs where (never
inside an open transaction).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import multiprocessing
import os
import pickle
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, ParamSpec, TypeVar

from ductor_core.builtin_steps import BUILTIN_STEP_SPECS
from ductor_core.expressions import ExpressionEngine, default_engine, engine_by_name
from ductor_core.step_specs import StepSpecs
from ductor_server.engine.errors import OffloadFailed

P = ParamSpec("P")
T = TypeVar("T")


class _OnLoop:
    """A lane's asyncio state on one loop (asyncio primitives bind to one): its
    slots, and each tenant's share of them with the calls using that share."""

    def __init__(self, slots: int) -> None:
        self.slots = asyncio.Semaphore(slots)
        self.turns: dict[str, tuple[asyncio.Semaphore, list[int]]] = {}


class Lane:
    """A bounded set of worker-thread slots for one kind of heavy work.

    At most `slots` calls run at once; the others wait their turn on the event
    loop, holding nothing but their arguments. Separate lanes keep a flood of
    one kind (tenants validating huge definitions) from starving another (the
    coordinator's ticks). Lanes are shared by a whole process, and work on any
    event loop (tests run several).

    Args:
        name: what the lane runs, for logs and metrics.
        slots: how many calls may run in threads at once.
    """

    def __init__(self, name: str, slots: int, *, processes: bool = True) -> None:
        if slots < 1:
            raise ValueError("a lane needs at least one slot")
        self.name = name
        self.slots = slots
        self.processes = processes  # False: every call runs in a thread
        self._threads = ThreadPoolExecutor(max_workers=slots, thread_name_prefix=f"ductor-{name}")
        self._pool: ProcessPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self.waiting = 0  # calls queued for a slot right now
        self.running = 0  # calls in a thread right now
        self.calls = 0  # calls given a slot since the process started
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _OnLoop] = (
            weakref.WeakKeyDictionary()
        )

    def _on_loop(self) -> _OnLoop:
        loop = asyncio.get_running_loop()
        state = self._loops.get(loop)
        if state is None:
            state = self._loops[loop] = _OnLoop(self.slots)
        return state

    async def run_for(
        self, key: str, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """`run`, for the tenant `key`: one key holds at most all slots but one at
        once (its further calls wait their turn, holding nothing), so a tenant
        that floods the lane leaves a slot to every other."""
        if self.slots < 2:
            return await self.run(fn, *args, **kwargs)
        turns = self._on_loop().turns
        share, users = turns.get(key) or turns.setdefault(
            key, (asyncio.Semaphore(self.slots - 1), [0])
        )
        users[0] += 1
        try:
            async with share:
                return await self.run(fn, *args, **kwargs)
        finally:
            users[0] -= 1
            if not users[0]:
                del turns[key]  # no key is kept once its calls are done

    async def run(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Call `fn(*args, **kwargs)` once a slot is free: in a worker process if
        the call pickles (and the lane uses processes), else in a worker thread.

        Pickling happens in the thread, never on the loop. Cancelling the caller
        does not stop a call already running; the slot is held until the call
        ends, so the bound holds even then.

        Raises:
            OffloadFailed: a worker process died during the call.
        """
        semaphore = self._on_loop().slots
        self.waiting += 1
        try:
            await semaphore.acquire()
        finally:
            self.waiting -= 1
        self.running += 1
        self.calls += 1
        released = False

        def release(done: asyncio.Future[T] | None = None) -> None:
            nonlocal released
            if done is not None and not done.cancelled():
                done.exception()  # retrieved here when the caller has gone
            if not released:
                released = True
                self.running -= 1
                semaphore.release()

        try:
            # The lane's own threads: the loop's default executor also serves
            # name resolution and must not wait behind heavy work.
            context = contextvars.copy_context()
            task = asyncio.get_running_loop().run_in_executor(
                self._threads, functools.partial(context.run, self._call, fn, args, kwargs)
            )
        except BaseException:
            release()
            raise
        task.add_done_callback(release)
        # Shield: a cancelled caller leaves the thread to finish and free the slot.
        return await asyncio.shield(task)

    def _call(self, fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
        # In a worker thread: hand the call to a process when it pickles.
        if not self.processes:
            return fn(*args, **kwargs)
        try:
            payload = pickle.dumps((fn, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # a closure, a lock, an engine only this process has
            return fn(*args, **kwargs)
        pool = self._process_pool()
        try:
            result: T = pool.submit(_call_pickled, payload).result()
        except BrokenProcessPool as exc:
            self._drop_pool(pool)
            raise OffloadFailed(
                f"a {self.name} worker process died during the call; it has been replaced"
            ) from exc
        return result

    def _process_pool(self) -> ProcessPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                # Spawned, not forked: the server has threads, a loop and open sockets.
                self._pool = ProcessPoolExecutor(
                    max_workers=self.slots,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=_start_worker,
                    initargs=(tuple(_WORKER_SETUP),),
                )
            return self._pool

    def _drop_pool(self, pool: ProcessPoolExecutor) -> None:
        with self._pool_lock:
            if self._pool is pool:
                self._pool = None
        pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        """Stop the lane's worker processes (new calls start new ones)."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


_WORKER_SETUP: list[Callable[[], object]] = []


def add_worker_setup(setup: Callable[[], object]) -> None:
    """Call `setup()` in each lane worker process as it starts, before any call
    (registering plugin CEL functions before an engine is built there).

    `setup` must be a module-level function (it is pickled by name); it applies
    to the worker processes started after this call. Adding one twice adds it once.
    """
    if setup not in _WORKER_SETUP:
        _WORKER_SETUP.append(setup)


def _start_worker(setup: tuple[Callable[[], object], ...] = ()) -> None:
    # Heavy tenant work yields the CPU to the processes that answer requests.
    os.nice(WORKER_NICENESS)
    for step in setup:
        step()
    # A worker outlives a killed server otherwise (it waits on a queue whose
    # writing end it holds itself): leave once the parent is gone.
    parent = os.getppid()
    threading.Thread(target=_exit_with, args=(parent,), daemon=True).start()


def _exit_with(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK_SECONDS)
    os._exit(0)


PARENT_CHECK_SECONDS = 1.0
"""How often a worker process checks that the process that started it still runs."""


WORKER_NICENESS = 10
"""How much lower the scheduling priority of a lane's worker processes is."""


def _call_pickled(payload: bytes) -> Any:
    fn, args, kwargs = pickle.loads(payload)
    return fn(*args, **kwargs)


def portable_engine(engine: ExpressionEngine | None) -> ExpressionEngine | str:
    """`engine`, or its name when that names the same process-wide engine, so a
    call can be sent to a worker process (which rebuilds it by name)."""
    found = engine or default_engine()
    try:
        named = engine_by_name(found.name)
    except ValueError:
        return found
    return found.name if named is found else found


def portable_specs(specs: StepSpecs) -> StepSpecs | None:
    """None for the built-in step types (a worker process has them), else `specs`."""
    return None if specs is BUILTIN_STEP_SPECS else specs


def resolve_engine(engine: ExpressionEngine | str | None) -> ExpressionEngine:
    """The engine a `portable_engine` result stands for."""
    if isinstance(engine, str):
        return engine_by_name(engine)
    return engine or default_engine()


def resolve_specs(specs: StepSpecs | None) -> StepSpecs:
    """The step types a `portable_specs` result stands for."""
    return BUILTIN_STEP_SPECS if specs is None else specs


VALIDATION = Lane("validation", 2)
"""Validating definitions and compiling configuration sent by tenants."""

ENGINE = Lane("engine", 2)
"""The engine's pure work: ticks, first ticks of new runs, trigger filters."""

ISOLATION = Lane("isolation", 1)
"""One call at a time: the tick of a run whose tick a worker process died in
(see `Coordinator._died`), so that a worker that dies there dies of that tick
alone and takes no other call with it."""


__all__ = [
    "ENGINE",
    "ISOLATION",
    "VALIDATION",
    "Lane",
    "add_worker_setup",
    "portable_engine",
    "portable_specs",
    "resolve_engine",
    "resolve_specs",
]
