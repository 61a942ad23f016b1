"""Signed receipts and tool manifests: DSSE envelopes, Ed25519, key rotation, JWKS."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta, timezone

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ductor_settlement.canonical import canonical_json
from ductor_settlement.dsse import (
    Envelope,
    KeyRing,
    Signature,
    SigningKey,
    decode_envelope,
    encode_envelope,
    export_public_keys,
    key_id_for,
    load_public_keys,
    pae,
    sign,
    verify,
)
from ductor_settlement.errors import (
    BadSignature,
    InvalidKey,
    InvalidTime,
    MalformedEnvelope,
    NotCanonical,
    UnknownKey,
    WrongPayloadType,
)
from ductor_settlement.receipts import (
    RECEIPT_PAYLOAD_TYPE,
    TOOL_MANIFEST_PAYLOAD_TYPE,
    ConsentRecord,
    Cost,
    DecisionRef,
    Receipt,
    Subject,
    SubjectKind,
    Tool,
    ToolManifest,
    issue_receipt,
    manifest_hash,
    receipt_digest,
    sign_tool_manifest,
    verify_receipt,
    verify_tool_manifest,
)

# RFC 8032, section 7.1, test 1.
RFC8032_SEED = bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
RFC8032_PUBLIC_X = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"
RFC8032_EMPTY_SIG = bytes.fromhex(
    "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9"
    "b46bd25bf5f0595bbe24655141438e7a100b"
)

MANIFEST = ToolManifest(
    name="crm-agent",
    version="1.2.0",
    publisher="acme",
    tools=(
        Tool(
            name="lookup",
            description="find a contact",
            input_schema={"type": "object", "properties": {"email": {"type": "string"}}},
        ),
    ),
)


def receipt(**changes: object) -> Receipt:
    base = Receipt(
        id="rcpt-1",
        tenant_id="acme",
        subject=Subject(kind=SubjectKind.ASSIGNMENT, id="asg-1"),
        issued_at=datetime(2025, 3, 1, 12, 0, tzinfo=UTC),
        decision=DecisionRef(id="dec-1", explanation_hash="sha256:" + "ab" * 32),
        configuration_hash="sha256:" + "cd" * 32,
        tool_manifest_hash=manifest_hash(MANIFEST),
        cost=Cost(micros=12_500_000, currency="USD"),
        consent=(
            ConsentRecord(
                granted=True,
                scopes=("phone", "email"),
                evidence="https://forms.example/123",
                captured_at="2025-02-28T09:00:00Z",
            ),
        ),
        ledger_entries=("ent_0123", "ent_4567"),
    )
    return msgspec.structs.replace(base, **changes)


def ring(kid: str = "k1") -> KeyRing:
    return KeyRing([SigningKey.generate(kid)], active=kid)


def flip(text: str, index: int = 5) -> str:
    """`text` (base64) with one bit of one decoded byte flipped."""
    raw = bytearray(base64.b64decode(text))
    raw[index % len(raw)] ^= 0x01
    return base64.b64encode(bytes(raw)).decode()


# --- the DSSE envelope ------------------------------------------------------------


def test_pae_matches_the_dsse_specification() -> None:
    assert pae("http://example.com/HelloWorld", b"hello world") == (
        b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
    )
    assert pae("t\u00e9", b"") == b"DSSEv1 3 t\xc3\xa9 0 "


def test_ed25519_keys_follow_rfc_8032() -> None:
    key = SigningKey.from_seed(RFC8032_SEED, kid="rfc")
    assert key.sign_bytes(b"") == RFC8032_EMPTY_SIG
    assert key.seed() == RFC8032_SEED
    jwks = json.loads(export_public_keys({"rfc": key.public_key}))
    assert jwks == {
        "keys": [
            {
                "kty": "OKP",
                "crv": "Ed25519",
                "kid": "rfc",
                "x": RFC8032_PUBLIC_X,
                "alg": "EdDSA",
                "use": "sig",
            }
        ]
    }
    assert "9d61" not in repr(key)


def test_an_envelope_has_the_dsse_json_shape_and_signs_the_pae() -> None:
    keys = ring()
    envelope = issue_receipt(receipt(), keys)
    wire = json.loads(encode_envelope(envelope))
    assert set(wire) == {"payload", "payloadType", "signatures"}
    assert wire["payloadType"] == RECEIPT_PAYLOAD_TYPE
    assert [set(s) for s in wire["signatures"]] == [{"keyid", "sig"}]
    payload = base64.b64decode(wire["payload"])
    assert payload == canonical_json(receipt())
    # An independent check with the bare cryptography API, over PAE(type, payload).
    keys.active.public_key.verify(
        base64.b64decode(wire["signatures"][0]["sig"]), pae(RECEIPT_PAYLOAD_TYPE, payload)
    )
    assert decode_envelope(encode_envelope(envelope)) == envelope


def test_a_receipt_verifies_with_only_the_public_keys_and_comes_back_equal() -> None:
    keys = ring()
    published = load_public_keys(keys.export_public_keys())
    envelope = decode_envelope(encode_envelope(issue_receipt(receipt(), keys)))
    assert verify_receipt(envelope, published) == receipt()
    assert receipt_digest(envelope) == receipt_digest(receipt())


def test_a_receipt_issued_in_another_offset_is_signed_in_utc() -> None:
    local = datetime(2025, 3, 1, 14, 0, tzinfo=timezone(timedelta(hours=2)))
    envelope = issue_receipt(receipt(issued_at=local), ring())
    assert b'"issued_at":"2025-03-01T12:00:00Z"' in envelope.payload_bytes()
    with pytest.raises(InvalidTime):
        issue_receipt(receipt(issued_at=datetime(2025, 3, 1)), ring())  # naive on purpose


@pytest.mark.parametrize("index", [0, 17, 100, -1])
def test_a_flipped_payload_byte_fails(index: int) -> None:
    keys = ring()
    envelope = issue_receipt(receipt(), keys)
    tampered = msgspec.structs.replace(envelope, payload=flip(envelope.payload, index))
    with pytest.raises(BadSignature) as caught:
        verify_receipt(tampered, keys.public_keys())
    assert caught.value.code == "receipt.bad_signature"


def test_a_flipped_signature_byte_fails() -> None:
    keys = ring()
    envelope = issue_receipt(receipt(), keys)
    (signature,) = envelope.signatures
    tampered = msgspec.structs.replace(
        envelope, signatures=(Signature(keyid=signature.keyid, sig=flip(signature.sig, 40)),)
    )
    with pytest.raises(BadSignature):
        verify_receipt(tampered, keys.public_keys())


def test_a_different_key_under_the_same_id_fails_and_an_unknown_id_is_unknown() -> None:
    envelope = issue_receipt(receipt(), ring("k1"))
    with pytest.raises(BadSignature):
        verify_receipt(envelope, ring("k1").public_keys())
    with pytest.raises(UnknownKey) as caught:
        verify_receipt(envelope, ring("k2").public_keys())
    assert caught.value.code == "receipt.unknown_key"
    assert caught.value.details == {"keyids": ["k1"], "known": ["k2"]}


def test_tampering_with_the_payload_type_fails() -> None:
    keys = ring()
    envelope = issue_receipt(receipt(), keys)
    retyped = msgspec.structs.replace(envelope, payload_type=TOOL_MANIFEST_PAYLOAD_TYPE)
    with pytest.raises(BadSignature):
        verify_tool_manifest(retyped, keys.public_keys())
    with pytest.raises(BadSignature):
        verify(retyped, keys.public_keys())


def test_a_validly_signed_manifest_is_not_accepted_as_a_receipt() -> None:
    keys = ring()
    envelope = sign_tool_manifest(MANIFEST, keys)
    assert verify_tool_manifest(envelope, keys.public_keys()) == MANIFEST
    with pytest.raises(WrongPayloadType) as caught:
        verify_receipt(envelope, keys.public_keys())
    assert caught.value.code == "receipt.wrong_payload_type"


def test_rotation_signs_with_the_new_key_and_old_receipts_still_verify() -> None:
    old_ring = ring("2025-01")
    old_receipt = issue_receipt(receipt(), old_ring)
    new_ring = old_ring.rotate(SigningKey.generate("2025-06"))
    new_receipt = issue_receipt(receipt(id="rcpt-2"), new_ring)
    assert new_ring.active.kid == "2025-06"
    assert new_receipt.signatures[0].keyid == "2025-06"
    published = load_public_keys(new_ring.export_public_keys())
    assert sorted(published) == ["2025-01", "2025-06"]
    assert verify_receipt(old_receipt, published).id == "rcpt-1"
    assert verify_receipt(new_receipt, published).id == "rcpt-2"
    # Retiring drops the private half; the public half still verifies.
    retired = new_ring.retire("2025-01")
    assert retired.key_ids == ("2025-06", "2025-01")
    assert verify_receipt(old_receipt, retired.public_keys()).id == "rcpt-1"
    # A verifier that only knows the new key cannot check the old receipt.
    with pytest.raises(UnknownKey):
        verify_receipt(old_receipt, {"2025-06": new_ring.active.public_key})


def test_a_signature_without_a_key_id_is_tried_against_every_key() -> None:
    keys = ring()
    envelope = issue_receipt(receipt(), keys)
    anonymous = msgspec.structs.replace(
        envelope, signatures=(Signature(sig=envelope.signatures[0].sig),)
    )
    others = ring("other").public_keys()
    assert verify_receipt(anonymous, {**others, **keys.public_keys()}) == receipt()
    with pytest.raises(BadSignature):
        verify_receipt(anonymous, others)


def test_a_validly_signed_payload_that_is_not_canonical_is_refused() -> None:
    keys = ring()
    loose = json.dumps(msgspec.to_builtins(receipt()), indent=2).encode()
    envelope = sign(RECEIPT_PAYLOAD_TYPE, loose, keys.active)
    with pytest.raises(NotCanonical) as caught:
        verify_receipt(envelope, keys.public_keys())
    assert caught.value.code == "receipt.not_canonical"


def test_malformed_envelopes_and_payloads_are_refused() -> None:
    keys = ring()
    good = issue_receipt(receipt(), keys)
    with pytest.raises(MalformedEnvelope) as caught:
        decode_envelope(b'{"payload": 1}')
    assert caught.value.code == "receipt.malformed"
    with pytest.raises(MalformedEnvelope):
        decode_envelope(b"not json")
    with pytest.raises(MalformedEnvelope):
        verify_receipt(msgspec.structs.replace(good, payload="%%%"), keys.public_keys())
    with pytest.raises(MalformedEnvelope):
        verify_receipt(msgspec.structs.replace(good, signatures=()), keys.public_keys())
    not_a_receipt = sign(RECEIPT_PAYLOAD_TYPE, canonical_json({"id": 5}), keys.active)
    with pytest.raises(MalformedEnvelope):
        verify_receipt(not_a_receipt, keys.public_keys())


def test_url_safe_unpadded_base64_is_accepted() -> None:
    keys = ring()
    envelope = issue_receipt(receipt(), keys)
    (signature,) = envelope.signatures

    def urlsafe(text: str) -> str:
        return base64.urlsafe_b64encode(base64.b64decode(text)).decode().rstrip("=")

    relaxed = Envelope(
        payload=urlsafe(envelope.payload),
        payload_type=envelope.payload_type,
        signatures=(Signature(keyid=signature.keyid, sig=urlsafe(signature.sig)),),
    )
    assert verify_receipt(relaxed, keys.public_keys()) == receipt()


def test_a_cost_beyond_the_micros_range_cannot_be_issued() -> None:
    with pytest.raises(NotCanonical):
        issue_receipt(receipt(cost=Cost(micros=2**60, currency="USD")), ring())
    with pytest.raises(NotCanonical):
        issue_receipt(receipt(cost=Cost(micros=1, currency="us dollars")), ring())


# --- manifests and keys -----------------------------------------------------------


def test_the_manifest_hash_does_not_depend_on_key_order() -> None:
    reordered = msgspec.structs.replace(
        MANIFEST,
        tools=(
            Tool(
                name="lookup",
                description="find a contact",
                input_schema={"properties": {"email": {"type": "string"}}, "type": "object"},
            ),
        ),
    )
    assert manifest_hash(reordered) == manifest_hash(MANIFEST)
    assert manifest_hash(msgspec.structs.replace(MANIFEST, version="1.2.1")) != manifest_hash(
        MANIFEST
    )


def test_key_ids_default_to_a_hash_of_the_public_key() -> None:
    key = SigningKey.from_seed(RFC8032_SEED)
    assert key.kid == key_id_for(key.public_key)
    assert len(key.kid) == 16
    assert SigningKey.generate().kid != key.kid


@pytest.mark.parametrize(
    "build",
    [
        lambda: SigningKey.from_seed(b"short"),
        lambda: SigningKey("", Ed25519PrivateKey.generate()),
        lambda: KeyRing([SigningKey.generate("a")], active="b"),
        lambda: KeyRing([SigningKey.generate("a"), SigningKey.generate("a")], active="a"),
        lambda: ring("a").retire("a"),
        lambda: ring("a").retire("zzz"),
    ],
)
def test_bad_key_material_or_rings_are_invalid(build: object) -> None:
    with pytest.raises(InvalidKey) as caught:
        build()  # type: ignore[operator]
    assert caught.value.code == "receipt.invalid_key"


@pytest.mark.parametrize(
    "jwks",
    [
        b"nope",
        b'{"keys": [{"kty": "RSA", "crv": "", "kid": "r", "x": "AA"}]}',
        b'{"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": "s", "x": "AAAA"}]}',
        b'{"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": "s", "x": "!!"}]}',
    ],
)
def test_a_malformed_public_key_set_is_refused(jwks: bytes) -> None:
    with pytest.raises(InvalidKey):
        load_public_keys(jwks)


def test_a_public_key_set_with_a_repeated_key_id_is_refused() -> None:
    one = json.loads(ring("a").export_public_keys())["keys"][0]
    with pytest.raises(InvalidKey, match="twice"):
        load_public_keys(json.dumps({"keys": [one, one]}))
