"""A real HTTP server on 127.0.0.1 in a thread, standing in for the API a connection
reaches: it records every request and answers what the test says (`answer`, or
`script(fn)` to answer from the request)."""

from __future__ import annotations

import json
import threading
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


Reply = tuple[int, bytes]


def reply(status: int = 200, body: Any = None) -> Reply:
    """An answer: `body` as JSON (none when None)."""
    return status, b"" if body is None else json.dumps(body).encode()


class HttpSink:
    """Use as `with HttpSink() as sink:`; `sink.url` is its base URL."""

    def __init__(self) -> None:
        self.seen: list[Seen] = []
        self.lock = threading.Lock()
        self._script: Callable[[Seen], Reply] = lambda _: reply(200, {"ok": True})
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return None

            def _answer(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {k.lower(): v for k, v in self.headers.items()}
                seen = Seen(self.command, self.path, headers, body)
                with sink.lock:
                    sink.seen.append(seen)
                status, content = sink._script(seen)
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(content)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(content)
                except OSError:
                    pass

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _answer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def answer(self, status: int = 200, body: Any = None) -> None:
        fixed = reply(status, body)
        self._script = lambda _: fixed

    def script(self, fn: Callable[[Seen], Reply]) -> None:
        self._script = fn

    @property
    def last(self) -> Seen:
        with self.lock:
            return self.seen[-1]

    def __enter__(self) -> HttpSink:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *_: object) -> None:
        self.server.shutdown()
        self.server.server_close()
