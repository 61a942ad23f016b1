"""Benchmark: what the expression sandbox costs, as a ratio to in-process cel-rust.

Run: uv run python bench/sandbox.py [--seconds S]

Every case is measured against in-process evaluation on the same engine in
the same run (interleaved batches, best of five, wall-clock time: the sandbox's work happens in
another process, so this process's CPU time would hide it).

- common path: expressions under the threshold, evaluated through the
  `SandboxedEngine` against a mapping, and bound once then evaluated (a
  routing decision). These run the inner engine's own program objects.
- sandboxed: expressions at or over the threshold, each evaluation a round
  trip to a sandbox process; and a trivial expression forced into the sandbox
  (threshold 0), which is the round trip alone.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from ductor_core.expressions import CelRustEngine, estimate_cost
from ductor_server.sandbox import SandboxedEngine, SandboxLimits, SandboxPool

RULE = "routable.attributes.state in ['CA', 'TX'] && routable.attributes.score > 50"
DATAFLOW = "input.items.filter(i, i.qty > 0).map(i, i.price * i.qty)"
ROUTABLE = {"routable": {"attributes": {"state": "CA", "score": 72, "source": "web"}}}
ITEMS = {"input": {"items": [{"qty": i % 3, "price": i} for i in range(10)]}}
LISTS = {"input": {"a": list(range(100)), "b": list(range(100))}}
JOIN = "input.a.map(x, input.b.filter(y, y == x).size())"
SMALL_JOIN = "input.a.map(x, input.b.exists(y, y == x))"


def calls_for(run: Callable[[], Any], seconds: float) -> int:
    """How many calls of `run` take about `seconds` / 10."""
    run()
    calls = 1
    while True:
        start = time.perf_counter()
        for _ in range(calls):
            run()
        if time.perf_counter() - start > seconds / 10:
            return calls
        calls *= 2


def compare(
    base: Callable[[], Any], other: Callable[[], Any], seconds: float
) -> tuple[float, float]:
    """Seconds per call of each: batches interleaved (so both see the same machine),
    the best of five each."""
    calls = calls_for(base, seconds)
    found: list[list[float]] = [[], []]
    for _ in range(5):
        for index, run in enumerate((base, other)):
            start = time.perf_counter()
            for _ in range(calls):
                run()
            found[index].append((time.perf_counter() - start) / calls)
    return min(found[0]), min(found[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=0.5)
    args = parser.parse_args()
    inner = CelRustEngine()
    pool = SandboxPool("cel-rust", limits=inner.limits, sandbox=SandboxLimits(processes=1))
    wrapped = SandboxedEngine(inner, pool)
    forced = SandboxedEngine(inner, pool, threshold=0)
    rows: list[tuple[str, float, float]] = []

    def row(label: str, base: Callable[[], Any], other: Callable[[], Any]) -> None:
        rows.append((label, *compare(base, other, args.seconds)))

    try:
        row(
            "rule, mapping (common path)",
            lambda: inner.evaluate(RULE, ROUTABLE),
            lambda: wrapped.evaluate(RULE, ROUTABLE),
        )
        program, same = inner.compile(RULE), wrapped.compile(RULE)
        row(
            "rule, bind + evaluate (common path)",
            lambda: program.evaluate(inner.bind(ROUTABLE)),
            lambda: same.evaluate(wrapped.bind(ROUTABLE)),
        )
        row("bind (common path)", lambda: inner.bind(ROUTABLE), lambda: wrapped.bind(ROUTABLE))
        bound, bound_wrapped = inner.bind(ROUTABLE), wrapped.bind(ROUTABLE)
        row(
            "rule, bound once (common path)",
            lambda: program.evaluate(bound),
            lambda: same.evaluate(bound_wrapped),
        )
        row(
            "dataflow filter().map(), 10 items (common path)",
            lambda: inner.evaluate(DATAFLOW, ITEMS),
            lambda: wrapped.evaluate(DATAFLOW, ITEMS),
        )
        row(
            "trivial `1 + 2` forced into the sandbox (round trip)",
            lambda: inner.evaluate("1 + 2", {}),
            lambda: forced.evaluate("1 + 2", {}),
        )
        row(
            "rule forced into the sandbox",
            lambda: inner.evaluate(RULE, ROUTABLE),
            lambda: forced.evaluate(RULE, ROUTABLE),
        )
        row(
            f"join exists(), cost {estimate_cost(SMALL_JOIN).cost:,} (sandboxed)",
            lambda: inner.evaluate(SMALL_JOIN, LISTS),
            lambda: wrapped.evaluate(SMALL_JOIN, LISTS),
        )
        row(
            f"join filter(), cost {estimate_cost(JOIN).cost:,} (sandboxed)",
            lambda: inner.evaluate(JOIN, LISTS),
            lambda: wrapped.evaluate(JOIN, LISTS),
        )
    finally:
        pool.close()
    print(f"{'case':58} {'in-process':>12} {'sandbox':>12} {'ratio':>7} {'added':>10}")
    for label, base, other in rows:
        print(
            f"{label:58} {base * 1e6:10.1f}us {other * 1e6:10.1f}us"
            f" {other / base:6.2f}x {(other - base) * 1e6:8.1f}us"
        )


if __name__ == "__main__":
    main()
