"""Server configuration, read from flags and the environment at the edge only."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ductor_server.netaddr import parse_networks

if TYPE_CHECKING:
    from ductor_server.engine.fairness import FairPolicy

ALL_ROLES: tuple[str, ...] = ("api", "coordinator", "worker", "timer")
LOG_LEVELS: tuple[str, ...] = ("debug", "info", "warning", "error")
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
IDLE_POLL_INTERVAL = 5.0
"""Seconds between an idle loop's looks when every write wakes it: a safety net only."""
SPLIT_POLL_INTERVAL = 0.5
"""Seconds between an idle loop's looks when writes in other processes cannot wake it."""


def parse_roles(text: str) -> tuple[str, ...]:
    """Parse "api,worker" into roles, rejecting unknown names.

    Raises:
        ValueError: a role that is not one of api, coordinator, worker, timer.
    """
    roles = tuple(dict.fromkeys(r.strip() for r in text.split(",") if r.strip()))
    unknown = [r for r in roles if r not in ALL_ROLES]
    if unknown or not roles:
        raise ValueError(f"unknown roles {unknown or text!r}: choose from {', '.join(ALL_ROLES)}")
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
        lease_seconds: how long a worker owns a leased task before another may retry it.
        poll_interval: seconds an idle engine loop sleeps, when nothing wakes it, before
            looking again; None: `IDLE_POLL_INTERVAL` when wake-ups reach every loop
            (Redis, or all roles in this process), else `SPLIT_POLL_INTERVAL`.
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
        operator_key: the bearer key of operators' calls (`/v1/admin/...`,
            `DUCTOR_OPERATOR_KEY`); None: those calls are refused. Never shown in
            the settings' repr.
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
    def embedded(self) -> bool:
        """True when the server stores everything in SQLite under `data_dir`."""
        return self.database_url is None

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
        """Where a running `ductor dev` writes its process id."""
        return self.data_dir / "ductor.pid"

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        """Build settings from `DUCTOR_*` environment variables, then overrides.

        Raises:
            ValueError: an environment variable that does not parse.
        """
        env = os.environ
        values: dict[str, object] = {}
        if url := env.get("DUCTOR_DATABASE_URL"):
            values["database_url"] = url
        if url := env.get("DUCTOR_REDIS_URL"):
            values["redis_url"] = url
        if prefix := env.get("DUCTOR_REDIS_PREFIX"):
            values["redis_prefix"] = prefix
        if fairness := env.get("DUCTOR_FAIRNESS"):
            values["fairness"] = _fair_policy(fairness)
        if data_dir := env.get("DUCTOR_DATA_DIR"):
            values["data_dir"] = Path(data_dir)
        if host := env.get("DUCTOR_HOST"):
            values["host"] = host
        if port := env.get("DUCTOR_PORT"):
            values["port"] = int(port)
        if roles := env.get("DUCTOR_ROLES"):
            values["roles"] = parse_roles(roles)
        if size := env.get("DUCTOR_MAX_BODY_BYTES"):
            values["max_body_bytes"] = int(size)
        if lease := env.get("DUCTOR_LEASE_SECONDS"):
            values["lease_seconds"] = float(lease)
        if poll := env.get("DUCTOR_POLL_INTERVAL"):
            values["poll_interval"] = float(poll)
        if poison := env.get("DUCTOR_POISON_AFTER"):
            values["poison_after"] = int(poison)
        if grace := env.get("DUCTOR_STOP_GRACE"):
            values["stop_grace"] = float(grace)
        if cel := env.get("DUCTOR_CEL_ENGINE"):
            values["cel_engine"] = cel
        if sandbox := env.get("DUCTOR_CEL_SANDBOX"):
            values["cel_sandbox"] = parse_switch("DUCTOR_CEL_SANDBOX", sandbox)
        if threshold := env.get("DUCTOR_CEL_SANDBOX_THRESHOLD"):
            values["cel_sandbox_threshold"] = int(threshold)
        if timeout := env.get("DUCTOR_CEL_SANDBOX_TIMEOUT"):
            values["cel_sandbox_timeout"] = float(timeout)
        if memory := env.get("DUCTOR_CEL_SANDBOX_MEMORY_MB"):
            values["cel_sandbox_memory_mb"] = int(memory)
        if processes := env.get("DUCTOR_CEL_SANDBOX_PROCESSES"):
            values["cel_sandbox_processes"] = int(processes)
        if stripe_key := env.get("DUCTOR_STRIPE_API_KEY"):
            values["stripe_api_key"] = stripe_key
        if stripe_secret := env.get("DUCTOR_STRIPE_WEBHOOK_SECRET"):
            values["stripe_webhook_secret"] = stripe_secret
        if stripe_base := env.get("DUCTOR_STRIPE_API_BASE"):
            values["stripe_api_base"] = stripe_base
        if level := env.get("DUCTOR_LOG_LEVEL"):
            if level.lower() not in LOG_LEVELS:
                raise ValueError(
                    f"DUCTOR_LOG_LEVEL must be one of {', '.join(LOG_LEVELS)}, got {level!r}"
                )
            values["log_level"] = level.lower()
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
            if len(operator_key) < 16:
                raise ValueError("DUCTOR_OPERATOR_KEY must be at least 16 characters long")
            values["operator_key"] = operator_key
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]
