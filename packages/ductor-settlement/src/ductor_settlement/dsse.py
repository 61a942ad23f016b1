"""Signed envelopes (DSSE) with Ed25519 keys: sign, verify, key rings, public key sets.

Pure crypto over bytes; no I/O, no clock. The only non-deterministic call is
`SigningKey.generate`, which draws a fresh key from the OS's random source.

**Envelope.** DSSE v1 (the Dead Simple Signing Envelope of in-toto/Sigstore),
as JSON::

    {"payload": "<base64 of the payload bytes>",
     "payloadType": "application/vnd.ductor.receipt+json",
     "signatures": [{"keyid": "<key id>", "sig": "<base64 Ed25519 signature>"}]}

The signature is over the pre-authentication encoding, not the payload alone::

    PAE(type, body) = "DSSEv1" SP LEN(type) SP type SP LEN(body) SP body

where SP is one space and LEN the byte length in ASCII decimal. So the payload
type is signed too: changing it breaks every signature. Base64 is the standard
alphabet with padding on output; both alphabets, padded or not, are accepted.

**Keys.** Ed25519 (RFC 8032). A `KeyRing` holds several keys by key id, one of
them active for signing; rotating adds a new active key and keeps the old ones,
so receipts they signed still verify. `verify` needs only public keys.

**Public key set.** Published as a JWK Set (RFC 7517, with RFC 8037's OKP
keys), which any JOSE library reads::

    {"keys": [{"kty": "OKP", "crv": "Ed25519", "alg": "EdDSA", "use": "sig",
               "kid": "<key id>", "x": "<base64url, unpadded, of the 32-byte raw key>"}]}
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import msgspec

from ductor_settlement.errors import (
    BadSignature,
    InvalidKey,
    MalformedEnvelope,
    UnknownKey,
    WrongPayloadType,
)

# cryptography is imported by the functions that sign, verify or read keys: a
# process that never does (a server without receipt keys) does not load it.
if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

__all__ = [
    "Envelope",
    "KeyRing",
    "PublicKeys",
    "Signature",
    "SigningKey",
    "decode_envelope",
    "encode_envelope",
    "export_public_keys",
    "key_id_for",
    "load_public_keys",
    "pae",
    "sign",
    "verify",
]

PublicKeys = Mapping[str, "Ed25519PublicKey"]
"""Public keys by key id: all a verifier needs."""


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1's pre-authentication encoding of a payload and its type: what is signed."""
    kind = payload_type.encode("utf-8")
    return b"DSSEv1 %d %b %d %b" % (len(kind), kind, len(payload), payload)


def _b64encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _b64decode(text: str, what: str) -> bytes:
    """Standard or URL-safe base64, padded or not."""
    try:
        raw = text.encode("ascii")
        raw = raw.replace(b"-", b"+").replace(b"_", b"/")
        raw += b"=" * (-len(raw) % 4)
        return base64.b64decode(raw, validate=True)
    except (UnicodeEncodeError, binascii.Error, ValueError) as exc:
        raise MalformedEnvelope(f"{what} is not valid base64", details={"field": what}) from exc


class Signature(msgspec.Struct, frozen=True, kw_only=True):
    """One signature of an envelope: the signer's key id and the base64 signature."""

    sig: str
    keyid: str = ""


class Envelope(msgspec.Struct, frozen=True, kw_only=True):
    """A DSSE envelope: a typed payload and its signatures (see the module docstring)."""

    payload: str
    payload_type: str = msgspec.field(name="payloadType")
    signatures: tuple[Signature, ...] = ()

    def payload_bytes(self) -> bytes:
        """The payload, base64-decoded (not verified: use `verify` for that).

        Raises:
            MalformedEnvelope: the payload is not base64.
        """
        return _b64decode(self.payload, "payload")


def encode_envelope(envelope: Envelope) -> bytes:
    """The envelope as JSON bytes."""
    return msgspec.json.encode(envelope)


def decode_envelope(data: bytes | str) -> Envelope:
    """An envelope from JSON.

    Raises:
        MalformedEnvelope: not JSON, or not an envelope's shape.
    """
    try:
        return msgspec.json.decode(data, type=Envelope)
    except msgspec.DecodeError as exc:
        raise MalformedEnvelope(
            f"not a DSSE envelope: {exc}", details={"reason": str(exc)}
        ) from exc


def key_id_for(public_key: Ed25519PublicKey) -> str:
    """A key id derived from the public key: the first 16 hex digits of SHA-256 of its raw bytes."""
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    raw = public_key.public_bytes(Encoding.Raw, PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


class SigningKey:
    """An Ed25519 private key with its key id. Its repr never shows the key."""

    __slots__ = ("_private", "kid")

    def __init__(self, kid: str, private_key: Ed25519PrivateKey) -> None:
        """Wrap `private_key` under key id `kid` (non-empty)."""
        if not kid:
            raise InvalidKey("a signing key needs a non-empty key id", details={})
        self.kid = kid
        self._private = private_key

    @classmethod
    def generate(cls, kid: str | None = None) -> SigningKey:
        """A fresh random key; its key id defaults to `key_id_for` its public key."""
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        private = Ed25519PrivateKey.generate()
        return cls(kid or key_id_for(private.public_key()), private)

    @classmethod
    def from_seed(cls, seed: bytes, kid: str | None = None) -> SigningKey:
        """The key whose 32-byte raw private key (RFC 8032 seed) is `seed`.

        Raises:
            InvalidKey: `seed` is not 32 bytes.
        """
        if len(seed) != 32:
            raise InvalidKey(
                f"an Ed25519 seed is 32 bytes, not {len(seed)}", details={"length": len(seed)}
            )
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        private = Ed25519PrivateKey.from_private_bytes(seed)
        return cls(kid or key_id_for(private.public_key()), private)

    def seed(self) -> bytes:
        """The 32-byte raw private key, to store (encrypted) and restore with `from_seed`."""
        from cryptography.hazmat.primitives.serialization import (
            Encoding,
            NoEncryption,
            PrivateFormat,
        )

        return self._private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())

    @property
    def public_key(self) -> Ed25519PublicKey:
        """The matching public key."""
        return self._private.public_key()

    def sign_bytes(self, message: bytes) -> bytes:
        """The raw 64-byte Ed25519 signature of `message`."""
        return self._private.sign(message)

    def __repr__(self) -> str:
        return f"SigningKey(kid={self.kid!r})"


def sign(payload_type: str, payload: bytes, key: SigningKey) -> Envelope:
    """An envelope of `payload` typed `payload_type`, signed by `key` over its PAE."""
    signature = key.sign_bytes(pae(payload_type, payload))
    return Envelope(
        payload=_b64encode(payload),
        payload_type=payload_type,
        signatures=(Signature(keyid=key.kid, sig=_b64encode(signature)),),
    )


def verify(
    envelope: Envelope, public_keys: PublicKeys, *, payload_type: str | None = None
) -> bytes:
    """The payload of `envelope` once a signature by one of `public_keys` verifies.

    A signature with a key id is checked against that key only; one without a
    key id is tried against every key. The payload type is checked after the
    signature, so a tampered type reads as a bad signature.

    Args:
        envelope: the envelope.
        public_keys: trusted public keys by key id.
        payload_type: the type the caller expects; None accepts any.

    Raises:
        MalformedEnvelope: the payload is not base64 or there are no signatures.
        UnknownKey: no signature is by a key in `public_keys`.
        BadSignature: a signature by a known key does not verify.
        WrongPayloadType: the signed type is not `payload_type`.
    """
    from cryptography.exceptions import InvalidSignature

    payload = envelope.payload_bytes()
    if not envelope.signatures:
        raise MalformedEnvelope("the envelope has no signatures", details={})
    message = pae(envelope.payload_type, payload)
    tried: list[str] = []
    for signature in envelope.signatures:
        if signature.keyid:
            candidates = [public_keys[signature.keyid]] if signature.keyid in public_keys else []
        else:
            candidates = list(public_keys.values())
        if not candidates:
            continue
        tried.append(signature.keyid)
        try:
            raw = _b64decode(signature.sig, "sig")
        except MalformedEnvelope:
            continue  # a garbled signature is a bad one
        for candidate in candidates:
            try:
                candidate.verify(raw, message)
            except InvalidSignature:
                continue
            if payload_type is not None and envelope.payload_type != payload_type:
                raise WrongPayloadType(
                    f"the envelope carries {envelope.payload_type!r}, not {payload_type!r}",
                    details={"payload_type": envelope.payload_type, "expected": payload_type},
                )
            return payload
    keyids = [signature.keyid for signature in envelope.signatures]
    if not tried:
        raise UnknownKey(
            "no signature on the envelope is by a known key: " + ", ".join(map(repr, keyids)),
            details={"keyids": keyids, "known": sorted(public_keys)},
        )
    raise BadSignature(
        "the envelope's signature does not verify with key " + ", ".join(map(repr, tried)),
        details={"keyids": tried},
    )


class KeyRing:
    """Signing keys by key id, one active; retired keys keep only their public half.

    Rotation adds a key and makes it active; old keys keep verifying what they
    signed. `public_keys` and `export_public_keys` give what verifiers need.
    """

    def __init__(
        self,
        keys: Iterable[SigningKey],
        *,
        active: str,
        retired: Mapping[str, Ed25519PublicKey] | None = None,
    ) -> None:
        """A ring of `keys` signing with key `active`, also trusting `retired` public keys.

        Raises:
            InvalidKey: duplicate key ids, or `active` is not among `keys`.
        """
        self._keys: dict[str, SigningKey] = {}
        for key in keys:
            if key.kid in self._keys:
                raise InvalidKey(f"key id {key.kid!r} appears twice", details={"kid": key.kid})
            self._keys[key.kid] = key
        self._retired = dict(retired or {})
        clash = sorted(set(self._keys) & set(self._retired))
        if clash:
            raise InvalidKey(f"key ids {clash} are both live and retired", details={"kids": clash})
        if active not in self._keys:
            raise InvalidKey(
                f"the active key {active!r} is not in the ring", details={"kid": active}
            )
        self._active = active

    @property
    def active(self) -> SigningKey:
        """The key new envelopes are signed with."""
        return self._keys[self._active]

    @property
    def key_ids(self) -> tuple[str, ...]:
        """Every key id the ring verifies, live keys first."""
        return (*self._keys, *self._retired)

    def sign(self, payload_type: str, payload: bytes) -> Envelope:
        """An envelope of `payload`, signed by the active key."""
        return sign(payload_type, payload, self.active)

    def rotate(self, key: SigningKey) -> KeyRing:
        """A ring with `key` added and active; every older key still verifies."""
        return KeyRing([*self._keys.values(), key], active=key.kid, retired=self._retired)

    def retire(self, kid: str) -> KeyRing:
        """A ring where `kid`'s private half is dropped; its public half still verifies.

        Raises:
            InvalidKey: `kid` is the active key or not a live key.
        """
        if kid == self._active or kid not in self._keys:
            raise InvalidKey(
                f"key {kid!r} is active or not a live key of the ring", details={"kid": kid}
            )
        keys = [key for key in self._keys.values() if key.kid != kid]
        retired = {**self._retired, kid: self._keys[kid].public_key}
        return KeyRing(keys, active=self._active, retired=retired)

    def public_keys(self) -> dict[str, Ed25519PublicKey]:
        """Every public key of the ring by key id, retired ones included."""
        return {**{kid: key.public_key for kid, key in self._keys.items()}, **self._retired}

    def export_public_keys(self) -> bytes:
        """The ring's public keys as a JWK Set (see the module docstring)."""
        return export_public_keys(self.public_keys())


class _Jwk(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    kty: str
    crv: str
    kid: str
    x: str
    alg: str | None = None
    use: str | None = None


class _Jwks(msgspec.Struct, frozen=True, kw_only=True):
    keys: tuple[_Jwk, ...]


def export_public_keys(public_keys: PublicKeys) -> bytes:
    """`public_keys` as a JWK Set, keys in key-id order."""
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    jwks = _Jwks(
        keys=tuple(
            _Jwk(
                kty="OKP",
                crv="Ed25519",
                alg="EdDSA",
                use="sig",
                kid=kid,
                x=base64.urlsafe_b64encode(key.public_bytes(Encoding.Raw, PublicFormat.Raw))
                .decode("ascii")
                .rstrip("="),
            )
            for kid, key in sorted(public_keys.items())
        )
    )
    return msgspec.json.encode(jwks)


def load_public_keys(data: bytes | str) -> dict[str, Ed25519PublicKey]:
    """Public keys by key id from a JWK Set such as `export_public_keys` writes.

    Raises:
        InvalidKey: not a JWK Set, a key that is not Ed25519, a bad ``x``, or a
            key id that appears twice.
    """
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        jwks = msgspec.json.decode(data, type=_Jwks)
    except msgspec.DecodeError as exc:
        raise InvalidKey(f"not a JWK Set: {exc}", details={"reason": str(exc)}) from exc
    keys: dict[str, Ed25519PublicKey] = {}
    for jwk in jwks.keys:
        if jwk.kty != "OKP" or jwk.crv != "Ed25519":
            raise InvalidKey(
                f"key {jwk.kid!r} is {jwk.kty}/{jwk.crv}, not OKP/Ed25519",
                details={"kid": jwk.kid},
            )
        if jwk.kid in keys:
            raise InvalidKey(f"key id {jwk.kid!r} appears twice", details={"kid": jwk.kid})
        try:
            raw = _b64decode(jwk.x, "x")
        except MalformedEnvelope as exc:
            raise InvalidKey(
                f"key {jwk.kid!r}: x is not base64url", details={"kid": jwk.kid}
            ) from exc
        if len(raw) != 32:
            raise InvalidKey(
                f"key {jwk.kid!r}: an Ed25519 public key is 32 bytes, not {len(raw)}",
                details={"kid": jwk.kid},
            )
        keys[jwk.kid] = Ed25519PublicKey.from_public_bytes(raw)
    return keys
