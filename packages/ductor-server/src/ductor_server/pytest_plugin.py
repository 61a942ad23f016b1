"""Pytest fixtures for real PostgreSQL and Redis, one fresh database per test.

Load with `pytest_plugins = ["ductor_server.pytest_plugin"]`. Outside CI a
missing service skips the tests that need it and prints a loud summary line;
with `CI=true` a missing service fails them.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from typing import NoReturn
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
import redis

DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"

_missing: dict[str, str] = {}


def admin_database_url() -> str:
    """The server-level PostgreSQL URL tests create their databases from."""
    return os.environ.get("DUCTOR_TEST_DATABASE_URL", DEFAULT_DATABASE_URL)


def test_redis_url() -> str:
    """The Redis URL tests use (each test takes its own key prefix)."""
    return os.environ.get("DUCTOR_TEST_REDIS_URL", DEFAULT_REDIS_URL)


test_redis_url.__test__ = False  # type: ignore[attr-defined]


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def unavailable(service: str, reason: str) -> NoReturn:
    """Stop the test because `service` (a server, a browser, a runtime) is missing.

    The one rule for what a test needs from the machine: under `CI=true` this is a
    failure, since CI installs everything the suite uses and a skip there would
    hide a lost install step; on a developer's machine it is a skip named in the
    session's summary, so a partial setup can still run the rest.
    """
    _missing[service] = reason
    message = f"{service} unavailable: {reason}"
    if _in_ci():
        pytest.fail(f"{message} (CI=true: a missing service is a failure)", pytrace=False)
    pytest.skip(message, allow_module_level=True)


def _with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


def create_database(admin_url: str | None = None) -> str:
    """Create a fresh, uniquely named PostgreSQL database; return its URL."""
    admin_url = admin_url or admin_database_url()
    name = f"ductor_t_{secrets.token_hex(6)}"
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=3) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return _with_database(admin_url, name)


def drop_database(url: str, admin_url: str | None = None) -> None:
    """Drop a database made by `create_database`, closing its connections."""
    admin_url = admin_url or admin_database_url()
    name = urlsplit(url).path.lstrip("/")
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=3) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def _postgres_admin() -> str:
    url = admin_database_url()
    try:
        with psycopg.connect(url, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        unavailable("PostgreSQL", f"{url}: {exc}".strip())
    return url


@pytest.fixture
def postgres_url(_postgres_admin: str) -> Iterator[str]:
    """A URL to a brand-new PostgreSQL database, dropped after the test."""
    url = create_database(_postgres_admin)
    try:
        yield url
    finally:
        drop_database(url, _postgres_admin)


@pytest.fixture(scope="session")
def _redis_available() -> str:
    url = test_redis_url()
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=3)
        client.ping()
        client.close()
    except redis.RedisError as exc:
        unavailable("Redis", f"{url}: {exc}")
    return url


@pytest.fixture
def redis_url(_redis_available: str) -> str:
    """The test Redis URL; `redis_prefix` gives the test its own key space."""
    return _redis_available


@pytest.fixture
def redis_prefix(_redis_available: str) -> Iterator[str]:
    """A unique key prefix; every key under it is deleted after the test."""
    prefix = f"ductor_t_{secrets.token_hex(6)}:"
    yield prefix
    client = redis.Redis.from_url(_redis_available)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say loudly which services were missing, so a green run is not mistaken."""
    for service, reason in _missing.items():
        terminalreporter.write_sep(
            "!", f"{service} MISSING: its tests were skipped ({reason})", red=True, bold=True
        )
