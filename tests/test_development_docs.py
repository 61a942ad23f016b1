"""docs/development.md and the README's "Two commands", held to what the scripts and
the test fixtures do: every package's suite runs alone, CI starts the services with
the commands the page shows, and a missing service is a loud skip (a failure in CI)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import psycopg

from ductor_server.pytest_plugin import admin_database_url
from ductor_server.testing import free_port

ROOT = Path(__file__).resolve().parents[1]
DEVELOPMENT = ROOT / "docs" / "development.md"


def _words(command: str) -> str:
    """A shell command with its line continuations, quotes and runs of blanks gone."""
    return " ".join(command.replace("\\\n", " ").replace('"', "").split())


def test_scripts_test_runs_every_workspace_package_alone_then_the_top_level_tests() -> None:
    script = (ROOT / "scripts" / "test").read_text()
    (loop,) = re.findall(r"^for pkg in ([^;]+);", script, re.MULTILINE)
    alone = loop.split()
    for isolated in ('--package "$pkg"', ".venvs/$pkg", "--package ductor-server"):
        assert isolated in script, isolated
    members = {
        tomllib.loads(p.read_text())["project"]["name"]
        for p in ROOT.glob("packages/*/pyproject.toml")
    }
    assert members == {*alone, "ductor-server"}, "a package whose suite scripts/test skips"
    # Lint, format, types and import contracts first; the top-level tests/ last.
    order = [
        "ruff check .",
        "ruff format --check .",
        "uv run --no-sync mypy",
        "lint-imports",
        "for pkg in",
        "pytest packages/ductor-server",
        "pytest tests ",
    ]
    places = [script.index(step) for step in order]
    assert places == sorted(places), order
    # Extra arguments reach every pytest call.
    assert all('"$@"' in line for line in script.splitlines() if "pytest " in line)


def test_ci_starts_the_services_with_the_commands_the_page_shows() -> None:
    page = DEVELOPMENT.read_text()
    shown = re.findall(r"^  - `((?:pg_ctlcluster|redis-server) [^`]+)`$", page, re.MULTILINE)
    assert len(shown) == 2, shown
    ci = _words((ROOT / ".ci" / "run").read_text())
    for command in shown:
        assert _words(command) in ci, command
    assert "exec ./scripts/test" in ci
    assert "[ ! -x /usr/bin/chromium ]" in ci


def _inner_suite(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """A suite of two tests that need PostgreSQL and Redis, run by its own pytest."""
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["ductor_server.pytest_plugin"]\n')
    (tmp_path / "test_needs_services.py").write_text(
        "def test_postgres(postgres_url):\n"
        "    open('urls', 'a').write(postgres_url + '\\n')\n"
        "def test_postgres_again(postgres_url):\n"
        "    open('urls', 'a').write(postgres_url + '\\n')\n"
        "def test_redis(redis_url, redis_prefix):\n"
        "    pass\n"
    )
    clean = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS")}
    clean = {k: v for k, v in clean.items() if not k.startswith(("DUCTOR_", "PYTEST_XDIST"))}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"],
        cwd=tmp_path,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_missing_service_is_a_loud_skip_and_a_failure_under_ci(tmp_path: Path) -> None:
    nowhere = {
        "DUCTOR_TEST_DATABASE_URL": f"postgresql://postgres@127.0.0.1:{free_port()}/postgres",
        "DUCTOR_TEST_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
    }
    (tmp_path / "dev").mkdir()
    skipped = _inner_suite(tmp_path / "dev", nowhere)
    assert skipped.returncode == 0, skipped.stdout + skipped.stderr
    assert "3 skipped" in skipped.stdout, skipped.stdout
    assert "PostgreSQL MISSING: its tests were skipped" in skipped.stdout, skipped.stdout
    assert "Redis MISSING: its tests were skipped" in skipped.stdout, skipped.stdout

    (tmp_path / "ci").mkdir()
    failed = _inner_suite(tmp_path / "ci", {**nowhere, "CI": "true"})
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "3 error" in failed.stdout, failed.stdout
    assert "CI=true: a missing service is a failure" in failed.stdout, failed.stdout


def test_each_test_gets_a_fresh_database_dropped_after(tmp_path: Path) -> None:
    done = _inner_suite(tmp_path, {"DUCTOR_TEST_DATABASE_URL": admin_database_url()})
    assert done.returncode == 0, done.stdout + done.stderr
    urls = (tmp_path / "urls").read_text().split()
    assert len(urls) == len(set(urls)) == 2, urls
    names = [url.rsplit("/", 1)[1] for url in urls]
    with psycopg.connect(admin_database_url()) as conn:
        left = conn.execute(
            "SELECT datname FROM pg_database WHERE datname = ANY(%s)", (names,)
        ).fetchall()
    assert left == [], f"not dropped: {left}"
