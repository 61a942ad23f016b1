"""`ductor extensions list`: the extension points and the plugins installed in this
environment (what a server started from it loads), with every load failure."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import msgspec


def _cmd_list(args: argparse.Namespace) -> int:
    # These load every plugin and the server's built-ins: only here.
    from ductor_server.composition import refuse_unpluggable
    from ductor_server.extensions import installed_extensions

    extensions = installed_extensions()
    refuse_unpluggable(extensions)
    view = extensions.view()
    out = sys.stdout
    if args.json:
        out.write(msgspec.json.format(msgspec.json.encode(view)).decode() + "\n")
        return 1 if view.failures else 0
    for point in view.points:
        out.write(f"{point.group} ({point.title}): {len(point.extensions)}\n")
        for ext in point.extensions:
            out.write(f"  {ext.name}  {ext.distribution} {ext.version}  {ext.object}\n")
    if view.failures:
        out.write(f"failed: {len(view.failures)}\n")
        for failure in view.failures:
            out.write(
                f"  {failure.group} {failure.name}  {failure.distribution} {failure.version}"
                f"  {failure.object}  {failure.code}: {failure.error}\n"
            )
    return 1 if view.failures else 0


def add_extensions_commands(subparsers: Any) -> None:
    """Add `ductor extensions list`."""
    extensions = subparsers.add_parser(
        "extensions", help="the plugins installed for each extension point"
    )
    commands = extensions.add_subparsers(dest="extensions_command", metavar="COMMAND")
    listing = commands.add_parser(
        "list",
        help="list each extension point's loaded plugins and every load failure"
        " (exit status 1 when any failed)",
    )
    listing.add_argument("--json", action="store_true", help="print the JSON of GET /v1/extensions")
    listing.set_defaults(func=_cmd_list)
