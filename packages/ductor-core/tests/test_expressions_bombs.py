"""Expression bombs: each is refused at compile time on both engines, and each really is one.

A bomb is a short expression that, left to run, takes seconds of CPU, a
gigabyte of memory or the process (cel-rust aborts when an allocation
fails). Every one here is refused with `expression.too_costly` by both
engines' `compile`, within milliseconds. The proofs that they are dangerous
run the bare CEL libraries, without Ductor's limits, in a child process with
a small address space and one second of CPU: never in the test process.

Realistic expressions (routing rules, trigger filters, wait matches, edge
conditions, dataflow projections, enrichers) are accepted, and give the same
answer on both engines.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from ductor_core.errors import ExpressionError
from ductor_core.expressions import (
    ENGINE_NAMES,
    CelPyEngine,
    CelRustEngine,
    ExpressionEngine,
    estimate_cost,
)
from ductor_core.validation import validate_definition

ENGINES: dict[str, ExpressionEngine] = {"cel-python": CelPyEngine(), "cel-rust": CelRustEngine()}

L8 = "[1, 2, 3, 4, 5, 6, 7, 8]"
L10 = "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]"


def nest(ranges: list[str], variables: str, body: str) -> str:
    """`r1.map(a, r2.map(b, ... body))`."""
    for range_, variable in reversed(list(zip(ranges, variables, strict=True))):
        body = f"{range_}.map({variable}, {body})"
    return body


# id -> (what makes it a bomb, the expression). "Runtime" bombs are costly
# to evaluate; "structure" bombs are costly (or impossible) to parse or to
# walk, and are refused before any parser sees them.
RUNTIME_BOMBS: dict[str, tuple[str, str]] = {
    "nested-maps-doubled-strings": (
        "seven maps over 8-item lists (2 million runs), each building a 128-character string",
        nest([L8] * 7, "abcdefg", " + ".join(["'xxxxxxxx'"] * 16)),
    ),
    "string-doubling-chain": (
        "a string doubled 28 times: 2 GiB",
        "['xxxxxxxx']" + ".map(s, s + s)" * 28,
    ),
    "bytes-doubling-chain": (
        "bytes doubled 28 times: 2 GiB",
        "[b'xxxxxxxx']" + ".map(s, s + s)" * 28,
    ),
    "list-doubling-chain": (
        "a list doubled 28 times: a billion items",
        "[[1, 2, 3, 4]]" + ".map(l, l + l)" * 28,
    ),
    "shared-list-tree": (
        "a list holding itself twice, 30 levels: 2^30 leaves once copied out",
        "['x']" + ".map(a, [a, a])" * 30,
    ),
    "cubic-map-over-input": (
        "three maps over one input list: n^3 values",
        "input.items.map(a, input.items.map(b, input.items.map(c, a + b + c)))",
    ),
    "quartic-exists-over-input": (
        "four nested exists() over an input list: n^4 tests",
        "input.items.exists(a, input.items.exists(b, input.items.exists(c,"
        " input.items.exists(d, a + b + c + d < 0))))",
    ),
    "exists-over-map-over-map": (
        "exists() whose body maps over a map over the input: n^3",
        "input.items.exists(x, input.items.map(y, input.items.map(z, x + y + z)).size() < 0)",
    ),
    "regex-on-doubled-strings": (
        "matches() run 4,096 times over a 512 KiB doubled string",
        "['abababab']"
        + ".map(s, s + s)" * 16
        + f".map(s, {nest([L8] * 4, 'abcd', 's.matches(' + repr('^(a|b)+$') + ')')})",
    ),
    "ternary-in-six-loops": (
        "six nested maps over 10-item lists: a million conditionals",
        nest([L10] * 6, "abcdef", "a > b ? c : d"),
    ),
    "filter-over-concatenated-input": (
        "filter() nested three deep over input lists concatenated with themselves",
        "(input.items + input.items).filter(a, (input.items + input.items).filter(b,"
        " (input.items + input.items).exists(c, a + b == c + 1000)).size() > 0)",
    ),
    "custom-function-amplification": (
        "join() and split() of a whole input list inside three loops",
        "input.items.map(x, input.items.map(y, input.items.map(z,"
        " split(join(input.a, ','), ','))))",
    ),
    "map-literal-explosion": (
        "seven maps over 8-item lists, each building a map",
        nest([L8] * 7, "abcdefg", "{'a': a, 'b': b, 'c': c, 'd': d, 'e': e, 'f': f, 'g': g}"),
    ),
    "membership-in-doubled-list": (
        "`in` over a list doubled 20 times, for every pair of input items",
        "[[1]]"
        + ".map(l, l + l)" * 20
        + ".map(l, input.items.all(x, input.items.all(y, !(x * 1000 + y + 2 in l))))",
    ),
    "regex-compiled-in-a-loop": (
        "a pattern of 10,000 any-characters, compiled again for each of 100 items",
        "input.items.map(x, 'a'.matches('.{10000}'))",
    ),
    "patterns-built-in-a-loop": (
        "a different large pattern built for each of 100 items",
        "input.items.map(x, 'aaa'.matches('(.{100}){' + string(x % 50 + 50) + '}'))",
    ),
    "variable-lists-copied-in-two-loops": (
        "a list read from a variable, ten times, into a value built 10,000 times",
        "size(input.items.map(x, input.items.map(y, [" + ", ".join(["input.a"] * 10) + "])))",
    ),
}
STRUCTURE_BOMBS: dict[str, tuple[str, str]] = {
    "huge-list-literal": (
        "a list literal of 4,000 ints in 8 KiB",
        "[" + ",".join(["1"] * 4000) + "]",
    ),
    "many-list-literals": (
        "66 list literals of 40 ints each",
        "[" + ",".join(["[" + ",".join(["12"] * 40) + "]"] * 66) + "]",
    ),
    "huge-map-literal": (
        "a map literal of 700 entries",
        "{" + ",".join(f"'k{i}': {i}" for i in range(700)) + "}",
    ),
    "deep-brackets": ("lists nested 1,000 deep", "[" * 1000 + "1" + "]" * 1000),
    "deep-parentheses": ("parentheses nested 2,000 deep", "(" * 2000 + "1" + ")" * 2000),
    "long-operator-chain": ("an addition of 300 terms", "1" + " + 1" * 299),
    "long-negation-chain": ("600 negations", "!" * 600 + "true"),
    "long-member-chain": ("a field selection 450 deep", "input" + ".a" * 450),
}
BOMBS = {**RUNTIME_BOMBS, **STRUCTURE_BOMBS}
LITERAL_BOMBS = ("huge-list-literal", "many-list-literals", "huge-map-literal")

STATES = (
    "['AL', 'AK', 'AZ', 'AR', 'CA', 'CO', 'CT', 'DE', 'FL', 'GA', 'HI', 'ID', 'IL', 'IN',"
    " 'IA', 'KS', 'KY', 'LA', 'ME', 'MD', 'MA', 'MI', 'MN', 'MS', 'MO', 'MT', 'NE', 'NV',"
    " 'NH', 'NJ', 'NM', 'NY', 'NC', 'ND', 'OH', 'OK', 'OR', 'PA', 'RI', 'SC', 'SD', 'TN',"
    " 'TX', 'UT', 'VT', 'VA', 'WA', 'WV', 'WI', 'WY']"
)
REALISTIC = [
    # routing rules and enrichers
    "routable.attributes.state in ['CA', 'TX'] && routable.attributes.score > 50",
    "has(attributes.credit_score) && attributes.credit_score >= 700",
    "routable.consent.granted && attributes.state != 'NY'",
    "attributes.vertical == 'auto' && attributes.amount_micros >= 2000000"
    " && attributes.tags.exists(t, t == 'returning')",
    "local_time(now, 'America/Los_Angeles').hour >= 9"
    " && local_time(now, 'America/Los_Angeles').hour < 17"
    " && local_time(now, 'America/Los_Angeles').weekday in [1, 2, 3, 4, 5]",
    f"attributes.state in {STATES}",
    "lower(attributes.source) == 'web' || attributes.source.startsWith('partner-')",
    "attributes.email.matches('^[^@]+@(gmail|yahoo)\\\\.com$')",
    "size(attributes.tags) > 0 && !('blocked' in attributes.tags)",
    "coalesce(attributes.priority, 0) > 5 ? true : attributes.score > 90",
    "attributes.amount_micros / 1000000 > 100 ? 'large' : 'small'",
    "string(attributes.score) + '-' + attributes.state",
    # trigger filters and wait matches
    "event.data.order_id == input.id",
    "event.name == 'order.shipped' && event.data.carrier in ['UPS', 'FedEx']",
    "event.data.items.all(i, i.qty > 0) && event.data.total > 0",
    # edge conditions and waits
    "steps.route.output.assigned",
    "steps.fetch.output.status == 200 && size(steps.fetch.output.items) > 0",
    "steps.score.output.value >= 0.8 || input.priority == 'high'",
    "timestamp(input.created_at) + duration('24h') > timestamp(now)",
    # dataflow projections
    "{'id': input.id, 'name': trim(input.first_name) + ' ' + trim(input.last_name),"
    " 'email': lower(input.email)}",
    "input.orders.filter(o, o.paid).map(o, o.total)",
    "sum(input.orders.filter(o, o.paid).map(o, o.total))",
    "input.orders.map(o, {'id': o.id, 'total': o.total, 'lines': size(o.lines)})",
    "input.orders.map(o, {'id': o.id, 'skus': o.lines.map(l, l.sku)})",
    "input.orders.exists(o, o.lines.exists(l, l.sku == 'X-1'))",
    "input.orders.map(o, {'order': o.id,"
    " 'customer': input.customers.filter(c, c.id == o.customer_id).map(c, c.name)})",
    "input.orders.all(o, input.customers.exists(c, c.id == o.customer_id))",
    "input.orders.filter(o, o.paid && o.lines.all(l, l.qty > 0))"
    ".map(o, {'id': o.id, 'total': sum(o.lines.map(l, l.price * l.qty))})",
    "join(input.tags.map(t, upper(t)), ', ')",
    "split(input.csv, ',').map(s, trim(s))",
    "input.items.map(i, i.price * i.qty)",
    "max(input.orders.map(o, o.total))",
    "{'count': size(input.items), 'first': input.items[0],"
    " 'last': input.items[size(input.items) - 1]}",
    "input.tags.filter(t, t.startsWith('seg:'))",
    "{'name': upper(input.name), 'tags': input.tags + [steps.enrich.output.segment]}",
]


def realistic_variables() -> dict[str, Any]:
    orders = [
        {
            "id": f"o{i}",
            "paid": i % 3 != 0,
            "total": 1000 * i,
            "customer_id": f"c{i % 7}",
            "lines": [{"sku": f"X-{j}", "qty": 1 + j % 2, "price": 250} for j in range(8)],
        }
        for i in range(30)
    ]
    attributes = {
        "state": "CA",
        "score": 72,
        "credit_score": 710,
        "vertical": "auto",
        "amount_micros": 2_500_000,
        "tags": ["returning", "web"],
        "source": "partner-acme",
        "email": "ada@gmail.com",
        "priority": None,
    }
    return {
        "routable": {"id": "r1", "consent": {"granted": True}, "attributes": attributes},
        "attributes": attributes,
        "now": "2024-03-01T18:30:00Z",
        "event": {
            "name": "order.shipped",
            "data": {"order_id": "o1", "carrier": "UPS", "items": [{"qty": 2}], "total": 5},
        },
        "steps": {
            "route": {"output": {"assigned": True}},
            "fetch": {"output": {"status": 200, "items": [1, 2]}},
            "score": {"output": {"value": 0.5}},
            "enrich": {"output": {"segment": "gold"}},
        },
        "input": {
            "id": "o1",
            "first_name": " Ada ",
            "last_name": "Lovelace",
            "email": "ADA@Example.com",
            "orders": orders,
            "customers": [{"id": f"c{i}", "name": f"Customer {i}"} for i in range(7)],
            "tags": ["seg:gold", "vip", "seg:web"],
            "csv": "a, b ,c",
            "items": [{"price": 2, "qty": 3}, {"price": 5, "qty": 1}],
            "created_at": "2024-03-01T00:00:00Z",
            "priority": "high",
            "name": "ada",
        },
    }


# ------------------------------------------------------------- refusals


def test_there_are_enough_distinct_bombs() -> None:
    assert len(BOMBS) >= 24
    assert len(RUNTIME_BOMBS) >= 17
    assert len({expr for _, expr in BOMBS.values()}) == len(BOMBS)


@pytest.mark.parametrize("engine_name", ENGINE_NAMES)
@pytest.mark.parametrize("bomb", sorted(BOMBS))
def test_every_bomb_is_refused_at_compile_time(engine_name: str, bomb: str) -> None:
    source = BOMBS[bomb][1]
    engine = ENGINES[engine_name]
    with pytest.raises(ExpressionError) as info:
        engine.compile(source)
    error = info.value
    assert error.code == "expression.too_costly", str(error)[:300]
    assert error.expression == source
    assert error.details["phase"] == "compile"
    assert error.details["found"] > error.details["maximum"]
    if bomb in RUNTIME_BOMBS:
        # Refused for what it would do, not for how it is written.
        assert error.details["limit"] in ("cost", "string_length", "list_length")
    else:
        assert error.details["limit"] in ("tokens", "nesting", "depth")


def test_the_estimate_is_far_over_the_budget_for_the_runtime_bombs() -> None:
    # At least three times the budget (or ten times a size limit): refusing
    # them does not hang on a fine tuning of the defaults.
    for bomb, (_, source) in RUNTIME_BOMBS.items():
        estimate = estimate_cost(source)
        over = (
            estimate.cost > 3_000_000
            or estimate.longest_string > 10_000_000
            or estimate.longest_list > 1_000_000
        )
        assert over, (bomb, estimate)


# --------------------------------------------------- realistic expressions


def test_realistic_expressions_are_accepted_and_agree_on_both_engines() -> None:
    variables = realistic_variables()
    answers = {}
    for name, engine in ENGINES.items():
        bound = engine.bind(variables)
        answers[name] = [engine.compile(source).evaluate(bound) for source in REALISTIC]
    assert answers["cel-python"] == answers["cel-rust"]
    # A few answers, so that "agree" is not "both empty".
    python = dict(zip(REALISTIC, answers["cel-python"], strict=True))
    assert python[REALISTIC[0]] is True
    assert python["split(input.csv, ',').map(s, trim(s))"] == ["a", "b", "c"]
    assert python["input.orders.exists(o, o.lines.exists(l, l.sku == 'X-1'))"] is True


def test_realistic_expressions_leave_room_under_the_budget() -> None:
    costs = {source: estimate_cost(source).cost for source in REALISTIC}
    # The costliest is a join of two input lists (100 x 100 assumed).
    assert max(costs.values()) < 700_000, max(costs.items(), key=lambda kv: kv[1])
    assert sorted(costs.values())[len(costs) // 2] < 5_000  # most are tiny


def _estimate_or_code(source: str) -> int | str:
    """The estimated cost of `source`, or the code of the error estimating it raised."""
    try:
        return estimate_cost(source).cost
    except ExpressionError as error:
        return error.code


def test_no_case_of_the_shared_corpus_is_too_costly() -> None:
    corpus = json.loads((Path(__file__).parent / "data" / "cel_corpus.json").read_text("utf-8"))
    for case in corpus["cases"]:
        if case["id"].startswith("syntax-"):
            # Both engines refuse it as syntax; the estimator, which reads structure
            # only, refuses it too or finds it cheap (a bad literal: '\\q', 1e999).
            for engine in ENGINES.values():
                with pytest.raises(ExpressionError, match="syntax"):
                    engine.compile(case["expr"])
            outcome = _estimate_or_code(case["expr"])
            assert outcome == "expression.syntax" or (
                isinstance(outcome, int) and outcome < 100_000
            ), case["id"]
            continue
        assert estimate_cost(case["expr"]).cost < 100_000, case["id"]


# ------------------------------------------------------------ the proofs

# Imports the bare libraries once, then forks one child per bomb, which gets
# an address space 512 MiB over what the parent uses and a few CPU seconds.
# A child that finishes says "exit 0"; one the kernel stops, its signal.
_RUNTIME_PROVER = textwrap.dedent(
    """
    import json, os, resource, signal, sys
    import cel

    bombs = json.load(sys.stdin)
    variables = {"input": {"items": list(range(100)), "a": [str(i) * 10 for i in range(100)]}}
    functions = {"split": lambda s, sep: s.split(sep), "join": lambda l, sep: sep.join(l)}
    with open("/proc/self/status") as status:
        size = next(int(l.split()[1]) * 1024 for l in status if l.startswith("VmSize"))
    for name, (source, seconds) in bombs.items():
        pid = os.fork()
        if pid == 0:
            os.dup2(os.open(os.devnull, os.O_WRONLY), 2)  # cel-rust prints a backtrace
            resource.setrlimit(resource.RLIMIT_AS, (size + 512 * 2**20,) * 2)
            resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds + 1))
            try:
                context = cel.Context(variables=variables, functions=functions)
                cel.compile(source).execute(context)
            except MemoryError:
                os._exit(3)
            except BaseException:
                os._exit(4)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            outcome = signal.Signals(os.WTERMSIG(status)).name
        else:
            outcome = f"exit {os.WEXITSTATUS(status)}"
        print(json.dumps([name, outcome]), flush=True)
    """
)


def _run_bare_cel_rust(bombs: dict[str, tuple[str, int]]) -> dict[str, str]:
    """Each bomb's fate on bare cel-rust: {name: signal name or "exit N"}."""
    done = subprocess.run(
        [sys.executable, "-c", _RUNTIME_PROVER],
        input=json.dumps(bombs),
        # No backtrace: printing one can take longer than the CPU limit.
        env={**os.environ, "RUST_BACKTRACE": "0"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(json.loads(line) for line in done.stdout.splitlines())


def test_the_runtime_bombs_really_exhaust_cel_rust() -> None:
    outcomes = _run_bare_cel_rust(
        {name: (source, 1) for name, (_, source) in RUNTIME_BOMBS.items()}
    )
    assert set(outcomes) == set(RUNTIME_BOMBS)
    # Out of CPU (SIGXCPU), or dead on a failed allocation (cel-rust aborts:
    # SIGABRT; or a MemoryError): never "exit 0", a finished evaluation.
    for name, outcome in outcomes.items():
        assert outcome in ("SIGXCPU", "SIGKILL", "SIGABRT", "SIGSEGV", "exit 3"), (name, outcome)


def test_string_doubling_kills_the_process_on_cel_rust() -> None:
    # The crash that started this: with the memory it may use capped, bare
    # cel-rust does not fail the evaluation, it aborts the whole process.
    source = RUNTIME_BOMBS["string-doubling-chain"][1]
    assert _run_bare_cel_rust({"doubling": (source, 20)}) == {"doubling": "SIGABRT"}


_STRUCTURE_PROVER = textwrap.dedent(
    """
    import json, sys, time
    import celpy
    from ductor_core.errors import ExpressionError
    from ductor_core.expressions import CelPyEngine

    bombs = json.load(sys.stdin)
    environment = celpy.Environment()
    engine = CelPyEngine()

    def best(action):
        times = []
        for _ in range(3):
            start = time.perf_counter()
            action()
            times.append(time.perf_counter() - start)
        return min(times)

    def refuse(source):
        try:
            engine.compile(source)
        except ExpressionError:
            engine._cache._programs.clear()

    report = {}
    for name, source in bombs.items():
        try:
            parse = best(lambda: environment.compile(source))
            environment.program(environment.compile(source)).evaluate({"input": {}})
            outcome = "value"
        except RecursionError:
            outcome = "RecursionError"
        except Exception as exc:
            outcome = type(exc).__name__
        report[name] = [outcome, parse / best(lambda: refuse(source))]
    print(json.dumps(report))
    """
)


def test_the_structure_bombs_are_slow_or_fatal_to_cel_python() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _STRUCTURE_PROVER],
        input=json.dumps({name: source for name, (_, source) in STRUCTURE_BOMBS.items()}),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    for name in STRUCTURE_BOMBS:
        outcome, slower = report[name]
        if name in LITERAL_BOMBS:
            # Harmless values, but cel-python's parser takes (here) at least
            # 20 times longer to read them than the estimator takes to refuse
            # them; a definition of many such is a compile-time freeze.
            assert outcome == "value", name
            assert slower > 20, (name, slower)
        else:
            # Too deep for cel-python's recursive evaluator.
            assert outcome == "RecursionError", (name, outcome)


def test_a_definition_of_125_huge_literals_is_refused_literal_by_literal() -> None:
    # The shape that froze validation: a 1 MiB body whose projection holds
    # 125 different 8 KiB list literals. Each is refused from its first
    # 1,001 tokens, before cel-python's parser would spend 0.2 s on it.
    literals = {f"k{n}": "[" + ",".join(["7"] * 4000) + f",{n}]" for n in range(125)}
    definition = {
        "family_slug": "literals",
        "title": "Literals",
        "steps": [
            {
                "ref": "big",
                "type": "STEP_TYPE_DATAFLOW",
                "title": "Big",
                "args": {"operation": "project", "project": literals},
            }
        ],
        "edges": [],
    }
    assert len(json.dumps(definition)) > 1_000_000
    report = validate_definition(definition, engine=CelPyEngine())
    assert [(p.code, p.pointer) for p in report.problems] == [
        ("definition.expression_too_costly", f"/steps/0/args/project/k{n}") for n in range(125)
    ]
    assert all("1,001 tokens or more" in p.message for p in report.problems)


# The shapes that were once under-priced: a variable's list or string put
# into what two nested loops build is copied whole each time.
VARIABLE_IN_LOOPS = {
    "list": "size(input.a.map(x, input.b.map(y, [" + ", ".join(["input.c"] * 10) + "])))",
    "string": "size(input.a.map(x, input.b.map(y, input.s)))",
}


@pytest.mark.parametrize("engine_name", ENGINE_NAMES)
@pytest.mark.parametrize("shape", sorted(VARIABLE_IN_LOOPS))
def test_a_variable_copied_in_two_loops_is_refused(engine_name: str, shape: str) -> None:
    with pytest.raises(ExpressionError) as info:
        ENGINES[engine_name].compile(VARIABLE_IN_LOOPS[shape])
    assert info.value.code == "expression.too_costly"
    assert info.value.details["limit"] == "cost"


def test_the_same_copy_ten_times_fewer_is_accepted_and_fast() -> None:
    # One loop over a ten-item literal instead of a 100-item variable: a
    # tenth of the copies, accepted, and done in well under a second.
    source = "size(input.a.map(x, " + L10 + ".map(y, input.s)))"
    assert estimate_cost(source).cost < 200_000
    variables = {"input": {"a": list(range(100)), "s": "x" * 1000}}
    program = ENGINES["cel-rust"].compile(source)
    assert program.evaluate(variables) == 100
    check = textwrap.dedent(
        f"""
        import json, time, cel
        context = cel.Context(variables={variables!r})
        program = cel.compile({source!r})
        start = time.perf_counter()
        program.execute(context)
        print(time.perf_counter() - start)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, timeout=30, check=True
    )
    assert float(done.stdout) < 0.5
