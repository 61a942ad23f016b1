"""Receipt signing keys: the key file (last key signs, every key published), the inline
setting (line, bare seed or PEM), clear errors that never show key material, key
rotation by appending, and the composition's switches."""

from __future__ import annotations

import base64
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from ductor_server import Settings
from ductor_server.composition import build
from ductor_server.receipts import (
    ReceiptKeyError,
    add_key,
    load_keys,
    parse_inline_key,
    parse_key_file,
)
from ductor_settlement import key_id_for

SEED_A = bytes(range(32))
SEED_B = bytes(range(32, 64))


def _b64(seed: bytes) -> str:
    return base64.b64encode(seed).decode()


def test_the_last_key_of_the_file_signs_and_every_key_is_published() -> None:
    text = f"# keys\n\nold {_b64(SEED_A)}\n  new {_b64(SEED_B)}  \n"
    ring = parse_key_file(text)
    assert ring.active.kid == "new"
    assert ring.active.seed() == SEED_B
    assert set(ring.public_keys()) == {"old", "new"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "holds no key"),
        ("# only a comment\n", "holds no key"),
        (f"k1 {_b64(SEED_A)}\nk1 {_b64(SEED_B)}\n", "line 2: key id 'k1' appears twice"),
        ("k1 not*base64\n", "line 1: the key is not base64"),
        (f"k1 {_b64(SEED_A[:16])}\n", "line 1: an Ed25519 seed is 32 bytes, not 16"),
        (f"k1 {_b64(SEED_A)} extra\n", "line 1: expected 'KEY_ID BASE64_SEED'"),
        (f"bad/kid {_b64(SEED_A)}\n", "line 1: key id 'bad/kid' must be"),
    ],
)
def test_a_bad_key_file_says_where_without_the_key(text: str, message: str) -> None:
    with pytest.raises(ReceiptKeyError) as refused:
        parse_key_file(text, source="keys.txt")
    assert message in str(refused.value)
    for seed in (SEED_A, SEED_B, SEED_A[:16]):
        assert _b64(seed) not in str(refused.value)


def test_a_hash_starts_a_comment_anywhere_on_a_line() -> None:
    text = f"old {_b64(SEED_A)}  # retired in July\nnew {_b64(SEED_B)}# signs now\n"
    ring = parse_key_file(text)
    assert ring.active.kid == "new"
    assert ring.active.seed() == SEED_B
    assert set(ring.public_keys()) == {"old", "new"}


def test_an_inline_key_is_a_line_a_bare_seed_or_a_pem() -> None:
    assert parse_inline_key(f"main {_b64(SEED_A)}").kid == "main"
    bare = parse_inline_key(_b64(SEED_A))
    assert bare.kid == key_id_for(bare.public_key)
    pem_text = (
        Ed25519PrivateKey.from_private_bytes(SEED_B)
        .private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
        .decode()
    )
    from_pem = parse_inline_key(pem_text)
    assert from_pem.seed() == SEED_B
    assert from_pem.kid == key_id_for(from_pem.public_key)
    with pytest.raises(ReceiptKeyError, match="not a readable"):
        parse_inline_key("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")


def test_one_source_of_keys_at_a_time(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(f"k1 {_b64(SEED_A)}\n")
    assert load_keys(None, None) is None
    loaded = load_keys(path, None)
    assert loaded is not None
    assert loaded.active.kid == "k1"
    with pytest.raises(ReceiptKeyError, match="not both"):
        load_keys(path, _b64(SEED_B))
    with pytest.raises(ReceiptKeyError, match="cannot read the receipt key file"):
        load_keys(tmp_path / "missing", None)


def test_adding_a_key_rotates_and_keeps_the_old_ones(tmp_path: Path) -> None:
    path = tmp_path / "receipt_keys"
    first = add_key(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    second = add_key(path, "2030-07")
    ring = load_keys(path, None)
    assert ring is not None
    assert ring.active.kid == "2030-07" == second.kid
    assert set(ring.public_keys()) == {first.kid, "2030-07"}
    assert ring.public_keys()[first.kid] == first.public_key
    with pytest.raises(ReceiptKeyError, match="already in"):
        add_key(path, "2030-07")
    with pytest.raises(ReceiptKeyError, match="must be 1-64"):
        add_key(path, "2031-01\n")  # would have split the file's line
    assert load_keys(path, None) is not None


def test_the_settings_never_show_an_inline_key(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, receipt_key=f"k1 {_b64(SEED_A)}")
    assert _b64(SEED_A) not in repr(settings)


def test_run_receipts_are_wired_only_when_asked_and_need_a_key(tmp_path: Path) -> None:
    def settings(**values: object) -> Settings:
        return Settings(data_dir=tmp_path, cel_sandbox=False, **values)  # type: ignore[arg-type]

    key = f"k1 {_b64(SEED_A)}"
    off = build(settings(receipt_key=key))
    assert off.services.receipts.enabled
    assert off.runtime.parts.on_finish == []
    on = build(settings(receipt_key=key, receipts_for_runs=True))
    assert on.runtime.parts.on_finish == [on.services.receipts.on_run_finished]
    none = build(settings())
    assert not none.services.receipts.enabled
    with pytest.raises(ReceiptKeyError, match="DUCTOR_RECEIPTS_FOR_RUNS is on"):
        build(settings(receipts_for_runs=True))


def test_the_environment_settings_are_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DUCTOR_RECEIPT_KEYS", str(tmp_path / "keys"))
    monkeypatch.setenv("DUCTOR_RECEIPTS_FOR_RUNS", "on")
    settings = Settings.from_env()
    assert settings.receipt_keys_file == tmp_path / "keys"
    assert settings.receipts_for_runs
    monkeypatch.setenv("DUCTOR_RECEIPTS_FOR_RUNS", "maybe")
    with pytest.raises(ValueError, match="DUCTOR_RECEIPTS_FOR_RUNS must be on or off"):
        Settings.from_env()
