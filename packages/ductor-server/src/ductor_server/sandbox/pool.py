"""A small pool of sandbox processes that evaluate CEL under a memory cap and a deadline.

Each process is `ductor_server.sandbox.child`, started on first use. An
evaluation that passes its deadline, or whose process dies (cel-rust aborts
when an allocation fails under the cap), kills that process, raises
`expression.resource_exhausted` (not retryable), and the next evaluation starts
a fresh one. Evaluations are synchronous: call them from a worker thread, never
from the event loop.
"""

from __future__ import annotations

import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ductor_core.errors import ExpressionError
from ductor_core.expressions import DEFAULT_COST_LIMITS, CostLimits
from ductor_server.sandbox.child import RESOURCE_EXHAUSTED, limits_argument
from ductor_server.sandbox.wire import HEADER, MAX_FRAME, Reply, Request, decode_reply, frame

SANDBOX_UNAVAILABLE = "expression.sandbox_unavailable"


@dataclass(frozen=True, kw_only=True)
class SandboxLimits:
    """How a sandbox runs.

    Attributes:
        processes: how many sandbox processes evaluate at once.
        memory_bytes: the address space of each process (RLIMIT_AS).
        timeout: seconds one evaluation may take before its process is killed.
        start_timeout: seconds a new process may take to be ready.
    """

    processes: int = 2
    memory_bytes: int = 1024**3
    timeout: float = 2.0
    start_timeout: float = 30.0


def exhausted(source: str, limit: str, message: str, maximum: float) -> ExpressionError:
    """The error of an evaluation the sandbox stopped: `limit` is "time" or "memory"."""
    error = ExpressionError(
        f"resources exhausted: {message}", expression=source, code=RESOURCE_EXHAUSTED
    )
    error.retryable = False
    error.details = {"limit": limit, "maximum": maximum, "phase": "evaluate"}
    return error


class _Stopped(Exception):
    """The process ended (EOF) or passed the deadline."""

    def __init__(self, timed_out: bool) -> None:
        super().__init__("timed out" if timed_out else "ended")
        self.timed_out = timed_out


class SandboxProcess:
    """One sandbox process and its pipes; used by one thread at a time."""

    def __init__(self, engine_name: str, limits: CostLimits, sandbox: SandboxLimits) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ductor_server.sandbox.child",
                engine_name,
                limits_argument(limits),
                str(sandbox.memory_bytes),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
        )
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self._in = self.proc.stdin.fileno()
        self._out = self.proc.stdout.fileno()
        try:
            ready = self._receive(time.monotonic() + sandbox.start_timeout)
        except _Stopped as exc:
            self.kill()
            raise RuntimeError(f"the expression sandbox did not start ({exc})") from exc
        if ready.value != "ready":
            self.kill()
            raise RuntimeError("the expression sandbox did not start")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def evaluate(self, request: bytes, deadline: float) -> Reply:
        """Send one request frame; the reply (raises _Stopped)."""
        try:
            view = memoryview(request)
            while view:
                view = view[os.write(self._in, view) :]
        except (BrokenPipeError, OSError) as exc:
            raise _Stopped(timed_out=False) from exc
        return self._receive(deadline)

    def _receive(self, deadline: float) -> Reply:
        header = self._read(HEADER.size, deadline)
        (size,) = HEADER.unpack(header)
        if size > MAX_FRAME:
            raise _Stopped(timed_out=False)
        return decode_reply(self._read(size, deadline))

    def _read(self, size: int, deadline: float) -> bytes:
        chunks: list[bytes] = []
        while size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _Stopped(timed_out=True)
            readable, _, _ = select.select([self._out], [], [], remaining)
            if not readable:
                raise _Stopped(timed_out=True)
            chunk = os.read(self._out, min(size, 1 << 20))
            if not chunk:
                raise _Stopped(timed_out=False)
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)

    def kill(self) -> int | None:
        """Kill the process (if alive) and reap it; its exit status."""
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            code = self.proc.wait(timeout=10)
        finally:
            for pipe in (self.proc.stdin, self.proc.stdout):
                if pipe is not None:
                    pipe.close()
        return code


class SandboxPool:
    """Up to `sandbox.processes` sandbox processes of one engine, started on demand.

    Args:
        engine_name: "cel-rust" or "cel-python", as the server's engine.
        limits: the cost limits the processes' engine applies (the server's).
        sandbox: processes, memory cap and deadline.
    """

    def __init__(
        self,
        engine_name: str,
        *,
        limits: CostLimits = DEFAULT_COST_LIMITS,
        sandbox: SandboxLimits | None = None,
    ) -> None:
        self.engine_name = engine_name
        self.limits = limits
        self.sandbox = sandbox or SandboxLimits()
        self._idle: queue.LifoQueue[SandboxProcess | None] = queue.LifoQueue()
        for _ in range(self.sandbox.processes):
            self._idle.put(None)
        self._lock = threading.Lock()
        self._live: set[SandboxProcess] = set()
        self._closed = False
        self.restarts = 0  # processes killed after a timeout or a death

    def evaluate(self, source: str, activation: Mapping[str, Any]) -> Any:
        """Evaluate `source` in a sandbox process; its JSON result.

        Raises:
            ExpressionError: as the engine raises it in-process, or
                `expression.resource_exhausted` when the deadline passed or the
                process died (the memory cap), or `expression.sandbox_unavailable`
                (retryable) when no sandbox process could start.
        """
        try:
            request = frame(Request(source=source, activation=dict(activation)))
        except (TypeError, NotImplementedError, OverflowError) as exc:
            raise ExpressionError(
                f"variables with no sandbox form: {exc}",
                expression=source,
                code="expression.evaluation",
            ) from exc
        process = self._idle.get()
        try:
            if process is not None and process.proc.poll() is not None:
                # Died while idle (killed from outside): not this expression's doing.
                self._discard(process)
                process = None
            if process is None:
                process = self._start(source)
            deadline = time.monotonic() + self.sandbox.timeout
            try:
                reply = process.evaluate(request, deadline)
            except _Stopped as stopped:
                status = self._discard(process)
                process = None
                if stopped.timed_out:
                    raise exhausted(
                        source,
                        "time",
                        f"evaluation took longer than {self.sandbox.timeout:g}s",
                        self.sandbox.timeout,
                    ) from None
                raise exhausted(
                    source,
                    "memory",
                    f"the evaluation ended its process ({_describe(status)}) under a"
                    f" {self.sandbox.memory_bytes // (1024 * 1024)} MiB memory cap",
                    self.sandbox.memory_bytes,
                ) from None
            if reply.failure is not None and reply.failure.code == RESOURCE_EXHAUSTED:
                self._discard(process)
                process = None
                raise exhausted(source, "memory", reply.failure.message, self.sandbox.memory_bytes)
        finally:
            self._idle.put(process)
        if reply.failure is not None:
            error = ExpressionError(
                reply.failure.message.removesuffix(f" (in expression {source!r})"),
                expression=source,
                code=reply.failure.code,
            )
            error.retryable = reply.failure.retryable
            error.details = reply.failure.details
            raise error
        return reply.value

    def _start(self, source: str) -> SandboxProcess:
        with self._lock:
            closed = self._closed
        try:
            if closed:
                raise RuntimeError("the expression sandbox is closed")
            process = SandboxProcess(self.engine_name, self.limits, self.sandbox)
        except (RuntimeError, OSError) as exc:
            error = ExpressionError(
                f"the expression sandbox is unavailable: {exc}",
                expression=source,
                code=SANDBOX_UNAVAILABLE,
            )
            error.retryable = True
            raise error from exc
        with self._lock:
            self._live.add(process)
        return process

    def _discard(self, process: SandboxProcess) -> int | None:
        with self._lock:
            self._live.discard(process)
            self.restarts += 1
        return process.kill()

    def pids(self) -> list[int]:
        """The process ids of the live sandbox processes."""
        with self._lock:
            return sorted(p.pid for p in self._live)

    def close(self) -> None:
        """Kill every sandbox process; later evaluations fail."""
        with self._lock:
            self._closed = True
            live, self._live = self._live, set()
        for process in live:
            process.kill()


def _describe(status: int | None) -> str:
    if status is None:
        return "no exit status"
    if status < 0:
        try:
            return f"signal {signal.Signals(-status).name}"
        except ValueError:
            return f"signal {-status}"
    return f"exit status {status}"
