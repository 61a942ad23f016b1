"""The wire counter the idle test and bench/latency.py read: commits, statements
and round trips a client sends to a real Postgres, counted exactly."""

from __future__ import annotations

import time
from urllib.parse import urlsplit

import psycopg

from ductor_server.testing import CommitCounter


def _settled(counter: CommitCounter, want: tuple[int, int, int]) -> tuple[int, int, int]:
    """The counts once the proxy has passed on what was sent (bounded wait)."""
    deadline = time.monotonic() + 5
    while _counts(counter) != want:
        if time.monotonic() > deadline:
            break
        time.sleep(0.01)
    return _counts(counter)


def _counts(counter: CommitCounter) -> tuple[int, int, int]:
    return counter.commits, counter.statements, counter.round_trips


def test_commits_statements_and_round_trips_are_counted_on_the_wire(postgres_url: str) -> None:
    parts = urlsplit(postgres_url)
    counter = CommitCounter((parts.hostname or "127.0.0.1", parts.port or 5432))
    try:
        with psycopg.connect(counter.url(postgres_url), autocommit=True, sslmode="disable") as conn:
            commits, statements, trips = _counts(counter)  # whatever connecting sent
            conn.execute("SELECT 1")
            want = (commits, statements + 1, trips + 1)
            assert _settled(counter, want) == want
            with conn.transaction():
                conn.execute("SELECT 2")
                conn.execute("SELECT %s", ("x" * 100_000,))  # one message over many reads
            # BEGIN, two statements, COMMIT: each waited for
            want = (commits + 1, statements + 5, trips + 5)
            assert _settled(counter, want) == want
            with conn.cursor() as cur:
                cur.executemany("SELECT %s", [(1,), (2,), (3,)])  # pipelined: one Execute each
            # one round trip for the three
            want = (commits + 1, statements + 8, trips + 6)
            assert _settled(counter, want) == want
            with conn.pipeline(), conn.cursor() as cur:
                cur.execute("BEGIN")
                cur.execute("SELECT 3")
                cur.execute("COMMIT")
            want = (commits + 2, statements + 11, trips + 7)
            assert _settled(counter, want) == want
    finally:
        counter.close()
