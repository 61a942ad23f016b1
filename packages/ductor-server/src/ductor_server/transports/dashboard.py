"""The optional web dashboard at `/ui`: the `ductor_ui` package's static files, or a
404 that says how to install them.

Nothing here reads a store or a service: the dashboard is a page that calls the
public REST API with the key its user signs in with. This module only serves
its files, with headers that keep it from being framed or running inline script.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from litestar import Request, Response, get
from litestar.datastructures import MutableScopeHeaders
from litestar.exceptions import NotFoundException
from litestar.static_files import create_static_files_router
from litestar.types import Message, Scope

UI_PATH = "/ui"

SECURITY_HEADERS = {
    # Scripts, styles and calls come from this origin only; no inline script or
    # style, no plugins, no framing, no base-URL or form tricks.
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'self'; "
        "frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cache-Control": "no-cache",
}
"""Headers on every `/ui` answer: its files, and its errors (404, 405) as well."""

NOT_INSTALLED = (
    "the web dashboard is not installed in this server: install the optional extra "
    "(pip install 'ductor-server[ui]') and restart"
)


def find_dashboard_assets() -> Path | None:
    """The dashboard's files when the `ductor_ui` package is installed, else None."""
    try:
        module = importlib.import_module("ductor_ui")
    except ImportError:
        return None
    assets: Path = module.assets_dir()
    return assets if (assets / "index.html").is_file() else None


def is_dashboard_path(path: str) -> bool:
    """Whether `path` is the dashboard's (`/ui` or under `/ui/`)."""
    return path == UI_PATH or path.startswith(UI_PATH + "/")


async def secure_dashboard_answers(message: Message, scope: Scope) -> None:
    """A `before_send` hook: `SECURITY_HEADERS` on every answer to a `/ui` path.

    A hook on the application, not on the files' router, so the answers no route
    handler makes (a missing file's 404, a wrong method's 405) carry them too.
    """
    if message["type"] == "http.response.start" and is_dashboard_path(scope["path"]):
        headers = MutableScopeHeaders.from_message(message)
        for name, value in SECURITY_HEADERS.items():
            headers[name] = value


@get([UI_PATH, UI_PATH + "/{path:path}"], include_in_schema=False, sync_to_thread=False)
def _not_installed(request: Request[Any, Any, Any]) -> Response[dict[str, Any]]:
    return Response(
        {
            "code": "route.not_found",
            "message": NOT_INSTALLED,
            "details": {"path": request.url.path},
        },
        status_code=404,
    )


NAME_MAX = 255
"""The longest file or folder name, in bytes, that a file system takes."""

PATH_MAX = 4096
"""The longest path, in bytes, that a file system takes."""


def names_no_file(path: str) -> bool:
    """Whether `path` cannot name any file: it holds a NUL byte, or a name or the
    whole is longer than a file system takes."""
    raw = path.encode("utf-8", "surrogatepass")
    return (
        b"\x00" in raw
        or len(raw) > PATH_MAX
        or any(len(part) > NAME_MAX for part in raw.split(b"/"))
    )


def _refuse_what_names_no_file(request: Request[Any, Any, Any]) -> None:
    """A `before_request` hook: a path that can name no file is not found, as a
    missing file is, rather than an error from the file system."""
    if names_no_file(request.scope["path"]):
        raise NotFoundException()


def dashboard_routes(assets: Path | None) -> list[Any]:
    """Route handlers serving `assets` at `/ui` (index at `/ui/`), or, when there are
    none, a 404 `route.not_found` on every `/ui` path whose message names the extra."""
    if assets is None:
        return [_not_installed]
    return [
        create_static_files_router(
            path=UI_PATH,
            directories=[assets],
            html_mode=True,
            name="dashboard",
            include_in_schema=False,
            before_request=_refuse_what_names_no_file,
        )
    ]


__all__ = [
    "SECURITY_HEADERS",
    "UI_PATH",
    "dashboard_routes",
    "find_dashboard_assets",
    "is_dashboard_path",
    "secure_dashboard_answers",
]
