"""A tiny real HTTP server on 127.0.0.1 in a thread, for the http action tests.

It records every request (method, path, headers, body) and answers by path:
`/json` 200 JSON echo, `/text` 200 text, `/status/<n>` that status (503 and
429 with Retry-After: 0), `/sleep/<seconds>` sleeps then 200, `/flaky/<n>`
503 for the first n requests of each step (idempotency key minus its
attempt), then 200.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

from ductor_server.testing import LoopbackHTTPServer


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class HttpSink:
    """Start with `with HttpSink() as sink:`; `sink.url` is its base URL."""

    def __init__(self) -> None:
        self.seen: list[Seen] = []
        self.lock = threading.Lock()
        self._per_key: dict[str, int] = {}
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return None

            def _answer(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {k.lower(): v for k, v in self.headers.items()}
                with sink.lock:
                    sink.seen.append(Seen(self.command, self.path, headers, body))
                status, content_type, payload, extra = sink.route(self.path, headers, body)
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", content_type)
                    self.send_header("Content-Length", str(len(payload)))
                    for name, value in extra.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(payload)
                except OSError:
                    pass  # the client gave up (a timeout test)

            do_GET = do_POST = do_PUT = do_DELETE = _answer

        self.server = LoopbackHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    def route(
        self, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, str, bytes, dict[str, str]]:
        key = headers.get("idempotency-key", "")
        if path.startswith("/status/"):
            status = int(path.rsplit("/", 1)[1])
            extra = {"Retry-After": "0"} if status in (429, 503) else {}
            return status, "application/json", json.dumps({"status": status}).encode(), extra
        if path.startswith("/sleep/"):
            time.sleep(float(path.rsplit("/", 1)[1]))
        if path.startswith("/flaky/"):
            failures = int(path.rsplit("/", 1)[1])
            unit = key.rsplit(":", 1)[0]  # the step, whatever the attempt
            with self.lock:
                count = self._per_key.get(unit, 0)
                self._per_key[unit] = count + 1
            if count < failures:
                return 503, "text/plain", b"try again", {"Retry-After": "0"}
        if path.startswith("/text"):
            return 200, "text/plain; charset=utf-8", b"plain words", {}
        echo = {"path": path, "key": key, "body": json.loads(body) if body else None}
        return 200, "application/json", json.dumps(echo).encode(), {"ETag": '"v1"'}

    def requests_to(self, prefix: str) -> list[Seen]:
        with self.lock:
            return [s for s in self.seen if s.path.startswith(prefix)]

    def __enter__(self) -> HttpSink:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
