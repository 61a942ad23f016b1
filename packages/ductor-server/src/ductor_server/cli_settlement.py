"""The `ductor ledger` and `ductor receipts` commands.

`ledger balance|entries` and `receipts get|list` read the REST API like the
other client commands (`cli_client`). `receipts verify` needs no server and no
API key: it checks a receipt's DSSE envelope against a JWK Set read from a
file, or fetched from a server's ``/.well-known/ductor-keys``. `receipts
add-key` appends a fresh signing key to a key file (for rotation).

Exit codes of `verify`: 0 the receipt is valid; 1 it is not (a changed byte,
a wrong key, an unknown key id, another payload type); 2 it could not be
checked (a file or the key set could not be read).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit

import httpx

from ductor_server.cli_client import ApiClient, ClientError, command, path_id, segment

KEYS_PATH = "/.well-known/ductor-keys"
"""Where a server publishes its receipt keys."""

VERIFY_VALID, VERIFY_INVALID, VERIFY_UNCHECKED = 0, 1, 2


def _money(amount: int, currency: str) -> str:
    from ductor_settlement import format_micros

    return format_micros(amount, currency)


def _print_json(value: Any, out: TextIO) -> None:
    out.write(json.dumps(value, indent=2) + "\n")


# --- ledger --------------------------------------------------------------------


def cmd_ledger_balance(client: ApiClient, args: argparse.Namespace, out: TextIO) -> int:
    """Show one account's balances, or every account's."""
    if args.account:
        accounts = [client.call("GET", f"/v1/accounts/{segment(args.account)}")]
    else:
        accounts = client.call("GET", "/v1/accounts")
    if args.json:
        _print_json(accounts[0] if args.account else accounts, out)
        return 0
    if not accounts:
        out.write("no accounts\n")
        return 0
    width = max(len(a["code"]) for a in accounts)
    out.write(f"{'account':<{width}}  {'balance':>22}  {'pending':>22}  {'available':>22}\n")
    for a in accounts:
        currency = a["currency"]
        out.write(
            f"{a['code']:<{width}}  {_money(a['balance'], currency):>22}  "
            f"{_money(a['pending'], currency):>22}  {_money(a['available'], currency):>22}\n"
        )
    return 0


def cmd_ledger_entries(client: ApiClient, args: argparse.Namespace, out: TextIO) -> int:
    """List entries newest first, each with its postings (positive: debit)."""
    page = client.call(
        "GET",
        "/v1/ledger/entries",
        params={"account": args.account, "cursor": args.cursor, "limit": args.limit},
    )
    if args.json:
        _print_json(page, out)
        return 0
    if not page["items"]:
        out.write("no entries\n")
    for entry in page["items"]:
        reference = entry["reference"]
        ref = f"{reference['kind']}:{reference['id']}" if reference.get("id") else reference["kind"]
        out.write(f"{entry['id']}  {entry['created_at']}  {ref}  {entry['description']}\n")
        for posting in entry["postings"]:
            amount = _money(posting["amount"], posting["currency"])
            out.write(
                f"    {posting['account']:<32} {'+' if posting['amount'] > 0 else ''}{amount}\n"
            )
    if page.get("next_cursor"):
        out.write(f"more: --cursor {page['next_cursor']}\n")
    return 0


# --- receipts over the API -------------------------------------------------------


def cmd_receipts_get(client: ApiClient, args: argparse.Namespace, out: TextIO) -> int:
    """Fetch a receipt; write its DSSE envelope (what `verify` checks) to -o or stdout."""
    view = client.call("GET", f"/v1/receipts/{segment(args.receipt_id)}")
    document = view if args.full else view["envelope"]
    text = json.dumps(document, indent=2) + "\n"
    if args.output and args.output != "-":
        try:
            Path(args.output).write_text(text, encoding="utf-8")
        except OSError as exc:
            raise ClientError("client.file", f"cannot write {args.output}: {exc.strerror}") from exc
        subject = view["subject"]
        sys.stderr.write(
            f"receipt {view['id']} for {subject['kind']}:{subject['id']}, signed by key "
            f"{view['key_id']}, written to {args.output}\n"
        )
    else:
        out.write(text)
    return 0


def cmd_receipts_list(client: ApiClient, args: argparse.Namespace, out: TextIO) -> int:
    """List receipts newest first, optionally of one subject (KIND:ID) or kind."""
    page = client.call(
        "GET",
        "/v1/receipts",
        params={
            "subject": args.subject,
            "kind": args.kind,
            "cursor": args.cursor,
            "limit": args.limit,
        },
    )
    if args.json:
        _print_json(page, out)
        return 0
    if args.quiet:
        out.writelines(view["id"] + "\n" for view in page["items"])
        return 0
    for view in page["items"]:
        subject = view["subject"]
        out.write(
            f"{view['id']}  {subject['kind']}:{subject['id']}  key {view['key_id']}  "
            f"{view['created_at']}\n"
        )
    if page.get("next_cursor"):
        out.write(f"more: --cursor {page['next_cursor']}\n")
    return 0


# --- receipts offline ---------------------------------------------------------------


class _Unchecked(Exception):
    """The receipt could not be checked (not: it is invalid)."""


def _keys_url(source: str) -> str:
    parts = urlsplit(source)
    if parts.path in ("", "/"):
        return source.rstrip("/") + KEYS_PATH
    return source


def _read_keys(source: str) -> bytes:
    if source.startswith(("http://", "https://")):
        url = _keys_url(source)
        try:
            response = httpx.get(url, timeout=30.0, follow_redirects=True)
        except httpx.HTTPError as exc:
            raise _Unchecked(f"cannot fetch the keys from {url}: {exc}") from exc
        if response.status_code != 200:
            raise _Unchecked(f"cannot fetch the keys from {url}: HTTP {response.status_code}")
        return response.content
    try:
        return Path(source).read_bytes()
    except OSError as exc:
        raise _Unchecked(f"cannot read the keys file {source}: {exc.strerror}") from exc


def _read_envelope(name: str) -> bytes:
    try:
        raw = sys.stdin.buffer.read() if name == "-" else Path(name).read_bytes()
    except OSError as exc:
        raise _Unchecked(f"cannot read {name}: {exc.strerror}") from exc
    # `receipts get --full` writes the whole view: check the envelope inside it.
    try:
        document = json.loads(raw)
    except ValueError:
        return raw  # not JSON: let the envelope decoder say so
    if isinstance(document, dict) and isinstance(document.get("envelope"), dict):
        return json.dumps(document["envelope"]).encode()
    return raw


def cmd_receipts_verify(args: argparse.Namespace) -> int:
    """Check a receipt offline against a key set; say why not when it fails."""
    from ductor_settlement import (
        InvalidKey,
        ReceiptError,
        decode_envelope,
        load_public_keys,
        verify_receipt,
    )

    try:
        envelope_bytes = _read_envelope(args.file)
        keys_bytes = _read_keys(args.keys)
        try:
            public_keys = load_public_keys(keys_bytes)
        except InvalidKey as exc:
            raise _Unchecked(f"the key set {args.keys} is not usable: {exc.message}") from exc
    except _Unchecked as exc:
        sys.stderr.write(f"error: {exc}\n")
        return VERIFY_UNCHECKED
    try:
        receipt = verify_receipt(decode_envelope(envelope_bytes), public_keys)
    except ReceiptError as exc:
        sys.stderr.write(f"INVALID: {args.file}: {exc.code}: {exc.message}\n")
        return VERIFY_INVALID
    keyids = [s.keyid for s in decode_envelope(envelope_bytes).signatures]
    cost = _money(receipt.cost.micros, receipt.cost.currency)
    sys.stdout.write(
        f"valid: receipt {receipt.id} for {receipt.subject.kind.value}:{receipt.subject.id} "
        f"(tenant {receipt.tenant_id}), signed by key {', '.join(keyids)}, "
        f"issued {receipt.issued_at.isoformat()}, cost {cost}\n"
    )
    return VERIFY_VALID


def cmd_receipts_add_key(args: argparse.Namespace) -> int:
    """Append a fresh signing key to a key file; it signs from the next server start."""
    from ductor_server.receipts.keys import add_key

    key = add_key(Path(args.file), args.kid)
    sys.stdout.write(f"{key.kid}\n")
    sys.stderr.write(
        f"added key {key.kid} to {args.file}: it signs new receipts once the server restarts; "
        "keep the older keys in the file so their receipts still verify\n"
    )
    return 0


# --- wiring --------------------------------------------------------------------------


def add_settlement_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `ledger` and `receipts` on the top-level parser."""
    ledger = sub.add_parser("ledger", help="read ledger balances and entries")
    lg = ledger.add_subparsers(dest="ledger_command", metavar="COMMAND", required=True)
    p = command(
        lg, "balance", cmd_ledger_balance, "show an account's balances (or every account's)"
    )
    p.add_argument("account", nargs="?", default=None, help="account code (default: all)")
    p.add_argument("--json", action="store_true")
    p = command(lg, "entries", cmd_ledger_entries, "list ledger entries, newest first")
    p.add_argument("--account", default=None, help="only entries posting to this account")
    p.add_argument("--cursor", default=None)
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--json", action="store_true")

    receipts = sub.add_parser("receipts", help="fetch and verify signed receipts")
    rc = receipts.add_subparsers(dest="receipts_command", metavar="COMMAND", required=True)
    p = command(rc, "get", cmd_receipts_get, "fetch a receipt's signed envelope")
    p.add_argument("receipt_id", type=path_id)
    p.add_argument("-o", "--output", default=None, help="write it to this file (default stdout)")
    p.add_argument("--full", action="store_true", help="the whole view, not just the envelope")
    p = command(rc, "list", cmd_receipts_list, "list receipts, newest first")
    p.add_argument("--subject", default=None, help="KIND:ID, e.g. run:run_1 or assignment:a1")
    p.add_argument("--kind", default=None, choices=("assignment", "run"))
    p.add_argument("--cursor", default=None)
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--json", action="store_true")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the receipt ids")
    verify = rc.add_parser(
        "verify",
        help="check a receipt offline against published keys",
        description="Check a receipt's signature, payload type and form against a JWK Set. "
        "Exit 0: valid; 1: not valid; 2: could not be checked.",
    )
    verify.add_argument("file", help="the envelope (from `receipts get -o FILE`); '-' for stdin")
    verify.add_argument(
        "--keys",
        required=True,
        help="a JWK Set file, or a server URL (its /.well-known/ductor-keys is fetched)",
    )
    verify.set_defaults(func=cmd_receipts_verify)
    add = rc.add_parser(
        "add-key",
        help="append a new signing key to a key file (rotation)",
        description="Append a fresh Ed25519 key to FILE (created with mode 0600); it signs "
        "new receipts once the server restarts with DUCTOR_RECEIPT_KEYS=FILE.",
    )
    add.add_argument("file", help="the key file")
    add.add_argument("--kid", default=None, help="key id (default: derived from the key)")
    add.set_defaults(func=cmd_receipts_add_key)


__all__ = [
    "KEYS_PATH",
    "add_settlement_commands",
    "cmd_receipts_add_key",
    "cmd_receipts_verify",
]
