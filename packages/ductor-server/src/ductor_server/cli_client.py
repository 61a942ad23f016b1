"""The client-side `ductor` commands: workflows, runs and events over the REST API.

They only speak HTTP (httpx) to a running server; they never open the store.
The server and key come from flags, then `DUCTOR_URL` / `DUCTOR_API_KEY`,
then `<data-dir>/api_key` as written by `ductor dev`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import quote

import httpx

from ductor_server.netaddr import http_url
from ductor_server.settings import MAX_PORT, parse_host, parse_whole

TERMINAL_RUN_STATUSES = frozenset(
    {"RUN_STATUS_SUCCEEDED", "RUN_STATUS_FAILED", "RUN_STATUS_CANCELLED"}
)


class ClientError(Exception):
    """An error answer from the server (or no answer at all)."""

    def __init__(self, code: str, message: str, details: Any = None, status: int = 0) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.details = details
        self.status = status


def default_url() -> str:
    """`DUCTOR_URL`, else built from `DUCTOR_HOST` / `DUCTOR_PORT` (127.0.0.1:7070)."""
    if url := os.environ.get("DUCTOR_URL"):
        return url
    # Empty is unset, as for the server (`Settings.from_env`).
    host = os.environ.get("DUCTOR_HOST") or "127.0.0.1"
    port = os.environ.get("DUCTOR_PORT") or "7070"
    return http_url(host, port)


def server_url(flag: str | None) -> str:
    """The server a client command talks to: `--url`, else `default_url()`, checked.

    Raises:
        ClientError: `client.usage`, naming the flag or variable whose value makes no
            http(s) URL (`DUCTOR_PORT=abc`, `DUCTOR_HOST=http://x`, `--url ftp://...`),
            before any call.
    """
    if flag:
        source, url = "--url", flag
    elif os.environ.get("DUCTOR_URL"):
        source, url = "DUCTOR_URL", default_url()
    else:
        try:
            parse_host("DUCTOR_HOST", os.environ.get("DUCTOR_HOST") or "127.0.0.1")
            parse_whole(
                "DUCTOR_PORT", os.environ.get("DUCTOR_PORT") or "7070", low=0, high=MAX_PORT
            )
        except ValueError as exc:
            raise ClientError("client.usage", str(exc)) from None
        source, url = "DUCTOR_HOST", default_url()
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError) as exc:
        raise ClientError("client.usage", f"{source}: {url!r} is not a URL ({exc})") from None
    if parsed.port is not None and parsed.port > MAX_PORT:
        raise ClientError("client.usage", f"{source}: {url!r} has no port {parsed.port}") from None
    if parsed.scheme not in ("http", "https") or not parsed.host or parsed.port == 0:
        raise ClientError(
            "client.usage", f"{source} must be an http:// or https:// URL, got {url!r}"
        )
    return url


def usage_error(exc: ClientError) -> int:
    """Print a `client.usage` error as its one line; the exit status of one (2)."""
    sys.stderr.write(f"error: {exc.code}: {exc.message}\n")
    return 2


def path_id(value: str) -> str:
    """An argparse `type` for an id that goes into a URL path: an empty one (a
    `RUN_ID=$(...)` whose command failed) would name the collection instead
    (`GET /v1/runs/` lists runs), so it is refused before any call."""
    if not value:
        raise argparse.ArgumentTypeError("must not be empty")
    return value


def seconds(text: str) -> float:
    """An argparse `type` for a time in seconds (`--interval`, `--timeout`): a finite
    number above zero, so that no wait polls without pause, never ends, or fails
    after its first request in Python's words."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a number of seconds above zero, got {text!r}")
    return value


def segment(value: str | int) -> str:
    """`value` as one path segment of a URL: an id given on the command line may
    hold `/`, `?`, `#`, `%` or control characters, and each must reach the server
    as part of the id, never as another path or a query."""
    return quote(str(value), safe="")


API_KEY_SOURCES = "--api-key, DUCTOR_API_KEY or <data dir>/api_key"
"""Where the client commands find the API key, as an error names them."""


def checked_key(key: str, where: str) -> str:
    """`key` as it is sent, without the whitespace around it (a secret kept in a file
    often ends with a newline).

    Raises:
        ClientError: `client.usage`, it holds a character no key has (a key is
            printable ASCII); the message names `where` it came from, not the key.
    """
    key = key.strip()
    if not key or not all(32 < ord(c) < 127 for c in key):
        raise ClientError(
            "client.usage",
            f"the key given by {where} holds a character no key has (a key is printable"
            " ASCII without spaces)",
        )
    return key


def find_api_key(flag: str | None, data_dir: str | None) -> str | None:
    """The key from the flag, `DUCTOR_API_KEY`, or `<data-dir>/api_key`, in that order
    (as given: `checked_key` checks it)."""
    if flag:
        return flag
    if key := os.environ.get("DUCTOR_API_KEY"):
        return key
    directory = Path(data_dir or os.environ.get("DUCTOR_DATA_DIR") or ".ductor")
    path = directory / "api_key"
    if path.is_file():
        return path.read_text().strip() or None
    return None


class ApiClient:
    """A small synchronous client of the Ductor REST API."""

    def __init__(
        self,
        url: str,
        api_key: str | None,
        *,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.url = url
        self.timeout = timeout
        self.http = httpx.Client(
            base_url=url, headers=headers, timeout=timeout, transport=transport
        )

    def close(self) -> None:
        """Close the connection pool."""
        self.http.close()

    def call(
        self,
        method: str,
        path: str,
        *,
        content: bytes | None = None,
        body: Any = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        held: float = 0.0,
    ) -> Any:
        """One request; the decoded JSON answer. `held`: seconds the server may
        hold the request (a long poll) beyond the client's timeout.

        Raises:
            ClientError: an error answer (its code and message), or no connection.
        """
        if body is not None:
            content = json.dumps(body).encode()
        send_headers = {"Content-Type": "application/json"} if content is not None else {}
        send_headers.update(headers or {})
        try:
            response = self.http.request(
                method,
                path,
                content=content,
                params={k: v for k, v in (params or {}).items() if v is not None},
                headers=send_headers,
                timeout=httpx.Timeout(self.timeout + held) if held else httpx.USE_CLIENT_DEFAULT,
            )
        except httpx.TransportError as exc:
            raise ClientError(
                "client.unreachable", f"cannot reach the server at {self.url} ({exc})"
            ) from exc
        try:
            payload = response.json() if response.content else None
        except ValueError:
            payload = None
        if response.status_code >= 400:
            if isinstance(payload, dict) and "code" in payload:
                raise ClientError(
                    str(payload["code"]),
                    str(payload.get("message", "")),
                    payload.get("details"),
                    response.status_code,
                )
            raise ClientError(
                "http.error", f"HTTP {response.status_code}: {response.text[:200]}", None
            )
        return payload


class _NotJson(ValueError):
    """What Python's json reads but JSON cannot carry (NaN, Infinity, 1e999)."""


def _no_constant(name: str) -> Any:
    raise _NotJson(f"{name} is not a JSON value")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotJson(f"{text} is out of a number's range")
    return value


def _json_arg(text: str | None, what: str) -> Any:
    """`text` (a flag's JSON) decoded, refusing what Python's json would read but
    send on as bare NaN or Infinity, which the server cannot read."""
    if text is None:
        return None
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except json.JSONDecodeError as exc:
        raise ClientError(
            "client.bad_json", f"{what} is not valid JSON: {exc.msg} at column {exc.colno}"
        ) from exc
    except _NotJson as exc:
        raise ClientError("client.bad_json", f"{what} is not valid JSON: {exc}") from exc


def _read_file(name: str) -> bytes:
    if name == "-":
        return sys.stdin.buffer.read()
    try:
        return Path(name).read_bytes()
    except OSError as exc:
        raise ClientError("client.file", f"cannot read {name}: {exc.strerror}") from exc


def _print_json(value: Any, out: TextIO) -> None:
    out.write(json.dumps(value, indent=2, sort_keys=False) + "\n")


def _short(status: str | None) -> str:
    if not status:
        return "-"
    for prefix in ("RUN_STATUS_", "STEP_STATUS_"):
        if status.startswith(prefix):
            return status[len(prefix) :].lower()
    return status.lower()


# --- commands ----------------------------------------------------------------


def cmd_workflows_validate(client: ApiClient, args: argparse.Namespace, out: TextIO) -> int:
    """Validate a definition file; print every problem with its pointer."""
    report = client.call("POST", "/v1/workflows/validate", content=_read_file(args.file))
    if args.json:
        _print_json(report, out)
    elif report.get("valid"):
        out.write(f"{args.file}: valid\n")
    else:
        problems = report.get("problems", [])
        out.write(f"{args.file}: {len(problems)} problem(s)\n")
        for problem in problems:
            pointer = problem.get("pointer") or "/"
            out.write(f"  {pointer}: {problem.get('code')}: {problem.get('message')}\n")
    return 0 if report.get("valid") else 1


def cmd_workflows_publish(client: ApiClient, args: argparse.Namespace, out: TextIO) -> int:
    """Publish a definition file as a new version (or find the identical one)."""
    headers = {"Idempotency-Key": args.idempotency_key} if args.idempotency_key else None
    published = client.call("POST", "/v1/workflows", content=_read_file(args.file), headers=headers)
    if args.json:
        _print_json(published, out)
    else:
        verb = "published" if published["created"] else "unchanged"
        out.write(
            f"{verb} {published['family_slug']} version {published['version']} "
            f"({published['hash']})\n"
        )
    return 0


def cmd_workflows_list(client: ApiClient, args: argparse.Namespace, out: TextIO) -> int:
    """List the workflow families of the tenant, then the SDK workflows of its bridge
    apps (as `bridge:<app>:<workflow>`, the slug that triggers them)."""
    families = client.call("GET", "/v1/workflows")
    if args.json:
        _print_json(families, out)
        return 0
    for family in families:
        out.write(f"{family['family_slug']:<32} v{family['latest_version']:<4} {family['title']}\n")
    apps = client.call("GET", "/v1/bridge/apps")
    for app in apps:
        for workflow in app["workflows"]:
            slug = f"bridge:{app['app_id']}:{workflow}"
            stale = " (stale)" if app.get("stale") else ""
            out.write(f"{slug:<32} {'sdk':<5} app {app['app_id']}{stale}\n")
    if not families and not any(app["workflows"] for app in apps):
        # On stderr, so that the list itself stays empty for scripts.
        sys.stderr.write(
            "no workflows yet: publish one with `ductor workflows publish FILE`, "
            "or start a bridge app (docs/sdk.md)\n"
        )
    return 0


def cmd_workflows_get(client: ApiClient, args: argparse.Namespace, out: TextIO) -> int:
    """Print a family (or one version with --version) as JSON."""
    if args.version is not None:
        path = f"/v1/workflows/{segment(args.slug)}/versions/{segment(args.version)}"
    else:
        path = f"/v1/workflows/{segment(args.slug)}"
    _print_json(client.call("GET", path), out)
    return 0


LONG_POLL = 30.0
"""Seconds one request of `runs trigger --wait` asks the server to hold it."""


def _poll_until_done(
    client: ApiClient,
    run_id: str,
    *,
    interval: float,
    timeout: float | None,
    on_poll: Callable[[dict[str, Any] | None, str | None], None] | None = None,
    long_poll: bool = False,
) -> dict[str, Any]:
    """The run once it has ended, read every `interval` (each read shown to
    `on_poll`). With `long_poll`, each request asks the server to answer when the
    run ends (`GET /v1/runs/{id}?wait=`, up to `LONG_POLL` seconds or the time
    left), and `interval` is only the pause after an answer the server did not
    hold, or while it cannot be reached."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        wait: float | None = None
        if long_poll:
            left = LONG_POLL if deadline is None else deadline - time.monotonic()
            wait = min(LONG_POLL, max(left, 0.001))
        asked = time.monotonic()
        run: dict[str, Any] | None = None
        problem: str | None = None
        try:
            run = client.call(
                "GET", f"/v1/runs/{segment(run_id)}", params={"wait": wait}, held=wait or 0
            )
        except ClientError as exc:
            if exc.code != "client.unreachable":
                raise
            problem = "server unreachable, retrying"
        if on_poll is not None:
            on_poll(run, problem)
        if run is not None and run.get("status") in TERMINAL_RUN_STATUSES:
            return run
        if deadline is not None and time.monotonic() > deadline:
            raise ClientError("client.timeout", f"run {run_id} did not finish within {timeout:g}s")
        if wait is None or run is None or time.monotonic() - asked < wait / 2:
            time.sleep(interval)


def _run_exit_code(run: dict[str, Any]) -> int:
    return 0 if run.get("status") == "RUN_STATUS_SUCCEEDED" else 1


def cmd_runs_trigger(client: ApiClient, args: argparse.Namespace, out: TextIO) -> int:
    """Start a run; with --wait, wait until it ends and print the final run."""
    body: dict[str, Any] = {"family_slug": args.family, "input": _json_arg(args.input, "--input")}
    if args.version is not None:
        body["version"] = args.version
    headers = {"Idempotency-Key": args.idempotency_key} if args.idempotency_key else None
    run = client.call("POST", "/v1/runs", body=body, headers=headers)
    if args.wait:
        run = _poll_until_done(
            client, run["id"], interval=args.interval, timeout=args.timeout, long_poll=True
        )
    if args.quiet:
        out.write(run["id"] + "\n")
    else:
        _print_json(run, out)
    return _run_exit_code(run) if args.wait else 0


def cmd_runs_get(client: ApiClient, args: argparse.Namespace, out: TextIO) -> int:
    """Print a run as JSON."""
    _print_json(client.call("GET", f"/v1/runs/{segment(args.run_id)}"), out)
    return 0


def cmd_runs_history(client: ApiClient, args: argparse.Namespace, out: TextIO) -> int:
    """Print a run's history, one entry per line."""
    entries = client.call("GET", f"/v1/runs/{segment(args.run_id)}/history")
    if args.json:
        _print_json(entries, out)
        return 0
    for entry in entries:
        data = json.dumps(entry.get("data"), separators=(",", ":"))
        out.write(f"{entry['seq']:>5} {entry['at']} {entry['kind']:<24} {data}\n")
    return 0


def cmd_runs_list(client: ApiClient, args: argparse.Namespace, out: TextIO) -> int:
    """List runs newest first."""
    page = client.call(
        "GET",
        "/v1/runs",
        params={
            "status": args.status,
            "family_slug": args.family,
            "cursor": args.cursor,
            "limit": args.limit,
        },
    )
    if args.json:
        _print_json(page, out)
        return 0
    for run in page["items"]:
        out.write(
            f"{run['id']:<36} {run['family_slug']:<24} v{run['version']:<4} "
            f"{_short(run['status']):<10} {run['created_at']}\n"
        )
    if page.get("next_cursor"):
        out.write(f"more: --cursor {page['next_cursor']}\n")
    return 0


def render_run(run: dict[str, Any] | None, problem: str | None = None) -> str:
    """A run's steps as text: one line per step, then the output once it ended."""
    if run is None:
        return f"({problem})\n" if problem else ""
    lines = [
        f"run {run['id']}  {run['family_slug']} v{run['version']}  {_short(run['status'])}"
        + (f"  ({problem})" if problem else "")
    ]
    width = max([len(step["ref"]) for step in run.get("steps", [])] + [4])
    for step in run.get("steps", []):
        extra = []
        if step.get("attempt", 0) > 1:
            extra.append(f"attempt {step['attempt']}")
        if step.get("waiting_for"):
            extra.append(f"waiting for {step['waiting_for']}")
        if step.get("retry_at"):
            extra.append(f"retry at {step['retry_at']}")
        if step.get("error"):
            extra.append(f"error {step['error'].get('code')}: {step['error'].get('message')}")
        lines.append(
            f"  {step['ref']:<{width}}  {_short(step['status']):<10} {'  '.join(extra)}".rstrip()
        )
    if run.get("status") in TERMINAL_RUN_STATUSES:
        if run.get("error"):
            lines.append(f"error: {json.dumps(run['error'])}")
        lines.append("output: " + json.dumps(run.get("output"), indent=2))
    return "\n".join(lines) + "\n"


def cmd_runs_watch(client: ApiClient, args: argparse.Namespace, out: TextIO) -> int:
    """Show a run's steps live (redrawn each poll) until it ends; print its output."""
    live = out.isatty()
    last = ""

    def draw(run: dict[str, Any] | None, problem: str | None) -> None:
        nonlocal last
        frame = render_run(run, problem)
        if frame == last:
            return
        last = frame
        if live:
            out.write("\x1b[H\x1b[J")  # cursor home, clear the screen below
        elif run is not None:
            out.write("\n")
        out.write(frame)
        out.flush()

    run = _poll_until_done(
        client, args.run_id, interval=args.interval, timeout=args.timeout, on_poll=draw
    )
    return _run_exit_code(run)


def cmd_runs_cancel(client: ApiClient, args: argparse.Namespace, out: TextIO) -> int:
    """Ask for a run to be cancelled."""
    run = client.call(
        "POST", f"/v1/runs/{segment(args.run_id)}/cancel", body={"reason": args.reason}
    )
    out.write(f"cancel requested for run {run['id']} ({_short(run['status'])})\n")
    return 0


def cmd_runs_rerun(client: ApiClient, args: argparse.Namespace, out: TextIO) -> int:
    """Start a new run with an ended run's family, version and input."""
    headers = {"Idempotency-Key": args.idempotency_key} if args.idempotency_key else None
    body = {"latest": True} if args.latest else None
    answer = client.call(
        "POST", f"/v1/runs/{segment(args.run_id)}/rerun", body=body, headers=headers
    )
    run = answer["run"]
    if args.quiet:
        out.write(run["id"] + "\n")
    else:
        out.write(
            f"re-ran {answer['rerun_of']} as {run['id']} ({run['family_slug']} v{run['version']})\n"
        )
    return 0


def cmd_runs_signal(client: ApiClient, args: argparse.Namespace, out: TextIO) -> int:
    """Send a signal to a run."""
    body: dict[str, Any] = {"payload": _json_arg(args.payload, "--payload")}
    if args.id:
        body["id"] = args.id
    accepted = client.call(
        "POST", f"/v1/runs/{segment(args.run_id)}/signals/{segment(args.name)}", body=body
    )
    _print_json(accepted, out)
    return 0


def cmd_events_send(client: ApiClient, args: argparse.Namespace, out: TextIO) -> int:
    """Send an event; print which runs it started or reached."""
    if args.data is not None and args.data_flag is not None:
        raise ClientError("client.usage", "give the event data once: as DATA or with --data")
    if args.data_flag is not None:
        data = _json_arg(args.data_flag, "--data")
    else:
        data = _json_arg(args.data, "DATA")
    body: dict[str, Any] = {"name": args.name, "data": data}
    if args.id:
        body["id"] = args.id
    _print_json(client.call("POST", "/v1/events", body=body), out)
    return 0


def cmd_apps_list(client: ApiClient, args: argparse.Namespace, out: TextIO) -> int:
    """List the tenant's bridge apps with their workflows."""
    apps = client.call("GET", "/v1/bridge/apps")
    if args.json:
        _print_json(apps, out)
        return 0
    if not apps:
        sys.stderr.write(
            "no bridge apps yet: an app registers itself when it syncs with the server "
            "(docs/sdk.md)\n"
        )
    for app in apps:
        state = "stale" if app.get("stale") else "live"
        out.write(
            f"{app['app_id']:<20} {state:<5} {app.get('url') or '-'}  "
            f"{app['sdk']} {app['sdk_version']}  last seen {app['last_seen_at']}\n"
        )
        for workflow in app["workflows"]:
            out.write(f"  bridge:{app['app_id']}:{workflow}\n")
    return 0


def cmd_apps_keys_create(client: ApiClient, args: argparse.Namespace, out: TextIO) -> int:
    """Create a signing key for a bridge app; print it (shown this once)."""
    body = None if args.grace is None else {"grace_seconds": args.grace}
    created = client.call("POST", f"/v1/bridge/apps/{segment(args.app_id)}/keys", body=body)
    if args.json:
        _print_json(created, out)
        return 0
    out.write(f"{created['signing_key']}\n")
    previous = created.get("previous_keys_expire_at")
    sys.stderr.write(
        f"key {created['key_id']} of app {created['app_id']}: shown once, store it now"
        + (f"; the app's previous keys stay valid until {previous}" if previous else "")
        + "\n"
    )
    return 0


def cmd_apps_keys_list(client: ApiClient, args: argparse.Namespace, out: TextIO) -> int:
    """List a bridge app's signing keys (never their secrets)."""
    keys = client.call("GET", f"/v1/bridge/apps/{segment(args.app_id)}/keys")
    if args.json:
        _print_json(keys, out)
        return 0
    for key in keys:
        state = "primary" if key["primary"] else ("active" if key["active"] else "inactive")
        until = f" until {key['expires_at']}" if key["active"] and key["expires_at"] else ""
        out.write(f"{key['key_id']}  {state}{until}  created {key['created_at']}\n")
    return 0


def cmd_apps_keys_revoke(client: ApiClient, args: argparse.Namespace, out: TextIO) -> int:
    """Revoke one of a bridge app's signing keys at once."""
    client.call("DELETE", f"/v1/bridge/apps/{segment(args.app_id)}/keys/{segment(args.key_id)}")
    out.write(f"revoked key {args.key_id} of app {args.app_id}\n")
    return 0


# --- wiring --------------------------------------------------------------------


def run_client_command(args: argparse.Namespace) -> int:
    """Run a client command: resolve server and key, call, print errors as `code: message`."""
    key = find_api_key(args.api_key, args.data_dir)
    if key is None:
        sys.stderr.write(
            "error: no API key: pass --api-key, set DUCTOR_API_KEY, or start `ductor dev` "
            "(it writes .ductor/api_key)\n"
        )
        return 1
    try:
        key = checked_key(key, API_KEY_SOURCES)
        url = server_url(args.url)
    except ClientError as exc:
        return usage_error(exc)
    client = ApiClient(url, key)
    try:
        result: int = args.client_func(client, args, sys.stdout)
        return result
    except ClientError as exc:
        sys.stderr.write(f"error: {exc.code}: {exc.message}\n")
        if exc.details is not None:
            sys.stderr.write(json.dumps(exc.details, indent=2) + "\n")
        return 1
    finally:
        client.close()


ClientCommand = Callable[[ApiClient, argparse.Namespace, TextIO], int]
"""A client command: given the API client, its arguments and where to print."""

_COMMON = argparse.ArgumentParser(add_help=False)
_COMMON.add_argument("--url", default=None, help="server URL (default $DUCTOR_URL or :7070)")
_COMMON.add_argument("--api-key", default=None, help="API key (default $DUCTOR_API_KEY)")
_COMMON.add_argument("--data-dir", default=None, help="where to find api_key (default .ductor)")


def command(
    group: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    func: ClientCommand,
    help_text: str,
) -> argparse.ArgumentParser:
    """Add the client command `name` to `group`, with the options every client command
    takes (`--url`, `--api-key`, `--data-dir`)."""
    parser = group.add_parser(name, parents=[_COMMON], help=help_text, description=help_text)
    parser.set_defaults(func=run_client_command, client_func=func)
    return parser


def add_client_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `workflows`, `runs`, `events` and `apps` on the top-level parser."""

    workflows = sub.add_parser("workflows", help="validate, publish and read definitions")
    wf = workflows.add_subparsers(dest="workflows_command", metavar="COMMAND", required=True)
    p = command(wf, "validate", cmd_workflows_validate, "validate a definition file")
    p.add_argument("file", help="JSON definition file ('-' for stdin)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p = command(wf, "publish", cmd_workflows_publish, "publish a definition file")
    p.add_argument("file", help="JSON definition file ('-' for stdin)")
    p.add_argument("--idempotency-key", default=None)
    p.add_argument("--json", action="store_true", help="print the answer as JSON")
    p = command(wf, "list", cmd_workflows_list, "list workflow families and bridge apps' workflows")
    p.add_argument("--json", action="store_true")
    p = command(wf, "get", cmd_workflows_get, "show a family or one version")
    p.add_argument("slug", type=path_id)
    p.add_argument("--version", type=int, default=None)

    runs = sub.add_parser("runs", help="trigger, read, watch and steer runs")
    rs = runs.add_subparsers(dest="runs_command", metavar="COMMAND", required=True)
    p = command(rs, "trigger", cmd_runs_trigger, "start a run of a published workflow")
    p.add_argument("family", help="the workflow's family_slug")
    p.add_argument("--input", default=None, help="run input as JSON")
    p.add_argument("--version", type=int, default=None, help="pin a version (default latest)")
    p.add_argument("--idempotency-key", default=None)
    p.add_argument("--wait", action="store_true", help="wait for the run to end")
    p.add_argument(
        "--interval",
        type=seconds,
        default=0.5,
        help="with --wait, the pause between requests when the server answers at once",
    )
    p.add_argument("--timeout", type=seconds, default=None, help="give up waiting after N s")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the run id")
    p = command(rs, "get", cmd_runs_get, "show a run as JSON")
    p.add_argument("run_id", type=path_id)
    p = command(rs, "history", cmd_runs_history, "show a run's history")
    p.add_argument("run_id", type=path_id)
    p.add_argument("--json", action="store_true")
    p = command(rs, "list", cmd_runs_list, "list runs, newest first")
    p.add_argument("--status", default=None, help="e.g. RUN_STATUS_RUNNING")
    p.add_argument("--family", default=None, help="only runs of this family_slug")
    p.add_argument("--cursor", default=None)
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--json", action="store_true")
    p = command(rs, "watch", cmd_runs_watch, "show a run's steps live until it ends")
    p.add_argument("run_id", type=path_id)
    p.add_argument("--interval", type=seconds, default=0.5, help="seconds between polls")
    p.add_argument("--timeout", type=seconds, default=None, help="give up after N seconds")
    p = command(rs, "cancel", cmd_runs_cancel, "cancel a run")
    p.add_argument("run_id", type=path_id)
    p.add_argument("--reason", default="")
    p = command(rs, "rerun", cmd_runs_rerun, "start a new run like an ended one")
    p.add_argument("run_id", type=path_id)
    p.add_argument("--latest", action="store_true", help="run the family's latest version")
    p.add_argument("--idempotency-key", default=None)
    p.add_argument("-q", "--quiet", action="store_true", help="print only the new run's id")
    p = command(rs, "signal", cmd_runs_signal, "send a signal to a run")
    p.add_argument("run_id", type=path_id)
    p.add_argument("name", type=path_id)
    p.add_argument("--payload", default=None, help="signal payload as JSON")
    p.add_argument("--id", default=None, help="signal id (a repeat is ignored)")

    events = sub.add_parser("events", help="send events")
    ev = events.add_subparsers(dest="events_command", metavar="COMMAND", required=True)
    p = command(ev, "send", cmd_events_send, "send an event")
    p.add_argument("name")
    p.add_argument("data", nargs="?", default=None, help="event data as JSON")
    p.add_argument(
        "--data", dest="data_flag", metavar="DATA", default=None, help="event data as JSON"
    )
    p.add_argument("--id", default=None, help="event id (a repeat is a duplicate)")

    apps = sub.add_parser("apps", help="bridge apps: list them, manage their signing keys")
    ap = apps.add_subparsers(dest="apps_command", metavar="COMMAND", required=True)
    p = command(ap, "list", cmd_apps_list, "list bridge apps and their workflows")
    p.add_argument("--json", action="store_true")
    app_keys = ap.add_parser("keys", help="create, list and revoke an app's signing keys")
    ak = app_keys.add_subparsers(dest="apps_keys_command", metavar="COMMAND", required=True)
    p = command(ak, "create", cmd_apps_keys_create, "create a signing key for an app")
    p.add_argument("app_id", type=path_id)
    p.add_argument(
        "--grace", type=int, default=None, help="seconds the previous keys stay valid (1 day)"
    )
    p.add_argument("--json", action="store_true")
    p = command(ak, "list", cmd_apps_keys_list, "list an app's signing keys")
    p.add_argument("app_id", type=path_id)
    p.add_argument("--json", action="store_true")
    p = command(ak, "revoke", cmd_apps_keys_revoke, "revoke one of an app's signing keys")
    p.add_argument("app_id", type=path_id)
    p.add_argument("key_id", type=path_id)
