"""A real HTTP server on 127.0.0.1 in a thread that plays an outside API for the
provider tests: it records every request and answers with what the test scripts.

`sink.answer(status, body, headers)` sets the answer to every request;
`sink.script(fn)` answers with `fn(seen)`; `sink.delay` makes it wait first.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass(frozen=True)
class Reply:
    status: int = 200
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()


def reply(status: int = 200, body: Any = b"", **headers: str) -> Reply:
    """A `Reply`: `body` bytes or text as is, anything else as JSON."""
    pairs = [(k.replace("_", "-"), v) for k, v in headers.items()]
    if isinstance(body, str):
        content = body.encode()
        pairs.insert(0, ("Content-Type", "text/plain; charset=utf-8"))
    elif isinstance(body, bytes):
        content = body
    else:
        content = json.dumps(body).encode()
        pairs.insert(0, ("Content-Type", "application/json"))
    return Reply(status, content, tuple(pairs))


class HttpSink:
    """Use as `with HttpSink() as sink:`; `sink.url` is its base URL."""

    def __init__(self) -> None:
        self.seen: list[Seen] = []
        self.lock = threading.Lock()
        self.delay = 0.0
        self._script: Callable[[Seen], Reply] = lambda _: reply(200, {"ok": True})
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return None

            def _answer(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                seen = Seen(
                    self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body
                )
                with sink.lock:
                    sink.seen.append(seen)
                if sink.delay:
                    time.sleep(sink.delay)
                answer = sink._script(seen)
                try:
                    self.send_response(answer.status)
                    for name, value in answer.headers:
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(answer.body)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(answer.body)
                except OSError:
                    pass  # the client gave up (a timeout test)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _answer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def answer(self, status: int = 200, body: Any = b"", **headers: str) -> None:
        fixed = reply(status, body, **headers)
        self._script = lambda _: fixed

    def script(self, fn: Callable[[Seen], Reply]) -> None:
        self._script = fn

    @property
    def last(self) -> Seen:
        with self.lock:
            return self.seen[-1]

    def __enter__(self) -> HttpSink:
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def __exit__(self, *_: object) -> None:
        self.server.shutdown()
        self.server.server_close()
