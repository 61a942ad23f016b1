"""`/ui`: the dashboard's files with headers that forbid inline script and framing
when the `ductor-ui` package is installed, and a 404 naming the extra when not."""

from __future__ import annotations

from pathlib import Path

import pytest
from litestar.testing import AsyncTestClient

from ductor_server import Settings, create_app
from ductor_server.transports import dashboard


@pytest.fixture
def assets(tmp_path: Path) -> Path:
    folder = tmp_path / "static"
    (folder / "js").mkdir(parents=True)
    (folder / "index.html").write_text("<!doctype html><title>Ductor</title>")
    (folder / "js" / "main.js").write_text("export {};\n")
    return folder


async def test_the_files_are_served_with_security_headers(
    tmp_path: Path, assets: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dashboard, "find_dashboard_assets", lambda: assets)
    monkeypatch.setattr("ductor_server.app.find_dashboard_assets", lambda: assets)
    async with AsyncTestClient(app=create_app(Settings(data_dir=tmp_path / "data"))) as client:
        index = await client.get("/ui/")
        assert index.status_code == 200, index.text
        assert index.text.startswith("<!doctype html>")
        csp = index.headers["content-security-policy"]
        assert "script-src 'self'" in csp
        assert "'unsafe-inline'" not in csp
        assert "frame-ancestors 'none'" in csp
        assert index.headers["x-frame-options"] == "DENY"
        assert index.headers["x-content-type-options"] == "nosniff"
        assert index.headers["referrer-policy"] == "no-referrer"
        module = await client.get("/ui/js/main.js")
        assert module.status_code == 200
        assert "javascript" in module.headers["content-type"]
        assert module.headers["content-security-policy"] == csp
        # The answers no file makes carry the same headers: a missing file, a wrong method.
        missing = await client.get("/ui/js/nope.js")
        assert missing.status_code == 404
        assert missing.json()["code"] == "route.not_found"
        wrong_method = await client.post("/ui/")
        assert wrong_method.status_code == 405
        for answer in (missing, wrong_method):
            for name, value in dashboard.SECURITY_HEADERS.items():
                assert answer.headers[name] == value, (answer.request.url, name)
        # Outside the folder is not reachable.
        assert (await client.get("/ui/../pyproject.toml")).status_code == 404
        # Other paths are left as they are.
        assert "content-security-policy" not in (await client.get("/healthz")).headers
        # /ui needs no key (the page signs in itself); /v1 still does.
        assert (await client.get("/v1/runs")).status_code == 401


async def test_a_path_that_can_name_no_file_is_a_404(
    tmp_path: Path, assets: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A NUL byte, or a name longer than a file system takes, cannot name a file:
    # not found, as any other missing file, not a 500 from the file system.
    monkeypatch.setattr("ductor_server.app.find_dashboard_assets", lambda: assets)
    async with AsyncTestClient(app=create_app(Settings(data_dir=tmp_path / "data"))) as client:
        for path in (
            "/ui/%00",
            "/ui/js/main.js%00.png",
            "/ui/" + "a" * 300,
            "/ui/js/" + "b" * 5000 + ".js",
            "/ui/" + "/".join(["c" * 200] * 30),
        ):
            answer = await client.get(path)
            assert answer.status_code == 404, (path[:40], answer.text)
            assert answer.json()["code"] == "route.not_found"
            assert answer.headers["x-frame-options"] == "DENY"
        assert (await client.get("/ui/js/main.js")).status_code == 200


async def test_without_the_package_ui_is_a_404_naming_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("ductor_server.app.find_dashboard_assets", lambda: None)
    async with AsyncTestClient(app=create_app(Settings(data_dir=tmp_path / "data"))) as client:
        for path in ("/ui", "/ui/", "/ui/js/main.js"):
            answer = await client.get(path)
            assert answer.status_code == 404, path
            body = answer.json()
            assert body["code"] == "route.not_found"
            assert "ductor-server[ui]" in body["message"]
            assert answer.headers["x-frame-options"] == "DENY"


def test_the_package_is_found_when_installed() -> None:
    try:
        import ductor_ui
    except ImportError:
        assert dashboard.find_dashboard_assets() is None
    else:
        assert dashboard.find_dashboard_assets() == ductor_ui.assets_dir()
