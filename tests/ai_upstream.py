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
    `deep`     answers 200 with a JSON object nested 100,000 levels deep (`deep_error`:
               the same as a 500's body).
    `endless`  (streams) sends 64 KiB chunk events until the caller goes;
               `endless_sent` counts the bytes sent.
    `linger`   (streams) the usual stream, then 2 s before its body ends.
    `crlf`     (streams) the usual stream, its lines ended with CRLF and each event's
               last LF sent in a write of its own.
    `mangled`  answers text and two tool calls holding lone surrogates (`\\ud800`
               escapes without their pair): in the text, a tool's name and its
               arguments; to tool results, a text holding one.
    `mangled_error` answers 500 with an error object holding lone surrogates;
    `nested_error`  answers 500 with an error object nested 600 levels deep
               (deep enough to read, too deep to give back).
    `huge_error`    answers 500 with an error object of about 100 KB.
    `operator` plays a model with tools, for the chat agent (see `operator_answer`);
               usage 100 in, 20 out.
    `looper`   asks for `list_workflows` every time (it never answers).
    `tattle`   answers, and streams, the `Authorization` header it got (the
               connection's key), in its text and as an object key, as a careless
               upstream echoing its request would.
    `usage`    answers, and streams, "counted" with the last message's content (JSON)
               as its `usage`, whatever it is.
    `raw`      answers (status 200, JSON), or streams, the last message's content as
               its body, byte for byte, whatever it is.
    `bigevent` (streams) sends one event of 1 MiB + 8 KiB, all but its last 12 KiB
               first, the rest with its end 0.2 s later; then the usual stream.
Streams send "Hel", "lo", " world" (usage 11 in, 3 out when asked) and `[DONE]`.
Embeddings answer one 3-float vector per input, usage 2 tokens per input.
`fail_after_tool` makes the next request whose last message is a tool result
answer 500 (once). `hold("tool")` (or `hold("any")`) makes the next agent request
whose last message is a tool result (or any agent request) wait, once, until
`let_go()`: `held` is set when it arrives, so a test knows the model call is in
flight (and can kill the server under it).
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

UPSTREAM_KEY = "sk-upstream-Xq7Lm2Nb8Vc4Rt9Y"
USAGE = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
STREAM_USAGE = {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}
PIECES = ["Hel", "lo", " world"]
OPERATOR_USAGE = {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}


def _call(name: str, arguments: dict[str, Any], n: int = 0) -> dict[str, Any]:
    return {
        "id": f"call_{name}_{n}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def _tool_results(messages: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """(tool name, decoded result) of each tool message after the last answer."""
    asked: dict[str, str] = {}
    results: list[tuple[str, Any]] = []
    for message in messages:
        if message.get("role") == "assistant":
            asked = {c["id"]: c["function"]["name"] for c in message.get("tool_calls") or []}
            results = []
        elif message.get("role") == "tool":
            try:
                value = json.loads(message.get("content") or "null")
            except ValueError:
                value = message.get("content")
            results.append((asked.get(message.get("tool_call_id", ""), "?"), value))
    return results


def _asked_usage(body: dict[str, Any]) -> Any:
    """The `usage` model's usage: its last message's content, decoded."""
    messages = body.get("messages") or [{}]
    return json.loads(messages[-1].get("content") or "null")


def operator_answer(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The `operator` model's next message: tool calls, or a final text.

    To a user's message: "why did L go to B?" -> `list_assignments` of L; "retry
    the failed runs of F" -> `list_runs` of F's failed runs; "start F" ->
    `trigger_run` of F; "call TOOL {json}" -> that call as is ("call TOOL xN {json}":
    N of them); else "echo: ...".
    To tool results: `list_assignments` -> `get_decision` of the first one's
    decision; `get_decision` -> a text quoting the decision's explanation (its
    JSON with sorted keys); `list_runs` -> one `rerun_run` per run; anything else
    -> a text with each result ("not executed" for a refused call).
    """
    last = messages[-1]
    if last.get("role") == "user":
        text = str(last.get("content") or "")
        if match := re.search(r"why did (\S+) go to (\S+?)\??$", text):
            return {
                "content": None,
                "tool_calls": [_call("list_assignments", {"routable_id": match[1]})],
            }
        if match := re.search(r"retry the failed runs of (\S+)", text):
            arguments = {"status": "RUN_STATUS_FAILED", "family_slug": match[1]}
            return {"content": None, "tool_calls": [_call("list_runs", arguments)]}
        if match := re.fullmatch(r"start (\S+)", text):
            return {
                "content": None,
                "tool_calls": [_call("trigger_run", {"family_slug": match[1]})],
            }
        if match := re.fullmatch(r"call (\w+) x(\d+) (.*)", text, re.DOTALL):
            raw_calls = [
                {
                    "id": f"call_raw_{n}",
                    "type": "function",
                    "function": {"name": match[1], "arguments": match[3]},
                }
                for n in range(int(match[2]))
            ]
            return {"content": None, "tool_calls": raw_calls}
        if match := re.fullmatch(r"call (\w+) (.*)", text, re.DOTALL):
            raw = {
                "id": "call_raw",
                "type": "function",
                "function": {"name": match[1], "arguments": match[2]},
            }
            return {"content": None, "tool_calls": [raw]}
        return {"content": f"echo: {text}"}
    results = _tool_results(messages)
    names = [name for name, _ in results]
    if names == ["list_assignments"]:
        items = (results[0][1] or {}).get("items") or []
        if not items:
            return {"content": "I found no assignment of it."}
        return {
            "content": None,
            "tool_calls": [_call("get_decision", {"decision_id": items[0]["decision_id"]})],
        }
    if names == ["get_decision"]:
        decision = results[0][1]
        if set(decision) == {"error"}:
            return {"content": f"I could not read the decision: {decision['error']['message']}"}
        explanation = json.dumps(decision["explanation"], sort_keys=True)
        return {
            "content": f"{decision['routable_id']} went to {decision['worker']} "
            f"(pool {decision['pool']}, strategy {decision['explanation'].get('strategy')}).\n"
            f"The decision's explanation: {explanation}"
        }
    if names == ["list_runs"]:
        runs = (results[0][1] or {}).get("items") or []
        if not runs:
            return {"content": "There are no failed runs."}
        return {
            "content": None,
            "tool_calls": [_call("rerun_run", {"run_id": r["id"]}, n) for n, r in enumerate(runs)],
        }
    lines = []
    for name, value in results:
        if isinstance(value, dict) and set(value) == {"error"}:
            lines.append(
                f"{name}: not executed ({value['error']['code']}: {value['error']['message']})"
            )
        elif name == "rerun_run":
            lines.append(f"re-ran {value['rerun_of']} as {value['run']['id']}")
        elif name == "trigger_run":
            lines.append(f"started {value['id']}")
        else:
            lines.append(f"{name}: {json.dumps(value, sort_keys=True)}")
    return {"content": "\n".join(lines)}


class _QuietServer(ThreadingHTTPServer):
    """Says nothing when a caller hung up first (the proxy's timeouts do)."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        return None


class ScriptedUpstream:
    """The upstream; `requests` keeps (path, authorization, body) of every request,
    `headers` the headers of each (names in lower case)."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, Any]]] = []
        self.headers: list[dict[str, str]] = []
        self.gate = threading.Event()
        self.gate_released_by_caller: bool | None = None
        self.quiet = False
        self.fail_after_tool = False
        self.holding: str | None = None
        self.held = threading.Event()
        self.gone = threading.Event()
        self.endless_sent = 0
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
                    upstream.headers.append({k.lower(): v for k, v in self.headers.items()})
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
                if model in ("deep", "deep_error"):
                    data = b'{"error": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
                    self.send_response(200 if model == "deep" else 500)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return None
                if model == "mangled_error":
                    error = {"message": "bad \ud800 input", "code": "\udc00", "\ud800": 1}
                    return self._json(500, {"error": error})
                if model == "nested_error":
                    nested: Any = []
                    for _ in range(600):
                        nested = [nested]
                    return self._json(500, {"error": {"message": "too deep", "x": nested}})
                if model == "huge_error":
                    error = {"message": "too much", "blob": ["x" * 1000] * 100}
                    return self._json(500, {"error": error})
                if model == "mangled":
                    return self._mangled(body)
                if model == "endless" and body.get("stream"):
                    return self._endless()
                if model == "raw":
                    return self._raw(body)
                if model == "bigevent" and body.get("stream"):
                    return self._big_event(body, auth)
                if model in ("operator", "looper"):
                    return self._agent(model, body)
                if model == "slow":
                    time.sleep(5)
                if body.get("stream"):
                    return self._stream(body, auth)
                text = "four score"
                if model == "usage":
                    text = "counted"
                elif model == "tattle":
                    text = f"you sent {auth}"
                elif model != "nousage":
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
                if model == "usage":
                    answer["usage"] = _asked_usage(body)
                elif model != "nousage":
                    answer["usage"] = USAGE
                if model == "tattle":
                    answer["echo"] = {auth: ["header", auth]}
                return self._json(200, answer)

            def _agent(self, model: str, body: dict[str, Any]) -> None:
                messages = body.get("messages") or [{}]
                after_tool = messages[-1].get("role") == "tool"
                if upstream.holding == "any" or (upstream.holding == "tool" and after_tool):
                    upstream.holding = None
                    upstream.held.set()
                    upstream.gone.wait(30)
                if upstream.fail_after_tool and after_tool:
                    upstream.fail_after_tool = False
                    return self._json(
                        500, {"error": {"message": "the model crashed", "type": "server_error"}}
                    )
                if model == "looper":
                    message: dict[str, Any] = {
                        "content": None,
                        "tool_calls": [_call("list_workflows", {}, len(messages))],
                    }
                else:
                    message = operator_answer(messages)
                answer = {
                    "id": "chatcmpl-a",
                    "object": "chat.completion",
                    "created": 1700000000,
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", **message},
                            "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
                        }
                    ],
                    "usage": OPERATOR_USAGE,
                }
                return self._json(200, answer)

            def _mangled(self, body: dict[str, Any]) -> None:
                # `json.dumps` writes a lone surrogate as its `\u` escape.
                messages = body.get("messages") or [{}]
                message: dict[str, Any] = {"role": "assistant", "content": "done \udc00"}
                if messages[-1].get("role") != "tool":
                    arguments = json.dumps({"run_id": "run-\ud800"}, ensure_ascii=False)
                    message = {
                        "role": "assistant",
                        "content": "looking \ud800 up",
                        "tool_calls": [
                            {
                                **_call("get_run", {}),
                                "function": {"name": "get_run", "arguments": arguments},
                            },
                            _call("list_\udc00runs", {}, 1),
                        ],
                    }
                answer = {"choices": [{"index": 0, "message": message}], "usage": USAGE}
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

            def _event(self, value: Any, *, crlf: bool = False) -> None:
                data = value if isinstance(value, str) else json.dumps(value)
                frame = f"data: {data}\n\n".encode()
                parts = [frame]
                if crlf:
                    frame = frame.replace(b"\n", b"\r\n")
                    parts = [frame[:-1], frame[-1:]]
                for n, part in enumerate(parts):
                    if n:
                        time.sleep(0.05)  # so the two parts arrive apart
                    self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
                    self.wfile.flush()

            def _endless(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                delta = {"choices": [{"index": 0, "delta": {"content": "x" * 65_000}}]}
                frame = f"data: {json.dumps(delta)}\n\n".encode()
                try:
                    while True:
                        self.wfile.write(f"{len(frame):x}\r\n".encode() + frame + b"\r\n")
                        self.wfile.flush()
                        upstream.endless_sent += len(frame)
                except OSError:
                    return

            def _raw(self, body: dict[str, Any]) -> None:
                messages = body.get("messages") or [{}]
                data = str(messages[-1].get("content") or "").encode()
                streamed = bool(body.get("stream"))
                self.send_response(200)
                self.send_header(
                    "Content-Type", "text/event-stream" if streamed else "application/json"
                )
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _big_event(self, body: dict[str, Any], auth: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                delta = {"choices": [{"index": 0, "delta": {"content": "y" * (1032 * 1024)}}]}
                frame = f"data: {json.dumps(delta)}\n\n".encode()
                cut = len(frame) - 12 * 1024
                for n, part in enumerate((frame[:cut], frame[cut:])):
                    if n:
                        time.sleep(0.2)  # the proxy has read the first part by now
                    self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
                    self.wfile.flush()
                self._stream(body, auth, headers=False)

            def _stream(self, body: dict[str, Any], auth: str, *, headers: bool = True) -> None:
                model = body.get("model")
                crlf = model == "crlf"
                pieces = [f"you sent {auth}", "."] if model == "tattle" else PIECES
                if headers:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                for i, piece in enumerate(pieces):
                    self._event(
                        {
                            "id": "chatcmpl-s",
                            "object": "chat.completion.chunk",
                            "created": 1700000000,
                            "model": model,
                            "choices": [
                                {"index": 0, "delta": {"content": piece}, "finish_reason": None}
                            ],
                        },
                        crlf=crlf,
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
                            "usage": _asked_usage(body) if model == "usage" else STREAM_USAGE,
                        },
                        crlf=crlf,
                    )
                self._event("[DONE]", crlf=crlf)
                if model == "linger":
                    time.sleep(2)
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

        self.server = _QuietServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> ScriptedUpstream:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.gate.set()
        self.gone.set()
        self.server.shutdown()
        self.server.server_close()

    def release(self) -> None:
        """Let a `gated` stream go on."""
        self.gate.set()

    def hold(self, when: str) -> None:
        """Make the next agent request (`any`), or the next one answering tool
        results (`tool`), wait until `let_go()`; `held` is set when it arrives."""
        assert when in ("any", "tool")
        self.held.clear()
        self.gone.clear()
        self.holding = when

    def let_go(self) -> None:
        """Let a held request go on (it answers whoever still listens)."""
        self.gone.set()

    def bodies(self, model: str | None = None) -> list[dict[str, Any]]:
        """The bodies received (of `model`)."""
        return [b for _, _, b in self.requests if model is None or b.get("model") == model]


__all__ = [
    "OPERATOR_USAGE",
    "PIECES",
    "STREAM_USAGE",
    "UPSTREAM_KEY",
    "USAGE",
    "ScriptedUpstream",
    "operator_answer",
]
