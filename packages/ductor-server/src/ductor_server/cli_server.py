"""The server-side `ductor` commands: `dev`, `serve`, `migrate` and `config reference`.

`dev` and `serve` run what the composition root builds; `migrate` opens the
store directly. The client commands live in `cli_client`, the key and tenant
commands in `cli_keys`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import re
import signal
import socket
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ductor_server import __version__
from ductor_server.netaddr import http_url
from ductor_server.settings import (
    ALL_ROLES,
    MAX_PORT,
    Settings,
    parse_host,
    parse_roles,
    parse_whole,
    reference_markdown,
)

if TYPE_CHECKING:
    import uvicorn

    from ductor_server.storage import Store

# The store, the API and the engines are imported inside the commands that
# need them, so `ductor --help` and the client commands start fast.

DEV_TENANT = "dev"
_DEV_KEY = re.compile(r"dk_[A-Za-z0-9_-]{43}")
"""The form of the keys `ductor dev` makes (`services.keys.new_api_key`)."""
STORE_VARIABLES = ("DUCTOR_DATABASE_URL", "DUCTOR_DATA_DIR")
"""The variables `ductor migrate` reads: where the store is."""


async def open_migrated(settings: Settings) -> Store:
    """The store of `settings`, opened and migrated (closed again if migrating fails)."""
    from ductor_server.storage import open_store

    store = open_store(settings.store_target)
    await store.open()
    try:
        await store.migrate()
    except BaseException:
        await store.close()
        raise
    return store


async def create_key(
    store: Store,
    tenant_id: str,
    *,
    name: str,
    key: str | None = None,
    scopes: Sequence[str] = ("admin",),
) -> str:
    """Ensure `tenant_id` exists and store an API key for it (a new one unless `key`),
    with `scopes` (admin by default)."""
    from ductor_server.services.keys import KeysService

    return await KeysService(store).provision(tenant_id, name=name, key=key, scopes=scopes)


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    path.chmod(0o600)


class _DataDirBusy(Exception):
    """Another live `ductor dev` or embedded `ductor serve` holds the data dir's pid
    file (its text: that pid)."""


def _hold_pid_file(path: Path) -> int:
    """Lock `path` for this process's life and write its pid there; the open file,
    to close at exit. The lock, not the text, says who runs: it goes with its process,
    by kill -9 too, so a stale pid file never stops a start.

    Raises:
        _DataDirBusy: another live process holds the lock.
    """
    for _ in range(10):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        if sys.platform != "win32":
            import fcntl

            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                other = os.read(fd, 64).decode(errors="replace").strip()
                os.close(fd)
                raise _DataDirBusy(other or "unknown") from None
            try:
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # the holder removed the file as we opened it: open anew
                os.close(fd)
                continue
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        os.chmod(path, 0o600)
        return fd
    raise _DataDirBusy("unknown")


async def ensure_dev_key(settings: Settings) -> tuple[str, bool]:
    """Migrate the embedded store and make sure the dev tenant has the key in
    `<data-dir>/api_key` (minting and writing one on first start).

    Returns:
        The key, and whether it was created now.
    """
    path = settings.api_key_file
    existing = path.read_bytes().decode(errors="replace").strip() if path.exists() else ""
    if existing and not _DEV_KEY.fullmatch(existing):
        # Stored as it stands, it would be a dev admin key no key ductor makes looks
        # like (a guessable word, or a character the client commands refuse).
        raise ValueError(
            f"{path} holds no API key ductor dev made (dk_ and 43 URL-safe characters):"
            " remove the file, and ductor dev makes a new key"
        )
    store = await open_migrated(settings)
    try:
        key = await create_key(store, DEV_TENANT, name="dev", key=existing or None)
        if not existing:
            _write_private(path, key + "\n")
        return key, not existing
    finally:
        await store.close()


def ensure_dev_receipt_keys(settings: Settings) -> tuple[Settings, str | None, bool]:
    """Give `ductor dev` a receipt signing key when none is configured: the key file
    under the data dir (mode 0600), made with one fresh key on first start.

    Returns:
        The settings pointing at the key file, the signing key id (None when
        keys come from the environment), and whether the file was created now.
    """
    from ductor_server.receipts.keys import add_key, load_keys

    if settings.receipt_keys_file is not None or settings.receipt_key:
        return settings, None, False
    path = settings.dev_receipt_keys_file
    created = not path.exists()
    if created:
        add_key(path)
    ring = load_keys(path, None)
    assert ring is not None
    return dataclasses.replace(settings, receipt_keys_file=path), ring.active.kid, created


def ensure_dev_secret_keys(settings: Settings) -> tuple[Settings, str | None, bool]:
    """Give `ductor dev` a connection secret key when `DUCTOR_SECRET_KEYS` is not set:
    the key file under the data dir (mode 0600), made with one fresh key on first start.

    Returns:
        The settings pointing at the key file, the newest key id (None when keys
        come from the environment), and whether the file was created now.
    """
    from ductor_server.connections import SecretKeys, ensure_key_file

    if settings.secret_keys or settings.secret_keys_file is not None:
        return settings, None, False
    path = settings.dev_secret_keys_file
    text, created = ensure_key_file(path)
    kid = SecretKeys.parse(text).newest.kid
    return dataclasses.replace(settings, secret_keys_file=path), kid, created


class _StopOnSigterm:
    """SIGTERM at any moment asks the server to stop: before it serves (it then
    starts no loop), while it serves (uvicorn's own handler is in place then, and
    re-raises the signal once it has drained), or after.

    The handler raises nothing: an exception from a signal handler lands in
    whatever Python code runs at that moment, and one that lands in a weakref
    callback or a `__del__` is printed and dropped, leaving the server serving."""

    def __init__(self) -> None:
        self.asked = False
        self.server: uvicorn.Server | None = None  # once it exists

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.asked = True
        if self.server is not None:
            self.server.should_exit = True


def _server(config: uvicorn.Config, *, on_exit: Callable[[], None]) -> uvicorn.Server:
    """A uvicorn server that also calls `on_exit` when a stop is asked."""
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, which also tells the app when a stop is asked: long
        polls are answered then, not cut once the connection drain times out."""

        def __init__(self, config: uvicorn.Config, *, on_exit: Callable[[], None]) -> None:
            super().__init__(config)
            self._on_exit = on_exit

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            super().handle_exit(sig, frame)
            # A signal handler: hand the call to the event loop, which runs the app.
            with contextlib.suppress(RuntimeError):  # no loop running yet
                asyncio.get_running_loop().call_soon_threadsafe(self._on_exit)

    return Server(config, on_exit=on_exit)


def _listen(host: str, port: int) -> list[socket.socket]:
    """Sockets bound to `port` on every address `host` names, as the server's own
    binding would make them, but before anything starts: an address another process
    holds stops the start before the engines run and the start line is printed.

    Raises:
        OSError: `host` names no address, or one of its addresses cannot be bound.
    """
    infos = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP, flags=socket.AI_PASSIVE
    )
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            if os.name == "posix":  # as asyncio does: a port in TIME_WAIT is free
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def _bind(settings: Settings) -> list[socket.socket] | None:
    """The sockets `settings` listen on, bound; None, once one `error:` line says
    why, when they cannot be (a port another process holds, a host naming no
    address of this machine)."""
    try:
        return _listen(settings.host, settings.port)
    except OSError as exc:
        sys.stderr.write(
            f"error: cannot listen on {http_url(settings.host, settings.port)}"
            f" (--host and --port, or DUCTOR_HOST and DUCTOR_PORT): {exc.strerror or exc}\n"
        )
        return None


def _serve(
    settings: Settings, sockets: list[socket.socket], announce: Callable[[str], Sequence[str]]
) -> int:
    """Serve on the bound `sockets` until stopped; print the `announce` lines (given
    the URL served on) once everything is built, so that a bad setting stops the
    start before anything claims to be serving."""
    from ductor_server.telemetry.setup import setup_from_env

    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("ductor").setLevel(settings.log_level.upper())
    try:
        # Before anything records: the SDK's providers, if OTEL_* asks for them.
        telemetry = setup_from_env()
    except ValueError as exc:
        sys.stderr.write(f"error: OpenTelemetry: {exc}\n")
        return 2
    if telemetry is not None:
        print(
            f"OpenTelemetry: service {telemetry.service_name}, traces {telemetry.traces},"
            f" metrics {telemetry.metrics}",
            flush=True,
        )
    # uvicorn drains and shuts the app down on SIGTERM, then re-raises the
    # signal; this handler makes that, and a SIGTERM before it serves, a normal exit.
    stop = _StopOnSigterm()
    signal.signal(signal.SIGTERM, stop)
    return _serve_on(settings, sockets, announce, stop)


def _serve_on(
    settings: Settings,
    sockets: list[socket.socket],
    announce: Callable[[str], Sequence[str]],
    stop: _StopOnSigterm,
) -> int:
    """`_serve` once its telemetry and signal handler are in place."""
    import uvicorn

    from ductor_server.app import create_app
    from ductor_server.composition import build
    from ductor_server.engine.memory import settle_heap
    from ductor_server.transports.head import HeadAsGet
    from ductor_server.transports.rest.inbox import MAX_SOCKET_MESSAGE

    composition = build(settings)
    app = HeadAsGet(create_app(composition=composition))
    # Port 0 is a free port the system picked: announce the one it is.
    port = sockets[0].getsockname()[1] if sockets else settings.port
    for line in announce(http_url(settings.host, port)):
        print(line, flush=True)
    # Everything is imported and built: keep the collector off it for good.
    settle_heap()
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level="warning",
        timeout_graceful_shutdown=5,
        ws_max_size=MAX_SOCKET_MESSAGE,
    )
    server = _server(config, on_exit=composition.runtime.endings.stop_waiting)
    stop.server = server
    if stop.asked:  # stopped while starting: start nothing
        return 0
    server.run(sockets=sockets)
    return 0 if server.started or stop.asked else 3  # 3: uvicorn's start failure


def seed(settings: Settings, source: str, tenant_id: str) -> int:
    """Apply the manifests under `source` to `tenant_id` (created if new) through the
    services, before serving; print the plan, or every problem and change nothing.

    Returns:
        0 when applied, 1 on any problem.
    """
    from ductor_server.composition import build
    from ductor_server.manifests import apply_plan, make_plan, read_manifests, where
    from ductor_server.manifests.local import ServicesTarget
    from ductor_server.manifests.report import (
        change_lines,
        failure,
        partial,
        problem_lines,
        summary,
    )

    resources, problems = read_manifests(Path(source))
    if not resources:
        for line in [*problem_lines(problems), f"seed {source}: {failure(problems)}"]:
            sys.stderr.write(line + "\n")
        return 1

    async def run() -> int:
        composition = build(settings)
        async with composition.opened(migrate=settings.migrate_on_start):
            async with composition.store.transaction() as tx:
                now = composition.runtime.clock.now()
                await tx.ensure_tenant(tenant_id, name=tenant_id, now=now)
            target = ServicesTarget(composition.services, tenant_id)
            plan = await make_plan(target, resources)
            found = sorted([*problems, *plan.problems], key=where)
            if found:
                for line in [*problem_lines(found), f"seed {source}: {failure(found)}"]:
                    sys.stderr.write(line + "\n")
                return 1
            done, error = await apply_plan(target, plan)
            if error is not None:
                for line in partial(done, f"{error.code}: {error.message}"):
                    sys.stderr.write(line + "\n")
                return 1
        for line in change_lines(plan, applied=True):
            print(f"seed: {line}", flush=True)
        print(f"seed {source} (tenant {tenant_id}): {summary(plan, dry_run=False)}", flush=True)
        return 0

    return asyncio.run(run())


def cmd_dev(args: argparse.Namespace) -> int:
    """`ductor dev`: the embedded server (SQLite under the data dir, in-process queue)."""
    settings = Settings.from_env(
        host=args.host,
        port=args.port,
        data_dir=Path(args.data_dir) if args.data_dir else None,
        migrate_on_start=True,
    )
    if not settings.embedded:
        settings = dataclasses.replace(settings, database_url=None)
    if settings.outbound_allow is None:
        # On a developer's machine the app under development listens on loopback.
        settings = dataclasses.replace(settings, outbound_allow=("127.0.0.0/8", "::1/128"))
    settings.make_data_dir()

    def start() -> int:
        # Before anything is written: a port in use stops the start at once.
        if (sockets := _bind(settings)) is None:
            return 1
        try:
            return _dev(args, settings, sockets)
        finally:
            for sock in sockets:
                sock.close()

    return _holding_data_dir(settings, "ductor dev", start)


def _holding_data_dir(settings: Settings, who: str, start: Callable[[], int]) -> int:
    """`start()` while this process holds the embedded data dir's pid file; 1 and one
    `error:` line naming `who` runs there when another live process holds it.

    Two servers on one data dir would both run engines on its SQLite file, and share
    its pid file: the second would answer for, and on its exit remove, the first's pid.
    """
    try:
        pid_fd = _hold_pid_file(settings.pid_file)
    except _DataDirBusy as busy:
        sys.stderr.write(
            f"error: {who} is already running on {settings.data_dir.resolve()}"
            f" (pid {busy}): stop it first, or give this one another --data-dir\n"
        )
        return 1
    try:
        return start()
    finally:
        # A clean exit removes the pid file; after kill -9 it stays, naming a dead process.
        with contextlib.suppress(OSError):
            settings.pid_file.unlink()
        os.close(pid_fd)


def _dev(args: argparse.Namespace, settings: Settings, sockets: list[socket.socket]) -> int:
    """`ductor dev` once it holds its data dir."""
    from ductor_server.storage import SchemaTooNew, StoreError

    try:
        key, created = asyncio.run(ensure_dev_key(settings))
    except SchemaTooNew as exc:
        sys.stderr.write(
            f"error: the database ({_where(settings)}) is too new for ductor {__version__}: {exc}\n"
        )
        return 1
    except StoreError as exc:
        sys.stderr.write(f"error: cannot open the database ({_where(settings)}): {exc}\n")
        return 1
    settings, receipt_kid, receipt_created = ensure_dev_receipt_keys(settings)
    settings, secret_kid, secret_created = ensure_dev_secret_keys(settings)
    if args.seed is not None and seed(settings, args.seed, DEV_TENANT) != 0:
        return 1
    from ductor_server.transports.dashboard import find_dashboard_assets

    dashboard = find_dashboard_assets() is not None

    def announce(where: str) -> list[str]:
        lines = [
            f"ductor {__version__} (embedded) on {where}",
            f"data dir: {settings.data_dir.resolve()}",
        ]
        if dashboard:
            lines.append(f"dashboard: {where}/ui/ (sign in with the API key)")
        else:
            lines.append("dashboard: not installed (pip install 'ductor-server[ui]')")
        if created:
            lines.append(f"API key (created, saved to {settings.api_key_file}): {key}")
        else:
            # Shown on the first start only: a later start's output may end up in logs.
            lines.append(f"API key (from {settings.api_key_file}; printed on first start only)")
        if receipt_kid is not None:
            made = "created, saved to" if receipt_created else "from"
            lines.append(
                f"receipt signing key {receipt_kid} ({made} {settings.dev_receipt_keys_file})"
            )
        if secret_kid is not None:
            made = "created, saved to" if secret_created else "from"
            lines.append(
                f"connection secret key {secret_kid} ({made} {settings.dev_secret_keys_file})"
            )
        return lines

    return _serve(settings, sockets, announce)


def _where(settings: Settings) -> str:
    """The database of `settings` for messages, without a password."""
    if (path := settings.sqlite_file) is not None or settings.database_url is None:
        return f"sqlite at {path}"
    parts = urlsplit(settings.database_url)
    host = parts.hostname or "localhost"
    port = f":{parts.port}" if parts.port else ""
    return f"postgres at {host}{port}{parts.path}"


@contextlib.contextmanager
def quiet_pool() -> Iterator[None]:
    """Mute the pool's log line per failed connection attempt: the command says why
    in one line of its own."""
    logger = logging.getLogger("psycopg.pool")
    before = logger.disabled
    logger.disabled = True
    try:
        yield
    finally:
        logger.disabled = before


async def _check_database(settings: Settings) -> str | None:
    """Why `serve` cannot start on this database (unreachable, or not migrated when
    it will not migrate at start); None when it can."""
    from ductor_server.storage import SchemaTooNew, StoreError, open_store

    store = open_store(settings.store_target)
    try:
        await store.open()
    except StoreError as exc:
        verb = "reach" if settings.sqlite_file is None else "open"
        return f"cannot {verb} the database ({_where(settings)}): {exc}"
    try:
        # Read even when migrating at start: a database a newer version migrated is
        # refused either way, before this version's code runs against its schema.
        pending = await store.pending_migrations()
    except SchemaTooNew as exc:
        return f"the database ({_where(settings)}) is too new for ductor {__version__}: {exc}"
    except StoreError as exc:
        return f"cannot read the database ({_where(settings)}): {exc}"
    finally:
        await store.close()
    if pending and not settings.migrate_on_start:
        return (
            f"the database ({_where(settings)}) is not migrated ({len(pending)} "
            "migration(s) pending): run `ductor migrate` first, or start with "
            "`ductor serve --migrate`"
        )
    return None


def cmd_serve(args: argparse.Namespace) -> int:
    """`ductor serve`: the production server on DUCTOR_DATABASE_URL (or the embedded store)."""
    roles = parse_roles(args.roles, name="--roles") if args.roles is not None else None
    settings = Settings.from_env(
        host=args.host,
        port=args.port,
        data_dir=Path(args.data_dir) if args.data_dir else None,
        roles=roles,
        migrate_on_start=args.migrate,
    )
    seed_tenant = None
    if args.seed is not None:
        from ductor_server.services.tenants import tenant_id_problem

        seed_tenant = args.seed_tenant or os.environ.get("DUCTOR_SEED_TENANT")
        if not seed_tenant:
            sys.stderr.write("error: --seed needs --seed-tenant (or $DUCTOR_SEED_TENANT)\n")
            return 2
        if (wrong := tenant_id_problem(seed_tenant)) is not None:
            sys.stderr.write(f"error: --seed-tenant {seed_tenant!r}: {wrong}\n")
            return 2
    if settings.embedded:
        # Nobody else migrates an embedded store: do it at start, as `dev` does.
        settings.make_data_dir()
        settings = dataclasses.replace(settings, migrate_on_start=True)
        # The lock `dev` takes: either command may be the one that runs there.
        return _holding_data_dir(
            settings, "ductor", lambda: _serve_checked(args, settings, seed_tenant)
        )
    return _serve_checked(args, settings, seed_tenant)


def _serve_checked(args: argparse.Namespace, settings: Settings, seed_tenant: str | None) -> int:
    """`ductor serve` once its flags are read (and it holds an embedded data dir)."""
    with quiet_pool():
        problem = asyncio.run(_check_database(settings))
    if problem:
        sys.stderr.write(f"error: {problem}\n")
        return 1
    # Before the seed is applied: a port in use stops the start with nothing written.
    if (sockets := _bind(settings)) is None:
        return 1
    try:
        if seed_tenant is not None and seed(settings, args.seed, seed_tenant) != 0:
            return 1
        backend = (
            "postgres" if settings.sqlite_file is None else f"sqlite at {settings.sqlite_file}"
        )
        listed = ",".join(settings.roles)
        return _serve(
            settings,
            sockets,
            lambda where: [f"ductor {__version__} serve on {where} ({backend}; roles {listed})"],
        )
    finally:
        for sock in sockets:
            sock.close()


def cmd_migrate(args: argparse.Namespace) -> int:
    """`ductor migrate`: apply pending migrations to the configured store."""
    # Only the store's variables: a bad value of another (DUCTOR_PORT) concerns `serve`.
    environ = {k: v for k, v in os.environ.items() if k in STORE_VARIABLES}
    settings = Settings.from_env(
        environ=environ, data_dir=Path(args.data_dir) if args.data_dir else None
    )
    if settings.embedded:
        settings.make_data_dir()

    async def run() -> list[str]:
        from ductor_server.storage import open_store

        store = open_store(settings.store_target)
        await store.open()
        try:
            return await store.migrate()
        finally:
            await store.close()

    from ductor_server.storage import StoreError

    try:
        with quiet_pool():
            applied = asyncio.run(run())
    except StoreError as exc:
        sys.stderr.write(f"error: cannot migrate the database ({_where(settings)}): {exc}\n")
        return 1
    for name in applied:
        print(f"applied {name}")
    if not applied:
        print("database is up to date")
    return 0


def cmd_config_reference(args: argparse.Namespace) -> int:
    """`ductor config reference`: every DUCTOR_* variable, its default and meaning."""
    sys.stdout.write(reference_markdown())
    return 0


def _port(text: str) -> int:
    """A `--port` value (argparse shows the message of an `ArgumentTypeError` as is)."""
    try:
        return parse_whole("--port", text, low=0, high=MAX_PORT)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _host(text: str) -> str:
    """A `--host` value (argparse shows the message of an `ArgumentTypeError` as is)."""
    try:
        return parse_host("--host", text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_server_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `dev`, `serve`, `migrate` and `config` on the top-level parser."""
    dev = sub.add_parser(
        "dev",
        help="run on the embedded default (SQLite, in-process queue)",
        description="Run Ductor on its embedded default. Creates a dev tenant and an admin "
        "API key on first start, prints the key and writes it to <data-dir>/api_key (mode "
        "0600); later starts print only that file's path. Without "
        "$DUCTOR_RECEIPT_KEYS or $DUCTOR_RECEIPT_KEY, also a receipt signing key in "
        "<data-dir>/receipt_keys (mode 0600); without $DUCTOR_SECRET_KEYS, a connection "
        "secret key in <data-dir>/secret_keys (mode 0600).",
    )
    # The field defaults, not `Settings()`: building one loads the fair queue's
    # policy and with it the engine, which `ductor --help` need not wait for.
    defaults = {f.name: f for f in dataclasses.fields(Settings)}
    host_help = f"interface (default $DUCTOR_HOST, else {defaults['host'].default})"
    port_help = f"port (default $DUCTOR_PORT, else {defaults['port'].default})"
    make_data_dir = defaults["data_dir"].default_factory
    data_dir = make_data_dir() if callable(make_data_dir) else defaults["data_dir"].default
    data_dir_help = f"data directory (default $DUCTOR_DATA_DIR, else {data_dir})"
    dev.add_argument("--host", type=_host, default=None, help=host_help)
    dev.add_argument("--port", type=_port, default=None, help=port_help)
    dev.add_argument("--data-dir", default=None, help=data_dir_help)
    dev.add_argument(
        "--seed",
        default=None,
        metavar="DIR",
        help="apply the manifests in DIR to the dev tenant before serving, as `ductor apply`"
        " would (a problem stops the start: exit 1)",
    )
    dev.set_defaults(func=cmd_dev)

    serve = sub.add_parser(
        "serve",
        help="run against DUCTOR_DATABASE_URL (Postgres) with selectable roles",
        description="Run Ductor on the database in $DUCTOR_DATABASE_URL (the embedded "
        "SQLite store if unset) and the optional $DUCTOR_REDIS_URL. A database that "
        "cannot be reached, or has migrations pending without --migrate, is refused "
        "with one error line and exit status 1.",
    )
    serve.add_argument("--host", type=_host, default=None, help=host_help)
    serve.add_argument("--port", type=_port, default=None, help=port_help)
    serve.add_argument(
        "--data-dir", default=None, help=data_dir_help + "; for the embedded store only"
    )
    serve.add_argument(
        "--roles",
        default=None,
        help="comma-separated, from " + ",".join(ALL_ROLES) + " (default $DUCTOR_ROLES, else all)",
    )
    serve.add_argument(
        "--migrate",
        action="store_true",
        help="apply pending migrations before serving (default off: a database with "
        "migrations pending is refused; always done for the embedded store)",
    )
    serve.add_argument(
        "--seed",
        default=None,
        metavar="DIR",
        help="apply the manifests in DIR (docs/configuration.md) to --seed-tenant before"
        " serving (a problem stops the start: exit 1)",
    )
    serve.add_argument(
        "--seed-tenant",
        default=None,
        metavar="TENANT",
        help="the tenant --seed applies to, created if new (default $DUCTOR_SEED_TENANT)",
    )
    serve.set_defaults(func=cmd_serve)

    migrate = sub.add_parser("migrate", help="apply pending database migrations")
    migrate.add_argument(
        "--data-dir", default=None, help=data_dir_help + "; for the embedded store only"
    )
    migrate.set_defaults(func=cmd_migrate)
    config = sub.add_parser("config", help="the server's configuration")
    config_sub = config.add_subparsers(dest="config_command", metavar="COMMAND", required=True)
    reference = config_sub.add_parser(
        "reference",
        help="print every DUCTOR_* environment variable, its default and meaning (Markdown)",
        description="Print the configuration reference of docs/deploy.md: every DUCTOR_* "
        "environment variable a ductor process reads, its default and what it sets, as a "
        "Markdown table.",
    )
    reference.set_defaults(func=cmd_config_reference)
