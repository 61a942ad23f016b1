"""The sandbox process: evaluates CEL requests read from stdin, one at a time.

Run as `python -m ductor_server.sandbox.child ENGINE LIMITS_JSON MEMORY_BYTES`.
It caps its own address space first (RLIMIT_AS), asks Linux to kill it when
its parent dies, registers the installed plugins' CEL functions (as the server
does), answers one `ready` frame, then one reply per request. Past its start it
opens no file and no socket; its stdout carries frames only.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import resource
import signal
import sys
from typing import Any

from ductor_core.errors import ExpressionError
from ductor_core.expressions import CelRustEngine, CostLimits, ExpressionEngine
from ductor_server.extensions.loader import install_cel_functions
from ductor_server.sandbox.wire import HEADER, MAX_FRAME, Failure, Reply, decode_request, frame

RESOURCE_EXHAUSTED = "expression.resource_exhausted"
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the closed stdin ends it instead
        pass


def _read_exact(fd: int, size: int) -> bytes | None:
    chunks: list[bytes] = []
    while size:
        chunk = os.read(fd, min(size, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def build_engine(name: str, limits: CostLimits) -> ExpressionEngine:
    """The engine a sandbox evaluates with: `name`'s class with the parent's limits."""
    if name == "cel-rust":
        return CelRustEngine(limits=limits)
    if name == "cel-python":
        from ductor_core.expressions import CelPyEngine

        return CelPyEngine(limits=limits)
    raise ValueError(f"unknown expression engine {name!r}")


def serve(engine: ExpressionEngine, read_fd: int, write_fd: int) -> None:
    """Answer requests until stdin closes (or a MemoryError leaves the process suspect)."""
    _write(write_fd, frame(Reply(value="ready")))
    while True:
        header = _read_exact(read_fd, HEADER.size)
        if header is None:
            return
        (size,) = HEADER.unpack(header)
        if size > MAX_FRAME:
            return
        body = _read_exact(read_fd, size)
        if body is None:
            return
        request = decode_request(body)
        fatal = False
        try:
            reply = Reply(value=engine.evaluate(request.source, request.activation))
        except ExpressionError as exc:
            failure = Failure(
                code=exc.code, message=exc.message, retryable=exc.retryable, details=exc.details
            )
            reply = Reply(failure=failure)
        except MemoryError:
            fatal = True
            reply = Reply(failure=Failure(code=RESOURCE_EXHAUSTED, message="out of memory"))
        try:
            data = frame(reply)
        except (TypeError, NotImplementedError, OverflowError) as exc:
            failure = Failure(code="expression.evaluation", message=f"result: {exc}")
            data = frame(Reply(failure=failure))
        _write(write_fd, data)
        if fatal:
            return


def main(argv: list[str]) -> int:
    """Entry point: `ENGINE LIMITS_JSON MEMORY_BYTES`."""
    name, limits_json, memory = argv[1], argv[2], int(argv[3])
    # Frames only on the pipe the server reads: anything else printed goes to stderr.
    write_fd = os.dup(1)
    os.dup2(2, 1)
    _die_with_parent()
    limits = CostLimits(**json.loads(limits_json))
    # The installed plugins' CEL functions, as the server registered them.
    install_cel_functions()
    engine = build_engine(name, limits)
    engine.evaluate("size([1]) == 1", {})  # load the engine before the cap and the clock
    if memory > 0:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    serve(engine, 0, write_fd)
    return 0


def limits_argument(limits: CostLimits) -> str:
    """`limits` as the JSON argument `main` reads."""
    values: dict[str, Any] = dataclasses.asdict(limits)
    return json.dumps(values)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
