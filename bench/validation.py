"""Benchmark: validating a generated 1,000-step definition, as a ratio to decoding it.

Run: uv run python bench/validation.py [--steps N] [--repeat R]

The baseline, measured in the same run, is `msgspec.json.decode` of the same
JSON into `WorkflowDefinition` (typed, strict: the cheapest way to accept a
definition at all). Validation is measured four ways:

- walk only:  an engine that accepts every expression without parsing it, so
              this is the structural walk, the semantic checks and the graph;
- cold:       a fresh engine per run, so every CEL expression is compiled;
- warm:       the same engine again, every program already in its cache
              (validating a definition that was just validated, e.g. at publish);
- json warm:  `validate_definition_json` from bytes, warm engine.

Times are CPU seconds of this process, best of several runs (as `timeit`
advises: noise only ever adds time), so other work on a shared machine skews
the ratios as little as it can.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from ductor_core import WorkflowDefinition, validate_definition, validate_definition_json
from ductor_core.expressions import (
    BoundVariables,
    CelPyEngine,
    CelRustEngine,
    CompiledExpression,
    ExpressionEngine,
    FunctionRegistry,
)


def generate(steps: int) -> dict[str, Any]:
    """A chain of fan-out/fan-in blocks: split -> 4 parallel actions -> join.

    Every step carries CEL that names the steps before it, so expressions are
    distinct and none can be shared between steps.
    """
    out: list[dict[str, Any]] = []
    edges: list[dict[str, Any]] = []
    previous: str | None = None
    block = 0
    while len(out) < steps:
        split = f"split_{block}"
        source = f"steps.{previous}.output" if previous else "input"
        out.append(
            {
                "ref": split,
                "type": "STEP_TYPE_DATAFLOW",
                "title": f"Split {block}",
                "args": {
                    "operation": "project",
                    "project": {
                        "items": f"{source}.items",
                        "total": f"size({source}.items) + {block}",
                        "tag": f"'block-{block}'",
                    },
                },
            }
        )
        if previous:
            edges.append({"source_ref": previous, "target_ref": split, "type": "EDGE_TYPE_SUCCESS"})
        workers = []
        for lane in range(4):
            if len(out) >= steps - 1:
                break
            ref = f"act_{block}_{lane}"
            workers.append(ref)
            out.append(
                {
                    "ref": ref,
                    "type": "STEP_TYPE_ACTION",
                    "args": {
                        "action": "http.post",
                        "params": {
                            "body": f"steps.{split}.output.items[{lane}]",
                            "key": f"run.id + '-{block}-{lane}'",
                        },
                    },
                    "retry": {"max_attempts": 3, "initial_interval": "1s", "max_interval": "1m"},
                    "timeout": "30s",
                }
            )
            condition = f"steps.{split}.output.total > {lane}"
            edges.append(
                {
                    "source_ref": split,
                    "target_ref": ref,
                    "type": "EDGE_TYPE_CONDITION",
                    "condition": condition,
                }
            )
        if not workers or len(out) >= steps:
            previous = split
            break
        join = f"join_{block}"
        out.append(
            {
                "ref": join,
                "type": "STEP_TYPE_DATAFLOW",
                "args": {
                    "operation": "filter",
                    "items": "[" + ", ".join(f"steps.{w}.output" for w in workers) + "]",
                    "predicate": f"item != null && item.status == {block}",
                },
            }
        )
        edges += [
            {"source_ref": w, "target_ref": join, "type": "EDGE_TYPE_ALWAYS"} for w in workers
        ]
        previous = join
        block += 1
    return {
        "family_slug": "bench-fan",
        "title": "Generated fan-out/fan-in chain",
        "steps": out,
        "edges": edges,
        "triggers": [{"event": "bench.start", "filter": "event.data.size > 0"}],
        "output": f"steps.{previous}.output",
    }


class _AcceptingEngine:
    """Compiles nothing: isolates the walk from CEL parsing."""

    name = "accept-all"

    def __init__(self) -> None:
        self._real = CelPyEngine()

    @property
    def functions(self) -> FunctionRegistry:
        return self._real.functions

    def compile(self, source: str) -> CompiledExpression:
        return _Accepted(source)

    def evaluate(self, source: str, activation: Any) -> Any:
        # Validation only compiles; this engine exists to time the walk alone.
        raise RuntimeError("the accept-all bench engine never evaluates")

    def bind(self, activation: Mapping[str, Any]) -> BoundVariables:
        return self._real.bind(activation)


class _Accepted:
    def __init__(self, source: str) -> None:
        self.source = source

    def evaluate(self, activation: Any) -> Any:
        raise RuntimeError("the accept-all bench engine never evaluates")


def measure(
    run: Callable[[], object], repeat: int, setup: Callable[[], None] | None = None
) -> float:
    """Best CPU time of `run` in seconds over `repeat` runs (setup is not timed)."""
    times = []
    for _ in range(repeat):
        if setup is not None:
            setup()
        start = time.process_time()
        run()
        times.append(time.process_time() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()

    raw = generate(args.steps)
    data = json.dumps(raw).encode()
    expressions = _count_expressions(raw)
    print(
        f"definition: {len(raw['steps'])} steps, {len(raw['edges'])} edges, "
        f"{expressions} CEL expressions, {len(data) / 1024:.0f} KiB of JSON"
    )

    decoder = msgspec.json.Decoder(WorkflowDefinition)
    baseline = measure(lambda: decoder.decode(data), args.repeat * 5)
    rows: list[tuple[str, float]] = [("baseline: msgspec decode", baseline)]

    accept = _AcceptingEngine()
    rows.append(
        ("walk only", measure(lambda: validate_definition(raw, engine=accept), args.repeat))
    )

    engines: dict[str, Callable[[], ExpressionEngine]] = {
        "cel-python": CelPyEngine,
        "cel-rust": CelRustEngine,
    }
    for name, make in engines.items():
        try:
            make()
        except Exception as exc:  # an optional engine may be missing here
            print(f"({name} not available: {exc})")
            continue
        rows += _engine_rows(name, make, raw, data, args.repeat)

    width = max(len(label) for label, _ in rows)
    print(f"{'measure':<{width}}  {'ms':>9}  {'x baseline':>10}")
    for label, seconds in rows:
        print(f"{label:<{width}}  {seconds * 1000:9.2f}  {seconds / baseline:10.1f}")


def _engine_rows(
    name: str, make: Callable[[], ExpressionEngine], raw: Any, data: bytes, repeat: int
) -> list[tuple[str, float]]:
    engines: list[ExpressionEngine] = []

    def fresh() -> None:
        engines[:] = [make()]

    def with_latest() -> object:
        return validate_definition(raw, engine=engines[0])

    cold = measure(with_latest, max(2, repeat // 2), setup=fresh)
    fresh()
    report = validate_definition(raw, engine=engines[0])
    assert report.valid, report.problems[:3]
    warm = measure(with_latest, repeat)
    from_json = measure(lambda: validate_definition_json(data, engine=engines[0]), repeat)
    return [
        (f"cold ({name})", cold),
        (f"warm ({name})", warm),
        (f"json warm ({name})", from_json),
    ]


def _count_expressions(raw: dict[str, Any]) -> int:
    count = 1 + len(raw["triggers"])
    for step in raw["steps"]:
        args = step["args"]
        count += len(args.get("project", {})) + len(args.get("params", {}))
        count += sum(1 for key in ("items", "predicate") if key in args)
    count += sum(1 for edge in raw["edges"] if "condition" in edge)
    return count


if __name__ == "__main__":
    main()
