"""The expression sandbox: same answers as in-process, runaway evaluations cut at the
deadline or the memory cap, dead processes replaced, the common path untouched."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from ductor_core.errors import ExpressionError
from ductor_core.expressions import CelRustEngine, CostLimits, estimate_cost
from ductor_server.composition import build
from ductor_server.sandbox import (
    RESOURCE_EXHAUSTED,
    SANDBOX_UNAVAILABLE,
    SandboxedEngine,
    SandboxedProgram,
    SandboxLimits,
    SandboxPool,
    WatchedProgram,
)
from ductor_server.settings import Settings

# Deadlines of a second that include a child process's start: run alone.
pytestmark = pytest.mark.serial

CORPUS = Path(__file__).parents[3] / "ductor-core/tests/data/cel_corpus.json"
LISTS = {"input": {"a": list(range(100)), "b": list(range(100)), "c": list(range(100))}}
JOIN = "input.a.map(x, input.b.filter(y, y == x).size())"
# Accepted by the estimate (about 790,000 units) yet seconds of cel-rust CPU:
# cel-rust's map() copies the list it builds at every step, which the estimate
# prices linearly.
RUNAWAY = "size([" + ",".join(str(i) for i in range(70)) + "].map(x, input.b.map(y, input.c)))"


@pytest.fixture
def inner() -> CelRustEngine:
    return CelRustEngine()


@pytest.fixture
def pool(inner: CelRustEngine) -> Iterator[SandboxPool]:
    made = SandboxPool(
        "cel-rust", limits=inner.limits, sandbox=SandboxLimits(processes=1, timeout=1.0)
    )
    try:
        yield made
    finally:
        made.close()


def test_cheap_expressions_run_the_inner_engines_own_programs(
    inner: CelRustEngine, pool: SandboxPool
) -> None:
    engine = SandboxedEngine(inner, pool)
    rule = "routable.attributes.state in ['CA', 'TX'] && routable.attributes.score > 50"
    assert engine.compile(rule) is inner.compile(rule)
    assert engine.bind == inner.bind  # until a program is sandboxed
    assert engine.evaluate(rule, {"routable": {"attributes": {"state": "CA", "score": 60}}})
    assert isinstance(engine.compile(JOIN), SandboxedProgram)
    assert engine.bind != inner.bind
    assert pool.pids() == []  # processes start with the first sandboxed evaluation
    assert engine.evaluate(JOIN, LISTS) == [1] * 100
    assert len(pool.pids()) == 1


def test_heavy_list_items_send_a_cheap_looking_filter_to_the_sandbox(
    inner: CelRustEngine,
) -> None:
    # Estimated at 304 units before the items are seen; cel-rust's filter()
    # copies the list it builds at every step, deeply: about half a second
    # in-process for 100 items of 1,000 numbers (480 KiB of JSON).
    source = "input.items.filter(x, x.paid).size()"

    def items(numbers: int, count: int = 100) -> dict[str, Any]:
        return {"input": {"items": [{"paid": True, "lines": list(range(numbers))}] * count}}

    # A deadline the heavy evaluation cannot meet shows where it ran.
    pool = SandboxPool(
        "cel-rust", limits=inner.limits, sandbox=SandboxLimits(processes=1, timeout=0.2)
    )
    try:
        engine = SandboxedEngine(inner, pool)
        program = engine.compile(source)
        assert isinstance(program, WatchedProgram)
        assert program.evaluate(items(2, count=10)) == 10
        assert program.evaluate(engine.bind(items(2, count=10))) == 10
        assert pool.pids() == []  # light inputs stay in-process
        assert program.evaluate(items(10)) == 100  # 10,219 units: in the sandbox
        assert len(pool.pids()) == 1
        for heavy in (items(1000), engine.bind(items(1000))):
            with pytest.raises(ExpressionError) as caught:
                program.evaluate(heavy)
            assert caught.value.code == RESOURCE_EXHAUSTED
        assert inner.evaluate(source, items(1000)) == 100  # in-process, no deadline
    finally:
        pool.close()


def test_the_corpus_gives_the_same_answers_in_the_sandbox(
    inner: CelRustEngine, pool: SandboxPool
) -> None:
    corpus = json.loads(CORPUS.read_text())
    forced = SandboxedEngine(inner, pool, threshold=0)
    checked = 0
    for case in corpus["cases"]:
        if "differs" in case:
            continue  # some are hash-ordered: they differ between any two processes
        activation = corpus["activations"][case.get("activation", "default")]
        try:
            expected: Any = ("value", inner.evaluate(case["expr"], activation))
        except ExpressionError as exc:
            expected = ("error", exc.code, exc.message)
        try:
            found: Any = ("value", forced.evaluate(case["expr"], activation))
        except ExpressionError as exc:
            found = ("error", exc.code, exc.message)
        assert found == expected, case["id"]
        checked += 1
    assert checked > 450


def test_time_values_and_bytes_cross_the_pipe(inner: CelRustEngine, pool: SandboxPool) -> None:
    forced = SandboxedEngine(inner, pool, threshold=0)
    activation = {
        "now": datetime(2024, 3, 1, 12, 0, tzinfo=UTC),
        "wait": timedelta(seconds=90, microseconds=5),
        "blob": b"\x00\xff",
        "big": 2**64 - 1,
        "ratio": 3.0,
    }
    for source in ("now + wait", "wait", "blob", "big", "ratio", "[now, wait, blob, big]"):
        assert forced.evaluate(source, activation) == inner.evaluate(source, activation), source


def test_bound_variables_reach_the_sandbox(inner: CelRustEngine, pool: SandboxPool) -> None:
    engine = SandboxedEngine(inner, pool)
    program = engine.compile(JOIN)
    assert isinstance(program, SandboxedProgram)
    bound = engine.bind(LISTS)
    assert program.evaluate(bound) == [1] * 100
    assert engine.compile("input.a[3]").evaluate(bound) == 3  # in-process, same bound
    assert pool.pids() != []


def test_a_runaway_evaluation_is_cut_at_the_deadline(
    inner: CelRustEngine, pool: SandboxPool
) -> None:
    engine = SandboxedEngine(inner, pool)
    assert estimate_cost(RUNAWAY).cost < inner.limits.max_cost  # the estimate accepts it
    engine.evaluate(JOIN, LISTS)
    (first,) = pool.pids()
    started = time.monotonic()
    with pytest.raises(ExpressionError) as caught:
        engine.evaluate(RUNAWAY, LISTS)
    assert time.monotonic() - started < 3
    assert caught.value.code == RESOURCE_EXHAUSTED
    assert caught.value.retryable is False
    assert caught.value.details == {"limit": "time", "maximum": 1.0, "phase": "evaluate"}
    assert "longer than 1s" in caught.value.message
    assert pool.pids() == []
    with pytest.raises(ProcessLookupError):
        os.kill(first, 0)
    assert engine.evaluate(JOIN, LISTS) == [1] * 100  # a fresh process
    assert pool.pids() != [first]
    assert pool.restarts == 1


def test_an_evaluation_that_kills_its_process_is_an_error_not_a_crash() -> None:
    # Limits loose enough to accept a 256 MiB string, a process capped well below
    # what building it takes: cel-rust aborts the sandbox process, not this one.
    loose = CostLimits(max_cost=10**12, max_string_length=2**40)
    inner = CelRustEngine(limits=loose)
    bomb = "size(['xxxxxxxx']" + ".map(s, s + s)" * 25 + "[0])"
    pool = SandboxPool(
        "cel-rust",
        limits=loose,
        sandbox=SandboxLimits(processes=1, timeout=30.0, memory_bytes=400 * 1024**2),
    )
    engine = SandboxedEngine(inner, pool)
    try:
        with pytest.raises(ExpressionError) as caught:
            engine.evaluate(bomb, {})
        assert caught.value.code == RESOURCE_EXHAUSTED
        assert caught.value.details["limit"] == "memory"
        assert "400 MiB" in caught.value.message
        assert engine.evaluate("size(['ab']" + ".map(s, s + s)" * 4 + "[0])", {}) == 32
        assert pool.restarts == 1
    finally:
        pool.close()


def test_a_process_killed_between_evaluations_is_replaced_silently(
    inner: CelRustEngine, pool: SandboxPool
) -> None:
    engine = SandboxedEngine(inner, pool)
    engine.evaluate(JOIN, LISTS)
    (pid,) = pool.pids()
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.1)
    assert engine.evaluate(JOIN, LISTS) == [1] * 100
    assert pool.pids() not in ([], [pid])


def test_errors_keep_their_codes_and_messages(inner: CelRustEngine, pool: SandboxPool) -> None:
    forced = SandboxedEngine(inner, pool, threshold=0)
    many = {"input": {"a": list(range(5000)), "b": list(range(5000))}}
    for source, activation in (("input.a.map(x, 1 / (x - x))", LISTS), (JOIN, many)):
        with pytest.raises(ExpressionError) as in_process:
            inner.evaluate(source, activation)
        with pytest.raises(ExpressionError) as sandboxed:
            forced.evaluate(source, activation)
        assert sandboxed.value.code == in_process.value.code
        assert str(sandboxed.value) == str(in_process.value)
        assert sandboxed.value.details == in_process.value.details


def test_the_settings_choose_the_sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def built(**overrides: Any) -> Any:
        return build(Settings(data_dir=tmp_path, **overrides)).expressions

    assert isinstance(built(), SandboxedEngine)
    assert built().threshold == 10_000
    assert not isinstance(built(cel_sandbox=False), SandboxedEngine)
    assert not isinstance(built(cel_engine="cel-python"), SandboxedEngine)
    monkeypatch.setenv("DUCTOR_CEL_SANDBOX", "off")
    assert Settings.from_env().cel_sandbox is False
    monkeypatch.setenv("DUCTOR_CEL_SANDBOX", "on")
    monkeypatch.setenv("DUCTOR_CEL_SANDBOX_THRESHOLD", "500")
    monkeypatch.setenv("DUCTOR_CEL_SANDBOX_TIMEOUT", "0.5")
    monkeypatch.setenv("DUCTOR_CEL_SANDBOX_MEMORY_MB", "256")
    monkeypatch.setenv("DUCTOR_CEL_SANDBOX_PROCESSES", "3")
    settings = Settings.from_env(data_dir=tmp_path)
    engine = build(settings).expressions
    assert isinstance(engine, SandboxedEngine)
    assert engine.threshold == 500
    assert engine.pool.sandbox == SandboxLimits(
        processes=3, memory_bytes=256 * 1024**2, timeout=0.5
    )
    monkeypatch.setenv("DUCTOR_CEL_SANDBOX", "maybe")
    with pytest.raises(ValueError, match="DUCTOR_CEL_SANDBOX"):
        Settings.from_env()


def test_a_closed_sandbox_is_a_retryable_error(inner: CelRustEngine, pool: SandboxPool) -> None:
    engine = SandboxedEngine(inner, pool)
    assert engine.evaluate(JOIN, LISTS) == [1] * 100
    engine.close()
    assert pool.pids() == []
    with pytest.raises(ExpressionError) as caught:
        engine.evaluate(JOIN, LISTS)
    assert caught.value.code == SANDBOX_UNAVAILABLE
    assert caught.value.retryable is True
    assert engine.evaluate("1 + 2", {}) == 3  # the common path does not need it
