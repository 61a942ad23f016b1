"""The `ductor connections` commands.

`list` reads the REST API like the other client commands (`cli_client`).
`new-key` prints a fresh `KID:KEY` for `DUCTOR_SECRET_KEYS` and needs nothing
else. `rotate` opens the database directly (like `ductor tenants --database`) and seals
every connection's secrets under the newest key of `DUCTOR_SECRET_KEYS` (or, for
the embedded store without it, the dev key file `ductor dev` made).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import TextIO

from ductor_server.cli_client import ApiClient, command
from ductor_server.settings import Settings


def cmd_connections_list(client: ApiClient, args: argparse.Namespace, out: TextIO) -> int:
    """List the tenant's connections (never their secrets: only which are set)."""
    connections = client.call("GET", "/v1/connections")
    if args.json:
        out.write(json.dumps(connections, indent=2) + "\n")
        return 0
    if not connections:
        out.write("no connections\n")
        return 0
    width = max(len(c["name"]) for c in connections)
    for c in connections:
        secrets = ", ".join(sorted(c["secrets"])) or "-"
        out.write(f"{c['name']:<{width}}  {c['provider']:<10}  secrets: {secrets}\n")
    return 0


def cmd_connections_new_key(args: argparse.Namespace) -> int:
    """Print a fresh `KID:KEY` entry."""
    from ductor_server.connections import new_secret_key

    sys.stdout.write(new_secret_key(args.kid) + "\n")
    sys.stderr.write(
        "put it first in DUCTOR_SECRET_KEYS (comma-separated, newest first), keep the older"
        " keys after it, restart the servers, then run `ductor connections rotate`\n"
    )
    return 0


def cmd_connections_rotate(args: argparse.Namespace) -> int:
    """Seal every connection's secrets under the newest key; report how many."""
    from ductor_server.connections import load_secret_keys
    from ductor_server.services.connections import rotate_secrets
    from ductor_server.storage import open_store

    settings = Settings.from_env(data_dir=Path(args.data_dir) if args.data_dir else None)
    path = settings.secret_keys_file
    if not settings.secret_keys and path is None and settings.embedded:
        dev = settings.dev_secret_keys_file
        path = dev if dev.exists() else None
    keys = load_secret_keys(settings.secret_keys, path)
    if keys is None:
        sys.stderr.write("error: secrets.unconfigured: set DUCTOR_SECRET_KEYS\n")
        return 1

    async def run() -> int:
        store = open_store(settings.store_target)
        await store.open()
        try:
            await store.migrate()
            report = await rotate_secrets(store, keys)
        finally:
            await store.close()
        print(
            f"rotated {report.rotated} connection(s) to key {report.key_id}"
            f" ({report.current} already on it, {len(report.failed)} failed)"
        )
        for failure in report.failed:
            sys.stderr.write(f"error: {failure['tenant']}/{failure['name']}: {failure['reason']}\n")
        return 1 if report.failed else 0

    return asyncio.run(run())


def add_connections_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `connections` on the top-level parser."""
    connections = sub.add_parser(
        "connections", help="list connections; make and rotate their secret keys"
    )
    cn = connections.add_subparsers(dest="connections_command", metavar="COMMAND", required=True)
    p = command(cn, "list", cmd_connections_list, "list the tenant's connections")
    p.add_argument("--json", action="store_true")
    new_key = cn.add_parser(
        "new-key",
        help="print a fresh KID:KEY for DUCTOR_SECRET_KEYS",
        description="Print a fresh AES-256 key as KID:KEY (the key URL-safe base64).",
    )
    new_key.add_argument("--kid", default=None, help="key id (default: k + 8 hex digits)")
    new_key.set_defaults(func=cmd_connections_new_key)
    rotate = cn.add_parser(
        "rotate",
        help="re-encrypt every connection's secrets under the newest key",
        description="Seal every connection's secrets under the first key of "
        "DUCTOR_SECRET_KEYS (direct database access; idempotent). Exit 1 when one "
        "could not be decrypted (its key is not in DUCTOR_SECRET_KEYS).",
    )
    rotate.add_argument(
        "--data-dir", default=None, help="data directory, for the embedded store only"
    )
    rotate.set_defaults(func=cmd_connections_rotate)


__all__ = ["add_connections_commands"]
