"""`ReceiptService.issue_in` on both backends: a receipt is signed and stored in the
caller's transaction, once per subject, verifiable with the published keys only,
gone with a rolled-back transaction, and still verifiable after a key rotation."""

from __future__ import annotations

import asyncio
import base64
import json
from datetime import UTC, datetime

import pytest

from ductor_server.receipts import ReceiptsTx
from ductor_server.services.receipts import (
    ReceiptService,
    ReceiptView,
    decision_ref,
    receipt_id_for,
)
from ductor_server.storage import Store
from ductor_settlement import (
    BadSignature,
    ConsentRecord,
    Cost,
    DecisionRef,
    Subject,
    SubjectKind,
    UnknownKey,
    canonical_hash,
    load_public_keys,
    verify_receipt,
)

from .conftest import ring

NOW = datetime(2030, 1, 1, tzinfo=UTC)
ASSIGNMENT = Subject(kind=SubjectKind.ASSIGNMENT, id="asg_1")


async def _issue_or_none(
    service: ReceiptService, store: Store, subject: Subject = ASSIGNMENT
) -> ReceiptView | None:
    async with store.transaction() as tx:
        return await service.issue_in(
            tx,
            "tenant-a",
            subject,
            cost=Cost(micros=12_500_000, currency="USD"),
            decision=DecisionRef(id="dec_1", explanation_hash="sha256:" + "e" * 64),
            configuration_hash="sha256:" + "c" * 64,
            tool_manifest_hash="sha256:" + "d" * 64,
            consent=[ConsentRecord(granted=True, scopes=("phone",), evidence="form-9")],
            ledger_entries=["ent_1", "ent_2"],
            now=NOW,
        )


async def _issue(
    service: ReceiptService, store: Store, subject: Subject = ASSIGNMENT
) -> ReceiptView:
    view = await _issue_or_none(service, store, subject)
    assert view is not None
    return view


async def _rows(store: Store) -> int:
    async with store.transaction() as tx:
        row = await tx.session.fetch_one("SELECT COUNT(*) FROM receipts", ())
    assert row is not None
    return int(row[0])


async def test_a_receipt_is_signed_stored_and_verifies_with_the_public_keys(store: Store) -> None:
    signing = ring("k1")
    service = ReceiptService(store, keys=signing)
    view = await _issue(service, store)
    public = load_public_keys(service.public_keys())
    receipt = verify_receipt(view.envelope, public)
    assert receipt.id == receipt_id_for("tenant-a", ASSIGNMENT)
    assert receipt.subject == ASSIGNMENT
    assert receipt.cost == Cost(micros=12_500_000, currency="USD")
    assert receipt.decision == DecisionRef(id="dec_1", explanation_hash="sha256:" + "e" * 64)
    assert receipt.ledger_entries == ("ent_1", "ent_2")
    assert receipt.consent[0].evidence == "form-9"
    assert receipt.issued_at == NOW
    assert view.key_id == "k1"
    async with store.transaction() as tx:
        stored = await ReceiptsTx(tx).for_subject("tenant-a", SubjectKind.ASSIGNMENT, "asg_1")
    assert stored is not None
    assert stored.envelope == view.envelope
    assert stored.key_id == "k1"
    # The JWK Set holds public members only, and no trace of the seed.
    jwks = json.loads(service.public_keys())
    assert [set(k) for k in jwks["keys"]] == [{"kty", "crv", "kid", "x", "alg", "use"}]
    seed = base64.b64encode(signing.active.seed()).decode()
    assert seed not in service.public_keys().decode()


async def test_issuing_again_answers_the_stored_receipt_unchanged(store: Store) -> None:
    service = ReceiptService(store, keys=ring("k1"))
    first = await _issue(service, store)
    # A later retry, even by a server with another key, answers the stored receipt.
    again = await _issue(ReceiptService(store, keys=ring("k2")), store)
    assert again == first
    assert await _rows(store) == 1


async def test_concurrent_issues_for_one_subject_store_one_receipt(store: Store) -> None:
    services = [ReceiptService(store, keys=ring(f"k{i}")) for i in range(4)]
    views = await asyncio.gather(*(_issue(s, store) for s in services))
    assert len({v.envelope.signatures[0].keyid for v in views}) == 1
    assert await _rows(store) == 1


async def test_a_rolled_back_transaction_leaves_no_receipt(store: Store) -> None:
    service = ReceiptService(store, keys=ring("k1"))
    issued = []

    async def commit_that_fails() -> None:
        async with store.transaction() as tx:
            issued.append(
                await service.issue_in(
                    tx, "tenant-a", ASSIGNMENT, cost=Cost(micros=1, currency="USD"), now=NOW
                )
            )
            raise RuntimeError("the assignment's commit failed")

    with pytest.raises(RuntimeError):
        await commit_that_fails()
    assert issued[0] is not None
    assert await _rows(store) == 0


async def test_without_keys_nothing_is_issued(store: Store) -> None:
    service = ReceiptService(store, keys=None)
    assert not service.enabled
    assert await _issue_or_none(service, store) is None
    assert await _rows(store) == 0
    assert load_public_keys(service.public_keys()) == {}


async def test_a_rotated_key_signs_new_receipts_and_old_ones_still_verify(store: Store) -> None:
    old_ring = ring("2030-01")
    old = await _issue(ReceiptService(store, keys=old_ring), store)
    rotated = ReceiptService(store, keys=old_ring.rotate(ring("2030-07").active))
    new = await _issue(rotated, store, Subject(kind=SubjectKind.RUN, id="run_2"))
    assert new.key_id == "2030-07"
    published = load_public_keys(rotated.public_keys())
    assert set(published) == {"2030-01", "2030-07"}
    for view in (old, new):
        verify_receipt(view.envelope, published)
    # Only the old key's set: the new receipt names a key it does not know.
    with pytest.raises(UnknownKey):
        verify_receipt(new.envelope, load_public_keys(old_ring.export_public_keys()))
    # Another key under the old id: the signature does not verify.
    impostor = ring("2030-01")
    with pytest.raises(BadSignature):
        verify_receipt(old.envelope, impostor.public_keys())


async def test_tenants_do_not_see_each_others_receipts(store: Store) -> None:
    service = ReceiptService(store, keys=ring("k1"))
    view = await _issue(service, store)
    async with store.transaction() as tx:
        assert await ReceiptsTx(tx).get("tenant-b", view.id) is None
        page = await ReceiptsTx(tx).list("tenant-b")
    assert page.receipts == []


def test_a_decision_is_referenced_by_the_canonical_hash_of_its_explanation() -> None:
    explanation = {"pool": "p1", "candidates": [{"worker": "w1", "score": 0.5}]}
    reordered = {"candidates": [{"score": 0.5, "worker": "w1"}], "pool": "p1"}
    ref = decision_ref("dec_1", explanation)
    assert ref.id == "dec_1"
    assert ref.explanation_hash == decision_ref("dec_1", reordered).explanation_hash
    assert ref.explanation_hash == canonical_hash(explanation)
    changed = {"pool": "p2", "candidates": [{"worker": "w1", "score": 0.5}]}
    assert decision_ref("dec_1", changed).explanation_hash != ref.explanation_hash
