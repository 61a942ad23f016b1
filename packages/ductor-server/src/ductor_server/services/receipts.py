"""Signed receipts: issue one per cleared assignment or run, read them, publish the keys.

`ReceiptService.issue_in` is called inside the transaction that clears the
work (routing's assign commit, the engine's run end), so a receipt exists
exactly when the work it proves was committed. It builds the receipt as
`ductor_settlement.receipts` defines it, signs it with the ring's active key
and stores it; a subject has one receipt, so calling it again (a retried
transaction) answers the stored one unchanged. Without signing keys it
issues nothing. The keys never leave this module except as public keys.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable
from datetime import datetime

import msgspec

from ductor_core.runs import RunFinished, RunStatus
from ductor_server.engine.clock import Clock, SystemClock
from ductor_server.errors import RequestInvalid
from ductor_server.receipts.errors import ReceiptNotFound
from ductor_server.receipts.store import InvalidReceiptCursor, ReceiptsTx, StoredReceipt
from ductor_server.storage.protocol import Store, Tx
from ductor_server.storage.records import RunRecord
from ductor_settlement import (
    ConsentRecord,
    Cost,
    DecisionRef,
    Envelope,
    KeyRing,
    Receipt,
    Subject,
    SubjectKind,
    document_hash,
    export_public_keys,
    issue_receipt,
    receipt_digest,
)

MAX_PAGE = 500
"""The most receipts one page lists."""

RUN_COST_CURRENCY = "USD"
"""The currency of a run receipt's cost (runs are not priced yet: 0)."""

_DEFINITION_HASHES = 4096


class ReceiptView(msgspec.Struct, frozen=True, kw_only=True):
    """A stored receipt: the signed envelope, and its payload read back for convenience.

    Attributes:
        id: the receipt's id.
        subject: the assignment or run it proves.
        key_id: the id of the key that signed it (see ``/.well-known/ductor-keys``).
        digest: ``sha256:<hex>`` of the signed canonical payload.
        receipt: the payload, decoded (what the envelope signs).
        envelope: the DSSE envelope, as signed: what ``ductor receipts verify`` checks.
        created_at: when it was issued.
    """

    id: str
    subject: Subject
    key_id: str
    digest: str
    receipt: Receipt
    envelope: Envelope
    created_at: datetime


class ReceiptPageView(msgspec.Struct, frozen=True, kw_only=True):
    """One page of receipts, newest first; pass `next_cursor` back for the next page."""

    items: list[ReceiptView]
    next_cursor: str | None = None


class PublicKey(msgspec.Struct, frozen=True, kw_only=True):
    """One published Ed25519 public key as a JWK (RFC 8037): `x` is the raw key,
    base64url without padding."""

    kty: str
    crv: str
    kid: str
    x: str
    alg: str
    use: str


class PublicKeySet(msgspec.Struct, frozen=True, kw_only=True):
    """The public receipt keys as a JWK Set (RFC 7517), in key-id order."""

    keys: list[PublicKey]


def receipt_id_for(tenant_id: str, subject: Subject) -> str:
    """The id of a subject's receipt: derived from the tenant and subject, so a
    retried issue names the same receipt."""
    text = f"{tenant_id}\x1f{subject.kind.value}\x1f{subject.id}"
    return "rct_" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def decision_ref(decision_id: str, explanation: object) -> DecisionRef:
    """A receipt's reference to a routing decision: its id and ``sha256:<hex>`` of its
    explanation's canonical JSON (RFC 8785), so anyone holding the explanation
    (``GET /v1/decisions/{id}``) can check it is the one the receipt names. An integer
    past 2**53 - 1 in it (an enriched 64-bit id) is hashed as the double a JSON reader
    takes it for."""
    return DecisionRef(id=decision_id, explanation_hash=document_hash(explanation))


def receipt_view(stored: StoredReceipt) -> ReceiptView:
    """The view of a stored receipt (its payload decoded, not re-verified)."""
    receipt = msgspec.json.decode(stored.envelope.payload_bytes(), type=Receipt)
    return ReceiptView(
        id=stored.id,
        subject=Subject(kind=stored.subject_kind, id=stored.subject_id),
        key_id=stored.key_id,
        digest=receipt_digest(stored.envelope),
        receipt=receipt,
        envelope=stored.envelope,
        created_at=stored.created_at,
    )


def parse_subject(text: str) -> Subject:
    """``KIND:ID`` (``run:run_1``, ``assignment:asg_1``) as a subject.

    Raises:
        RequestInvalid: no colon, an unknown kind, or an empty id.
    """
    kind, sep, subject_id = text.partition(":")
    kinds = [k.value for k in SubjectKind]
    if not sep or kind not in kinds or not subject_id:
        raise RequestInvalid(
            f"subject must be KIND:ID with KIND one of {', '.join(kinds)}, got {text!r}",
            details={"subject": text, "kinds": kinds},
        )
    return Subject(kind=SubjectKind(kind), id=subject_id)


class ReceiptService:
    """Issues, stores and reads signed receipts; publishes the public keys.

    Args:
        store: the store.
        keys: the signing ring (None: receipts are off and `issue_in` issues nothing).
        clock: where `now` comes from.
    """

    def __init__(
        self, store: Store, *, keys: KeyRing | None = None, clock: Clock | None = None
    ) -> None:
        self._store = store
        self._keys = keys
        self._clock = clock or SystemClock()
        self._definition_hashes: OrderedDict[tuple[str, str, int], str | None] = OrderedDict()

    @property
    def enabled(self) -> bool:
        """True when the server has a signing key, so receipts are issued."""
        return self._keys is not None

    @property
    def key_id(self) -> str | None:
        """The id of the key new receipts are signed with (None when off)."""
        return None if self._keys is None else self._keys.active.kid

    def public_keys(self) -> bytes:
        """Every public key receipts may be signed with, as a JWK Set (no private part)."""
        if self._keys is None:
            return export_public_keys({})
        return self._keys.export_public_keys()

    def public_key_set(self) -> PublicKeySet:
        """`public_keys` as a struct, for transports."""
        return msgspec.json.decode(self.public_keys(), type=PublicKeySet)

    async def issue_in(
        self,
        tx: Tx,
        tenant_id: str,
        subject: Subject,
        *,
        cost: Cost,
        decision: DecisionRef | None = None,
        configuration_hash: str | None = None,
        definition_hash: str | None = None,
        tool_manifest_hash: str | None = None,
        consent: Iterable[ConsentRecord] = (),
        ledger_entries: Iterable[str] = (),
        now: datetime | None = None,
    ) -> ReceiptView | None:
        """Issue `subject`'s receipt inside `tx` (the transaction that clears the work).

        Idempotent: if the subject has a receipt already (a retried transaction),
        that one is returned unchanged and nothing new is stored. It costs one
        signature and one insert. Returns None when receipts are off (no
        signing key).

        Raises:
            NotCanonical: a cost beyond the safe range or a malformed currency.
            InvalidTime: `now` is naive.
        """
        if self._keys is None:
            return None
        at = now if now is not None else self._clock.now()
        receipt = Receipt(
            id=receipt_id_for(tenant_id, subject),
            tenant_id=tenant_id,
            subject=subject,
            issued_at=at,
            cost=cost,
            decision=decision,
            configuration_hash=configuration_hash,
            definition_hash=definition_hash,
            tool_manifest_hash=tool_manifest_hash,
            consent=tuple(consent),
            ledger_entries=tuple(ledger_entries),
        )
        envelope = issue_receipt(receipt, self._keys)
        stored = StoredReceipt(
            tenant_id=tenant_id,
            id=receipt.id,
            subject_kind=subject.kind,
            subject_id=subject.id,
            key_id=self._keys.active.kid,
            envelope=envelope,
            created_at=at,
        )
        store = ReceiptsTx(tx)
        if not await store.insert(stored):
            # Issued before (a retry) or by a concurrent transaction: that one stands.
            found = await store.for_subject(tenant_id, subject.kind, subject.id)
            assert found is not None
            stored = found
        return receipt_view(stored)

    async def on_run_finished(
        self, tx: Tx, *, run: RunRecord, finished: RunFinished, now: datetime
    ) -> None:
        """The engine's run-end hook: issue the receipt of a run that succeeded, with
        its definition's hash, in the transaction that ends it."""
        if self._keys is None or finished.status is not RunStatus.SUCCEEDED:
            return
        await self.issue_in(
            tx,
            run.tenant_id,
            Subject(kind=SubjectKind.RUN, id=run.id),
            cost=Cost(micros=0, currency=RUN_COST_CURRENCY),
            definition_hash=await self._definition_hash(tx, run),
            now=now,
        )

    async def _definition_hash(self, tx: Tx, run: RunRecord) -> str | None:
        # Versions never change, so their hashes are cached (None: not a published
        # definition, e.g. an SDK-hosted run).
        key = (run.tenant_id, run.family_slug, run.version)
        if key in self._definition_hashes:
            self._definition_hashes.move_to_end(key)
            return self._definition_hashes[key]
        record = await tx.get_workflow_version(run.tenant_id, run.family_slug, run.version)
        found = None if record is None else record.hash
        self._definition_hashes[key] = found
        if len(self._definition_hashes) > _DEFINITION_HASHES:
            self._definition_hashes.popitem(last=False)
        return found

    async def get(self, tenant_id: str, receipt_id: str) -> ReceiptView:
        """One receipt of the tenant.

        Raises:
            ReceiptNotFound: `receipt.not_found` (another tenant's too).
        """
        async with self._store.transaction() as tx:
            stored = await ReceiptsTx(tx).get(tenant_id, receipt_id)
        if stored is None:
            raise ReceiptNotFound(receipt_id)
        return receipt_view(stored)

    async def list(
        self,
        tenant_id: str,
        *,
        subject: str | None = None,
        kind: str | None = None,
        cursor: str | None = None,
        limit: int = 50,
    ) -> ReceiptPageView:
        """Receipts newest first; `subject` (``KIND:ID``) keeps one subject's, `kind`
        (``assignment`` or ``run``) one kind's.

        Raises:
            RequestInvalid: a bad subject, kind, cursor or limit.
        """
        if isinstance(limit, bool) or not 1 <= limit <= MAX_PAGE:
            raise RequestInvalid(
                f"limit must be between 1 and {MAX_PAGE}", details={"limit": limit}
            )
        wanted = parse_subject(subject) if subject else None
        subject_kind: SubjectKind | None = None
        if kind:
            kinds = [k.value for k in SubjectKind]
            if kind not in kinds:
                raise RequestInvalid(
                    f"kind must be one of {', '.join(kinds)}, got {kind!r}",
                    details={"kind": kind, "kinds": kinds},
                )
            subject_kind = SubjectKind(kind)
        if wanted is not None:
            if subject_kind is not None and subject_kind is not wanted.kind:
                return ReceiptPageView(items=[])
            subject_kind = wanted.kind
        try:
            async with self._store.transaction() as tx:
                page = await ReceiptsTx(tx).list(
                    tenant_id,
                    kind=subject_kind,
                    subject_id=None if wanted is None else wanted.id,
                    cursor=cursor or None,
                    limit=limit,
                )
        except InvalidReceiptCursor as exc:
            raise RequestInvalid(str(exc), details={"cursor": cursor}) from exc
        return ReceiptPageView(
            items=[receipt_view(r) for r in page.receipts], next_cursor=page.next_cursor
        )


__all__ = [
    "MAX_PAGE",
    "RUN_COST_CURRENCY",
    "PublicKey",
    "PublicKeySet",
    "ReceiptPageView",
    "ReceiptService",
    "ReceiptView",
    "decision_ref",
    "parse_subject",
    "receipt_id_for",
    "receipt_view",
]
