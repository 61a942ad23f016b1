"""Receipts and the ledger from the command line, against real server processes.

`ductor receipts get` fetches a run's receipt; `ductor receipts verify` checks it
offline (exit 0), and fails with exit 1 and the reason on a flipped byte, a
wrong key or an unknown key id. Rotating the key (a key appended to the key
file, the server restarted) signs new receipts with the new key id while the
old receipt still verifies with the published key set. docs/settlement.md's
receipt example runs as written; `ductor ledger balance|entries` read the API.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx

from ductor_settlement import KeyRing, SigningKey

from .conftest import ServerProcess

DOC = Path(__file__).resolve().parents[1] / "docs" / "settlement.md"

GREET = {
    "family_slug": "greet",
    "title": "Greet",
    "steps": [
        {
            "ref": "greet",
            "type": "STEP_TYPE_DATAFLOW",
            "args": {"operation": "project", "project": {"message": '"hello"'}},
        }
    ],
    "edges": [],
}


def _receipt_of_a_new_run(server: ServerProcess, workdir: Path) -> tuple[str, dict[str, object]]:
    """Run `greet` to its end and fetch its receipt with the CLI; (receipt file, view)."""
    run_id = server.cli("runs", "trigger", "greet", "--wait", "--quiet").stdout.strip()
    receipt_id = server.cli("receipts", "list", "--subject", f"run:{run_id}", "-q").stdout.strip()
    assert receipt_id.startswith("rct_"), receipt_id
    path = workdir / f"{receipt_id}.json"
    fetched = server.cli("receipts", "get", receipt_id, "-o", str(path))
    assert f"written to {path}" in fetched.stderr
    with server.client() as http:
        view = http.get(f"/v1/receipts/{receipt_id}").json()
    assert view["subject"] == {"kind": "run", "id": run_id}
    assert json.loads(path.read_text()) == view["envelope"]
    return str(path), view


def _verify(server: ServerProcess, receipt: str, keys: str) -> subprocess.CompletedProcess[str]:
    return server.cli("receipts", "verify", receipt, "--keys", keys, check=False)


def _keys_file(path: Path, ring: KeyRing) -> str:
    path.write_bytes(ring.export_public_keys())
    return str(path)


def _flip_a_payload_byte(source: str, target: Path) -> str:
    envelope = json.loads(Path(source).read_text())
    payload = envelope["payload"]
    # Change one base64 character in the middle: still base64, other bytes.
    middle = len(payload) // 2
    swapped = "B" if payload[middle] != "B" else "C"
    envelope["payload"] = payload[:middle] + swapped + payload[middle + 1 :]
    target.write_text(json.dumps(envelope))
    return str(target)


def test_verify_offline_fails_on_tampering_and_wrong_keys_and_survives_rotation(
    server: ServerProcess, tmp_path: Path
) -> None:
    key_file = tmp_path / "receipt_keys"
    added = subprocess.run(
        [sys.executable, "-m", "ductor_server.cli", "receipts", "add-key", str(key_file)],
        capture_output=True,
        text=True,
        check=True,
    )
    first_kid = added.stdout.strip()
    server.extra_env.update(
        {"DUCTOR_RECEIPT_KEYS": str(key_file), "DUCTOR_RECEIPTS_FOR_RUNS": "on"}
    )
    server.start()
    (tmp_path / "greet.json").write_text(json.dumps(GREET))
    server.cli("workflows", "publish", str(tmp_path / "greet.json"))
    receipt, view = _receipt_of_a_new_run(server, tmp_path)
    assert view["key_id"] == first_kid
    assert key_file.read_text().split()[-2] == first_kid  # the private half stays in the file
    assert key_file.read_text().split()[-1] not in server.log()

    published = tmp_path / "keys-1.json"
    published.write_bytes(httpx.get(f"{server.url}/.well-known/ductor-keys").content)
    valid = _verify(server, receipt, str(published))
    assert valid.returncode == 0, valid.stderr
    assert valid.stdout.startswith(f"valid: receipt {view['id']} for run:")
    assert f"signed by key {first_kid}" in valid.stdout
    online = _verify(server, receipt, server.url)  # fetches /.well-known/ductor-keys
    assert online.returncode == 0, online.stderr

    tampered = _verify(server, _flip_a_payload_byte(receipt, tmp_path / "t.json"), str(published))
    assert tampered.returncode == 1
    assert "INVALID" in tampered.stderr
    assert "receipt.bad_signature" in tampered.stderr

    impostor = KeyRing([SigningKey.generate(first_kid)], active=first_kid)
    wrong = _verify(server, receipt, _keys_file(tmp_path / "wrong.json", impostor))
    assert wrong.returncode == 1
    assert "receipt.bad_signature" in wrong.stderr
    stranger = KeyRing([SigningKey.generate("someone-else")], active="someone-else")
    unknown = _verify(server, receipt, _keys_file(tmp_path / "unknown.json", stranger))
    assert unknown.returncode == 1
    assert "receipt.unknown_key" in unknown.stderr
    assert first_kid in unknown.stderr
    missing = _verify(server, receipt, str(tmp_path / "no-such-keys.json"))
    assert missing.returncode == 2
    assert "cannot read the keys file" in missing.stderr

    # Rotate: a new key at the end of the file signs once the server restarts.
    server.cli("receipts", "add-key", str(key_file), "--kid", "rotated-2")
    server.stop()
    server.start()
    new_receipt, new_view = _receipt_of_a_new_run(server, tmp_path)
    assert new_view["key_id"] == "rotated-2"
    rotated = tmp_path / "keys-2.json"
    rotated.write_bytes(httpx.get(f"{server.url}/.well-known/ductor-keys").content)
    assert {k["kid"] for k in json.loads(rotated.read_text())["keys"]} == {first_kid, "rotated-2"}
    for checked in (receipt, new_receipt):
        result = _verify(server, checked, str(rotated))
        assert result.returncode == 0, result.stderr
    # The old receipt is unchanged, and the old key set does not know the new key.
    with server.client() as http:
        assert http.get(f"/v1/receipts/{view['id']}").json()["envelope"] == view["envelope"]
    old_set = _verify(server, new_receipt, str(published))
    assert old_set.returncode == 1
    assert "receipt.unknown_key" in old_set.stderr


def _doc_receipt_script(port: int) -> str:
    text = DOC.read_text()
    section = text[text.index("## Receipts") : text.index("## Errors")]
    blocks = re.findall(r"^```sh\n(.*?)^```", section, re.DOTALL | re.MULTILINE)
    assert len(blocks) == 2
    script = "\n".join(blocks).replace("127.0.0.1:7070", f"127.0.0.1:{port}")
    return "set -euo pipefail\n" + script


def test_the_settlement_doc_receipt_example_runs_on_ductor_dev(
    make_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    # No key configured: `ductor dev` makes one under its data dir.
    server = make_server("dev", env={"DUCTOR_RECEIPTS_FOR_RUNS": "on"}).start()
    assert re.search(r"receipt signing key \S+ \(created, saved to .*receipt_keys\)", server.log())
    assert oct((server.data_dir / "receipt_keys").stat().st_mode & 0o777) == "0o600"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUCTOR_")}
    env.update(
        {
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
            "DUCTOR_URL": server.url,
            "DUCTOR_API_KEY": server.api_key,
        }
    )
    workdir = tmp_path / "work"
    workdir.mkdir()
    result = subprocess.run(
        ["bash", "-c", _doc_receipt_script(server.port)],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n{server.log()[-3000:]}"
    assert re.search(
        r"^valid: receipt rct_\w+ for run:run_\w+ \(tenant dev\), signed by key \S+, "
        r"issued \S+, cost 0\.000000 USD$",
        result.stdout,
        re.MULTILINE,
    ), result.stdout
    assert "exit status 1" in result.stdout
    assert "INVALID: tampered.json: receipt.bad_signature:" in result.stderr


def test_ledger_balance_and_entries_read_the_api(sqlite_server: ServerProcess) -> None:
    server = sqlite_server.start()
    with server.client() as http:
        for code, kind in (("cash", "asset"), ("wallet:buyer-42", "liability")):
            opened = http.post("/v1/accounts", json={"code": code, "currency": "USD", "kind": kind})
            assert opened.status_code == 201, opened.text
        for n in range(3):
            posted = http.post(
                "/v1/ledger/entries",
                json={
                    "description": f"top-up {n}",
                    "reference": {"kind": "top_up", "id": f"ch_{n}"},
                    "postings": [
                        {"account": "cash", "amount": 2_500_000, "currency": "USD"},
                        {"account": "wallet:buyer-42", "amount": -2_500_000, "currency": "USD"},
                    ],
                },
            )
            assert posted.status_code == 201, posted.text
    one = server.cli("ledger", "balance", "wallet:buyer-42").stdout
    assert re.search(r"wallet:buyer-42\s+7\.500000 USD\s+0\.000000 USD\s+7\.500000 USD", one), one
    every = server.cli("ledger", "balance").stdout
    assert [line.split()[0] for line in every.splitlines()[1:]] == ["cash", "wallet:buyer-42"]
    as_json = json.loads(server.cli("ledger", "balance", "cash", "--json").stdout)
    assert as_json["balance"] == 7_500_000

    page = server.cli("ledger", "entries", "--account", "cash", "--limit", "2").stdout
    assert "top-up 2" in page
    assert "top-up 1" in page
    assert "top-up 0" not in page
    assert "+2.500000 USD" in page
    assert "-2.500000 USD" in page
    cursor = re.search(r"^more: --cursor (\S+)$", page, re.MULTILINE)
    assert cursor is not None, page
    rest = server.cli("ledger", "entries", "--account", "cash", "--cursor", cursor.group(1))
    assert "top-up 0" in rest.stdout
    assert "more:" not in rest.stdout

    missing = server.cli("ledger", "balance", "nope", check=False)
    assert missing.returncode == 1
    assert "error: account.not_found" in missing.stderr


def test_a_bad_receipt_key_stops_the_server_with_a_message_that_hides_the_key(
    tmp_path: Path,
) -> None:
    secret = base64.b64encode(b"s" * 16).decode()
    base = {k: v for k, v in os.environ.items() if not k.startswith("DUCTOR_")}
    cases = [
        ({"DUCTOR_RECEIPT_KEY": f"k1 {secret}"}, "an Ed25519 seed is 32 bytes, not 16"),
        ({"DUCTOR_RECEIPT_KEYS": str(tmp_path / "missing")}, "cannot read the receipt key file"),
        ({"DUCTOR_RECEIPTS_FOR_RUNS": "on"}, "DUCTOR_RECEIPTS_FOR_RUNS is on but no receipt"),
    ]
    for extra, message in cases:
        result = subprocess.run(
            [sys.executable, "-m", "ductor_server.cli", "serve", "--data-dir", str(tmp_path)],
            env={**base, **extra, "DUCTOR_PORT": "0"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 2, (extra, result.stdout, result.stderr)
        assert message in result.stderr, result.stderr
        assert secret not in result.stdout + result.stderr
