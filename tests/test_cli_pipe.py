"""The `ductor` CLI writing into a pipe whose reader stops early (`ductor ... | head -1`).

Every command then stops quietly with exit status 141 (128 + SIGPIPE, what a
shell shows for a tool SIGPIPE killed): no traceback, and no "Exception ignored"
from the interpreter's last flush of stdout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parents[1]
EXAMPLE = CHECKOUT / "examples" / "routing"
BROKEN_PIPE = 141


def _buffered_env() -> dict[str, str]:
    """The environment without PYTHONUNBUFFERED (which test runners often set): a
    short output then waits in stdout's buffer, as it does for a user, until the
    flush at the end."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}


def _assert_quiet(stderr: str) -> None:
    for noise in ("Traceback", "BrokenPipeError", "Exception ignored"):
        assert noise not in stderr, stderr


def _events(tmp_path: Path, count: int) -> tuple[Path, Path]:
    """A routing config and `count` events, each decided in about 1 KiB of JSON."""
    config = tmp_path / "routing.json"
    config.write_text(
        json.dumps(
            {
                "kinds": {"job": {}},
                "workers": [{"id": "a"}, {"id": "b"}],
                "pools": [{"id": "p", "members": [{"worker": "a"}, {"worker": "b"}]}],
                "rule_set": {"default_pool": "p"},
            }
        )
    )
    events = tmp_path / "events.jsonl"
    events.write_text(
        "".join(
            json.dumps({"at": "2026-11-29T00:00:00Z", "routable": {"id": f"j{i}", "kind": "job"}})
            + "\n"
            for i in range(count)
        )
    )
    return config, events


def test_a_reader_that_stops_after_one_line_ends_simulate_quietly(tmp_path: Path) -> None:
    config, events = _events(tmp_path, 1_000)  # about 1 MB: far more than a pipe holds
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ductor_server.cli",
            "routing",
            "simulate",
            "--config",
            str(config),
            str(events),
            "--out",
            "-",
            "--progress",
            "never",
        ],
        cwd=tmp_path,
        env=_buffered_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()
    stderr = proc.stderr.read()
    proc.wait(timeout=120)
    assert json.loads(first)["routable_id"] == "j0"
    _assert_quiet(stderr)
    assert proc.returncode == BROKEN_PIPE, stderr


@pytest.mark.parametrize(
    "args",
    [
        # Short outputs wait in stdout's buffer until the end: the flush fails then.
        ["config", "reference"],
        ["--help"],
        ["--version"],
        [
            "routing",
            "simulate",
            "--config",
            str(EXAMPLE / "routing.json"),
            "--out",
            "decisions.jsonl",
            str(EXAMPLE / "events.jsonl"),
        ],
        ["extensions", "list"],
    ],
    ids=lambda args: " ".join(args[:2]),
)
def test_a_reader_gone_before_the_first_write_ends_a_command_quietly(
    tmp_path: Path, args: list[str]
) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody will ever read: every write to the pipe fails
    try:
        done = subprocess.run(
            [sys.executable, "-m", "ductor_server.cli", *args],
            cwd=tmp_path,
            env=_buffered_env(),
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)
    _assert_quiet(done.stderr)
    assert done.returncode == BROKEN_PIPE, done.stderr
