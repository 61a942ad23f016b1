"""Benchmark: CEL evaluations per second, per engine, as a ratio to plain Python.

Run: uv run python bench/expressions.py [--seconds S]

Each case is measured against a baseline in the same run: a plain Python
function that computes the same answer from the same dicts (no CEL at all).
A ratio of 40x means the engine takes 40 times as long as that function.
Times are CPU time of this process (`time.process_time`), so other work on a
busy machine does not inflate them; every figure is the best of three runs.

Every engine is measured two ways:

- mapping: `program.evaluate(activation_dict)`, which converts the variables
           on every call;
- bound:   `engine.bind(activation)` once, then `program.evaluate(bound)`, the
           way a routing decision evaluates many rules against one routable.

The last table is a routing decision: bind one routable, evaluate 100 rules
(first-match semantics disabled, so all 100 run), the figure routing needs to
reach 5,000 decisions/s.
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Callable
from typing import Any

from ductor_core.expressions import (
    ENGINE_NAMES,
    CelPyEngine,
    CelRustEngine,
    CompiledExpression,
    ExpressionEngine,
    engine_by_name,
)

# Engines with their own caches, for measuring compiles.
FRESH_ENGINES: dict[str, ExpressionEngine] = {
    "cel-python": CelPyEngine(cache_size=10**7),
    "cel-rust": CelRustEngine(cache_size=10**7),
}

ROUTABLE = {
    "routable": {
        "id": "r_1",
        "kind": "lead",
        "tenant": "acme",
        "attributes": {
            "state": "CA",
            "score": 72,
            "source": "Web",
            "amount_micros": 2_500_000,
            "vertical": "auto",
            "tcpa": True,
            "age": 41.5,
            "tags": ["returning", "mobile"],
        },
    }
}
ORDERS = {
    "input": {"orders": [{"id": f"o{i}", "total": 1000 * i, "paid": i % 2 == 0} for i in range(10)]}
}


def _routing_rule(a: dict[str, Any]) -> bool:
    attributes = a["routable"]["attributes"]
    return bool(attributes["state"] in ("CA", "NY") and attributes["score"] > 50)


def _dataflow_map(a: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"id": o["id"], "total": o["total"] * 2} for o in a["input"]["orders"] if o["paid"]]


def _custom_function(a: dict[str, Any]) -> bool:
    return bool(a["routable"]["attributes"]["source"].lower() == "web")


CASES: list[tuple[str, str, dict[str, Any], Callable[[dict[str, Any]], Any]]] = [
    (
        "routing rule",
        'routable.attributes.state in ["CA", "NY"] && routable.attributes.score > 50',
        ROUTABLE,
        _routing_rule,
    ),
    (
        "rule, flat vars",
        'attributes.state in ["CA", "NY"] && attributes.score > 50',
        {"attributes": ROUTABLE["routable"]["attributes"]},
        lambda a: _routing_rule({"routable": a}),
    ),
    (
        "dataflow map",
        "input.orders.filter(o, o.paid).map(o, {'id': o.id, 'total': o.total * 2})",
        ORDERS,
        _dataflow_map,
    ),
    (
        "custom function",
        "lower(routable.attributes.source) == 'web'",
        ROUTABLE,
        _custom_function,
    ),
]


def rate(call: Callable[[], Any], seconds: float) -> float:
    """Calls per CPU second of `call`, run for about `seconds` (best of three)."""
    clock = time.process_time
    batch = 1
    while True:
        start = clock()
        for _ in range(batch):
            call()
        if clock() - start > seconds / 20:
            break
        batch *= 2
    best = 0.0
    for _ in range(3):
        start = clock()
        count = 0
        while clock() - start < seconds / 3:
            for _ in range(batch):
                call()
            count += batch
        best = max(best, count / (clock() - start))
    return best


def rules(count: int) -> list[str]:
    """`count` distinct routing rules of the usual shapes; none matches the routable."""
    states = ["NY", "TX", "FL", "WA", "OR"]
    out = []
    for i in range(count):
        shape = i % 4
        if shape == 0:
            out.append(
                f"routable.attributes.state == '{states[i % 5]}' && routable.attributes.score > {i}"
            )
        elif shape == 1:
            out.append(f"routable.attributes.amount_micros > {10_000_000 + i}")
        elif shape == 2:
            out.append(
                f"routable.kind == 'ticket' && '{states[i % 5]}' in routable.attributes.tags"
            )
        else:
            out.append(f"has(routable.attributes.rule_{i}) && routable.attributes.tcpa")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="time per measurement")
    args = parser.parse_args()
    seconds: float = args.seconds

    header = f"{'case':<16} {'engine':<11} {'mode':<8} {'evals/s':>12} {'us/eval':>9}"
    print(f"{header} {'vs python':>10} {'vs cel-python':>14}")
    for label, source, activation, baseline in CASES:
        base = rate(lambda b=baseline, a=activation: b(a), seconds)
        print(f"{label:<16} {'python':<11} {'-':<8} {base:>12,.0f} {1e6 / base:>9.2f} {'1.0x':>10}")
        reference: dict[str, float] = {}
        for name in ENGINE_NAMES:
            engine = engine_by_name(name)
            program = engine.compile(source)
            assert program.evaluate(activation) == baseline(activation), (name, label)
            bound = engine.bind(activation)
            for mode, variables in (("mapping", activation), ("bound", bound)):
                per_second = rate(lambda p=program, v=variables: p.evaluate(v), seconds)
                reference.setdefault(mode, per_second)
                print(
                    f"{label:<16} {name:<11} {mode:<8} {per_second:>12,.0f} "
                    f"{1e6 / per_second:>9.2f} {base / per_second:>9.1f}x "
                    f"{per_second / reference[mode]:>12.1f}x faster"
                )

    print()
    print("compile (cache miss): distinct routing rules, per engine")
    print(f"{'engine':<11} {'compiles/s':>12} {'us/compile':>12}")
    for name in ENGINE_NAMES:
        numbers = itertools.count()
        per_second = rate(
            lambda e=FRESH_ENGINES[name], n=numbers: e.compile(
                f"routable.attributes.score > {next(n)}"
            ),
            seconds,
        )
        print(f"{name:<11} {per_second:>12,.0f} {1e6 / per_second:>12.1f}")

    count = 100
    sources = rules(count)
    python_rules = [_routing_rule] * count

    def python_decision() -> None:
        for rule in python_rules:
            rule(ROUTABLE)

    base = rate(python_decision, seconds)
    print()
    print(f"routing decision: bind one routable, evaluate {count} rules")
    print(f"{'engine':<11} {'decisions/s':>12} {'us/decision':>12} {'vs python':>10}")
    print(f"{'python':<11} {base:>12,.0f} {1e6 / base:>12.1f} {'1.0x':>10}")
    for name in ENGINE_NAMES:
        engine = engine_by_name(name)
        programs: list[CompiledExpression] = [engine.compile(s) for s in sources]

        def decision(e: Any = engine, ps: list[CompiledExpression] = programs) -> None:
            bound = e.bind(ROUTABLE)
            for p in ps:
                p.evaluate(bound)

        assert not any(p.evaluate(ROUTABLE) for p in programs)
        per_second = rate(decision, seconds)
        print(
            f"{name:<11} {per_second:>12,.0f} {1e6 / per_second:>12.1f} {base / per_second:>9.1f}x"
        )


if __name__ == "__main__":
    main()
