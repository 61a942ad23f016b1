"""The dashboard's files hold together without a browser: the index loads only
files that exist, no script or style is inline (the CSP forbids both), every
module import resolves, and the key is never put in localStorage or a URL."""

from __future__ import annotations

import re
from pathlib import Path

from ductor_ui import assets_dir

IMPORT = re.compile(r"""^\s*(?:import|export)\b[^'"]*?from\s+["']([^"']+)["']""", re.M)
DYNAMIC = re.compile(r"""import\(\s*["']([^"']+)["']\s*\)""")


def _modules() -> list[Path]:
    return sorted((assets_dir() / "js").rglob("*.js"))


def test_the_index_loads_only_files_that_exist_and_nothing_inline() -> None:
    index = (assets_dir() / "index.html").read_text()
    refs = re.findall(r"""(?:src|href)="(/ui/[^"]+)\"""", index)
    assert {"/ui/style.css", "/ui/js/main.js"} <= set(refs)
    for ref in refs:
        assert (assets_dir() / ref.removeprefix("/ui/")).is_file(), ref
    # Every <script> has a src (no inline code), and no element has a style or on* attribute.
    assert all("src=" in tag for tag in re.findall(r"<script\b[^>]*>", index))
    assert not re.search(r"\sstyle=|\son[a-z]+=", index)
    assert "<style" not in index


def test_every_module_import_resolves() -> None:
    modules = _modules()
    assert len(modules) >= 15
    for module in modules:
        text = module.read_text()
        for target in IMPORT.findall(text) + DYNAMIC.findall(text):
            assert target.startswith("."), (
                f"{module.name} imports {target!r}: only relative modules"
            )
            assert (module.parent / target).resolve().is_file(), f"{module.name}: {target}"


def test_no_markup_from_strings_and_no_key_outside_session_storage() -> None:
    for module in _modules():
        text = module.read_text()
        for risky in (
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
            "new Function",
        ):
            assert risky not in text, f"{module.name} uses {risky}"
        assert "localStorage" not in text, module.name
        assert "document.cookie" not in text, module.name
    api = (assets_dir() / "js" / "api.js").read_text()
    assert "sessionStorage" in api
    assert "Authorization" in api
