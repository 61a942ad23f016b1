"""The CLI's client side without a server: where it finds its key, how it reports
errors, and what `runs watch` draws (an httpx test transport plays the server)."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from ductor_server.cli import build_parser, main, parse_command
from ductor_server.cli_client import (
    ApiClient,
    ClientError,
    cmd_apps_list,
    cmd_runs_rerun,
    cmd_runs_watch,
    cmd_workflows_list,
    find_api_key,
    render_run,
    server_url,
)
from ductor_server.settings import Settings


def _run(status: str, steps: list[tuple[str, str]], output: Any = None) -> dict[str, Any]:
    return {
        "id": "r1",
        "family_slug": "hello-world",
        "version": 1,
        "status": status,
        "output": output,
        "steps": [{"ref": ref, "status": st, "attempt": 1} for ref, st in steps],
    }


def test_key_comes_from_flag_then_env_then_data_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "api_key").write_text("dk_from_file\n")
    monkeypatch.delenv("DUCTOR_API_KEY", raising=False)
    monkeypatch.delenv("DUCTOR_DATA_DIR", raising=False)
    assert find_api_key(None, str(tmp_path)) == "dk_from_file"
    monkeypatch.setenv("DUCTOR_API_KEY", "dk_from_env")
    assert find_api_key(None, str(tmp_path)) == "dk_from_env"
    assert find_api_key("dk_flag", str(tmp_path)) == "dk_flag"
    monkeypatch.delenv("DUCTOR_API_KEY")
    assert find_api_key(None, str(tmp_path / "empty")) is None


def test_the_variables_of_a_dev_started_elsewhere_lead_the_client_to_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """getting-started.md: a `ductor dev` on another port or data dir is found once
    the client has the same DUCTOR_PORT and DUCTOR_DATA_DIR (or --url, --data-dir)."""
    for name in ("DUCTOR_URL", "DUCTOR_HOST", "DUCTOR_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "api_key").write_text("dk_elsewhere\n")
    monkeypatch.setenv("DUCTOR_PORT", "7171")
    monkeypatch.setenv("DUCTOR_DATA_DIR", str(tmp_path))
    assert server_url(None) == "http://127.0.0.1:7171"
    assert find_api_key(None, None) == "dk_elsewhere"
    monkeypatch.delenv("DUCTOR_PORT")
    monkeypatch.delenv("DUCTOR_DATA_DIR")
    assert server_url("http://127.0.0.1:7171") == "http://127.0.0.1:7171"
    assert find_api_key(None, str(tmp_path)) == "dk_elsewhere"


def test_a_flag_wins_over_its_variable_even_one_that_does_not_parse(tmp_path: Path) -> None:
    # Kubernetes sets DUCTOR_PORT=tcp://IP:PORT for a Service named `ductor`.
    environ = {
        "DUCTOR_PORT": "tcp://10.0.0.7:7070",
        "DUCTOR_ROLES": "api,chef",
        "DUCTOR_HOST": "0.0.0.0",
        "DUCTOR_DATA_DIR": str(tmp_path / "env"),
    }
    settings = Settings.from_env(
        environ=environ, host="127.0.0.2", port=7203, roles=("api",), data_dir=tmp_path
    )
    assert (settings.host, settings.port, settings.roles, settings.data_dir) == (
        "127.0.0.2",
        7203,
        ("api",),
        tmp_path,
    )
    with pytest.raises(ValueError, match="DUCTOR_PORT must be a whole number"):
        Settings.from_env(environ=environ, roles=("api",))
    with pytest.raises(ValueError, match="unknown roles"):
        Settings.from_env(environ=environ, port=7203)


def test_an_error_answer_becomes_code_and_message() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.headers["authorization"] == "Bearer k"
        return httpx.Response(
            404, json={"code": "run.not_found", "message": "run 'x' not found", "details": None}
        )

    client = ApiClient("http://test", "k", transport=httpx.MockTransport(handler))
    with pytest.raises(ClientError) as raised:
        client.call("GET", "/v1/runs/x")
    assert (raised.value.code, raised.value.status) == ("run.not_found", 404)


def test_cli_prints_the_error_and_exits_1(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DUCTOR_API_KEY", raising=False)
    monkeypatch.delenv("DUCTOR_DATA_DIR", raising=False)
    assert main(["runs", "get", "x"]) == 1
    assert "no API key" in capsys.readouterr().err
    # A server that is not there: a clear message, exit 1.
    code = main(["runs", "get", "x", "--api-key", "k", "--url", "http://127.0.0.1:9"])
    assert code == 1
    assert capsys.readouterr().err.startswith("error: client.unreachable: cannot reach")


@pytest.mark.parametrize(
    ("env", "flags", "said"),
    [
        (
            {"DUCTOR_PORT": "abc"},
            [],
            "DUCTOR_PORT must be a whole number from 0 to 65535, got 'abc'",
        ),
        ({"DUCTOR_PORT": "tcp://10.0.0.1:80"}, [], "DUCTOR_PORT must be a whole number"),
        # Once a call to http://[http://x]:7070 that could not reach it: status 1.
        (
            {"DUCTOR_HOST": "http://x"},
            [],
            "DUCTOR_HOST must be an IP address or a host name, got 'http://x'",
        ),
        ({"DUCTOR_HOST": "a host"}, [], "DUCTOR_HOST must be an IP address or a host name"),
        ({"DUCTOR_URL": "http://127.0.0.1:abc"}, [], "DUCTOR_URL: 'http://127.0.0.1:abc' is not"),
        ({"DUCTOR_URL": "garbage"}, [], "DUCTOR_URL must be an http:// or https:// URL"),
        ({}, ["--url", "http://[::1"], "--url: 'http://[::1' is not"),
        ({}, ["--url", "ftp://host"], "--url must be an http:// or https:// URL, got 'ftp://host'"),
        ({}, ["--url", "https://host:99999"], "--url: 'https://host:99999' has no port 99999"),
    ],
)
def test_a_server_address_that_is_no_url_is_one_error_line_and_status_2(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    env: dict[str, str],
    flags: list[str],
    said: str,
) -> None:
    for name in ("DUCTOR_URL", "DUCTOR_HOST", "DUCTOR_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    manifest = tmp_path / "worker.yaml"
    manifest.write_text("kind: Worker\nspec:\n  id: ada\n")
    for command in (["runs", "get", "x"], ["keys", "list"], ["apply", str(manifest)]):
        assert main([*command, "--api-key", "k", *flags]) == 2, command
        err = capsys.readouterr().err
        assert err.startswith(f"error: client.usage: {said}"), (command, err)
        assert err.count("\n") == 1, err


def test_bad_json_flags_are_reported_before_any_call(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["runs", "trigger", "f", "--input", "{nope", "--api-key", "k", "--url", "http://x"])
    assert code == 1
    assert "error: client.bad_json: --input is not valid JSON" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("command", "flag", "text", "said"),
    [
        (["runs", "trigger", "f"], "--input", "NaN", "NaN is not a JSON value"),
        (["runs", "trigger", "f"], "--input", '{"a": [Infinity]}', "Infinity is not a JSON value"),
        (["runs", "trigger", "f"], "--input", "-Infinity", "-Infinity is not a JSON value"),
        (["runs", "trigger", "f"], "--input", '{"a": 1e999}', "1e999 is out of a number's range"),
        (["runs", "signal", "r", "go"], "--payload", "-1E400", "-1E400 is out of a number's range"),
        (["events", "send", "n"], "--data", "[NaN]", "NaN is not a JSON value"),
    ],
)
def test_json_flags_refuse_what_json_cannot_carry(
    capsys: pytest.CaptureFixture[str], command: list[str], flag: str, text: str, said: str
) -> None:
    """Python's json reads NaN, Infinity and 1e999 (as inf), and would send them on as
    bare NaN/Infinity, which no JSON reader takes: the server would answer
    malformed JSON at a column of a body the user never wrote."""
    code = main([*command, f"{flag}={text}", "--api-key", "k", "--url", "http://127.0.0.1:9"])
    assert code == 1
    assert capsys.readouterr().err == f"error: client.bad_json: {flag} is not valid JSON: {said}\n"


def test_watch_draws_each_change_and_ends_with_the_output() -> None:
    states = [
        _run(
            "RUN_STATUS_RUNNING",
            [("greet", "STEP_STATUS_SUCCEEDED"), ("pause", "STEP_STATUS_WAITING")],
        ),
        _run(
            "RUN_STATUS_RUNNING",
            [("greet", "STEP_STATUS_SUCCEEDED"), ("pause", "STEP_STATUS_WAITING")],
        ),
        _run(
            "RUN_STATUS_SUCCEEDED",
            [("greet", "STEP_STATUS_SUCCEEDED"), ("pause", "STEP_STATUS_SUCCEEDED")],
            {"pause": {"waited_until": "t"}},
        ),
    ]
    served = iter(states)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=next(served))

    client = ApiClient("http://test", "k", transport=httpx.MockTransport(handler))
    args = argparse.Namespace(run_id="r1", interval=0.0, timeout=5.0)
    out = io.StringIO()

    assert cmd_runs_watch(client, args, out) == 0
    text = out.getvalue()
    assert text.count("run r1  hello-world v1") == 2  # the repeat was not redrawn
    assert "pause  waiting" in text
    assert text.rstrip().endswith('"waited_until": "t"\n  }\n}'.rstrip())


def test_watch_exits_1_when_the_run_fails() -> None:
    failed = _run("RUN_STATUS_FAILED", [("call", "STEP_STATUS_FAILED")])
    failed["error"] = {"code": "http.status", "message": "503"}
    client = ApiClient(
        "http://test",
        "k",
        transport=httpx.MockTransport(lambda r: httpx.Response(200, json=failed)),
    )

    out = io.StringIO()
    args = argparse.Namespace(run_id="r1", interval=0.0, timeout=5.0)
    assert cmd_runs_watch(client, args, out) == 1
    assert "error: " in out.getvalue()


def test_render_shows_retries_and_waits() -> None:
    run = _run("RUN_STATUS_RUNNING", [("call", "STEP_STATUS_RETRYING")])
    run["steps"][0].update(attempt=2, retry_at="2026-01-01T00:00:05Z")
    text = render_run(run)
    assert "call  retrying   attempt 2  retry at 2026-01-01T00:00:05Z" in text
    assert "output" not in text
    assert json.dumps(None) not in text


def test_every_documented_command_parses() -> None:
    parser = build_parser()
    for argv in [
        ["dev", "--port", "7071", "--data-dir", "d"],
        ["serve", "--roles", "api,worker"],
        ["migrate"],
        ["keys", "create", "--tenant", "t"],
        ["workflows", "validate", "f.json"],
        ["workflows", "publish", "f.json"],
        [
            "runs",
            "trigger",
            "fam",
            "--input",
            "{}",
            "--version",
            "2",
            "--idempotency-key",
            "k",
            "--wait",
        ],
        ["runs", "get", "id"],
        ["runs", "list"],
        ["runs", "watch", "id"],
        ["events", "send", "name", "--data", "{}", "--id", "e1"],
        ["runs", "rerun", "id", "--latest", "--idempotency-key", "k"],
        ["chat", "-m", "why?", "--model", "gpt", "--yes"],
        ["chat", "--conversation", "agc_1", "--json"],
    ]:
        assert parser.parse_args(argv).func is not None


def test_rerun_posts_and_names_both_runs() -> None:
    seen: list[tuple[str, str, bytes, str | None]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(
            (
                request.method,
                request.url.path,
                request.content,
                request.headers.get("idempotency-key"),
            )
        )
        run = {"id": "r2", "family_slug": "fam", "version": 3, "status": "RUN_STATUS_RUNNING"}
        return httpx.Response(201, json={"rerun_of": "r1", "run": run})

    client = ApiClient("http://test", "k", transport=httpx.MockTransport(handler))
    out = io.StringIO()
    args = argparse.Namespace(run_id="r1", latest=True, idempotency_key="again", quiet=False)
    assert cmd_runs_rerun(client, args, out) == 0
    assert seen == [("POST", "/v1/runs/r1/rerun", b'{"latest": true}', "again")]
    assert out.getvalue() == "re-ran r1 as r2 (fam v3)\n"


def test_serve_refuses_unknown_roles(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--roles", "api,chef"]) == 2
    assert "unknown roles" in capsys.readouterr().err


def _send_event(argv: list[str]) -> dict[str, Any]:
    """Run `ductor events send ARGV` against a stand-in server; the body it sent."""
    sent: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        assert (request.method, request.url.path) == ("POST", "/v1/events")
        sent.append(json.loads(request.content))
        return httpx.Response(200, json={"event_id": "e1", "started": [], "delivered": []})

    args = parse_command(build_parser(), ["events", "send", *argv])
    client = ApiClient("http://test", "k", transport=httpx.MockTransport(handler))
    assert args.client_func(client, args, io.StringIO()) == 0
    return sent[0]


def test_event_data_may_be_positional_or_a_flag() -> None:
    # As docs/sdk.md writes it: the data right after the name.
    assert _send_event(["order.created", '{"id": 7}']) == {
        "name": "order.created",
        "data": {"id": 7},
    }
    assert _send_event(["order.created", "--data", '{"id": 8}'])["data"] == {"id": 8}
    assert _send_event(["order.created"])["data"] is None
    # Options may stand between the name and the data.
    sent = _send_event(["order.created", "--url", "http://test", '{"id": 9}'])
    assert sent["data"] == {"id": 9}


def test_event_data_given_twice_or_not_json_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    where = ["--api-key", "k", "--url", "http://127.0.0.1:9"]
    assert main(["events", "send", "n", "{}", "--data", "{}", *where]) == 1
    assert "give the event data once" in capsys.readouterr().err
    assert main(["events", "send", "n", "{nope", *where]) == 1
    assert "error: client.bad_json: DATA is not valid JSON" in capsys.readouterr().err


def test_a_usage_error_shows_the_sub_commands_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["events", "send", "order.created", "{}", "surplus"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: ductor events send ")
    assert "unrecognized arguments: surplus" in err
    with pytest.raises(SystemExit):
        main(["runs", "get", "r1", "r2"])
    assert capsys.readouterr().err.startswith("usage: ductor runs get ")


def test_server_commands_show_their_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    for command, expected in (
        ("serve", ["127.0.0.1", "7070", ".ductor", "$DUCTOR_ROLES", "else all", "default off"]),
        ("dev", ["127.0.0.1", "7070", ".ductor"]),
        ("migrate", [".ductor"]),
    ):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        shown = " ".join(capsys.readouterr().out.split())
        for text in expected:
            assert text in shown, (command, text)


def _lists(apps: list[dict[str, Any]], families: list[dict[str, Any]]) -> ApiClient:
    def handler(request: httpx.Request) -> httpx.Response:
        body = apps if request.url.path == "/v1/bridge/apps" else families
        return httpx.Response(200, json=body)

    return ApiClient("http://test", "k", transport=httpx.MockTransport(handler))


def test_empty_lists_say_how_to_fill_them_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    out = io.StringIO()
    args = argparse.Namespace(json=False)
    assert cmd_workflows_list(_lists([], []), args, out) == 0
    assert cmd_apps_list(_lists([], []), args, out) == 0
    assert out.getvalue() == ""  # the lists stay empty for scripts
    err = capsys.readouterr().err
    assert "no workflows yet: publish one with `ductor workflows publish FILE`" in err
    assert "no bridge apps yet" in err


def test_sdk_workflows_are_listed_as_bridge_slugs(capsys: pytest.CaptureFixture[str]) -> None:
    app = {
        "app_id": "shop",
        "stale": False,
        "url": "http://127.0.0.1:8010/api/ductor",
        "sdk": "ductor-python",
        "sdk_version": "0.1.0",
        "last_seen_at": "2026-12-01T00:00:00Z",
        "workflows": ["fulfil-order"],
    }
    out = io.StringIO()
    args = argparse.Namespace(json=False)
    assert cmd_workflows_list(_lists([app], []), args, out) == 0
    assert out.getvalue().split() == ["bridge:shop:fulfil-order", "sdk", "app", "shop"]
    out = io.StringIO()
    assert cmd_apps_list(_lists([app], []), args, out) == 0
    assert out.getvalue().splitlines()[1] == "  bridge:shop:fulfil-order"
    assert capsys.readouterr().err == ""


def test_a_tenant_id_given_to_the_operators_commands_is_checked_before_anything_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A database nobody can reach: a command that got past the check would fail there.
    monkeypatch.setenv("DUCTOR_DATABASE_URL", "postgresql://postgres@127.0.0.1:1/none")
    monkeypatch.delenv("DUCTOR_SEED_TENANT", raising=False)
    seed = tmp_path / "seed"
    seed.mkdir()
    for tenant in ("bad tenant", "évil/../x", "-dash", "t" * 65):
        assert main(["serve", "--seed", str(seed), f"--seed-tenant={tenant}"]) == 2
        err = capsys.readouterr().err
        assert err == (
            f"error: --seed-tenant {tenant!r}: a tenant id is 1 to 64 letters, digits,"
            " '.', '_' or '-', starting with a letter or digit\n"
        )
        monkeypatch.setenv("DUCTOR_SEED_TENANT", tenant)
        assert main(["serve", "--seed", str(seed)]) == 2
        assert "error: --seed-tenant" in capsys.readouterr().err
        monkeypatch.delenv("DUCTOR_SEED_TENANT")
        assert main(["keys", "create", f"--tenant={tenant}"]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"error: tenant.invalid: --tenant {tenant!r}: a tenant id is"), err


@pytest.mark.parametrize(
    "command",
    [
        ["runs", "get", ""],
        ["runs", "history", ""],
        ["runs", "watch", ""],
        ["runs", "cancel", ""],
        ["runs", "rerun", ""],
        ["runs", "signal", "", "go"],
        ["runs", "signal", "run_1", ""],
        ["workflows", "get", ""],
        ["apps", "keys", "list", ""],
        ["apps", "keys", "revoke", "app", ""],
        ["keys", "revoke", ""],
        ["receipts", "get", ""],
    ],
)
def test_an_empty_id_is_refused_before_any_call(
    capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    """`RUN_ID=$(ductor runs trigger ... --quiet)` leaves RUN_ID empty when the trigger
    fails; `ductor runs watch "$RUN_ID"` must then say so, not read `GET /v1/runs/`
    (the list of runs) as the run, nor fail with a traceback."""
    with pytest.raises(SystemExit) as exited:
        main([*command, "--api-key", "k", "--url", "http://127.0.0.1:9"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: ductor {' '.join(command[:2])} "), err
    assert err.rstrip().endswith(": must not be empty"), err


@pytest.mark.parametrize(
    "command",
    [
        ["runs", "watch", "run_1", "--interval=-1"],
        ["runs", "watch", "run_1", "--interval=nan"],
        ["runs", "watch", "run_1", "--interval=0"],
        ["runs", "watch", "run_1", "--timeout=-1"],
        ["runs", "watch", "run_1", "--timeout=inf"],
        ["runs", "trigger", "f", "--wait", "--interval=-0.5"],
        ["runs", "trigger", "f", "--wait", "--timeout=0"],
    ],
)
def test_a_wait_flag_that_is_no_time_is_refused_before_any_call(
    capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    """A negative or NaN --interval once failed after the first poll with Python's
    own words (`sleep length must be non-negative`); --timeout=-1 gave up at once."""
    with pytest.raises(SystemExit) as exited:
        main([*command, "--api-key", "k", "--url", "http://127.0.0.1:9"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    flag, value = command[-1].split("=")
    assert err.rstrip().endswith(
        f"argument {flag}: must be a number of seconds above zero, got {value!r}"
    ), err
