"""Benchmark: the pure tick per step on 1,000-step DAGs, as a ratio to persisting the state.

Run: uv run python bench/tick.py [--steps N] [--repeat R]

Shapes, each driven to completion the way the coordinator drives a run (one
input per tick, the state decoded before and encoded after every tick):

- chain:   N worker steps in a line, each result starts the next step;
- wide:    one root, N-2 parallel worker steps, one join; results one per tick;
- wide/batch: the same, with all N-2 results in a single tick (batching);
- scatter items: one SCATTER of N items, 50 at a time (cost per item);
- dataflow chain: steps evaluated inline with CEL (one `start_run` does all).

It also reports what finding the definition's index costs: built cold, found
by content for an equal definition decoded afresh, found by identity.

The baseline, measured in the same run on the same states, is msgspec JSON
encode + decode of the RunState, which the coordinator pays per tick anyway.
`scaling` compares the per-step tick cost on N steps with that on N/10 steps:
about 1.0 means a tick costs what it touches, not the size of the graph.
Times are CPU seconds of this process, the median of several repeats.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from itertools import pairwise
from typing import Any

import msgspec

from ductor_core import (
    AttemptResult,
    DispatchTask,
    RunInput,
    RunState,
    WorkflowDefinition,
    definition_from_obj,
    start_run,
    tick,
)
from ductor_core._step_index import build_index, index_for
from ductor_core.expressions import ENGINE_NAMES, engine_by_name

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _action(ref: str) -> dict[str, Any]:
    return {"ref": ref, "type": "STEP_TYPE_ACTION", "args": {"action": "http.post"}}


def chain(steps: int) -> WorkflowDefinition:
    refs = [f"s{i}" for i in range(steps)]
    return definition_from_obj(
        {
            "family_slug": "bench-chain",
            "steps": [_action(r) for r in refs],
            "edges": [{"source_ref": a, "target_ref": b} for a, b in pairwise(refs)],
        }
    )


def wide(steps: int) -> WorkflowDefinition:
    middle = [f"m{i}" for i in range(steps - 2)]
    return definition_from_obj(
        {
            "family_slug": "bench-wide",
            "steps": [_action("root"), *(_action(r) for r in middle), _action("join")],
            "edges": [
                *({"source_ref": "root", "target_ref": r} for r in middle),
                *({"source_ref": r, "target_ref": "join"} for r in middle),
            ],
        }
    )


def scatter(items: int) -> WorkflowDefinition:
    return definition_from_obj(
        {
            "family_slug": "bench-scatter",
            "steps": [
                {
                    "ref": "fan",
                    "type": "STEP_TYPE_SCATTER",
                    "args": {
                        "items": f"[{', '.join(str(i) for i in range(items))}]",
                        "max_concurrency": 50,
                        "step": {"type": "STEP_TYPE_ACTION", "args": {"action": "http.post"}},
                    },
                }
            ],
        }
    )


def dataflow_chain(steps: int) -> WorkflowDefinition:
    out = [
        {
            "ref": "s0",
            "type": "STEP_TYPE_DATAFLOW",
            "args": {"operation": "project", "project": {"n": "input.n"}},
        }
    ]
    for i in range(1, steps):
        out.append(
            {
                "ref": f"s{i}",
                "type": "STEP_TYPE_DATAFLOW",
                "args": {"operation": "project", "project": {"n": f"steps.s{i - 1}.output.n + 1"}},
            }
        )
    return definition_from_obj(
        {
            "family_slug": "bench-dataflow",
            "steps": out,
            "edges": [{"source_ref": f"s{i - 1}", "target_ref": f"s{i}"} for i in range(1, steps)],
        }
    )


def _result(task: DispatchTask) -> AttemptResult:
    return AttemptResult(
        step_ref=task.step_ref,
        item_index=task.item_index,
        attempt=task.attempt,
        ok=True,
        output={"ok": True},
    )


_decoder = msgspec.json.Decoder(RunState)
_encoder = msgspec.json.Encoder()


def drive(definition: WorkflowDefinition, *, batch: bool) -> tuple[float, float, int]:
    """Run `definition` to the end; return (tick CPU s, baseline CPU s, ticks)."""
    clock = time.process_time
    started = clock()
    first = start_run(definition, run_id="bench", input={"n": 1}, now=NOW)
    tick_time = clock() - started
    base_time = 0.0
    state = first.state
    pending = [_result(c) for c in first.commands if isinstance(c, DispatchTask)]
    ticks = 1
    while not state.status.terminal:
        assert pending, "run stuck"
        inputs: list[RunInput]
        if batch:
            inputs, pending = list(pending), []
        else:
            inputs = [pending.pop(0)]
        # the baseline: what persisting this state costs (decode + encode)
        started = clock()
        raw = _encoder.encode(state)
        decoded = _decoder.decode(raw)
        base_time += clock() - started
        state = decoded
        started = clock()
        result = tick(definition, state, inputs, NOW)
        tick_time += clock() - started
        ticks += 1
        # dropped outside the timed region: freeing the previous state is not tick work
        state = result.state
        pending.extend(_result(c) for c in result.commands if isinstance(c, DispatchTask))
        del result
    assert state.status.value == "RUN_STATUS_SUCCEEDED", state.status
    return tick_time, base_time, ticks


def median_of(repeat: int, fn: Callable[[], tuple[float, float, int]]) -> tuple[float, float, int]:
    runs = [fn() for _ in range(repeat)]
    return (
        statistics.median(r[0] for r in runs),
        statistics.median(r[1] for r in runs),
        runs[0][2],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    opts = parser.parse_args()
    n, repeat = opts.steps, opts.repeat

    print(f"tick benchmark: {n} steps, median of {repeat} (CPU time)")
    print(f"{'shape':<16}{'ticks':>7}{'tick us/step':>14}{'base us/tick':>14}{'ratio':>8}")
    per_step: dict[str, float] = {}
    for name, definition, batch in (
        ("chain", chain(n), False),
        ("wide", wide(n), False),
        ("wide/batch", wide(n), True),
        ("scatter items", scatter(n), False),
    ):
        tick_s, base_s, ticks = median_of(repeat, lambda d=definition, b=batch: drive(d, batch=b))
        per_step[name] = tick_s / n
        base_per_tick = base_s / max(1, ticks - 1)
        tick_per_tick = tick_s / ticks
        print(
            f"{name:<16}{ticks:>7}{tick_s / n * 1e6:>14.1f}{base_per_tick * 1e6:>14.1f}"
            f"{tick_per_tick / base_per_tick:>8.2f}"
        )
    print("  ratio = tick CPU per tick / (encode + decode of the RunState) per tick")

    small = max(10, n // 10)
    small_s, _, _ = median_of(repeat, lambda: drive(chain(small), batch=False))
    print(
        f"scaling: chain per-step tick cost at {n} steps / at {small} steps = "
        f"{per_step['chain'] / (small_s / small):.2f} (1.0 = independent of graph size)"
    )

    definition = chain(n)
    raw = msgspec.json.encode(definition)
    fresh = [msgspec.json.decode(raw, type=WorkflowDefinition) for _ in range(2 * repeat + 1)]
    clock = time.perf_counter
    started = clock()
    build_index(fresh[0])
    cold = clock() - started
    index_for(fresh[0])
    hits = []
    for other in fresh[1:]:
        started = clock()
        index_for(other)
        hits.append(clock() - started)
    started = clock()
    for _ in range(1000):
        index_for(fresh[0])
    same = (clock() - started) / 1000
    print(
        f"definition index ({n} steps): build {cold * 1e3:.1f} ms, "
        f"equal definition decoded afresh {statistics.median(hits) * 1e3:.2f} ms, "
        f"same object {same * 1e6:.1f} us"
    )

    flow_steps = n
    flow = dataflow_chain(flow_steps)
    for engine_name in ENGINE_NAMES:
        engine = engine_by_name(engine_name)
        start_run(flow, run_id="warm", input={"n": 1}, now=NOW, engine=engine)  # compile
        times = []
        for _ in range(repeat):
            started = time.process_time()
            result = start_run(flow, run_id="bench", input={"n": 1}, now=NOW, engine=engine)
            times.append(time.process_time() - started)
            assert result.state.output == {f"s{flow_steps - 1}": {"n": flow_steps}}
        flow_us = statistics.median(times) / flow_steps * 1e6
        print(
            f"dataflow chain ({flow_steps} steps, one CEL expression each, inline, {engine_name}): "
            f"{flow_us:.1f} us/step = {flow_us / (per_step['chain'] * 1e6):.1f}x a worker step"
        )


if __name__ == "__main__":
    main()
