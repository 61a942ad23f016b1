"""docs/observability.md, executed: its in-memory example runs in a fresh process
(the OpenTelemetry providers can be set once per process) and prints what the
page says it prints; every instrument and span the page names exists in the code."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "observability.md").read_text()
SOURCE = ROOT / "packages" / "ductor-server" / "src" / "ductor_server"


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", DOC, re.DOTALL | re.MULTILINE)


def test_the_in_memory_example_prints_what_the_page_shows(tmp_path: Path) -> None:
    [script] = blocks("python")
    expected = blocks("text")[-1]
    saved = tmp_path / "in_memory.py"  # as a user runs it: a file, so spawned processes import it
    saved.write_text(script)
    done = subprocess.run(
        [sys.executable, str(saved)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == expected


def test_every_metric_in_the_table_is_made_by_the_code() -> None:
    table = re.findall(r"^\| `(ductor\.[a-z._]+)` \| (?:histogram|gauge|counter)", DOC, re.M)
    code = "\n".join(p.read_text() for p in SOURCE.rglob("*.py"))
    made = set(re.findall(r'"(ductor\.[a-z._]+)",\n\s+(?:callbacks=|unit=)', code))
    assert len(table) == 8
    assert set(table) == made
