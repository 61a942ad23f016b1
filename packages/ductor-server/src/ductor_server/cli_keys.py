"""The `ductor keys` and `ductor tenants` commands.

`keys create|list|revoke` manage the calling tenant's API keys over the REST API
(`/v1/keys`, an admin key), like the other client commands (`cli_client`).
`tenants create|list|add-key` are the operator's: over the REST API with the
operator key (`--operator-key` or `DUCTOR_OPERATOR_KEY`), or, with
`--database`, straight against the database (`DUCTOR_DATABASE_URL`, or the
embedded store under `--data-dir`), through the same service. A new key's secret
goes to standard output, once; everything else said about it to standard error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TextIO

import msgspec

from ductor_server.cli_client import (
    ApiClient,
    ClientError,
    checked_key,
    command,
    path_id,
    run_client_command,
    segment,
    server_url,
    usage_error,
)
from ductor_server.settings import Settings

_SHOWN_ONCE = "shown once, store it now"


def _key_body(args: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {"name": args.name, "scopes": args.scopes or []}
    if args.expires_in is not None:
        body["expires_in"] = args.expires_in
    if args.expires_at is not None:
        body["expires_at"] = args.expires_at
    return body


def _print_created(created: dict[str, Any], args: argparse.Namespace, out: TextIO) -> None:
    if args.json:
        out.write(json.dumps(created, indent=2) + "\n")
        return
    scopes = ", ".join(created["scopes"])
    until = f", expires {created['expires_at']}" if created.get("expires_at") else ""
    if created.get("key") is None:
        sys.stderr.write(
            f"key {created['id']} ({scopes}{until}) was created by an earlier call with this"
            " idempotency key; its secret was shown then and cannot be shown again\n"
        )
        return
    out.write(created["key"] + "\n")
    sys.stderr.write(f"key {created['id']} ({scopes}{until}): {_SHOWN_ONCE}\n")


def _headers(args: argparse.Namespace) -> dict[str, str] | None:
    key: str | None = getattr(args, "idempotency_key", None)
    return {"Idempotency-Key": key} if key else None


# --- a tenant's own keys, over the API -------------------------------------------------


def cmd_keys_create(client: ApiClient, args: argparse.Namespace, out: TextIO) -> int:
    """Create an API key of the calling tenant; print its secret once."""
    created = client.call("POST", "/v1/keys", body=_key_body(args), headers=_headers(args))
    _print_created(created, args, out)
    return 0


def run_keys_create(args: argparse.Namespace) -> int:
    """`keys create`: over the API; with `--tenant`, straight in the database (as
    before tenants had an API of their own: the tenant is created if new, the key
    is admin unless `--scope` says otherwise)."""
    if args.tenant is None:
        return run_client_command(args)
    from ductor_core.errors import DuctorError
    from ductor_server.cli_server import create_key, open_migrated, quiet_pool
    from ductor_server.services.tenants import tenant_id_problem

    if (wrong := tenant_id_problem(args.tenant)) is not None:
        sys.stderr.write(f"error: tenant.invalid: --tenant {args.tenant!r}: {wrong}\n")
        return 1

    settings = Settings.from_env(data_dir=Path(args.data_dir) if args.data_dir else None)
    if settings.embedded:
        settings.make_data_dir()

    async def run() -> str:
        with quiet_pool():
            store = await open_migrated(settings)
        try:
            return await create_key(
                store, args.tenant, name=args.name, scopes=args.scopes or ("admin",)
            )
        finally:
            await store.close()

    try:
        key = asyncio.run(run())
    except DuctorError as exc:  # the database cannot be reached or opened
        sys.stderr.write(f"error: {exc.code}: {exc.message}\n")
        return 1
    sys.stdout.write(key + "\n")
    sys.stderr.write(f"(API key for tenant {args.tenant!r}: {_SHOWN_ONCE})\n")
    return 0


def cmd_keys_list(client: ApiClient, args: argparse.Namespace, out: TextIO) -> int:
    """List the calling tenant's API keys, newest first (never their secrets)."""
    keys: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        page = client.call("GET", "/v1/keys", params={"cursor": cursor, "limit": 500})
        keys.extend(page["items"])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    if args.json:
        out.write(json.dumps(keys, indent=2) + "\n")
        return 0
    for key in keys:
        out.write(
            f"{key['id']}  {key['prefix']}...  {key['name']}  [{','.join(key['scopes'])}]"
            f"  {key['status']}  last used {key['last_used_at'] or 'never'}"
            f"  expires {key['expires_at'] or 'never'}\n"
        )
    return 0


def cmd_keys_revoke(client: ApiClient, args: argparse.Namespace, out: TextIO) -> int:
    """Revoke one of the calling tenant's API keys: its next request fails."""
    client.call("DELETE", f"/v1/keys/{segment(args.key_id)}")
    out.write(f"revoked key {args.key_id}\n")
    return 0


# --- the operator's tenants, over the API or straight in the database --------------------

Operation = Callable[[Any], Awaitable[Any]]
"""What an operator command does with the tenants service (`--database`)."""


def _run_operator(
    args: argparse.Namespace,
    api: Callable[[ApiClient], Any],
    local: Operation,
    show: Callable[[Any, TextIO], None],
) -> int:
    """Run an operator command over the API (with the operator key) or, with
    `--database`, against the store; print its answer or its error."""
    try:
        if args.database:
            answer = asyncio.run(_locally(args, local))
        else:
            key = args.operator_key or os.environ.get("DUCTOR_OPERATOR_KEY")
            if not key:
                raise ClientError(
                    "client.usage",
                    "no operator key: pass --operator-key or set DUCTOR_OPERATOR_KEY"
                    " (or use --database to work on the database directly)",
                )
            try:
                key = checked_key(key, "--operator-key or DUCTOR_OPERATOR_KEY")
                url = server_url(args.url)
            except ClientError as exc:
                return usage_error(exc)
            client = ApiClient(url, key)
            try:
                answer = api(client)
            finally:
                client.close()
        show(answer, sys.stdout)
        return 0
    except ClientError as exc:
        sys.stderr.write(f"error: {exc.code}: {exc.message}\n")
        if exc.details is not None:
            sys.stderr.write(json.dumps(exc.details, indent=2) + "\n")
        return 1


async def _locally(args: argparse.Namespace, operation: Operation) -> Any:
    from ductor_core.errors import DuctorError
    from ductor_server.cli_server import open_migrated, quiet_pool
    from ductor_server.services.tenants import TenantsService

    settings = Settings.from_env(data_dir=Path(args.data_dir) if args.data_dir else None)
    if settings.embedded:
        settings.make_data_dir()
    try:
        # A database that cannot be reached or opened is an error line, as any other.
        with quiet_pool():
            store = await open_migrated(settings)
        try:
            answer = await operation(TenantsService(store))
        finally:
            await store.close()
    except DuctorError as exc:
        raise ClientError(exc.code, exc.message, msgspec.to_builtins(exc.details)) from None
    return msgspec.to_builtins(getattr(answer, "value", answer))


def cmd_tenants_create(args: argparse.Namespace) -> int:
    """Create a tenant and its first admin key; print the key once."""
    from ductor_server.services.tenants import TenantBody

    body: dict[str, Any] = {"id": args.tenant_id}
    if args.name is not None:
        body["name"] = args.name

    def show(created: dict[str, Any], out: TextIO) -> None:
        if args.json:
            out.write(json.dumps(created, indent=2) + "\n")
            return
        tenant, key = created["tenant"], created["key"]
        out.write(key["key"] + "\n")
        sys.stderr.write(
            f"tenant {tenant['id']!r} created; its admin key {key['id']}: {_SHOWN_ONCE}\n"
        )

    return _run_operator(
        args,
        lambda client: client.call("POST", "/v1/tenants", body=body),
        lambda tenants: tenants.create(msgspec.convert(body, TenantBody)),
        show,
    )


def cmd_tenants_list(args: argparse.Namespace) -> int:
    """List every tenant."""

    def api(client: ApiClient) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            page = client.call("GET", "/v1/tenants", params={"cursor": cursor, "limit": 500})
            items.extend(page["items"])
            cursor = page["next_cursor"]
            if cursor is None:
                return items

    async def local(tenants: Any) -> list[Any]:
        items: list[Any] = []
        cursor: str | None = None
        while True:
            page = await tenants.list(cursor=cursor, limit=500)
            items.extend(page.items)
            cursor = page.next_cursor
            if cursor is None:
                return items

    def show(items: list[dict[str, Any]], out: TextIO) -> None:
        if args.json:
            out.write(json.dumps(items, indent=2) + "\n")
            return
        for tenant in items:
            out.write(f"{tenant['id']}  {tenant['name']}  created {tenant['created_at']}\n")

    return _run_operator(args, api, local, show)


def cmd_tenants_add_key(args: argparse.Namespace) -> int:
    """Create a key of any scopes for an existing tenant; print it once."""
    from ductor_server.services.keys import CreateKeyBody

    body = _key_body(args)
    return _run_operator(
        args,
        lambda client: client.call(
            "POST", f"/v1/tenants/{segment(args.tenant_id)}/keys", body=body
        ),
        lambda tenants: tenants.create_key(args.tenant_id, msgspec.convert(body, CreateKeyBody)),
        lambda created, out: _print_created(created, args, out),
    )


# --- wiring ----------------------------------------------------------------------------


def _key_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--name", default="cli", help="a name to recognise the key by (cli)")
    parser.add_argument(
        "--scope",
        dest="scopes",
        action="append",
        metavar="SCOPE",
        help="admin, write, read or events:send (repeat for several)",
    )
    parser.add_argument("--expires-in", default=None, help="e.g. 30d, 12h (default: never)")
    parser.add_argument(
        "--expires-at", default=None, help="RFC 3339 time, e.g. 2030-01-01T00:00:00Z"
    )


def _operator_options(parser: argparse.ArgumentParser, defaults: Settings) -> None:
    parser.add_argument("--url", default=None, help="server URL (default $DUCTOR_URL or :7070)")
    parser.add_argument(
        "--operator-key", default=None, help="the operator key (default $DUCTOR_OPERATOR_KEY)"
    )
    parser.add_argument(
        "--database",
        action="store_true",
        help="work on the database directly ($DUCTOR_DATABASE_URL, else the embedded store)"
        " instead of over the API",
    )
    parser.add_argument(
        "--data-dir",
        default=None,
        help=f"with --database, the embedded store's directory (default $DUCTOR_DATA_DIR,"
        f" else {defaults.data_dir})",
    )
    parser.add_argument("--json", action="store_true", help="print the answer as JSON")


def add_keys_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `keys` (a tenant's API keys) and `tenants` (the operator's)."""
    keys = sub.add_parser("keys", help="create, list and revoke the tenant's API keys")
    ks = keys.add_subparsers(dest="keys_command", metavar="COMMAND", required=True)
    p = command(ks, "create", cmd_keys_create, "create an API key (needs an admin key)")
    _key_options(p)
    p.add_argument("--idempotency-key", default=None)
    p.add_argument("--json", action="store_true", help="print the whole answer as JSON")
    p.add_argument(
        "--tenant",
        default=None,
        help="operator: mint the key straight in the database for this tenant (created if"
        " new; admin unless --scope), as `ductor tenants add-key --database` does",
    )
    p.set_defaults(func=run_keys_create)
    p = command(ks, "list", cmd_keys_list, "list the tenant's API keys, newest first")
    p.add_argument("--json", action="store_true")
    p = command(ks, "revoke", cmd_keys_revoke, "revoke an API key (fails from its next call)")
    p.add_argument("key_id", type=path_id)

    defaults = Settings()
    tenants = sub.add_parser(
        "tenants",
        help="the operator's: create and list tenants, add a key to one",
        description="Operator commands: over the API with the operator key"
        " ($DUCTOR_OPERATOR_KEY), or with --database straight against the database.",
    )
    ts = tenants.add_subparsers(dest="tenants_command", metavar="COMMAND", required=True)
    p = ts.add_parser("create", help="create a tenant and its first admin key (shown once)")
    p.add_argument("tenant_id", help="1 to 64 letters, digits, '.', '_' or '-'")
    p.add_argument("--name", default=None, help="a display name (default: the id)")
    _operator_options(p, defaults)
    p.set_defaults(func=cmd_tenants_create)
    p = ts.add_parser("list", help="list every tenant")
    _operator_options(p, defaults)
    p.set_defaults(func=cmd_tenants_list)
    p = ts.add_parser("add-key", help="create a key for an existing tenant (e.g. a lost admin key)")
    p.add_argument("tenant_id", type=path_id)
    _key_options(p)
    _operator_options(p, defaults)
    p.set_defaults(func=cmd_tenants_add_key)


__all__ = ["add_keys_commands"]
