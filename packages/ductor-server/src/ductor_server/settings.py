"""Server configuration, read from flags and the environment at the edge only.

`VARIABLES` lists every `DUCTOR_*` environment variable a `ductor` process reads,
here or elsewhere (the client commands, the bridge keys), with its default and
meaning; `reference_markdown` renders it as the configuration reference of
docs/deploy.md (`ductor config reference`), and a test holds the two together.
"""

from __future__ import annotations

import errno
import ipaddress
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from ductor_server.netaddr import host_name_problem, parse_networks

if TYPE_CHECKING:
    from ductor_server.engine.fairness import FairPolicy

ALL_ROLES: tuple[str, ...] = ("api", "coordinator", "worker", "timer")
LOG_LEVELS: tuple[str, ...] = ("debug", "info", "warning", "error")
CEL_ENGINES: tuple[str, ...] = ("cel-rust", "cel-python")
"""The names `DUCTOR_CEL_ENGINE` may hold (`ductor_core.expressions.ENGINE_NAMES`)."""
MAX_PORT = 65535

_FLAG_FIELDS = ("host", "port", "data_dir", "roles")
"""The settings a `ductor` flag sets (`--host`, ...): each wins over its variable."""
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
IDLE_POLL_INTERVAL = 5.0
"""Seconds between an idle loop's looks when every write wakes it: a safety net only."""
MIN_OPERATOR_KEY_LENGTH = 32
"""The shortest `DUCTOR_OPERATOR_KEY` accepted."""
SPLIT_POLL_INTERVAL = 0.5
"""Seconds between an idle loop's looks when writes in other processes cannot wake it."""
POSTGRES_COORDINATOR_LOOPS = 2
"""Coordinator loops per process on Postgres unless `DUCTOR_COORDINATOR_LOOPS` says."""
MAX_COORDINATOR_LOOPS = 16
DEFAULT_WORKER_CONCURRENCY = 128
"""Step handlers one worker process runs at once unless `DUCTOR_WORKER_CONCURRENCY` says."""
MAX_WORKER_CONCURRENCY = 4096
MAX_SECONDS = 365 * 86400
"""The most seconds a setting may give (a year): more cannot be added to a time."""
MIN_SECONDS = 0.001
"""The fewest seconds a setting other than 0 may give (a millisecond): a lease of
1e-300 s is no lease once it is a time (0), and a poll that often is a busy loop."""
MAX_SANDBOX_MEMORY_MB = 1024 * 1024
"""The largest sandbox address space (1 TiB): more does not fit an rlimit."""
MAX_SANDBOX_PROCESSES = 256
"""The most sandbox processes one server process runs: each is an interpreter of its
own, and the pool makes a slot for each as it is built."""
POSTGRES_REPORT_LOOPS = 2
"""Worker report loops per process on Postgres (SQLite has one writer: 1)."""


def parse_roles(text: str, *, name: str = "DUCTOR_ROLES") -> tuple[str, ...]:
    """Parse "api,worker" (given as `name`) into roles, rejecting unknown names.

    Raises:
        ValueError: no role, or one that is not api, coordinator, worker or timer.
    """
    roles = tuple(dict.fromkeys(r.strip() for r in text.split(",") if r.strip()))
    unknown = [r for r in roles if r not in ALL_ROLES]
    if unknown or not roles:
        raise ValueError(
            f"{name}: unknown roles {unknown or text!r}: choose from {', '.join(ALL_ROLES)}"
        )
    return roles


def _fair_policy(text: str | None = None) -> FairPolicy:
    """The fair queue's policy: the default, or parsed from `DUCTOR_FAIRNESS` JSON
    (imported here, so that reading settings does not load the engine)."""
    from ductor_server.engine.fairness import FairPolicy

    return FairPolicy() if text is None else FairPolicy.from_json(text)


def parse_switch(name: str, text: str) -> bool:
    """Parse "on"/"off" (also true/false, 1/0, yes/no).

    Raises:
        ValueError: any other text.
    """
    value = text.strip().lower()
    if value in {"on", "true", "1", "yes"}:
        return True
    if value in {"off", "false", "0", "no"}:
        return False
    raise ValueError(f"{name} must be on or off, got {text!r}")


def parse_whole(name: str, text: str, *, low: int, high: int | None = None) -> int:
    """Parse a whole number from `low` (up to `high`) given as `name`.

    Raises:
        ValueError: not a whole number, or out of range; the message names `name`.
    """
    value = text.strip()
    if value.isascii() and value.isdigit():
        number = int(value)
        if number >= low and (high is None or number <= high):
            return number
    span = f"from {low} to {high}" if high is not None else f"of {low} or more"
    raise ValueError(f"{name} must be a whole number {span}, got {text!r}")


def parse_seconds(name: str, text: str, *, zero: bool = False) -> float:
    """Parse a number of seconds given as `name`: from `MIN_SECONDS`, or 0 too with
    `zero`, to `MAX_SECONDS`.

    Raises:
        ValueError: not a finite number, or out of range; the message names `name`.
    """
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    allowed = value >= MIN_SECONDS or (zero and value == 0)
    if math.isfinite(value) and allowed and value <= MAX_SECONDS:
        return value
    span = f"0, or from {MIN_SECONDS:g}" if zero else f"from {MIN_SECONDS:g}"
    raise ValueError(
        f"{name} must be a number of seconds {span} to {MAX_SECONDS} (a year), got {text!r}"
    )


def parse_choice(name: str, text: str, choices: tuple[str, ...]) -> str:
    """Parse one of `choices` (in any case) given as `name`.

    Raises:
        ValueError: any other text; the message names `name` and the choices.
    """
    if (value := text.strip().lower()) in choices:
        return value
    raise ValueError(f"{name} must be one of {', '.join(choices)}, got {text!r}")


# The characters of a host name; how long its labels may be is `host_name_problem`'s.
_HOST_NAME = re.compile(
    r"[A-Za-z0-9_](?:[A-Za-z0-9_-]*[A-Za-z0-9_])?(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]*[A-Za-z0-9_])?)*\.?"
)


def parse_host(name: str, text: str) -> str:
    """Parse the address to listen on, given as `name`: an IP address or a host name.

    Raises:
        ValueError: anything else (a space, a scheme, a port); the message names `name`.
    """
    value = text.strip()
    if value.startswith("[") and value.endswith("]"):  # an IPv6 address as a URL writes it
        value = value[1:-1]
    try:
        ipaddress.ip_address(value)
    except ValueError:
        if not _HOST_NAME.fullmatch(value) or host_name_problem(value) is not None:
            raise ValueError(f"{name} must be an IP address or a host name, got {text!r}") from None
    return value


def parse_http_url(name: str, text: str) -> str:
    """Parse an http:// or https:// URL given as `name`: its host an IP address or a
    host name, its port (if any) one that can be read.

    Raises:
        ValueError: anything else (no scheme, another scheme, no host); the message
            names `name`.
    """
    value = text.strip()
    try:
        parts = urlsplit(value)
        host, _ = parts.hostname, parts.port
        if parts.scheme.lower() not in ("http", "https") or not host:
            raise ValueError
        parse_host(name, host)
    except ValueError:
        raise ValueError(
            f"{name} must be an http:// or https:// URL (https://host[:port]), got {text!r}"
        ) from None
    return value


REDIS_SCHEMES: tuple[str, ...] = ("redis", "rediss", "unix")
"""The schemes `DUCTOR_REDIS_URL` may have (those redis-py opens)."""


def parse_redis_url(text: str) -> str:
    """Check that `DUCTOR_REDIS_URL` is a redis://, rediss:// or unix:// URL that
    redis-py reads whole; the URL, its scheme in lower case.

    Raises:
        ValueError: any other text, a port or query value that does not parse, or a
            database after the host that is no whole number (redis-py would take
            database 0 instead); the message shows the scheme only, since the rest
            of the URL may hold a password.
    """
    scheme, separator, rest = text.strip().partition("://")
    form = "(redis://[:password@]host:port/db)"
    if not separator or scheme.lower() not in REDIS_SCHEMES:
        shown = f"{scheme}://..." if separator else "a value without scheme://"
        raise ValueError(
            f"DUCTOR_REDIS_URL must be a redis://, rediss:// or unix:// URL {form}, got {shown}"
        )
    url = f"{scheme.lower()}://{rest}"
    # Only with DUCTOR_REDIS_URL set: the server loads redis-py then anyway.
    from redis.connection import parse_url

    try:
        options = parse_url(url)  # type: ignore[no-untyped-call]
    except ValueError as exc:
        raise ValueError(f"DUCTOR_REDIS_URL: {exc} {form}, got {scheme}://...") from None
    path = unquote(urlsplit(url).path).replace("/", "")
    db = options.get("db")
    if (url.startswith("redis") and path and db is None) or (db is not None and db < 0):
        raise ValueError(
            f"DUCTOR_REDIS_URL: the database after the host must be a whole number {form},"
            f" got {scheme}://..."
        )
    return url


@dataclass(frozen=True, kw_only=True)
class Settings:
    """How one `ductor` process is configured.

    With no `database_url` the server runs on its embedded default: a SQLite
    file under `data_dir` and an in-process queue.

    Attributes:
        host: interface the API listens on.
        port: port the API listens on.
        data_dir: where the embedded database, the dev API key and the pid file live.
        database_url: a `postgresql://` URL; None for the embedded SQLite store.
        redis_url: optional Redis: wake-ups across processes (pub/sub) and the fair
            task queue shared by every process.
        redis_prefix: the prefix of every Redis key and channel of this deployment.
        roles: which loops this process runs (api, coordinator, worker, timer).
        max_body_bytes: requests with a larger body get 413 `request.too_large`.
        migrate_on_start: apply pending migrations when the app starts.
        lease_seconds: how long a worker owns a leased task (and the chat agent a turn)
            before another may retry it.
        poll_interval: seconds an idle engine loop sleeps, when nothing wakes it, before
            looking again; None: `IDLE_POLL_INTERVAL` when wake-ups reach every loop
            (Redis, or all roles in this process), else `SPLIT_POLL_INTERVAL`.
        coordinator_loops: coordinator loops in a process with the coordinator role,
            each ticking its own batches; None: `POSTGRES_COORDINATOR_LOOPS` on
            Postgres, 1 on SQLite (one writer: a second loop would only wait for it).
        worker_concurrency: the step handlers a process with the worker role runs at
            once: its slots in the fair queue.
        fairness: the tenants' weights and limits in the task queue (`DUCTOR_FAIRNESS`).
        poison_after: how many times a task may die with its process (its lease
            expiring unfinished) before it is quarantined as `attempt.poisoned`; 0: never.
        stop_grace: seconds running steps may take to finish when the process stops
            (SIGTERM) before their tasks go back to the queue.
        cel_engine: the CEL engine of every expression (DAG runs, validation, trigger
            filters, routing): "cel-rust" or "cel-python".
        cel_sandbox: with cel-rust, evaluate expressions estimated at
            `cel_sandbox_threshold` units or more in capped child processes.
        cel_sandbox_threshold: the estimated cost from which an expression is sandboxed.
        cel_sandbox_timeout: seconds one sandboxed evaluation may take.
        cel_sandbox_memory_mb: the address space of each sandbox process, in MiB.
        cel_sandbox_processes: how many sandbox processes evaluate at once.
        stripe_api_key: Stripe's secret API key; with `stripe_webhook_secret`, wallets
            can be topped up through Stripe (the optional `stripe` extra).
        stripe_webhook_secret: the signing secret of the Stripe webhook endpoint
            (`POST /webhooks/stripe`).
        stripe_api_base: another Stripe API address (a test double); None for Stripe's.
        log_level: what the `ductor` loggers write to stderr: debug, info, warning
            or error.
        receipt_keys_file: the file of receipt signing keys (`DUCTOR_RECEIPT_KEYS`;
            see `ductor_server.receipts.keys`); the last key signs.
        receipt_key: one receipt signing key inline (`DUCTOR_RECEIPT_KEY`); never
            shown in the settings' repr.
        receipts_for_runs: also issue a signed receipt for every run that succeeds.
        outbound_allow: networks outbound calls on a tenant's behalf may reach even
            though they are not public (loopback, private ...); None: none for
            `ductor serve`, loopback for `ductor dev`.
        secret_keys: the keys connection secrets are encrypted with
            (`DUCTOR_SECRET_KEYS`: `KID:KEY` entries, comma-separated, newest first);
            never shown in the settings' repr.
        secret_keys_file: a file holding such entries (one per line), read when
            `secret_keys` is not set; `ductor dev` points it at
            `dev_secret_keys_file`.
        operator_key: the key that creates tenants (`/v1/tenants`) and sets their
            queue policies (`/v1/admin`) over the API (`DUCTOR_OPERATOR_KEY`, at
            least 32 characters); None: no operator calls over the API. Never shown
            in the settings' repr.
    """

    host: str = "127.0.0.1"
    port: int = 7070
    data_dir: Path = field(default_factory=lambda: Path(".ductor"))
    database_url: str | None = None
    redis_url: str | None = None
    redis_prefix: str = "ductor:"
    roles: tuple[str, ...] = ALL_ROLES
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    migrate_on_start: bool = True
    lease_seconds: float = 60.0
    poll_interval: float | None = None
    coordinator_loops: int | None = None
    worker_concurrency: int = DEFAULT_WORKER_CONCURRENCY
    fairness: FairPolicy = field(default_factory=lambda: _fair_policy())
    poison_after: int = 3
    stop_grace: float = 5.0
    cel_engine: str = "cel-rust"
    cel_sandbox: bool = True
    cel_sandbox_threshold: int = 10_000
    cel_sandbox_timeout: float = 5.0
    cel_sandbox_memory_mb: int = 1024
    cel_sandbox_processes: int = 2
    stripe_api_key: str | None = field(default=None, repr=False)
    stripe_webhook_secret: str | None = field(default=None, repr=False)
    stripe_api_base: str | None = None
    log_level: str = "warning"
    receipt_keys_file: Path | None = None
    receipt_key: str | None = field(default=None, repr=False)
    receipts_for_runs: bool = False
    outbound_allow: tuple[str, ...] | None = None
    secret_keys: str | None = field(default=None, repr=False)
    secret_keys_file: Path | None = None
    operator_key: str | None = field(default=None, repr=False)

    @property
    def engine_poll_interval(self) -> float:
        """The poll interval the engine loops use (see `poll_interval`)."""
        if self.poll_interval is not None:
            return self.poll_interval
        if self.redis_url or set(self.roles) == set(ALL_ROLES):
            return IDLE_POLL_INTERVAL
        return SPLIT_POLL_INTERVAL

    @property
    def engine_coordinator_loops(self) -> int:
        """The coordinator loops the engine runs (see `coordinator_loops`)."""
        if self.coordinator_loops is not None:
            return self.coordinator_loops
        return 1 if self.sqlite_file is not None else POSTGRES_COORDINATOR_LOOPS

    @property
    def engine_report_loops(self) -> int:
        """The worker report loops the engine runs: `POSTGRES_REPORT_LOOPS` on
        Postgres, 1 on SQLite (one writer: a second loop would only wait for it)."""
        return 1 if self.sqlite_file is not None else POSTGRES_REPORT_LOOPS

    @property
    def embedded(self) -> bool:
        """True when the server stores everything in SQLite under `data_dir`."""
        return self.database_url is None

    @property
    def sqlite_file(self) -> str | None:
        """The SQLite file the store lives in (embedded or `sqlite:///path`); None on Postgres."""
        if self.database_url is None:
            return self.store_target
        scheme, _, rest = self.database_url.partition("://")
        return rest if scheme.lower() == "sqlite" else None

    @property
    def store_target(self) -> str:
        """What `open_store` is given: the database URL or the SQLite file path."""
        return self.database_url or str(self.data_dir / "ductor.db")

    @property
    def api_key_file(self) -> Path:
        """Where `ductor dev` keeps the dev tenant's API key (mode 0600)."""
        return self.data_dir / "api_key"

    @property
    def dev_receipt_keys_file(self) -> Path:
        """Where `ductor dev` keeps the receipt signing key it made (mode 0600)."""
        return self.data_dir / "receipt_keys"

    @property
    def dev_secret_keys_file(self) -> Path:
        """Where `ductor dev` keeps the connection secret key it made (mode 0600)."""
        return self.data_dir / "secret_keys"

    @property
    def pid_file(self) -> Path:
        """Where a running `ductor dev` or embedded `ductor serve` writes its process id."""
        return self.data_dir / "ductor.pid"

    def make_data_dir(self) -> None:
        """Make the data dir (and its parents) unless it exists.

        Raises:
            ValueError: it cannot be made (a file has its name, a parent is not
                writable), or this process cannot write in it; the message names
                the directory and why.
        """
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(
                f"the data dir {str(self.data_dir)!r} (--data-dir or DUCTOR_DATA_DIR) must be"
                f" a directory that exists or can be made: {exc.strerror or exc}"
            ) from None
        # The database, its journal, the keys and the pid file are made in it.
        if not os.access(self.data_dir, os.W_OK | os.X_OK):
            raise ValueError(
                f"the data dir {str(self.data_dir)!r} (--data-dir or DUCTOR_DATA_DIR) must be"
                f" a directory this user can write in: {os.strerror(errno.EACCES)}"
            )

    @classmethod
    def from_env(cls, *, environ: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        """Build settings from `DUCTOR_*` environment variables, then overrides.

        Args:
            environ: the variables (default: the process environment).
            overrides: field values that win over the environment (None: not given).

        Raises:
            ValueError: an environment variable that does not parse.
        """
        env = os.environ if environ is None else environ
        # A flag wins over its variable, which is then not read at all (a value that
        # does not parse, such as Kubernetes' DUCTOR_PORT=tcp://..., is no error then).
        flagged = {
            variable.name
            for variable in VARIABLES
            if variable.field in _FLAG_FIELDS and overrides.get(variable.field) is not None
        }
        if flagged:
            env = {k: v for k, v in env.items() if k not in flagged}
        values: dict[str, object] = {}
        if url := env.get("DUCTOR_DATABASE_URL"):
            if ":" not in url:
                # `open_store` takes a plain path as a SQLite file; the variable does not.
                raise ValueError(
                    "DUCTOR_DATABASE_URL must be a URL (postgresql://... or sqlite:///path),"
                    f" got {url!r}"
                )
            values["database_url"] = url
        if url := env.get("DUCTOR_REDIS_URL"):
            values["redis_url"] = parse_redis_url(url)
        if prefix := env.get("DUCTOR_REDIS_PREFIX"):
            values["redis_prefix"] = prefix
        if fairness := env.get("DUCTOR_FAIRNESS"):
            try:
                values["fairness"] = _fair_policy(fairness)
            except ValueError as exc:
                raise ValueError(f"DUCTOR_FAIRNESS: {exc}") from None
        if data_dir := env.get("DUCTOR_DATA_DIR"):
            values["data_dir"] = Path(data_dir)
        if host := env.get("DUCTOR_HOST"):
            values["host"] = parse_host("DUCTOR_HOST", host)
        if port := env.get("DUCTOR_PORT"):
            values["port"] = parse_whole("DUCTOR_PORT", port, low=0, high=MAX_PORT)
        if roles := env.get("DUCTOR_ROLES"):
            values["roles"] = parse_roles(roles)
        if size := env.get("DUCTOR_MAX_BODY_BYTES"):
            values["max_body_bytes"] = parse_whole("DUCTOR_MAX_BODY_BYTES", size, low=1)
        if lease := env.get("DUCTOR_LEASE_SECONDS"):
            values["lease_seconds"] = parse_seconds("DUCTOR_LEASE_SECONDS", lease)
        if poll := env.get("DUCTOR_POLL_INTERVAL"):
            values["poll_interval"] = parse_seconds("DUCTOR_POLL_INTERVAL", poll)
        if loops := env.get("DUCTOR_COORDINATOR_LOOPS"):
            values["coordinator_loops"] = parse_whole(
                "DUCTOR_COORDINATOR_LOOPS", loops, low=1, high=MAX_COORDINATOR_LOOPS
            )
        if slots := env.get("DUCTOR_WORKER_CONCURRENCY"):
            values["worker_concurrency"] = parse_whole(
                "DUCTOR_WORKER_CONCURRENCY", slots, low=1, high=MAX_WORKER_CONCURRENCY
            )
        if poison := env.get("DUCTOR_POISON_AFTER"):
            # 0 is allowed: it turns quarantining off.
            values["poison_after"] = parse_whole("DUCTOR_POISON_AFTER", poison, low=0)
        if grace := env.get("DUCTOR_STOP_GRACE"):
            values["stop_grace"] = parse_seconds("DUCTOR_STOP_GRACE", grace, zero=True)
        if cel := env.get("DUCTOR_CEL_ENGINE"):
            values["cel_engine"] = parse_choice("DUCTOR_CEL_ENGINE", cel, CEL_ENGINES)
        if sandbox := env.get("DUCTOR_CEL_SANDBOX"):
            values["cel_sandbox"] = parse_switch("DUCTOR_CEL_SANDBOX", sandbox)
        if threshold := env.get("DUCTOR_CEL_SANDBOX_THRESHOLD"):
            values["cel_sandbox_threshold"] = parse_whole(
                "DUCTOR_CEL_SANDBOX_THRESHOLD", threshold, low=0
            )
        if timeout := env.get("DUCTOR_CEL_SANDBOX_TIMEOUT"):
            values["cel_sandbox_timeout"] = parse_seconds("DUCTOR_CEL_SANDBOX_TIMEOUT", timeout)
        if memory := env.get("DUCTOR_CEL_SANDBOX_MEMORY_MB"):
            values["cel_sandbox_memory_mb"] = parse_whole(
                "DUCTOR_CEL_SANDBOX_MEMORY_MB", memory, low=1, high=MAX_SANDBOX_MEMORY_MB
            )
        if processes := env.get("DUCTOR_CEL_SANDBOX_PROCESSES"):
            values["cel_sandbox_processes"] = parse_whole(
                "DUCTOR_CEL_SANDBOX_PROCESSES", processes, low=1, high=MAX_SANDBOX_PROCESSES
            )
        if stripe_key := env.get("DUCTOR_STRIPE_API_KEY"):
            values["stripe_api_key"] = stripe_key
        if stripe_secret := env.get("DUCTOR_STRIPE_WEBHOOK_SECRET"):
            values["stripe_webhook_secret"] = stripe_secret
        if stripe_base := env.get("DUCTOR_STRIPE_API_BASE"):
            values["stripe_api_base"] = parse_http_url("DUCTOR_STRIPE_API_BASE", stripe_base)
        if level := env.get("DUCTOR_LOG_LEVEL"):
            values["log_level"] = parse_choice("DUCTOR_LOG_LEVEL", level, LOG_LEVELS)
        if keys_file := env.get("DUCTOR_RECEIPT_KEYS"):
            values["receipt_keys_file"] = Path(keys_file)
        if key := env.get("DUCTOR_RECEIPT_KEY"):
            values["receipt_key"] = key
        if for_runs := env.get("DUCTOR_RECEIPTS_FOR_RUNS"):
            values["receipts_for_runs"] = parse_switch("DUCTOR_RECEIPTS_FOR_RUNS", for_runs)
        if (allow := env.get("DUCTOR_OUTBOUND_ALLOW")) is not None:
            try:
                networks = parse_networks(allow)
            except ValueError as exc:
                raise ValueError(f"DUCTOR_OUTBOUND_ALLOW: {exc}") from None
            values["outbound_allow"] = tuple(str(n) for n in networks)
        if secret_keys := env.get("DUCTOR_SECRET_KEYS"):
            values["secret_keys"] = secret_keys
        if operator_key := env.get("DUCTOR_OPERATOR_KEY"):
            if len(operator_key.strip()) < MIN_OPERATOR_KEY_LENGTH:
                raise ValueError(
                    f"DUCTOR_OPERATOR_KEY must be at least {MIN_OPERATOR_KEY_LENGTH} characters"
                    " (make one with: python -c 'import secrets;"
                    " print(secrets.token_urlsafe(32))')"
                )
            values["operator_key"] = operator_key.strip()
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]


@dataclass(frozen=True, kw_only=True)
class Variable:
    """One `DUCTOR_*` environment variable, as the configuration reference shows it.

    Attributes:
        name: the variable.
        what: what it sets (Markdown, links relative to docs/).
        field: the `Settings` attribute `from_env` sets from it; None for variables
            read elsewhere (the client commands, the bridge keys, `serve --seed`).
        default: the default as shown; None: the `Settings` field's default.
    """

    name: str
    what: str
    field: str | None = None
    default: str | None = None

    def shown_default(self) -> str:
        """The default as the reference shows it."""
        if self.default is not None:
            return self.default
        if self.field is None:
            return "unset"
        value = getattr(Settings(), self.field)
        if value is None:
            return "unset"
        if isinstance(value, bool):
            return "`on`" if value else "`off`"
        if isinstance(value, tuple):
            return "`" + ",".join(str(v) for v in value) + "`"
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        return f"`{value}`"


VARIABLES: tuple[Variable, ...] = (
    Variable(
        name="DUCTOR_DATABASE_URL",
        field="database_url",
        default="unset: SQLite under the data dir",
        what="a `postgresql://` (also `postgres://` or `postgresql+psycopg://`) URL for "
        "`ductor serve`, `ductor migrate` and the `--database` commands, or `sqlite:///path`; "
        "any other scheme, a URL without its `//`, or one whose host or port cannot be read "
        "(`:99999`), is refused",
    ),
    Variable(
        name="DUCTOR_REDIS_URL",
        field="redis_url",
        what="Redis (or Dragonfly, see [Redis](#redis-or-dragonfly)): the engine loops of "
        "every process wake each other through pub/sub (without it, a loop only hears of "
        "writes made in its own process and finds the others' by polling), and the fair "
        "task queue's order and limits hold across processes; the database stays the "
        "source of truth",
    ),
    Variable(
        name="DUCTOR_REDIS_PREFIX",
        field="redis_prefix",
        what="the prefix of this deployment's Redis channels (`<prefix>wake`, "
        "`<prefix>inbox`) and keys (`<prefix>q:...`): deployments sharing one Redis need "
        "different prefixes",
    ),
    Variable(
        name="DUCTOR_DATA_DIR",
        field="data_dir",
        what="the embedded database, `api_key`, `ductor.pid` (of the `ductor dev` or "
        "`ductor serve` running on it) and, for `ductor dev`, "
        "without a receipt key set, `receipt_keys`, and without `DUCTOR_SECRET_KEYS`, "
        "`secret_keys`; "
        "also where the client commands look for `api_key`",
    ),
    Variable(
        name="DUCTOR_HOST",
        field="host",
        what="the interface the server listens on (`--host`): an IP address or a host "
        "name; and where the client commands look for it",
    ),
    Variable(
        name="DUCTOR_PORT",
        field="port",
        what="the port the server listens on (`--port`), and where the client commands "
        "look for it; every process serves `/healthz` and `/readyz` there, whatever its roles",
    ),
    Variable(
        name="DUCTOR_ROLES",
        field="roles",
        what="what a `ductor serve` process runs (`--roles`, comma-separated): `api` (the "
        "HTTP API), `coordinator` (ticks runs), `worker` (runs steps, sends outbox emails), "
        "`timer` (fires timers and cron triggers, sweeps expired rows)",
    ),
    Variable(
        name="DUCTOR_MAX_BODY_BYTES",
        field="max_body_bytes",
        what="larger request bodies get `413 request.too_large`",
    ),
    Variable(
        name="DUCTOR_LEASE_SECONDS",
        field="lease_seconds",
        what="how long a worker owns a task (and the chat agent a turn) without renewing "
        "it before another may run it again",
    ),
    Variable(
        name="DUCTOR_POLL_INTERVAL",
        field="poll_interval",
        default=f"`{IDLE_POLL_INTERVAL:g}` with Redis or all roles in one process, "
        f"else `{SPLIT_POLL_INTERVAL:g}`",
        what="seconds an idle engine loop waits, when nothing wakes it, before looking for "
        "work again (a safety net when wake-ups reach every loop)",
    ),
    Variable(
        name="DUCTOR_COORDINATOR_LOOPS",
        field="coordinator_loops",
        default=f"`{POSTGRES_COORDINATOR_LOOPS}` on Postgres, `1` on SQLite",
        what="coordinator loops in a process with the coordinator role, each ticking its own "
        f"batch of runs while another waits for the database (1 to {MAX_COORDINATOR_LOOPS})",
    ),
    Variable(
        name="DUCTOR_WORKER_CONCURRENCY",
        field="worker_concurrency",
        what="step handlers a process with the worker role runs at once: its slots, which "
        f"the task queue shares out between tenants (1 to {MAX_WORKER_CONCURRENCY})",
    ),
    Variable(
        name="DUCTOR_FAIRNESS",
        field="fairness",
        default="unset: every tenant has weight 1 and no limits",
        what="the task queue's tenant weights and limits, as JSON (see [The task queue]"
        "(architecture.md#the-task-queue-tiers-weights-limits)); a bad value stops the "
        "server at start, naming each problem with its JSON pointer",
    ),
    Variable(
        name="DUCTOR_POISON_AFTER",
        field="poison_after",
        what="how many times a task may die with its process before it is quarantined as "
        "`attempt.poisoned` (`0`: never; see [Poisoned tasks](api.md#poisoned-tasks))",
    ),
    Variable(
        name="DUCTOR_STOP_GRACE",
        field="stop_grace",
        what="seconds running steps may take to finish when the process is stopped "
        "(SIGTERM) before their tasks go back to the queue",
    ),
    Variable(
        name="DUCTOR_LOG_LEVEL",
        field="log_level",
        what="what the server's own loggers write to stderr: `debug`, `info` (adds, e.g., "
        "each coordinator's totals at exit: runs ticked, batches, conflicts), `warning` "
        "or `error`",
    ),
    Variable(
        name="DUCTOR_CEL_ENGINE",
        field="cel_engine",
        what="the CEL engine of every expression: `cel-rust` or `cel-python` (see "
        "[Expressions](expressions.md))",
    ),
    Variable(
        name="DUCTOR_CEL_SANDBOX",
        field="cel_sandbox",
        what="with cel-rust, evaluate costly expressions in capped child processes (see "
        "[The server's runtime limit](expressions.md#the-servers-runtime-limit)); `off` "
        "evaluates everything in-process",
    ),
    Variable(
        name="DUCTOR_CEL_SANDBOX_THRESHOLD",
        field="cel_sandbox_threshold",
        what="the estimated cost (units) from which an expression is sandboxed",
    ),
    Variable(
        name="DUCTOR_CEL_SANDBOX_TIMEOUT",
        field="cel_sandbox_timeout",
        what="seconds one sandboxed evaluation may take before it fails as "
        "`expression.resource_exhausted`",
    ),
    Variable(
        name="DUCTOR_CEL_SANDBOX_MEMORY_MB",
        field="cel_sandbox_memory_mb",
        what="the address space of each sandbox process, in MiB",
    ),
    Variable(
        name="DUCTOR_CEL_SANDBOX_PROCESSES",
        field="cel_sandbox_processes",
        what=f"how many sandbox processes evaluate at once (1 to {MAX_SANDBOX_PROCESSES})",
    ),
    Variable(
        name="DUCTOR_OUTBOUND_ALLOW",
        field="outbound_allow",
        default="`ductor dev`: `127.0.0.0/8,::1`; `ductor serve`: empty",
        what="addresses or networks the server may call on a tenant's behalf although they "
        "are not public (see [the outbound guard](api.md#the-outbound-guard))",
    ),
    Variable(
        name="DUCTOR_SECRET_KEYS",
        field="secret_keys",
        default="unset (`ductor dev`: `<data dir>/secret_keys`, made on first start)",
        what="the keys connection secrets are encrypted with: `KID:KEY[,KID:KEY...]`, newest "
        "first, each key the URL-safe base64 of 32 bytes (`ductor connections new-key` makes "
        "one); without it `ductor serve` refuses connections with secrets "
        "(`503 secrets.unconfigured`; see "
        "[connections](connections.md#secrets-at-rest-and-key-rotation))",
    ),
    Variable(
        name="DUCTOR_RECEIPT_KEYS",
        field="receipt_keys_file",
        default="unset (`ductor dev`: `<data dir>/receipt_keys`, made on first start)",
        what="a file of receipt signing keys, one `KEY_ID BASE64_SEED` per line; the last "
        "one signs, all are published at `/.well-known/ductor-keys` (see "
        "[receipts](settlement.md#receipts))",
    ),
    Variable(
        name="DUCTOR_RECEIPT_KEY",
        field="receipt_key",
        what="one receipt signing key inline instead (`KEY_ID BASE64_SEED`, a base64 seed, "
        "or a PEM); never with `DUCTOR_RECEIPT_KEYS`",
    ),
    Variable(
        name="DUCTOR_RECEIPTS_FOR_RUNS",
        field="receipts_for_runs",
        what="issue a signed receipt for every run that succeeds, in the transaction that "
        "ends it (needs a receipt key)",
    ),
    Variable(
        name="DUCTOR_STRIPE_API_KEY",
        field="stripe_api_key",
        what="Stripe's secret key; with `DUCTOR_STRIPE_WEBHOOK_SECRET`, wallets can be topped "
        "up by card (`pip install 'ductor-server[stripe]'`; see "
        "[wallet top-ups](settlement.md#wallet-top-ups-through-stripe-experimental))",
    ),
    Variable(
        name="DUCTOR_STRIPE_WEBHOOK_SECRET",
        field="stripe_webhook_secret",
        what="the signing secret of the Stripe webhook endpoint (`POST /webhooks/stripe`)",
    ),
    Variable(
        name="DUCTOR_STRIPE_API_BASE",
        field="stripe_api_base",
        default="Stripe's",
        what="another address for Stripe's API (a test double): an `http://` or `https://` URL",
    ),
    Variable(
        name="DUCTOR_BRIDGE_SIGNING_KEY",
        what="the server-wide bridge signing key, for SDK apps without a key of their own "
        "(see [the SDK's keys](sdk.md)); a blank one (white space only) stops the start",
    ),
    Variable(
        name="DUCTOR_BRIDGE_SIGNING_KEY_FALLBACK",
        what="the previous server-wide bridge key, still accepted while apps move to the new one "
        "(set without `DUCTOR_BRIDGE_SIGNING_KEY`, or blank, it stops the start)",
    ),
    Variable(
        name="DUCTOR_BRIDGE_REQUIRE_NONCE",
        default="`off`",
        what="`1`: requests signed with the server-wide bridge key must carry a nonce too",
    ),
    Variable(
        name="DUCTOR_SEED_TENANT",
        what="the tenant `ductor serve --seed DIR` applies its manifests to (`--seed-tenant`)",
    ),
    Variable(
        name="DUCTOR_OPERATOR_KEY",
        field="operator_key",
        what="the operator's key (at least 32 characters) for `/v1/tenants` and `ductor "
        "tenants` over the API; unset, tenants are created with `ductor tenants create "
        "--database` only (see [security](security.md#tenancy))",
    ),
    Variable(
        name="DUCTOR_OTEL",
        default="unset: on when an `OTEL_*_EXPORTER` or OTLP endpoint variable is set",
        what="`on` or `off`: export traces and metrics through the OpenTelemetry SDK "
        "(the `ductor-server[otel]` extra), configured by the standard `OTEL_*` "
        "variables; see [observability](observability.md)",
    ),
    Variable(
        name="DUCTOR_URL",
        default="from `DUCTOR_HOST` and `DUCTOR_PORT`",
        what="the server the client commands (`ductor workflows ...`, `runs`, `events`, "
        "`apply` ...) talk to (`--url`)",
    ),
    Variable(
        name="DUCTOR_CHAT_MODEL",
        what="the model `ductor chat` asks for when `--model` is not given (see "
        "[AI](ai.md#ductor-chat))",
    ),
    Variable(
        name="DUCTOR_API_KEY",
        default="`<data dir>/api_key`",
        what="the key the client commands send (`--api-key`)",
    ),
)
"""Every `DUCTOR_*` variable a `ductor` process reads, in the reference's order."""


def reference_markdown() -> str:
    """The configuration reference: a Markdown table of `VARIABLES`."""
    lines = ["| variable | default | what |", "|---|---|---|"]
    for variable in VARIABLES:
        what = variable.what.replace("|", "\\|")
        lines.append(f"| `{variable.name}` | {variable.shown_default()} | {what} |")
    return "\n".join(lines) + "\n"
