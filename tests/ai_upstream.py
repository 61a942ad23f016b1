"""A scripted OpenAI-compatible upstream: a real HTTP server on 127.0.0.1 whose answers
are chosen by the request's model, so the inference proxy's tests (and
bench/ai_proxy.py) know exactly what the upstream said.

Models (chat):
    `echo`     answers "echo: <last message>"; usage 11 in, 7 out.
    `nousage`  answers "four score" with no usage at all.
    `gated`    (streams) sends its first chunk, then waits for `release()`.
    `stall`    (streams) sends one chunk, then goes silent for 5 s.
    `slow`     answers after 5 s.
    `fail`     answers 500 with an OpenAI error body.
    `limited`  answers 429 with an OpenAI error body.
Streams send "Hel", "lo", " world" (usage 11 in, 3 out when asked) and `[DONE]`.
Embeddings answer one 3-float vector per input, usage 2 tokens per input.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

UPSTREAM_KEY = "sk-upstream-Xq7Lm2Nb8Vc4Rt9Y"
USAGE = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
STREAM_USAGE = {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}
PIECES = ["Hel", "lo", " world"]


class ScriptedUpstream:
    """The upstream; `requests` keeps (path, authorization, body) of every request."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, Any]]] = []
        self.gate = threading.Event()
        self.gate_released_by_caller: bool | None = None
        self.quiet = False
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return None

            def setup(self) -> None:
                super().setup()
                # Each event leaves at once (no Nagle delay waiting for an ACK).
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                auth = self.headers.get("authorization", "")
                if not upstream.quiet:
                    upstream.requests.append((self.path, auth, body))
                if auth != f"Bearer {UPSTREAM_KEY}":
                    return self._json(401, {"error": {"message": "bad key", "type": "auth"}})
                if self.path.endswith("/embeddings"):
                    return self._embeddings(body)
                model = body.get("model")
                if model == "fail":
                    return self._json(
                        500, {"error": {"message": "the model crashed", "type": "server_error"}}
                    )
                if model == "limited":
                    return self._json(
                        429, {"error": {"message": "slow down", "code": "rate_limit_exceeded"}}
                    )
                if model == "slow":
                    time.sleep(5)
                if body.get("stream"):
                    return self._stream(body)
                text = "four score"
                if model != "nousage":
                    messages = body.get("messages") or [{}]
                    text = f"echo: {messages[-1].get('content')}"
                answer: dict[str, Any] = {
                    "id": "chatcmpl-1",
                    "object": "chat.completion",
                    "created": 1700000000,
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": text},
                            "finish_reason": "stop",
                        }
                    ],
                }
                if model != "nousage":
                    answer["usage"] = USAGE
                return self._json(200, answer)

            def _json(self, status: int, value: Any) -> None:
                data = json.dumps(value).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _embeddings(self, body: dict[str, Any]) -> None:
                inputs = body.get("input")
                items = inputs if isinstance(inputs, list) else [inputs]
                self._json(
                    200,
                    {
                        "object": "list",
                        "model": body.get("model"),
                        "data": [
                            {"object": "embedding", "index": i, "embedding": [0.5, -0.25, 0.125]}
                            for i in range(len(items))
                        ],
                        "usage": {"prompt_tokens": 2 * len(items), "total_tokens": 2 * len(items)},
                    },
                )

            def _event(self, value: Any) -> None:
                data = value if isinstance(value, str) else json.dumps(value)
                frame = f"data: {data}\n\n".encode()
                self.wfile.write(f"{len(frame):x}\r\n".encode() + frame + b"\r\n")
                self.wfile.flush()

            def _stream(self, body: dict[str, Any]) -> None:
                model = body.get("model")
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for i, piece in enumerate(PIECES):
                    self._event(
                        {
                            "id": "chatcmpl-s",
                            "object": "chat.completion.chunk",
                            "created": 1700000000,
                            "model": model,
                            "choices": [
                                {"index": 0, "delta": {"content": piece}, "finish_reason": None}
                            ],
                        }
                    )
                    if i == 0 and model == "gated":
                        upstream.gate_released_by_caller = upstream.gate.wait(10)
                    if i == 0 and model == "stall":
                        time.sleep(5)
                        return
                options = body.get("stream_options") or {}
                if options.get("include_usage"):
                    self._event(
                        {
                            "id": "chatcmpl-s",
                            "object": "chat.completion.chunk",
                            "created": 1700000000,
                            "model": model,
                            "choices": [],
                            "usage": STREAM_USAGE,
                        }
                    )
                self._event("[DONE]")
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> ScriptedUpstream:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.gate.set()
        self.server.shutdown()
        self.server.server_close()

    def release(self) -> None:
        """Let a `gated` stream go on."""
        self.gate.set()

    def bodies(self, model: str | None = None) -> list[dict[str, Any]]:
        """The bodies received (of `model`)."""
        return [b for _, _, b in self.requests if model is None or b.get("model") == model]


__all__ = ["PIECES", "STREAM_USAGE", "UPSTREAM_KEY", "USAGE", "ScriptedUpstream"]
