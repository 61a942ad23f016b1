"""`ductor chat`: talk with the chat agent from a terminal, over the REST API.

One-shot (`-m MESSAGE`) for scripts, or a REPL reading lines from standard input.
The answer goes to standard output; the tool calls, the cost and the conversation
id go to standard error. A mutating tool call that waits for confirmation is
shown and asked about (`y`/`n`, read from standard input) unless `--yes` allowed
mutations; a one-shot whose input is not a terminal leaves it waiting and exits 3.
Like the other client commands it only speaks HTTP (`cli_client.ApiClient`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, TextIO

import httpx

from ductor_server.cli_client import ApiClient, ClientError, command, segment

EXIT_WAITING = 3
"""The exit status of a one-shot that left tool calls waiting for confirmation."""

TURN_TIMEOUT = 900.0
"""Seconds the client waits for one turn (up to eight model calls and their tools)."""


def _arguments(call: dict[str, Any]) -> str:
    arguments = call.get("arguments")
    text = json.dumps(arguments, separators=(", ", ": ")) if arguments is not None else "{}"
    return text if len(text) <= 300 else text[:300] + "..."


def _show_turn(answer: dict[str, Any], out: TextIO, err: TextIO, *, as_json: bool) -> None:
    turn = answer.get("turn") or {}
    if as_json:
        out.write(json.dumps(answer, indent=2) + "\n")
        return
    for call in turn.get("decided", []):
        err.write(f"[tool] {call['tool']} {_arguments(call)}: {call['status']}\n")
    for message in turn.get("messages", []):
        for call in message.get("tool_calls", []):
            if call["status"] != "pending":
                err.write(f"[tool] {call['tool']} {_arguments(call)}: {call['status']}\n")
    if turn.get("answer"):
        out.write(turn["answer"] + "\n")
    out.flush()
    cost = turn.get("cost_micros", 0)
    err.write(
        f"(turn {turn.get('turn')}: {turn.get('status')}, {turn.get('model_calls')} model"
        f" call(s), {cost} micros)\n"
    )
    if turn.get("status") == "step_limit":
        err.write(f"the turn stopped: {(turn.get('error') or {}).get('message')}\n")


def _ask(call: dict[str, Any], err: TextIO, stdin: TextIO) -> bool:
    err.write(f"run {call['tool']} {_arguments(call)}? [y/N] ")
    err.flush()
    line = stdin.readline()
    return line.strip().lower() in ("y", "yes")


class _Chat:
    """One conversation driven from the terminal."""

    def __init__(self, client: ApiClient, args: argparse.Namespace, out: TextIO) -> None:
        self.client = client
        self.args = args
        self.out = out
        self.err = sys.stderr
        self.stdin = sys.stdin
        self.conversation: str | None = args.conversation

    def send(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.args.yes:
            body["allow_mutations"] = True
        if self.conversation is None:
            model = self.args.model or os.environ.get("DUCTOR_CHAT_MODEL")
            if not model:
                raise ClientError("client.usage", "name the model: --model or DUCTOR_CHAT_MODEL")
            first: dict[str, Any] = {"model": model, "message": body.pop("content", None)}
            first["allow_mutations"] = body.get("allow_mutations", False)
            if self.args.connection:
                first["connection"] = self.args.connection
            answer: dict[str, Any] = self.client.call("POST", "/v1/agent/conversations", body=first)
            self.conversation = answer["conversation"]["id"]
            self.err.write(f"conversation {self.conversation}\n")
            return answer
        path = f"/v1/agent/conversations/{segment(self.conversation)}/messages"
        result: dict[str, Any] = self.client.call("POST", path, body=body)
        return result

    def turn(self, content: str, *, interactive: bool) -> int:
        """Send `content`, show the answer, settle waiting calls; the exit status."""
        answer = self.send({"content": content})
        while True:
            _show_turn(answer, self.out, self.err, as_json=self.args.json)
            turn = answer.get("turn") or {}
            pending = turn.get("pending") or []
            if not pending:
                return 1 if turn.get("status") == "step_limit" else 0
            if self.args.yes:
                decisions = {"confirm": [c["id"] for c in pending], "reject": []}
            elif interactive:
                decisions = {"confirm": [], "reject": []}
                for call in pending:
                    decisions["confirm" if _ask(call, self.err, self.stdin) else "reject"].append(
                        call["id"]
                    )
            else:
                for call in pending:
                    self.err.write(
                        f"waiting for confirmation: {call['tool']} {_arguments(call)}"
                        f" ({call['id']})\n"
                    )
                self.err.write(
                    f"not executed; answer with: ductor chat --conversation {self.conversation}\n"
                )
                return EXIT_WAITING
            answer = self.send({k: v for k, v in decisions.items() if v})

    def settle_waiting(self) -> None:
        """Ask about the calls an earlier session left waiting (the REPL starts so)."""
        if self.conversation is None:
            return
        found = self.client.call("GET", f"/v1/agent/conversations/{segment(self.conversation)}")
        pending = found.get("pending") or []
        if not pending:
            return
        decisions: dict[str, list[str]] = {"confirm": [], "reject": []}
        for call in pending:
            yes = self.args.yes or _ask(call, self.err, self.stdin)
            decisions["confirm" if yes else "reject"].append(call["id"])
        answer = self.send({k: v for k, v in decisions.items() if v})
        _show_turn(answer, self.out, self.err, as_json=self.args.json)


def cmd_chat(client: ApiClient, args: argparse.Namespace, out: TextIO) -> int:
    """Talk with the chat agent: one message (`-m`) or a REPL on standard input."""
    client.http.timeout = httpx.Timeout(TURN_TIMEOUT)
    chat = _Chat(client, args, out)
    if args.message is not None:
        return chat.turn(args.message, interactive=sys.stdin.isatty())
    tty = sys.stdin.isatty()
    chat.settle_waiting()
    status = 0
    while True:
        if tty:
            sys.stderr.write("you> ")
            sys.stderr.flush()
        line = sys.stdin.readline()
        if not line:
            return status
        if not line.strip():
            continue
        try:
            status = chat.turn(line.rstrip("\n"), interactive=True)
        except ClientError as exc:
            sys.stderr.write(f"error: {exc.code}: {exc.message}\n")
            status = 1


def add_chat_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `chat` on the top-level parser."""
    p = command(sub, "chat", cmd_chat, "talk with the chat agent (the AI proxy and the tools)")
    p.add_argument("-m", "--message", default=None, help="send one message and exit")
    p.add_argument("--model", default=None, help="the model (default $DUCTOR_CHAT_MODEL)")
    p.add_argument(
        "--connection", default=None, help="the openai connection (default: the default)"
    )
    p.add_argument("--conversation", default=None, help="go on with this conversation id")
    p.add_argument("-y", "--yes", action="store_true", help="run mutating tools without asking")
    p.add_argument("--json", action="store_true", help="print each answer as JSON")


__all__ = ["EXIT_WAITING", "add_chat_command", "cmd_chat"]
