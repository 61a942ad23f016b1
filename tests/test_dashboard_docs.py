"""docs/dashboard.md shows every screenshot the browser tests take, and only those:
each picture it embeds is in docs/dashboard/, and each PNG there is named by a
`dash.check(page, NAME)` of tests/test_dashboard_e2e.py and embedded in the page."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "dashboard.md"
SHOTS = ROOT / "docs" / "dashboard"
TESTS = Path(__file__).with_name("test_dashboard_e2e.py")


def test_the_page_embeds_exactly_the_screenshots_the_tests_take() -> None:
    embedded = re.findall(r"!\[[^\]]+\]\(dashboard/([\w-]+)\.png\)", PAGE.read_text())
    taken = re.findall(r'dash\.check\(page, "([\w-]+)"\)', TESTS.read_text())
    committed = sorted(p.stem for p in SHOTS.glob("*.png"))
    assert len(embedded) == len(set(embedded))
    assert sorted(embedded) == committed == sorted(set(taken))
    for name in committed:
        data = (SHOTS / f"{name}.png").read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        assert len(data) < 200_000, f"{name}.png is large: {len(data)} bytes"
