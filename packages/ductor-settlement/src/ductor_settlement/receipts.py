"""Receipts and signed agent-tool manifests: canonical payloads in signed DSSE envelopes.

Pure: building, signing and verifying are computations over values passed in;
`issued_at` comes from the caller.

A `Receipt` joins, for one cleared unit of work (an assignment or a run), the
routing decision (id and explanation hash), the configuration hash, the
workflow definition or tool-manifest hash, the cost, the consent trail and the
ledger entries that settled it. Its payload is the receipt's canonical JSON
(RFC 8785, see `canonical.py`) with ``issued_at`` in UTC, signed in a DSSE
envelope of type `RECEIPT_PAYLOAD_TYPE` with Ed25519 (see `dsse.py`). Anyone
holding the published public keys can check it offline with `verify_receipt`,
which also insists the payload is canonical, so its hash (`receipt_digest`) is
the same wherever it is recomputed.

An agent-tool manifest (`ToolManifest`) is signed the same way with payload
type `TOOL_MANIFEST_PAYLOAD_TYPE`; its `manifest_hash` is what receipts cite.
Because DSSE signs the payload type, a signed manifest can never pass as a
receipt or the reverse.
"""

from __future__ import annotations

import enum
import hashlib
from datetime import datetime
from typing import Any, TypeVar

import msgspec

from ductor_settlement._time import aware
from ductor_settlement.canonical import canonical_hash, canonical_json, is_canonical
from ductor_settlement.dsse import Envelope, KeyRing, PublicKeys, verify
from ductor_settlement.errors import MalformedEnvelope, NotCanonical
from ductor_settlement.money import currency_problem, micros_problem

__all__ = [
    "RECEIPT_PAYLOAD_TYPE",
    "TOOL_MANIFEST_PAYLOAD_TYPE",
    "ConsentRecord",
    "Cost",
    "DecisionRef",
    "Receipt",
    "Subject",
    "SubjectKind",
    "Tool",
    "ToolManifest",
    "issue_receipt",
    "manifest_hash",
    "receipt_digest",
    "sign_tool_manifest",
    "verify_receipt",
    "verify_tool_manifest",
]

RECEIPT_PAYLOAD_TYPE = "application/vnd.ductor.receipt+json"
"""The DSSE payload type of receipts."""

TOOL_MANIFEST_PAYLOAD_TYPE = "application/vnd.ductor.tool-manifest+json"
"""The DSSE payload type of signed agent-tool manifests."""


class SubjectKind(enum.StrEnum):
    """What a receipt is for."""

    ASSIGNMENT = "assignment"
    RUN = "run"


class Subject(msgspec.Struct, frozen=True, kw_only=True):
    """The cleared unit of work: an assignment or a run, by id."""

    kind: SubjectKind
    id: str


class DecisionRef(msgspec.Struct, frozen=True, kw_only=True):
    """The routing decision behind the work and a hash of its explanation."""

    id: str
    explanation_hash: str


class Cost(msgspec.Struct, frozen=True, kw_only=True):
    """What the work cost, in integer micros of `currency`."""

    micros: int
    currency: str


class ConsentRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One step of the consent trail, as captured with the work item.

    Attributes:
        granted: whether the subject consented.
        scopes: what the consent covers ("phone", "email").
        evidence: where it was captured (a URL, form id, recording id).
        captured_at: when, as the capturing system wrote it (ISO-8601).
    """

    granted: bool
    scopes: tuple[str, ...] = ()
    evidence: str | None = None
    captured_at: str | None = None


class Receipt(msgspec.Struct, frozen=True, kw_only=True):
    """The signed proof of one cleared unit of work.

    Attributes:
        version: the receipt schema version (1).
        id: the receipt's id.
        tenant_id: the tenant it belongs to.
        subject: the assignment or run it proves.
        issued_at: when it was issued (UTC in the payload).
        decision: the routing decision, if the work was routed.
        configuration_hash: hash of the routing/pool configuration in force.
        definition_hash: hash of the workflow definition version that ran.
        tool_manifest_hash: hash of the agent-tool manifest used (`manifest_hash`).
        cost: what it cost.
        consent: the consent trail.
        ledger_entries: ids of the ledger entries that settled it.
    """

    id: str
    tenant_id: str
    subject: Subject
    issued_at: datetime
    cost: Cost
    version: int = 1
    decision: DecisionRef | None = None
    configuration_hash: str | None = None
    definition_hash: str | None = None
    tool_manifest_hash: str | None = None
    consent: tuple[ConsentRecord, ...] = ()
    ledger_entries: tuple[str, ...] = ()


class Tool(msgspec.Struct, frozen=True, kw_only=True):
    """One tool an agent may call: its name, description and JSON Schema of its input."""

    name: str
    description: str = ""
    input_schema: dict[str, Any] = {}


class ToolManifest(msgspec.Struct, frozen=True, kw_only=True):
    """The tools an agent offers, published and signed by `publisher`."""

    name: str
    version: str
    publisher: str = ""
    tools: tuple[Tool, ...] = ()


def _receipt_payload(receipt: Receipt) -> bytes:
    issued_at = aware(receipt.issued_at, "issued_at")
    reasons = [
        reason
        for reason in (
            micros_problem(receipt.cost.micros, allow_zero=True, signed=True),
            currency_problem(receipt.cost.currency),
        )
        if reason is not None
    ]
    if reasons:
        raise NotCanonical(
            f"receipt {receipt.id!r} has a bad cost: " + "; ".join(reasons),
            details={"receipt": receipt.id, "reasons": reasons},
        )
    return canonical_json(msgspec.structs.replace(receipt, issued_at=issued_at))


def issue_receipt(receipt: Receipt, keys: KeyRing) -> Envelope:
    """`receipt` as canonical JSON in a DSSE envelope signed by the ring's active key.

    Raises:
        InvalidTime: `issued_at` is naive.
        NotCanonical: the cost is beyond `MAX_MICROS` or not an integer, its currency
            is malformed, or a value cannot be canonicalized.
    """
    return keys.sign(RECEIPT_PAYLOAD_TYPE, _receipt_payload(receipt))


_T = TypeVar("_T")


def _open(envelope: Envelope, public_keys: PublicKeys, payload_type: str, into: type[_T]) -> _T:
    payload = verify(envelope, public_keys, payload_type=payload_type)
    if not is_canonical(payload):
        raise NotCanonical("the signed payload is not canonical JSON (RFC 8785)", details={})
    try:
        return msgspec.json.decode(payload, type=into)
    except msgspec.DecodeError as exc:
        raise MalformedEnvelope(
            f"the signed payload is not a valid {into.__name__}: {exc}",
            details={"reason": str(exc)},
        ) from exc


def verify_receipt(envelope: Envelope, public_keys: PublicKeys) -> Receipt:
    """The receipt inside `envelope`, once its signature, type and form check out.

    Args:
        envelope: a receipt envelope (see `decode_envelope` for JSON).
        public_keys: trusted public keys by key id (see `load_public_keys`).

    Raises:
        UnknownKey, BadSignature: the signature is not by a trusted key, or is wrong.
        WrongPayloadType: a validly signed envelope of another type.
        NotCanonical: the payload is not in canonical form.
        MalformedEnvelope: the payload is not a receipt.
    """
    return _open(envelope, public_keys, RECEIPT_PAYLOAD_TYPE, Receipt)


def receipt_digest(receipt: Receipt | Envelope) -> str:
    """``sha256:<hex>`` of the receipt's canonical payload, from the receipt or its envelope."""
    payload = (
        receipt.payload_bytes() if isinstance(receipt, Envelope) else _receipt_payload(receipt)
    )
    return "sha256:" + hashlib.sha256(payload).hexdigest()


def manifest_hash(manifest: ToolManifest) -> str:
    """``sha256:<hex>`` of the manifest's canonical JSON: what receipts cite."""
    return canonical_hash(manifest)


def sign_tool_manifest(manifest: ToolManifest, keys: KeyRing) -> Envelope:
    """`manifest` as canonical JSON in a DSSE envelope signed by the ring's active key."""
    return keys.sign(TOOL_MANIFEST_PAYLOAD_TYPE, canonical_json(manifest))


def verify_tool_manifest(envelope: Envelope, public_keys: PublicKeys) -> ToolManifest:
    """The manifest inside `envelope`, once its signature, type and form check out.

    Raises:
        UnknownKey, BadSignature, WrongPayloadType, NotCanonical, MalformedEnvelope:
            as `verify_receipt`.
    """
    return _open(envelope, public_keys, TOOL_MANIFEST_PAYLOAD_TYPE, ToolManifest)
