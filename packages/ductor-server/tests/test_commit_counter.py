"""The wire counter the idle test and bench/latency.py read: commits and
statements a client sends to a real Postgres, counted exactly."""

from __future__ import annotations

import time
from urllib.parse import urlsplit

import psycopg

from ductor_server.testing import CommitCounter


def _settled(counter: CommitCounter, commits: int, statements: int) -> tuple[int, int]:
    """The counts once the proxy has passed on what was sent (bounded wait)."""
    deadline = time.monotonic() + 5
    while (counter.commits, counter.statements) != (commits, statements):
        if time.monotonic() > deadline:
            break
        time.sleep(0.01)
    return counter.commits, counter.statements


def test_commits_and_statements_are_counted_on_the_wire(postgres_url: str) -> None:
    parts = urlsplit(postgres_url)
    counter = CommitCounter((parts.hostname or "127.0.0.1", parts.port or 5432))
    try:
        with psycopg.connect(counter.url(postgres_url), autocommit=True, sslmode="disable") as conn:
            base = (counter.commits, counter.statements)  # whatever connecting sent
            conn.execute("SELECT 1")
            assert _settled(counter, base[0], base[1] + 1) == (base[0], base[1] + 1)
            with conn.transaction():
                conn.execute("SELECT 2")
                conn.execute("SELECT %s", ("x" * 100_000,))  # one message over many reads
            # BEGIN, two statements, COMMIT
            assert _settled(counter, base[0] + 1, base[1] + 5) == (base[0] + 1, base[1] + 5)
            with conn.cursor() as cur:
                cur.executemany("SELECT %s", [(1,), (2,), (3,)])  # pipelined: one Execute each
            assert _settled(counter, base[0] + 1, base[1] + 8) == (base[0] + 1, base[1] + 8)
    finally:
        counter.close()
