"""`ductor dev` as a real process: it starts, serves health, and stops."""

from __future__ import annotations

import contextlib
import os
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


def _embedded(command: str, port: int, data: Path) -> subprocess.Popen[bytes]:
    """`ductor COMMAND` (dev or serve) on the embedded store in `data`, on `port`."""
    return subprocess.Popen(
        [sys.executable, "-m", "ductor_server.cli", command, "--port", str(port)],
        env=_env({"DUCTOR_DATA_DIR": str(data)}),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def _starts_after_kill_9(command: str, first: subprocess.Popen[bytes], data: Path) -> None:
    """Kill `first` with SIGKILL: its pid file stays behind, yet does not stop a new
    `ductor COMMAND` on `data`, whose clean stop removes the file."""
    pid_file = data / "ductor.pid"
    first.kill()
    first.wait(timeout=10)
    assert pid_file.read_text() == f"{first.pid}\n"  # kill -9 leaves it behind
    port = _free_port()
    second = _embedded(command, port, data)
    try:
        assert _ready(port, second) == 200
        assert pid_file.read_text() == f"{second.pid}\n"
    finally:
        if second.poll() is None:
            second.terminate()
            second.wait(timeout=10)
    assert second.returncode == 0
    assert not pid_file.exists(), "a clean stop removes the pid file"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_ductor_dev_serves_healthz(tmp_path: Path) -> None:
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ductor_server.cli",
            "dev",
            "--port",
            str(port),
            "--data-dir",
            str(tmp_path / "data"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                response = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
                assert time.monotonic() < deadline, "ductor dev did not start in 30s"
                time.sleep(0.1)
        assert response.json() == {"status": "ok"}
        # HEAD is answered as GET, without the body (load balancers probe so).
        head = httpx.head(f"http://127.0.0.1:{port}/healthz", timeout=5)
        assert (head.status_code, head.content) == (200, b"")
        assert head.headers["content-length"] == response.headers["content-length"]
        assert httpx.head(f"http://127.0.0.1:{port}/v1/runs", timeout=5).status_code == 401
        assert (tmp_path / "data").is_dir()
        assert (tmp_path / "data" / "ductor.pid").read_text().strip() == str(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert proc.returncode == 0
    assert not (tmp_path / "data" / "ductor.pid").exists(), "a clean stop removes the pid file"


def test_a_second_dev_on_the_same_data_dir_is_refused_and_a_stale_pid_file_is_not(
    tmp_path: Path,
) -> None:
    """The pid file is the one docs/getting-started.md kills with `kill -9`: a second
    `ductor dev` on the data dir (on the same port, or another) must neither take it
    over nor remove it; after kill -9, the file left behind does not stop a start."""
    data = tmp_path / "data"
    pid_file = data / "ductor.pid"

    port = _free_port()
    first = _embedded("dev", port, data)
    try:
        assert _ready(port, first) == 200
        for again in (port, _free_port()):
            done = subprocess.run(
                [sys.executable, "-m", "ductor_server.cli", "dev", "--port", str(again)],
                env=_env({"DUCTOR_DATA_DIR": str(data)}),
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 1, done.stdout + done.stderr
            assert done.stderr == (
                f"error: ductor dev is already running on {data.resolve()} (pid {first.pid}):"
                " stop it first, or give this one another --data-dir\n"
            )
            assert done.stdout == ""
            assert pid_file.read_text() == f"{first.pid}\n"
        _starts_after_kill_9("dev", first, data)
    finally:
        if first.poll() is None:
            first.terminate()
            first.wait(timeout=10)


def test_a_second_embedded_serve_on_the_same_data_dir_is_refused_until_the_first_dies(
    tmp_path: Path,
) -> None:
    """Two embedded `ductor serve` on one data dir would both run engines on its one
    SQLite file: the second is refused as a second `ductor dev` is, by the data dir's
    lock, which goes with its process (kill -9 too), so the pid file it leaves
    behind does not stop the next start."""
    data = tmp_path / "data"
    pid_file = data / "ductor.pid"

    port = _free_port()
    first = _embedded("serve", port, data)
    try:
        assert _ready(port, first) == 200
        assert pid_file.read_text() == f"{first.pid}\n"
        done = subprocess.run(
            [sys.executable, "-m", "ductor_server.cli", "serve", "--port", str(_free_port())],
            env=_env({"DUCTOR_DATA_DIR": str(data)}),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 1, done.stdout + done.stderr
        assert done.stderr == (
            f"error: ductor is already running on {data.resolve()} (pid {first.pid}):"
            " stop it first, or give this one another --data-dir\n"
        )
        assert done.stdout == ""
        # `ductor dev` and an embedded `ductor serve` take the one lock.
        dev = _ductor("dev", "--port", str(_free_port()), "--data-dir", str(data))
        assert dev.returncode == 1, dev
        assert f" is already running on {data.resolve()} (pid {first.pid})" in dev.stderr
        assert pid_file.read_text() == f"{first.pid}\n"
        _starts_after_kill_9("serve", first, data)
    finally:
        if first.poll() is None:
            first.terminate()
            first.wait(timeout=10)


def _env(env: dict[str, str] | None) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("DUCTOR_")}
    base.update(env or {})
    return base


def _ductor(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `ductor ARGS`; without `cwd`, in an empty directory that must stay empty
    (a database URL taken for a file name once left a SQLite file in the checkout)."""
    if cwd is not None:
        return subprocess.run(
            [sys.executable, "-m", "ductor_server.cli", *args],
            env=_env(env),
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=120,
        )
    with tempfile.TemporaryDirectory(prefix="ductor-cwd-") as empty:
        result = _ductor(*args, env=env, cwd=Path(empty))
        left = sorted(p.name for p in Path(empty).iterdir())
        assert left == [], f"ductor {' '.join(args)} wrote {left} into its working directory"
        return result


def _ready(port: int, proc: subprocess.Popen[bytes]) -> int:
    """Wait for the server's /readyz; its status code."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code
        except httpx.TransportError:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline, "the server did not start in 30s"
            time.sleep(0.1)


def _serve_until_ready(env: dict[str, str], cwd: Path) -> str:
    """Start `ductor serve`, wait until it is ready, stop it; what it printed."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ductor_server.cli", "serve", "--port", str(port)],
        env=_env(env),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        assert _ready(port, proc) == 200
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert proc.stdout is not None
    return proc.stdout.read().decode()


def test_an_ipv6_listen_address_is_written_in_brackets(tmp_path: Path) -> None:
    """DUCTOR_HOST may be an IPv6 address (docs/deploy.md: "or the address to
    listen on"): the start line shows a URL that works, and the client commands,
    which build theirs from DUCTOR_HOST and DUCTOR_PORT, reach the server."""
    with socket.socket(socket.AF_INET6) as s:
        s.bind(("::1", 0))
        port = s.getsockname()[1]
    env = {"DUCTOR_HOST": "::1", "DUCTOR_PORT": str(port)}
    data = tmp_path / "data"
    proc = subprocess.Popen(
        [sys.executable, "-m", "ductor_server.cli", "dev", "--data-dir", str(data)],
        env=_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline().decode()
        assert f" on http://[::1]:{port}" in first, first
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://[::1]:{port}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "ductor dev did not start in 30s"
            time.sleep(0.1)
        listed = _ductor("runs", "list", env={**env, "DUCTOR_DATA_DIR": str(data)})
        assert listed.returncode == 0, listed.stderr
        assert "Traceback" not in listed.stderr
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_serve_refuses_an_unmigrated_database_until_migrated(
    postgres_url: str, tmp_path: Path
) -> None:
    env = {"DUCTOR_DATABASE_URL": postgres_url}
    refused = _ductor("serve", "--port", str(_free_port()), env=env)
    assert refused.returncode == 1
    assert "Traceback" not in refused.stderr
    assert refused.stderr.strip().splitlines() == [refused.stderr.strip()]
    assert "is not migrated" in refused.stderr
    assert "run `ductor migrate`" in refused.stderr
    assert "serve on" not in refused.stdout

    assert _ductor("migrate", env=env).returncode == 0
    _serve_until_ready(env, tmp_path)


def test_serve_on_an_unreachable_database_fails_in_one_line(tmp_path: Path) -> None:
    url = f"postgresql://postgres@127.0.0.1:{_free_port()}/ductor"
    for command in (["serve", "--port", str(_free_port())], ["migrate"]):
        result = _ductor(*command, env={"DUCTOR_DATABASE_URL": url})
        assert result.returncode == 1, result
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert lines[0].startswith("error: cannot ")
        assert "127.0.0.1" in lines[0]
        assert "refused" in lines[0], lines[0]
        assert "serve on" not in result.stdout


def test_unknown_database_schemes_are_refused(tmp_path: Path) -> None:
    for command in (
        ["serve", "--port", str(_free_port())],
        ["migrate"],
        ["keys", "create", "--tenant", "t"],
    ):
        result = _ductor(*command, env={"DUCTOR_DATABASE_URL": "mysql://x"}, cwd=tmp_path)
        assert result.returncode != 0
        assert "unsupported database URL scheme 'mysql://'" in result.stderr
        assert "Traceback" not in result.stderr
        # A URL that lost its slashes is not a file name either.
        result = _ductor(*command, env={"DUCTOR_DATABASE_URL": "postgres:/db"}, cwd=tmp_path)
        assert result.returncode != 0
        assert result.stderr.startswith("error: malformed database URL 'postgres:...'")
        assert "Traceback" not in result.stderr
        # Nor one whose port or host cannot be read; its password is never shown.
        for url in ("postgresql://u:secret@127.0.0.1:99999/db", "postgresql://u:secret@[bad/db"):
            result = _ductor(*command, env={"DUCTOR_DATABASE_URL": url}, cwd=tmp_path)
            assert result.returncode == 2, (command, url, result)
            lines = result.stderr.strip().splitlines()
            assert len(lines) == 1, result.stderr
            assert lines[0].startswith("error: malformed database URL 'postgresql://...'"), lines
            assert "secret" not in lines[0]
    assert list(tmp_path.iterdir()) == [], "no SQLite file named after the URL"


def test_postgres_url_spellings_are_accepted(postgres_url: str) -> None:
    rest = postgres_url.split("://", 1)[1]
    first = _ductor("migrate", env={"DUCTOR_DATABASE_URL": f"postgresql+psycopg://{rest}"})
    assert first.returncode == 0, first.stderr
    assert "applied 0001" in first.stdout
    again = _ductor("migrate", env={"DUCTOR_DATABASE_URL": f"postgres://{rest}"})
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == "database is up to date"


def test_migrate_applies_once_then_reports_up_to_date(tmp_path: Path, postgres_url: str) -> None:
    for env, extra in (
        ({}, ["--data-dir", str(tmp_path / "data")]),
        ({"DUCTOR_DATABASE_URL": postgres_url}, []),
    ):
        first = _ductor("migrate", *extra, env=env)
        assert first.returncode == 0, first.stderr
        assert "applied 0001" in first.stdout
        # One line per migration applied, as docs/operations.md says, and nothing else.
        assert all(line.startswith("applied ") for line in first.stdout.splitlines())
        again = _ductor("migrate", *extra, env=env)
        assert again.returncode == 0, again.stderr
        assert again.stdout.strip() == "database is up to date"
    assert (tmp_path / "data" / "ductor.db").is_file()


def test_migrate_reads_only_where_the_store_is(tmp_path: Path) -> None:
    env = {"DUCTOR_PORT": "abc", "DUCTOR_LEASE_SECONDS": "x"}
    result = _ductor("migrate", "--data-dir", str(tmp_path / "data"), env=env)
    assert result.returncode == 0, result.stderr
    assert "applied 0001" in result.stdout


def test_bad_settings_stop_the_start_in_one_line_naming_the_variable(tmp_path: Path) -> None:
    cases = {
        "DUCTOR_PORT": "abc",
        "DUCTOR_MAX_BODY_BYTES": "1MB",
        "DUCTOR_POISON_AFTER": "x",
        "DUCTOR_CEL_SANDBOX_THRESHOLD": "x",
        "DUCTOR_CEL_SANDBOX_PROCESSES": "0",
        "DUCTOR_LEASE_SECONDS": "-5",
        "DUCTOR_POLL_INTERVAL": "fast",
        "DUCTOR_STOP_GRACE": "x",
        "DUCTOR_CEL_ENGINE": "v8",
        "DUCTOR_HOST": "not a host",
        "DUCTOR_DATABASE_URL": str(tmp_path / "x.db"),
        "DUCTOR_STRIPE_API_BASE": "notaurl",
        # These are read while the server is built: still before the start line.
        "DUCTOR_BRIDGE_REQUIRE_NONCE": "maybe",
        "DUCTOR_BRIDGE_SIGNING_KEY_FALLBACK": "old-key-without-a-new-one",
        "DUCTOR_BRIDGE_SIGNING_KEY": "   ",
        "DUCTOR_SECRET_KEYS": "bad",
        "DUCTOR_RECEIPTS_FOR_RUNS": "on",
        "DUCTOR_OTEL": "maybe",
        "DUCTOR_FAIRNESS": '{"default": {"weight": 0}}',
        "DUCTOR_REDIS_URL": "localhost:6379",
        "DUCTOR_RECEIPT_KEYS": str(tmp_path / "missing"),
    }
    # `dev` makes its own receipt key: DUCTOR_RECEIPTS_FOR_RUNS=on is fine there.
    dev_too = {
        "DUCTOR_PORT",
        "DUCTOR_HOST",
        "DUCTOR_BRIDGE_SIGNING_KEY_FALLBACK",
        "DUCTOR_BRIDGE_SIGNING_KEY",
        "DUCTOR_CEL_ENGINE",
        "DUCTOR_SECRET_KEYS",
        "DUCTOR_OTEL",
        "DUCTOR_FAIRNESS",
        "DUCTOR_REDIS_URL",
        "DUCTOR_RECEIPT_KEYS",
        "DUCTOR_STRIPE_API_BASE",
    }
    data = str(tmp_path / "data")
    for name, value in cases.items():
        commands = [["serve", "--data-dir", data]]
        if name in dev_too:
            commands.append(["dev", "--data-dir", data])
        for command in commands:
            # A --port flag wins over DUCTOR_PORT without reading it (a test in
            # api/test_cli.py): the variable is refused when it sets the port.
            port = [] if name == "DUCTOR_PORT" else ["--port", str(_free_port())]
            result = _ductor(*command, *port, env={name: value})
            assert result.returncode == 2, (name, command, result)
            lines = result.stderr.strip().splitlines()
            assert len(lines) == 1, (name, result.stderr)
            assert lines[0].startswith("error: "), lines[0]
            assert name in lines[0], lines[0]
            assert " on http" not in result.stdout, (name, result.stdout)
    assert not (tmp_path / "x.db").exists(), "a bare path is no SQLite URL"


def test_bad_flags_are_refused_before_the_start(tmp_path: Path) -> None:
    for flags, message in (
        (["--port", "99999"], "--port must be a whole number from 0 to 65535, got '99999'"),
        (["--port", "abc"], "--port must be a whole number from 0 to 65535, got 'abc'"),
        (["--roles", ""], "--roles: unknown roles"),
        (["--host", "http://x"], "--host must be an IP address or a host name, got 'http://x'"),
    ):
        result = _ductor("serve", "--data-dir", str(tmp_path), *flags)
        assert result.returncode == 2, (flags, result)
        assert message in result.stderr, result.stderr
        assert "serve on" not in result.stdout


def test_a_data_dir_that_cannot_be_made_stops_every_command_in_one_line(tmp_path: Path) -> None:
    taken = tmp_path / "a-file"
    taken.write_text("")
    wanted = f"error: the data dir '{taken}' (--data-dir or DUCTOR_DATA_DIR) must be a directory"
    port = str(_free_port())
    for args, env in (
        (["serve", "--port", port], {"DUCTOR_DATA_DIR": str(taken)}),
        (["dev", "--port", port], {"DUCTOR_DATA_DIR": str(taken)}),
        (["migrate", "--data-dir", str(taken)], {}),
        (["tenants", "create", "acme", "--database", "--data-dir", str(taken)], {}),
    ):
        result = _ductor(*args, env=env)
        assert result.returncode == 2, (args, result)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, (args, result.stderr)
        assert lines[0].startswith(wanted), (args, lines[0])
        assert " on http" not in result.stdout


def test_a_database_a_newer_version_migrated_is_refused_by_every_command(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    env = {"DUCTOR_DATA_DIR": str(data)}
    assert _ductor("migrate", env=env).returncode == 0
    with contextlib.closing(sqlite3.connect(data / "ductor.db")) as db, db:
        db.execute("INSERT INTO schema_migrations (name, applied_at) VALUES ('9999_future', 'now')")
    port = ["--port", str(_free_port())]
    for command in (["serve", *port], ["serve", "--migrate", *port], ["dev", *port], ["migrate"]):
        refused = _ductor(*command, env=env)
        assert refused.returncode == 1, (command, refused)
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1, (command, refused.stderr)
        assert lines[0].startswith("error: "), lines[0]
        assert "a newer version of Ductor migrated it" in lines[0], lines[0]
        assert "(9999_future)" in lines[0], lines[0]
        assert " on http" not in refused.stdout, refused.stdout


def test_a_sqlite_url_is_called_sqlite(tmp_path: Path) -> None:
    env = {"DUCTOR_DATABASE_URL": f"sqlite:///{tmp_path}/y.db"}
    refused = _ductor("serve", "--port", str(_free_port()), env=env)
    assert refused.returncode == 1
    assert f"the database (sqlite at /{tmp_path}/y.db) is not migrated" in refused.stderr
    assert _ductor("migrate", env=env).returncode == 0
    assert f"(sqlite at /{tmp_path}/y.db; roles " in _serve_until_ready(env, tmp_path)


def test_help_lists_every_command() -> None:
    result = _ductor("--help")
    assert result.returncode == 0
    for command in (
        "dev",
        "serve",
        "migrate",
        "keys",
        "workflows",
        "runs",
        "events",
        "ledger",
        "receipts",
        "config",
        "apps",
    ):
        assert command in result.stdout


def test_the_checkouts_venv_puts_ductor_and_its_python_on_path(tmp_path: Path) -> None:
    """docs/getting-started.md: `source .venv/bin/activate` in a checkout, then the
    docs' `ductor ...` and examples/bridge_app's `python ...` run as written."""
    activate = Path(__file__).resolve().parents[1] / ".venv" / "bin" / "activate"
    assert activate.is_file(), "scripts/dev and scripts/test make the checkout's .venv"
    script = (
        f"source {activate}\n"
        "ductor --version\n"
        "python -c 'import ductor, ductor_server, litestar, uvicorn; print(\"sdk ok\")'\n"
    )
    env = _env({"PATH": "/usr/bin:/bin"})
    env.pop("VIRTUAL_ENV", None)
    done = subprocess.run(
        ["bash", "-euc", script], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith("ductor ")
    assert done.stdout.splitlines()[1] == "sdk ok"


def test_scripts_ductor_runs_the_cli_from_any_directory(tmp_path: Path) -> None:
    script = Path(__file__).resolve().parents[1] / "scripts" / "ductor"
    env = _env(None)
    version = subprocess.run(
        [str(script), "--version"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert version.returncode == 0, version.stderr
    assert version.stdout.startswith("ductor ")
    # Paths on the command line are the caller's: the file is read, then the
    # (absent) server is what fails.
    (tmp_path / "hello.json").write_text("{}")
    nobody = f"http://127.0.0.1:{_free_port()}"
    validate = subprocess.run(
        [str(script), "workflows", "validate", "hello.json", "--api-key", "k", "--url", nobody],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert validate.returncode == 1
    assert validate.stderr.startswith("error: client.unreachable"), validate.stderr


def test_sigterm_while_starting_stops_the_server_with_status_0(tmp_path: Path) -> None:
    """SIGTERM at moments around the start (as the first line is printed, and
    shortly after, while uvicorn binds and the engines start) ends the process
    promptly with status 0: a stop asked while starting is never lost."""
    data = tmp_path / "data"
    first = subprocess.run(  # creates the data dir and its keys, so later starts are alike
        [sys.executable, "-m", "ductor_server.cli", "migrate"],
        env={**os.environ, "DUCTOR_DATA_DIR": str(data)},
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert first.returncode == 0, first.stderr
    for delay in (0.0, 0.05, 0.15, 0.3):
        port = str(_free_port())
        proc = subprocess.Popen(
            [sys.executable, "-m", "ductor_server.cli", "dev", "--port", port, "--data-dir", data],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            assert proc.stdout is not None
            first_line = proc.stdout.readline()  # printed once everything is built
            assert "ductor" in first_line, first_line
            time.sleep(delay)
            proc.terminate()
            proc.wait(timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        assert proc.returncode == 0, (delay, proc.returncode)


def test_a_port_in_use_stops_the_start_in_one_line_before_anything_is_written(
    tmp_path: Path,
) -> None:
    """A port another process listens on, or a host naming no address, is one
    `error:` line and exit status 1, before the start line, the dev key or the
    seed: nothing claims to serve, and nothing is written."""
    seed_dir = tmp_path / "seed"
    seed_dir.mkdir()
    (seed_dir / "hello.yaml").write_text(
        "kind: Workflow\n"
        "spec:\n"
        "  family_slug: hello\n"
        "  steps:\n"
        "    - {ref: a, type: STEP_TYPE_DATAFLOW, args: {operation: project, project: {x: '1'}}}\n"
    )
    with socket.create_server(("127.0.0.1", 0)) as holder:
        port = str(holder.getsockname()[1])
        for command in (
            ["dev", "--port", port],
            ["serve", "--port", port, "--seed", str(seed_dir), "--seed-tenant", "acme"],
            ["dev", "--host", "no-such-host.invalid", "--port", str(_free_port())],
        ):
            data = tmp_path / f"data-{command[0]}-{command[2]}"
            result = _ductor(*command, "--data-dir", str(data))
            assert result.returncode == 1, (command, result)
            lines = result.stderr.strip().splitlines()
            assert len(lines) == 1, (command, result.stderr)
            assert lines[0].startswith("error: cannot listen on http://"), lines[0]
            assert "(--host and --port, or DUCTOR_HOST and DUCTOR_PORT)" in lines[0], lines[0]
            assert result.stdout == "", (command, result.stdout)
            assert "Traceback" not in result.stderr
            left = sorted(p.name for p in data.iterdir()) if data.exists() else []
            assert not {"api_key", "ductor.pid"} & set(left), (command, left)
            if "ductor.db" in left:
                with contextlib.closing(sqlite3.connect(data / "ductor.db")) as db:
                    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master")}
                    if "workflow_versions" in tables:
                        assert db.execute("SELECT count(*) FROM workflow_versions").fetchone() == (
                            0,
                        ), "the seed was applied"
        again = _ductor("dev", "--port", port, "--data-dir", str(tmp_path / "again"))
        assert "address already in use" in again.stderr.lower(), again.stderr


def test_port_0_announces_the_port_the_system_picked(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "ductor_server.cli", "dev", "--port", "0"],
        env=_env({"DUCTOR_DATA_DIR": str(tmp_path / "data")}),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline().decode()
        assert " on http://127.0.0.1:" in first, first
        port = int(first.rsplit(":", 1)[1])
        assert port != 0
        assert _ready(port, proc) == 200
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert proc.returncode == 0


def _as_a_user(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run `ductor ARGS` bound by file permissions: as root, without the
    capabilities that let root write anywhere (a user's server would not have them)."""
    prefix: list[str] = []
    if os.geteuid() == 0:
        prefix = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search,-fowner", "--"]
    return subprocess.run(
        [*prefix, sys.executable, "-m", "ductor_server.cli", *args],
        env=_env(env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_data_dir_this_user_cannot_write_in_stops_every_command_in_one_line(
    tmp_path: Path,
) -> None:
    """A data dir made by another user (an earlier `sudo ductor dev`), or a database
    file of its that this user cannot write, is one `error:` line, no traceback: a
    directory is refused as a bad setting (status 2), a file it holds as a database
    that cannot be opened (status 1); no server starts on a database it could only
    read, answering ready and failing every write."""
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    read_only = tmp_path / "read-only"
    assert _ductor("migrate", "--data-dir", str(read_only)).returncode == 0
    (read_only / "ductor.db").chmod(0o400)
    port = str(_free_port())
    commands = (
        ["dev", "--port", port],
        ["serve", "--port", port],
        ["migrate"],
        ["tenants", "create", "acme", "--database"],
        ["keys", "create", "--tenant", "acme"],
    )
    try:
        for data, status, wanted, some in (
            (
                locked,
                2,
                f"error: the data dir '{locked}' (--data-dir or DUCTOR_DATA_DIR) must be",
                commands[:3],  # the others make the data dir the same way
            ),
            (read_only, 1, "error: ", commands),
        ):
            for command in some:
                result = _as_a_user(*command, "--data-dir", str(data), env={})
                assert result.returncode == status, (data, command, result)
                lines = result.stderr.strip().splitlines()
                assert len(lines) == 1, (data, command, result.stderr)
                assert lines[0].startswith(wanted), (command, lines[0])
                assert "Permission denied" in lines[0], (command, lines[0])
                assert result.stdout == "", (command, result.stdout)
        assert sorted(p.name for p in locked.iterdir()) == []
        # The pid file of a `ductor dev` another user ran there.
        writable = tmp_path / "writable"
        assert _ductor("migrate", "--data-dir", str(writable)).returncode == 0
        (writable / "ductor.pid").write_text("1\n")
        (writable / "ductor.pid").chmod(0o400)
        result = _as_a_user("dev", "--port", port, "--data-dir", str(writable), env={})
        assert result.returncode == 1, result
        assert result.stderr == f"error: cannot use {writable / 'ductor.pid'}: Permission denied\n"
        assert result.stdout == ""
    finally:
        locked.chmod(0o755)


def test_key_and_tenant_commands_on_an_unreachable_database_fail_in_one_line() -> None:
    url = f"postgresql://postgres@127.0.0.1:{_free_port()}/ductor"
    for command in (
        ["tenants", "create", "acme", "--database"],
        ["keys", "create", "--tenant", "acme"],
    ):
        result = _ductor(*command, env={"DUCTOR_DATABASE_URL": url})
        assert result.returncode == 1, (command, result)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, (command, result.stderr)
        assert lines[0].startswith("error: storage.unavailable: cannot connect to postgres"), lines
        assert "127.0.0.1" in lines[0]
        assert result.stdout == ""


def test_scripts_dev_takes_paths_in_its_flags_as_the_callers(tmp_path: Path) -> None:
    """README.md: flags of ./scripts/dev go to `ductor dev`; a relative --data-dir
    and --seed name the caller's directories, as they do for `ductor dev` itself
    (and for scripts/ductor), not the checkout's."""
    script = Path(__file__).resolve().parents[1] / "scripts" / "dev"
    (tmp_path / "manifests").mkdir()
    (tmp_path / "manifests" / "hello.yaml").write_text(
        "kind: Workflow\n"
        "spec:\n"
        "  family_slug: hello\n"
        "  steps:\n"
        "    - {ref: a, type: STEP_TYPE_DATAFLOW, args: {operation: project, project: {x: '1'}}}\n"
    )
    port = _free_port()
    proc = subprocess.Popen(
        [str(script), "--data-dir", "data", "--seed", "manifests", "--port", str(port)],
        cwd=tmp_path,
        env=_env(None),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        assert _ready(port, proc) == 200
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    text = out.decode()
    assert f"data dir: {tmp_path / 'data'}\n" in text, text
    assert "seed manifests (tenant dev): " in text, text
    assert (tmp_path / "data" / "api_key").is_file()


def test_dev_refuses_an_api_key_file_that_holds_no_key_it_made(tmp_path: Path) -> None:
    """Later starts reuse the key in <data dir>/api_key (getting-started.md): a file
    edited by hand to a word, or to bytes no key has, is not made the dev tenant's
    admin key; the start stops in one line naming the file, and nothing is stored."""
    for text in (b"password\n", b"dk_\x01\xff" + b"a" * 41 + b"\n"):
        data = tmp_path / f"data-{len(text)}"
        data.mkdir()
        (data / "api_key").write_bytes(text)
        result = _ductor("dev", "--port", str(_free_port()), "--data-dir", str(data))
        assert result.returncode == 2, result
        assert result.stderr == (
            f"error: {data / 'api_key'} holds no API key ductor dev made (dk_ and 43 URL-safe"
            " characters): remove the file, and ductor dev makes a new key\n"
        )
        assert result.stdout == ""
        assert (data / "api_key").read_bytes() == text
        assert not (data / "ductor.db").exists(), "no key stored, nothing migrated"
        assert not (data / "ductor.pid").exists()


def test_a_directory_where_dev_keeps_a_file_stops_the_start_in_one_line(tmp_path: Path) -> None:
    """The files `ductor dev` keeps in its data dir (the key, the key files, the pid
    file): a directory in the place of one, say made by a mistyped `mkdir -p`, is
    one `error:` line naming it, never a traceback, and nothing serves."""
    for name in ("api_key", "secret_keys", "receipt_keys", "ductor.pid"):
        data = tmp_path / f"data-{name}"
        (data / name).mkdir(parents=True)
        result = _ductor("dev", "--port", str(_free_port()), "--data-dir", str(data))
        assert result.returncode in (1, 2), (name, result)
        assert "Traceback" not in result.stderr, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, (name, result.stderr)
        assert lines[0].startswith("error: "), lines[0]
        assert f"{data / name}" in lines[0], lines[0]
        assert "Is a directory" in lines[0], lines[0]
        assert " on http://" not in result.stdout, (name, result.stdout)
