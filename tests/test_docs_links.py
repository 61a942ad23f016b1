"""Every relative link in the README and docs/ leads somewhere: the file exists
and, when the link names a section, the section does (GitHub's heading anchors)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def _prose(path: Path) -> list[str]:
    """The page's lines outside code blocks."""
    lines, fenced = [], False
    for line in path.read_text().splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def _anchor(heading: str) -> str:
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in _prose(path):
        if match := re.match(r"^#{1,6}\s+(.*)$", line):
            base = _anchor(match.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def _links(path: Path) -> list[str]:
    return [
        target
        for line in _prose(path)
        for target in LINK.findall(line)
        if not re.match(r"^[a-z]+:", target)  # http:, https:, mailto:
    ]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in _links(page):
        file_part, _, section = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(ROOT)}")
            continue
        if section and dest.suffix == ".md" and section not in _anchors(dest):
            broken.append(f"{target}: no section #{section} in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.name}: " + "; ".join(broken)


def test_the_anchor_rule_matches_github() -> None:
    assert _anchor("Metering, budgets and plans") == "metering-budgets-and-plans"
    assert _anchor("The `http` provider") == "the-http-provider"
    assert _anchor("1. Start the server") == "1-start-the-server"
