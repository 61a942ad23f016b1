"""Replay overhead of the bridge SDK per memoized step.

For workflows of N = 10, 100 and 1000 steps whose results are all recorded, one
execute replays every step and completes the run. The baseline, measured in the
same run, awaits the same plain async function N times directly. Printed: the
ratio (replay / baseline) and absolute microseconds per step for both.

    uv run python bench/sdk_replay.py [--repeat 7]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable

from ductor import Client, Context
from ductor.protocol import ExecuteRequest, OpcodeName, RunCompleteOp, StepKeys, StepRecord, step_id

SIZES = (10, 100, 1000)


async def work(i: int) -> int:
    return i + 1


def build(n: int) -> tuple[Client, ExecuteRequest]:
    client = Client("bench", signing_key="bench-key")

    @client.workflow(f"steps-{n}")
    async def body(ctx: Context, count: int) -> int:
        total = 0
        for i in range(count):
            total += await ctx.step.run("step", work, i)
        return total

    keys = StepKeys()
    history = [
        StepRecord(id=step_id(keys.key("step")), name="step", op=OpcodeName.STEP_RUN, result=i + 1)
        for i in range(n)
    ]
    request = ExecuteRequest(run_id="run", workflow_id=f"steps-{n}", input=n, steps=history)
    return client, request


async def baseline(n: int) -> int:
    total = 0
    for i in range(n):
        total += await work(i)
    return total


async def timed(fn: Callable[[], Awaitable[object]], loops: int, repeat: int) -> float:
    """Best-of-`repeat` seconds per call of `fn`, over `loops` calls each."""
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(loops):
            await fn()
        samples.append((time.perf_counter() - start) / loops)
    return min(samples)


async def main(repeat: int) -> None:
    print(f"{'N':>6} {'replay µs/step':>15} {'direct µs/step':>15} {'ratio':>8} {'execute ms':>11}")
    totals: dict[int, float] = {}
    for n in SIZES:
        client, request = build(n)
        answer = await client.execute(request)
        expected = n * (n + 1) // 2
        assert answer.opcodes == [RunCompleteOp(output=expected)], answer
        loops = max(20, 50_000 // n)
        replay = await timed(lambda c=client, r=request: c.execute(r), loops, repeat)
        direct = await timed(lambda n=n: baseline(n), loops * 10, repeat)
        totals[n] = replay
        per_replay = replay / n * 1e6
        per_direct = direct / n * 1e6
        print(
            f"{n:>6} {per_replay:>15.2f} {per_direct:>15.3f} {per_replay / per_direct:>7.0f}x"
            f" {replay * 1e3:>11.3f}"
        )
    low, high = SIZES[0], SIZES[-1]
    marginal = (totals[high] - totals[low]) / (high - low) * 1e6
    fixed = totals[low] * 1e6 - marginal * low
    print(
        f"marginal cost per memoized step: {marginal:.2f} µs;"
        f" fixed cost per execute: {fixed:.0f} µs"
    )
    print("replay µs/step = one execute that replays N recorded steps, divided by N")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    asyncio.run(main(parser.parse_args().repeat))
