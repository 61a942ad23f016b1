"""Ductor's web dashboard: static ES modules, one stylesheet and an index page.

This package holds files and one function that says where they are; it imports
nothing of Ductor and serves nothing itself. `ductor_server` mounts the files at
`/ui` when this package is installed (`pip install 'ductor-server[ui]'`). The
page talks only to the public REST API (`/v1/...`) with the API key the user
signs in with, so it can do nothing the API does not allow.
"""

from __future__ import annotations

from pathlib import Path

__version__ = "0.1.0"


def assets_dir() -> Path:
    """The folder of the dashboard's files (`index.html`, `style.css`, `js/`)."""
    return Path(__file__).resolve().parent / "static"


__all__ = ["__version__", "assets_dir"]
