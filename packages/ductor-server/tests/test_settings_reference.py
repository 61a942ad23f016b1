"""The configuration reference (`settings.VARIABLES`) against the code that reads
the environment: every `DUCTOR_*` name read is listed, and every listed name is read."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

import ductor_server
from ductor_core.expressions import ENGINE_NAMES
from ductor_server.cli import main
from ductor_server.settings import (
    CEL_ENGINES,
    MAX_COORDINATOR_LOOPS,
    POSTGRES_COORDINATOR_LOOPS,
    VARIABLES,
    Settings,
    reference_markdown,
)
from ductor_server.storage import open_store

SOURCE = Path(ductor_server.__file__).parent
NAME = re.compile(r"\bDUCTOR_[A-Z0-9_]*[A-Z0-9]\b")
HARNESS_ONLY = {"DUCTOR_TEST_DATABASE_URL", "DUCTOR_TEST_REDIS_URL"}
"""Read by the pytest plugin, for test runs; docs/development.md describes them."""


class Recording(Mapping[str, str]):
    """An empty environment that remembers every name looked up in it."""

    def __init__(self) -> None:
        self.asked: set[str] = set()

    def __getitem__(self, name: str) -> str:
        self.asked.add(name)
        raise KeyError(name)

    def get(self, name: str, default: object = None) -> object:  # type: ignore[override]
        self.asked.add(name)
        return default

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def test_from_env_reads_exactly_the_listed_settings_variables() -> None:
    environ = Recording()
    Settings.from_env(environ=environ)
    assert environ.asked == {v.name for v in VARIABLES if v.field is not None}
    fields = set(Settings.__dataclass_fields__)
    assert {v.field for v in VARIABLES if v.field is not None} <= fields


def test_every_name_in_the_code_is_listed_and_every_listed_name_is_read() -> None:
    listed = [v.name for v in VARIABLES]
    assert len(listed) == len(set(listed)), "a variable listed twice"
    found: dict[str, set[str]] = {}
    for path in SOURCE.rglob("*.py"):
        for name in NAME.findall(path.read_text()):
            found.setdefault(name, set()).add(path.name)
    assert set(found) - HARNESS_ONLY == set(listed)
    for variable in VARIABLES:
        if variable.field is None:
            assert found[variable.name] - {"settings.py"}, f"{variable.name} is read nowhere"


def test_defaults_come_from_the_settings() -> None:
    shown = {v.name: v.shown_default() for v in VARIABLES}
    assert shown["DUCTOR_PORT"] == f"`{Settings().port}`"
    assert shown["DUCTOR_ROLES"] == "`api,coordinator,worker,timer`"
    assert shown["DUCTOR_LEASE_SECONDS"] == "`60`"
    assert shown["DUCTOR_CEL_SANDBOX"] == "`on`"
    assert shown["DUCTOR_RECEIPTS_FOR_RUNS"] == "`off`"
    assert shown["DUCTOR_REDIS_URL"] == "unset"


def test_ductor_config_reference_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "reference"]) == 0
    out = capsys.readouterr().out
    assert out == reference_markdown()
    rows = [line for line in out.splitlines() if line.startswith("| `DUCTOR_")]
    assert len(rows) == len(VARIABLES)
    assert all(line.count(" | ") == 2 for line in rows), "a '|' in a cell breaks the table"


def test_coordinator_loops_default_by_backend_and_refuse_nonsense() -> None:
    assert Settings().engine_coordinator_loops == 1  # SQLite has one writer
    on_sqlite_url = Settings(database_url="sqlite:///tmp/x.db")  # a file named by URL too
    assert (on_sqlite_url.engine_coordinator_loops, on_sqlite_url.engine_report_loops) == (1, 1)
    on_postgres = Settings(database_url="postgresql://db/x")
    assert on_postgres.engine_coordinator_loops == POSTGRES_COORDINATOR_LOOPS
    chosen = Settings.from_env(environ={"DUCTOR_COORDINATOR_LOOPS": "3"})
    assert chosen.engine_coordinator_loops == 3
    for bad in ("0", "-1", "two", "1.5", str(MAX_COORDINATOR_LOOPS + 1)):
        with pytest.raises(ValueError, match="DUCTOR_COORDINATOR_LOOPS must be a whole number"):
            Settings.from_env(environ={"DUCTOR_COORDINATOR_LOOPS": bad})


def test_every_number_and_choice_is_checked_naming_the_variable() -> None:
    refused = {
        "DUCTOR_PORT": ("abc", "-1", "65536", "80.5"),
        "DUCTOR_MAX_BODY_BYTES": ("1MB", "0"),
        "DUCTOR_POISON_AFTER": ("x", "-1"),
        # 1e-300 s was a lease of 0 once a time, refused later without its name.
        "DUCTOR_LEASE_SECONDS": ("abc", "0", "-5", "nan", "inf", "1e300", "31536001", "1e-300"),
        "DUCTOR_POLL_INTERVAL": ("fast", "0", "1e300", "1e-300", "0.0009"),
        "DUCTOR_STOP_GRACE": ("x", "-1", "1e300", "1e-300"),
        "DUCTOR_CEL_ENGINE": ("v8",),
        "DUCTOR_CEL_SANDBOX_THRESHOLD": ("x", "-1"),
        "DUCTOR_CEL_SANDBOX_TIMEOUT": ("x", "0", "1e300", "1e-9"),
        "DUCTOR_CEL_SANDBOX_MEMORY_MB": ("x", "0", "99999999999999"),
        # A pool of that many slots was built before anything else started: the
        # start hung, filling memory, and SIGTERM could not stop it.
        "DUCTOR_CEL_SANDBOX_PROCESSES": ("x", "0", "257", "99999999999999999999"),
        "DUCTOR_LOG_LEVEL": ("loud",),
        "DUCTOR_ROLES": (",",),
        "DUCTOR_DATABASE_URL": ("/tmp/x.db", "x.db"),
        # Each was taken without a word, to fail only when a top-up called it.
        "DUCTOR_STRIPE_API_BASE": (
            "notaurl",
            " ",
            "127.0.0.1:12111",
            "ftp://127.0.0.1",
            "http://",
            "https://h:99999",
            "http://a b/",
        ),
    }
    # Refused when the store is opened, naming the variable but not the URL (a password).
    unreadable = {
        "DUCTOR_DATABASE_URL": (
            "postgresql:db",
            "postgresql://u:pw@127.0.0.1:99999/db",
            "postgres://u:pw@[::1/db",
            "mysql://u:pw@h/db",
        ),
    }
    # Each stopped the start in a line of redis-py's naming no variable, or was
    # taken as database 0 (`/abc`), or served while every call failed (`/-1`).
    redis_refused = (
        "redis://u:pw@127.0.0.1:99999/0",
        "redis://u:pw@127.0.0.1:abc/0",
        "redis://u:pw@[::1:6379/0",
        "redis://u:pw@127.0.0.1:6379/abc",
        "redis://u:pw@127.0.0.1:6379/-1",
        "redis://u:pw@127.0.0.1:6379?db=x",
        "http://u:pw@127.0.0.1:6379/0",
    )
    for value in redis_refused:
        with pytest.raises(ValueError) as caught:
            Settings.from_env(environ={"DUCTOR_REDIS_URL": value})
        assert str(caught.value).startswith("DUCTOR_REDIS_URL"), str(caught.value)
        assert "pw" not in str(caught.value), str(caught.value)
    for text, url in (
        ("redis://127.0.0.1:6379/2", "redis://127.0.0.1:6379/2"),
        ("REDIS://127.0.0.1:6379", "redis://127.0.0.1:6379"),  # the scheme in any case
        ("rediss://h:6380/0?db=3", "rediss://h:6380/0?db=3"),
        ("unix:///run/redis.sock?db=1", "unix:///run/redis.sock?db=1"),
    ):
        assert Settings.from_env(environ={"DUCTOR_REDIS_URL": text}).redis_url == url
    for name, values in unreadable.items():
        for value in values:
            with pytest.raises(ValueError) as caught:
                open_store(Settings.from_env(environ={name: value}).store_target)
            assert name in str(caught.value), str(caught.value)
            assert "pw" not in str(caught.value), str(caught.value)
    for name, values in refused.items():
        for value in values:
            with pytest.raises(ValueError) as caught:
                Settings.from_env(environ={name: value})
            assert str(caught.value).startswith(name), str(caught.value)
            assert repr(value) in str(caught.value)
    accepted = {
        "DUCTOR_PORT": ("0", 0),
        "DUCTOR_POISON_AFTER": ("0", 0),  # never quarantine
        "DUCTOR_STOP_GRACE": ("0", 0.0),
        "DUCTOR_LEASE_SECONDS": ("0.5", 0.5),
        "DUCTOR_CEL_SANDBOX_TIMEOUT": ("0.001", 0.001),
        "DUCTOR_POLL_INTERVAL": ("31536000", 31536000.0),
        "DUCTOR_CEL_SANDBOX_THRESHOLD": ("0", 0),
        "DUCTOR_CEL_ENGINE": ("cel-python", "cel-python"),
        "DUCTOR_DATABASE_URL": ("sqlite:///tmp/x.db", "sqlite:///tmp/x.db"),
        "DUCTOR_STRIPE_API_BASE": ("http://127.0.0.1:12111", "http://127.0.0.1:12111"),
    }
    field = {v.name: v.field for v in VARIABLES}
    for name, (text, value) in accepted.items():
        settings = Settings.from_env(environ={name: text})
        assert getattr(settings, str(field[name])) == value
    assert set(CEL_ENGINES) == set(ENGINE_NAMES)


def test_the_sqlite_file_is_known_whichever_way_it_is_given(tmp_path: Path) -> None:
    assert Settings(data_dir=tmp_path).sqlite_file == str(tmp_path / "ductor.db")
    assert Settings(database_url="sqlite:///tmp/y.db").sqlite_file == "/tmp/y.db"
    assert Settings(database_url="postgresql://db/x").sqlite_file is None
