"""`ductor connections new-key` makes usable keys, and a server given a key ring that
does not parse refuses to start, saying why without showing a key."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ductor_server.cli import build_parser, main
from ductor_server.connections import SecretKeys, new_secret_key
from ductor_server.testing import free_port


def test_new_key_prints_a_usable_entry(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["connections", "new-key", "--kid", "k2026"]) == 0
    out = capsys.readouterr()
    entry = out.out.strip()
    assert entry.startswith("k2026:")
    assert SecretKeys.parse(entry).kids == ("k2026",)
    assert "rotate" in out.err
    assert main(["connections", "new-key"]) == 0
    other = capsys.readouterr().out.strip()
    assert other.split(":")[1] != entry.split(":")[1]
    assert main(["connections", "new-key", "--kid", "no spaces"]) == 2


def test_the_commands_parse() -> None:
    parser = build_parser()
    for argv in (
        ["connections", "list", "--json"],
        ["connections", "rotate", "--data-dir", "d"],
        ["connections", "new-key"],
    ):
        assert parser.parse_args(argv).func is not None


def test_rotate_without_keys_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("DUCTOR_SECRET_KEYS", raising=False)
    monkeypatch.delenv("DUCTOR_DATABASE_URL", raising=False)
    assert main(["connections", "rotate", "--data-dir", str(tmp_path)]) == 1
    assert "secrets.unconfigured" in capsys.readouterr().err


def test_a_bad_key_ring_stops_the_server(tmp_path: Path) -> None:
    good = new_secret_key("k1")
    key = good.split(":")[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUCTOR_")}
    env["DUCTOR_SECRET_KEYS"] = f"{good},k2:{key[:-4]}"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "ductor_server.cli",
            "serve",
            "--port",
            str(free_port()),
            "--data-dir",
            str(tmp_path),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result
    assert "DUCTOR_SECRET_KEYS: secret key 'k2' must be 32 bytes" in result.stderr
    assert key[:-4] not in result.stderr + result.stdout
