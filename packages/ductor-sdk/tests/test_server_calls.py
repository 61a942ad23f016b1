"""The SDK's calls to the server, against a real local HTTP server: sync, payload
fetch for large executes, checkpoint mode with its fallback, and inline runs."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from ductor import ApiError, Client, Context, NonRetriableError
from ductor.protocol import (
    ExecutePayload,
    ExecuteRequest,
    OpcodeName,
    RunCompleteOp,
    SleepOp,
    StepRecord,
    StepRunOp,
    parse_signature,
    step_id,
)

KEY = "signkey-test-0001"
API_KEY = "api-key-test"


def make_client(server: Any, calls: Counter[str], **options: Any) -> Client:
    client = Client("shop", signing_key=KEY, server_url=server.url, api_key=API_KEY, **options)

    async def add(a: int, b: int) -> int:
        calls["add"] += 1
        return a + b

    @client.workflow("sum", trigger="numbers.ready")
    async def total(ctx: Context, numbers: list[int]) -> int:
        acc = 0
        for n in numbers:
            acc = await ctx.step.run("add", add, acc, n)
        return acc

    @client.workflow("nap")
    async def nap(ctx: Context, numbers: list[int]) -> int:
        first = await ctx.step.run("add", add, 0, numbers[0])
        await ctx.step.sleep("rest", "1h")
        return await ctx.step.run("add", add, first, numbers[1])

    @client.workflow("doomed")
    async def doomed(ctx: Context, _: Any) -> None:
        await ctx.step.run("add", add, 1, 1)
        raise NonRetriableError("not today", code="doomed.no")

    return client


async def test_sync_registers_the_app_with_its_url(fake_server: Any) -> None:
    client = make_client(fake_server, Counter(), url="http://app.internal/api/ductor")
    ack = await client.sync()
    await client.aclose()
    assert ack.accepted == ["sum", "nap", "doomed"]
    (manifest,) = fake_server.syncs
    assert manifest.url == "http://app.internal/api/ductor"
    assert manifest.sdk == "ductor-python"
    assert [t.event for t in manifest.workflows[0].triggers] == ["numbers.ready"]


async def test_every_call_names_the_app_and_carries_a_fresh_nonce(fake_server: Any) -> None:
    client = make_client(fake_server, Counter())
    await client.sync()
    await client.sync()
    await client.aclose()
    headers = [sent for _, _, _, sent in fake_server.received]
    assert [h["ductor-app"] for h in headers] == ["shop", "shop"]
    parts = [parse_signature(h["ductor-signature"]) for h in headers]
    assert all(p.nonce is not None and len(p.v1) == len(p.v2) == 1 for p in parts)
    assert parts[0].nonce != parts[1].nonce


async def test_sync_refused_by_the_server_raises_api_error(fake_server: Any) -> None:
    client = Client("shop", signing_key=KEY, server_url=fake_server.url, api_key="wrong")
    with pytest.raises(ApiError) as info:
        await client.sync()
    await client.aclose()
    assert (info.value.status, info.value.code) == (401, "auth.invalid")


async def test_server_answer_with_a_bad_signature_is_rejected(fake_server: Any) -> None:
    fake_server.sign_responses_with = "some-other-key"
    client = make_client(fake_server, Counter())
    with pytest.raises(ApiError) as info:
        await client.sync()
    await client.aclose()
    assert (info.value.code, info.value.status) == ("signature.mismatch", 200)
    assert "the server's answer failed verification" in info.value.message


async def test_unreachable_server_is_a_retryable_api_error() -> None:
    client = Client("shop", signing_key=KEY, server_url="http://127.0.0.1:9", api_key=API_KEY)
    with pytest.raises(ApiError) as info:
        await client.sync()
    await client.aclose()
    assert (info.value.code, info.value.retryable) == ("api.unreachable", True)


async def test_payload_ref_is_fetched_from_the_server(fake_server: Any) -> None:
    calls: Counter[str] = Counter()
    client = make_client(fake_server, calls)
    numbers = list(range(50))
    history = [
        StepRecord(
            id=step_id("add" if i == 0 else f"add:{i}"),
            name="add",
            op=OpcodeName.STEP_RUN,
            result=sum(numbers[: i + 1]),
        )
        for i in range(49)
    ]
    fake_server.payloads["ref-1"] = ExecutePayload(run_id="run-big", input=numbers, steps=history)
    request = ExecuteRequest(run_id="run-big", workflow_id="sum", payload_ref="ref-1")
    response = await client.execute(request)
    assert response.opcodes == [StepRunOp(id=step_id("add:49"), name="add", result=sum(numbers))]
    assert calls == {"add": 1}  # 49 memoized steps came from the fetched payload
    method, path, body, headers = fake_server.received[-1]
    assert (method, path, body) == ("GET", "/v1/bridge/runs/run-big/payload", b"")
    assert headers["authorization"] == f"Bearer {API_KEY}"

    missing = ExecuteRequest(run_id="run-big", workflow_id="sum", payload_ref="nope")
    with pytest.raises(ApiError) as info:
        await client.execute(missing)
    assert (info.value.status, info.value.code) == (404, "payload.not_found")
    await client.aclose()


async def test_checkpoint_mode_runs_consecutive_steps_in_one_execute(fake_server: Any) -> None:
    calls: Counter[str] = Counter()
    client = make_client(fake_server, calls, checkpoint=True)
    response = await client.execute(
        ExecuteRequest(run_id="run-1", workflow_id="sum", input=[1, 2, 3])
    )
    await client.aclose()
    assert response.opcodes == [RunCompleteOp(output=6)]
    assert calls == {"add": 3}
    reported = [op for cp in fake_server.checkpoints for op in cp.opcodes]
    assert [(op.name, op.result) for op in reported if isinstance(op, StepRunOp)] == [
        ("add", 1),
        ("add", 3),
        ("add", 6),
    ]
    assert all(cp.run_id == "run-1" and cp.app_id == "shop" for cp in fake_server.checkpoints)


async def test_checkpoint_failure_falls_back_to_one_step_per_call(fake_server: Any) -> None:
    calls: Counter[str] = Counter()
    client = make_client(fake_server, calls, checkpoint=True)
    fake_server.fail_checkpoints = True
    response = await client.execute(
        ExecuteRequest(run_id="run-1", workflow_id="sum", input=[1, 2, 3])
    )
    await client.aclose()
    assert response.opcodes == [StepRunOp(id=step_id("add"), name="add", result=1)]
    assert calls == {"add": 1}  # stopped after the unreported step
    assert fake_server.checkpoints == []


async def test_inline_run_completes_in_process(fake_server: Any) -> None:
    calls: Counter[str] = Counter()
    client = make_client(fake_server, calls)
    run = await client.run_inline("sum", [5, 6])
    await client.aclose()
    assert (run.run_id, run.status, run.output) == ("run-inline-1", "RUN_STATUS_SUCCEEDED", 11)
    assert fake_server.inline_runs[0].input == [5, 6]
    ops = [op for cp in fake_server.checkpoints for op in cp.opcodes]
    assert [type(op) for op in ops] == [StepRunOp, StepRunOp, RunCompleteOp]
    assert calls == {"add": 2}


async def test_inline_run_hands_over_to_the_engine_at_a_sleep(fake_server: Any) -> None:
    calls: Counter[str] = Counter()
    client = make_client(fake_server, calls)
    run = await client.run_inline("nap", [1, 2])
    await client.aclose()
    assert run.status == "RUN_STATUS_RUNNING"
    ops = [op for cp in fake_server.checkpoints for op in cp.opcodes]
    assert [type(op) for op in ops] == [StepRunOp, SleepOp]
    assert calls == {"add": 1}


async def test_inline_run_that_fails(fake_server: Any) -> None:
    client = make_client(fake_server, Counter())
    run = await client.run_inline("doomed")
    await client.aclose()
    assert run.status == "RUN_STATUS_FAILED"
    assert run.error is not None
    assert run.error.code == "doomed.no"


async def test_inline_run_of_an_unknown_workflow_starts_nothing(fake_server: Any) -> None:
    from ductor import WorkflowNotFound

    client = make_client(fake_server, Counter())
    with pytest.raises(WorkflowNotFound, match="'ghost'"):
        await client.run_inline("ghost")
    await client.aclose()
    assert fake_server.received == []


async def test_bridge_answers_502_when_its_own_call_to_the_server_fails(fake_server: Any) -> None:
    import time

    import msgspec

    from ductor.protocol import SIGNATURE_HEADER, ErrorResponse, SigningKeys, encode

    client = make_client(fake_server, Counter())
    keys = SigningKeys(KEY)

    fake_server.payloads["other"] = ExecutePayload(run_id="run-other", input=[1])
    fake_server.payloads["ref-x"] = ExecutePayload(run_id="run-x", input=[1])
    body = encode(ExecuteRequest(run_id="run-x", workflow_id="sum", payload_ref="missing"))
    answer = await client.handle(
        "POST", {SIGNATURE_HEADER: keys.request_header(body, now=int(time.time()))}, body
    )
    assert answer.status == 502
    assert msgspec.json.decode(answer.body, type=ErrorResponse).code == "payload.not_found"

    fake_server.sign_responses_with = "wrong-key"
    body = b'{"action":"sync","url":null}'
    answer = await client.handle(
        "POST", {SIGNATURE_HEADER.lower(): keys.request_header(body, now=int(time.time()))}, body
    )
    assert answer.status == 502
    assert msgspec.json.decode(answer.body, type=ErrorResponse).code == "signature.mismatch"
    await client.aclose()


async def test_checkpoint_mode_still_plans_parallel_steps(fake_server: Any) -> None:
    import asyncio

    from ductor.protocol import StepPlannedOp

    client = Client(
        "shop", signing_key=KEY, server_url=fake_server.url, api_key=API_KEY, checkpoint=True
    )

    @client.workflow("par")
    async def par(ctx: Context, _: Any) -> list[int]:
        one = await ctx.step.run("one", lambda: 1)
        rest = await asyncio.gather(
            ctx.step.run("two", lambda: 2), ctx.step.run("three", lambda: 3)
        )
        return [one, *rest]

    response = await client.execute(ExecuteRequest(run_id="run-p", workflow_id="par"))
    await client.aclose()
    assert [type(op) for op in response.opcodes] == [StepPlannedOp, StepPlannedOp]
    reported = [op for cp in fake_server.checkpoints for op in cp.opcodes]
    assert reported == [StepRunOp(id=step_id("one"), name="one", result=1)]


async def test_inline_run_with_checkpoints_down_hands_over_after_the_first_step(
    fake_server: Any,
) -> None:
    calls: Counter[str] = Counter()
    client = make_client(fake_server, calls)
    fake_server.fail_checkpoints = True
    run = await client.run_inline("sum", [1, 2, 3])
    await client.aclose()
    assert run.status == "RUN_STATUS_RUNNING"  # the engine re-drives it from the start
    assert calls == {"add": 1}  # it stopped at the first unreported step
    checkpoint_calls = [r for r in fake_server.received if r[1].endswith("/checkpoint")]
    assert len(checkpoint_calls) == 2  # the step, then the final report: both refused
