"""JSON values survive the round trip through either backend (property test)."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ductor_server.storage import AttemptRecord, EventRecord, Store

from .builders import NOW

# Floats are kept within +-2**53: Postgres jsonb prints numbers without an
# exponent, so a larger float would come back as the int its decimal text names.
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(min_value=-(2.0**53), max_value=2.0**53, allow_nan=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)

_IDS = itertools.count()


def without_nul(value: Any) -> Any:
    """What Postgres keeps of `value`: jsonb cannot hold U+0000, the store writes U+FFFD."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, list):
        return [without_nul(v) for v in value]
    if isinstance(value, dict):
        return {without_nul(k): without_nul(v) for k, v in value.items()}
    return value


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(value=json_values)
async def test_json_values_round_trip(store: Store, value: Any) -> None:
    n = next(_IDS)
    async with store.transaction() as tx:
        await tx.insert_events(
            [EventRecord(tenant_id="t1", id=f"e{n}", name="x", data=value, received_at=NOW)]
        )
        await tx.record_attempts(
            [
                AttemptRecord(
                    tenant_id="t1",
                    run_id=f"r{n}",
                    step_ref="a",
                    attempt=1,
                    ok=True,
                    output=value,
                    started_at=NOW,
                    finished_at=NOW,
                )
            ]
        )
    async with store.transaction() as tx:
        event = await tx.get_event("t1", f"e{n}")
        [stored] = await tx.list_attempts("t1", f"r{n}")
    expected = without_nul(value) if store.backend == "postgres" else value
    assert event is not None
    assert event.data == expected
    assert stored.output == expected


async def test_a_nul_next_to_escaped_backslashes_is_replaced_exactly(store: Store) -> None:
    value = {"k\x00": ["\\\x00", "\\u0000", "\\\\\x00x", "plain"]}
    async with store.transaction() as tx:
        await tx.insert_events(
            [EventRecord(tenant_id="t1", id="e", name="x", data=value, received_at=NOW)]
        )
        event = await tx.get_event("t1", "e")
    assert event is not None
    if store.backend == "postgres":
        assert event.data == {"k\ufffd": ["\\\ufffd", "\\u0000", "\\\\\ufffdx", "plain"]}
    else:
        assert event.data == value
