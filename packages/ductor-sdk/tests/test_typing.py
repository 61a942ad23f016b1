"""The public API's types, pinned by running `mypy --strict` over tests/typing/."""

from __future__ import annotations

from pathlib import Path

from mypy import api

TYPING = Path(__file__).parent / "typing"


def test_public_api_types_check_as_expected(tmp_path: Path) -> None:
    config = tmp_path / "mypy.ini"
    config.write_text("[mypy]\nstrict = True\nwarn_unused_ignores = True\n")
    stdout, stderr, status = api.run(
        [
            "--config-file",
            str(config),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--no-error-summary",
            "--show-error-codes",
            str(TYPING / "public_api.py"),
        ]
    )
    assert status == 0, stdout + stderr
