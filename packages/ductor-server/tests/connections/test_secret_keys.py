"""The secret key ring: parsing `DUCTOR_SECRET_KEYS`, sealing under the newest key,
opening under any key of the ring, and binding each value to its tenant and connection."""

from __future__ import annotations

import base64
import stat
from pathlib import Path

import pytest

from ductor_server.connections import SecretKeysInvalid, load_secret_keys, new_secret_key
from ductor_server.connections.secret_keys import (
    KeyNotInRing,
    Sealed,
    SecretKeys,
    Tampered,
    ensure_key_file,
)

K1, K2 = new_secret_key("k1"), new_secret_key("k2")


def test_new_writes_use_the_newest_and_old_keys_still_open() -> None:
    old = SecretKeys.parse(K1)
    sealed = old.seal(b'{"token": "s3cret"}', tenant_id="t1", connection_id="con_1")
    assert sealed.kid == "k1"
    assert b"s3cret" not in sealed.ciphertext.encode()
    ring = SecretKeys.parse(f"{K2}, {K1}")
    assert ring.kids == ("k2", "k1")
    assert ring.open(sealed, tenant_id="t1", connection_id="con_1") == b'{"token": "s3cret"}'
    again = ring.seal(b"x", tenant_id="t1", connection_id="con_1")
    assert again.kid == "k2"
    with pytest.raises(KeyNotInRing):
        SecretKeys.parse(K2).open(sealed, tenant_id="t1", connection_id="con_1")


def test_a_value_opens_only_for_its_tenant_and_connection() -> None:
    ring = SecretKeys.parse(K1)
    sealed = ring.seal(b"secret", tenant_id="t1", connection_id="con_1")
    for tenant, connection in [("t2", "con_1"), ("t1", "con_2"), ("t1\x00con", "_1")]:
        with pytest.raises(Tampered):
            ring.open(sealed, tenant_id=tenant, connection_id=connection)
    flipped = sealed.ciphertext[:-2] + ("A" if sealed.ciphertext[-2] != "A" else "B") + "A"
    for bad in (flipped, "", "!!!", sealed.ciphertext[:10]):
        with pytest.raises(Tampered):
            ring.open(Sealed("k1", bad), tenant_id="t1", connection_id="con_1")
    # the same plaintext twice gives two ciphertexts (a fresh nonce each time)
    assert ring.seal(b"secret", tenant_id="t1", connection_id="con_1") != sealed


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "at least one key"),
        ("k1", "KID:KEY"),
        ("bad kid:" + K1.split(":")[1], "KID:KEY"),
        ("k1:not base64 !", "URL-safe base64"),
        ("k1:" + "QUJD", "32 bytes, got 3"),
        (f"{K1},{K1}", "listed twice"),
        # 32 bytes once the characters outside the alphabet are dropped: still refused
        (K1 + "!!!!", "URL-safe base64"),
        (K1[:10] + "*" + K1[10:], "URL-safe base64"),
        ("k1:" + base64.b64encode(b"\xfb\xff" * 16).decode(), "URL-safe base64"),
    ],
    # Stable ids (the keys are random): parallel workers must collect the same tests.
    ids=[
        "empty",
        "no-colon",
        "bad-kid",
        "not-base64",
        "short",
        "twice",
        "trailing-junk",
        "junk-inside",
        "standard-base64",
    ],
)
def test_bad_rings_are_refused_without_showing_keys(text: str, says: str) -> None:
    with pytest.raises(SecretKeysInvalid) as refused:
        SecretKeys.parse(text)
    assert says in str(refused.value)
    assert K1.split(":")[1] not in str(refused.value)


def test_keys_never_show() -> None:
    ring = SecretKeys.parse(f"{K2},{K1}")
    for text in (repr(ring), repr(ring.newest), str(ring.newest)):
        assert K2.split(":")[1] not in text


def test_the_dev_key_file_is_made_once_and_private(tmp_path: Path) -> None:
    path = tmp_path / "secret_keys"
    text, created = ensure_key_file(path)
    assert created
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again, created_again = ensure_key_file(path)
    assert (again, created_again) == (text, False)
    ring = load_secret_keys(None, path)
    assert ring is not None
    assert len(ring.kids) == 1
    from_text = load_secret_keys(K1, path)  # the setting wins over the file
    assert from_text is not None
    assert from_text.kids == ("k1",)
    assert load_secret_keys(None, None) is None
    with pytest.raises(SecretKeysInvalid, match="cannot read"):
        load_secret_keys(None, tmp_path / "missing")
