"""docs/workflows.md agrees with the product: every definition on the page is
published to a real `ductor dev` and run (or refused) as the page says, and the
defaults, limits, codes and names it states are read from the code."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from ductor_core import builtin_steps, concurrency, durations, input_schemas
from ductor_core._retry import JITTER_FRACTION
from ductor_core.definitions import EdgeType, RetryPolicy, ScatterArgs, StepType
from ductor_core.tick import MAX_RECIPIENTS
from ductor_core.validation import PROBLEM_CODES, REF_PATTERN, SCATTER_STEP_TYPES, SLUG_PATTERN
from ductor_server.engine.actions import HttpAction
from ductor_server.engine.effects import MAX_START_DEPTH
from ductor_server.engine.outbound import MAX_RESPONSE_BYTES

from .conftest import ServerProcess

pytestmark = pytest.mark.timeout(120)

DOC = (Path(__file__).resolve().parents[1] / "docs" / "workflows.md").read_text()
BLOCKS: list[Any] = [json.loads(b) for b in re.findall(r"^```json\n(.*?)^```", DOC, re.S | re.M)]

# The inputs the page runs its examples with (each is quoted in the page).
RUNS: dict[str, Any] = {
    "review-or-not": {"amount": 250},
    "call-or-fallback": None,
    "approval-window": None,
    "call-double": {"n": 21},
    "greet-all": {"names": ["ada", "bo"]},
}
EVENT = {"id": "o-1", "total": 250, "customer": "c-9"}


def _definitions() -> dict[str, tuple[dict[str, Any], Any]]:
    """Each definition on the page by slug, with the output block after it (None when
    the next block is another definition)."""
    found: dict[str, tuple[dict[str, Any], Any]] = {}
    for i, block in enumerate(BLOCKS):
        if isinstance(block, dict) and "steps" in block:
            after = BLOCKS[i + 1] if i + 1 < len(BLOCKS) else None
            output = None if isinstance(after, dict) and "steps" in after else after
            found[block["family_slug"]] = (block, output)
    return found


DEFINITIONS = _definitions()


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    server = ServerProcess(data_dir=tmp_path_factory.mktemp("workflows") / "data")
    try:
        server.start()
        with server.client() as client:
            yield client
    finally:
        server.stop()


def _ended(http: httpx.Client, run_id: str) -> dict[str, Any]:
    for _ in range(20):
        run: dict[str, Any] = http.get(f"/v1/runs/{run_id}", params={"wait": 5}).json()
        if run["status"] not in ("RUN_STATUS_PENDING", "RUN_STATUS_RUNNING"):
            return run
    raise AssertionError(f"run {run_id} did not end: {run}")


def test_the_examples_run_as_the_page_says(http: httpx.Client) -> None:
    valid = [d for slug, (d, _) in DEFINITIONS.items() if slug != "Bad Slug"]
    assert {d["family_slug"] for d in valid} == {*RUNS, "double", "big-orders", "checked-orders"}
    for definition in valid:  # `double` before `call-double`, as on the page
        answer = http.post("/v1/workflows", json=definition)
        assert answer.status_code == 201, answer.text
    started = {}
    for slug, given in RUNS.items():
        if given is not None:
            assert f"`{json.dumps(given)}`" in DOC, slug
        answer = http.post("/v1/runs", json={"family_slug": slug, "input": given})
        assert answer.status_code == 201, answer.text
        started[slug] = answer.json()["id"]
    event = http.post("/v1/events", json={"name": "order.created", "data": EVENT})
    assert json.dumps({"name": "order.created", "data": EVENT}) in DOC.replace("\n", " ")
    [started["big-orders"]] = event.json()["runs_started"]
    for slug, run_id in started.items():
        run = _ended(http, run_id)
        assert run["status"] == "RUN_STATUS_SUCCEEDED", (slug, run["error"])
        assert run["output"] == DEFINITIONS[slug][1], slug
    call = next(s for s in _ended(http, started["call-or-fallback"])["steps"] if s["ref"] == "call")
    assert (call["attempt"], call["error"]["code"]) == (2, "http.connection")


def test_the_refused_definition_gets_the_answer_shown(http: httpx.Client) -> None:
    bad, answer = DEFINITIONS["Bad Slug"]
    report = http.post("/v1/workflows/validate", json=bad).json()
    refused = http.post("/v1/workflows", json=bad)
    assert refused.status_code == 422
    body = refused.json()
    assert (body["code"], body["message"]) == (answer["code"], answer["message"])
    for problems in (report["problems"], body["details"]):
        assert [(p["code"], p["pointer"]) for p in problems] == [
            (p["code"], p["pointer"]) for p in answer["details"]
        ]
        for real, shown in zip(problems, answer["details"], strict=True):
            head, _, tail = shown["message"].partition("...")
            assert real["message"].startswith(head), real
            assert real["message"].endswith(tail), real


def test_an_input_that_fails_the_schema_gets_the_answer_shown(http: httpx.Client) -> None:
    definition, shown = DEFINITIONS["checked-orders"]
    assert http.post("/v1/workflows", json=definition).status_code in (200, 201)
    given = {"total": "250"}
    assert f"`{json.dumps(given)}`" in DOC
    refused = http.post("/v1/runs", json={"family_slug": "checked-orders", "input": given})
    assert refused.status_code == 422
    assert refused.json() == shown
    good = {"id": "o-1", "total": 250, "tags": ["gift"]}
    assert http.post("/v1/runs", json={"family_slug": "checked-orders", "input": good}).is_success


def test_the_codes_and_names_are_the_codes() -> None:
    listed = re.findall(r"^\| `(definition\.[a-z_]+)` \|", DOC, re.M)
    server = {
        "definition.unknown_action",
        "definition.unknown_connection",
        "definition.unknown_operation",
        "definition.bad_input",
        "definition.not_email_connection",
    }
    assert listed[: len(PROBLEM_CODES)] == list(PROBLEM_CODES)
    assert sorted(listed[len(PROBLEM_CODES) :]) == sorted(server)
    assert re.findall(r"^\| `(EDGE_TYPE_[A-Z]+)` \|", DOC, re.M) == [t.value for t in EdgeType]
    for step_type in StepType:
        assert re.search(rf"^### .*{step_type.value}\b", DOC, re.M), step_type
    scatterable = sorted(t.name for t in SCATTER_STEP_TYPES)
    assert "a DATAFLOW, ACTION, BRIDGE or ROUTE;" in DOC
    assert scatterable == sorted(["DATAFLOW", "ACTION", "BRIDGE", "ROUTE"])
    assert "a built-in action: `noop` or `http`" in DOC


def test_the_defaults_and_limits_are_the_codes() -> None:
    retry = RetryPolicy()
    for name, value in (
        ("max_attempts", "`3`"),
        ("initial_interval", '`"1s"`'),
        ("backoff_coefficient", "`2.0`"),
        ("max_interval", '`"5m"`'),
        ("non_retryable_codes", "`[]`"),
    ):
        assert re.search(rf"^\| `{name}` \| [^|]+ \| {re.escape(value)} \|", DOC, re.M), name
        assert json.dumps(getattr(retry, name)) == value.strip("`"), name
    limits: list[tuple[object, object, str]] = [
        (JITTER_FRACTION, 0.1, "±10%"),
        (ScatterArgs(items="[]").max_concurrency, 10, "| `max_concurrency` | integer | `10` |"),
        (concurrency.MAX_LIMIT, 100_000, "1 to 100,000"),
        (concurrency.MAX_PERIOD, timedelta(days=30), "at most `30d`"),
        (concurrency.MAX_KEY_SOURCE, 1_000, "at most 1,000 characters"),
        (durations.MAX_DURATION, timedelta(days=36_500), "at most `36500d`"),
        (durations._MAX_TEXT_LENGTH, 64, "most 64 characters long"),
        (SLUG_PATTERN.pattern, "[a-z0-9][a-z0-9-]{0,62}", "1 to 63 lowercase"),
        (REF_PATTERN.pattern, "[A-Za-z_][A-Za-z0-9_-]{0,63}", "at most 64 characters"),
        (MAX_START_DEPTH, 16, "nest 16 deep"),
        (MAX_RECIPIENTS, 1000, "a list of 1 to 1,000"),
        (builtin_steps.MAX_CTAS, 2, "up to 2 `ctas`"),
        (HttpAction()._timeout, 30.0, "else 30 seconds"),
        (MAX_RESPONSE_BYTES, 10 * 1024 * 1024, "over 10 MiB"),
        (input_schemas.MAX_SCHEMA_BYTES, 64 * 1024, "at most 64 KiB of JSON"),
        (input_schemas.MAX_SCHEMA_DEPTH, 32, "nested at most 32 deep"),
        (input_schemas.MAX_PATTERN_CHARS, 1000, "at most 1,000 characters; matched"),
        (input_schemas.MAX_PROBLEMS, 20, "lists at most 20 problems"),
        (input_schemas.MAX_MESSAGE_CHARS, 200, "cut at 200 characters"),
        (input_schemas.MIN_STEPS, 10_000, "may take 10,000 steps"),
        (input_schemas.STEPS_PER_VALUE, 25, "plus 25 per value"),
    ]
    for actual, expected, phrase in limits:
        assert actual == expected, phrase
        assert phrase in DOC, phrase
    for value in ("250ms", "1.5s", "1h30m", "7d"):
        assert durations.parse_duration(value) > timedelta(0)


def test_the_timeout_and_retry_table_is_what_each_type_uses() -> None:
    table = DOC.split("| step types | `timeout` | `retry` |\n|---|---|---|\n", 1)[1]
    rows = re.findall(r"^\| (.+?) \| (.+?) \| (.+?) \|$", table.split("\n\n", 1)[0], re.M)
    used: dict[str, set[str]] = {}
    for types, timeout, retry in rows:
        for name in types.removesuffix(" (run by a worker)").split(", "):
            assert f"STEP_TYPE_{name}" not in used, name
            used[f"STEP_TYPE_{name}"] = {
                option
                for option, cell in (("timeout", timeout), ("retry", retry))
                if not cell.startswith("refused")
            }
    assert used == {spec.type: set(spec.options) for spec in builtin_steps.BUILTIN_STEP_SPECS}


def test_an_unknown_field_gets_the_code_the_page_gives_where_it_is(http: httpx.Client) -> None:
    assert "Any other field is refused: `definition.unknown_field`" in DOC
    assert "`args`, at any depth, it is `definition.bad_args`" in DOC
    step = {"ref": "a", "type": "STEP_TYPE_ACTION", "args": {"action": "noop"}}
    late = {"ref": "b", "type": "STEP_TYPE_ACTION", "args": {"action": "noop"}}
    scatter = {
        "ref": "a",
        "type": "STEP_TYPE_SCATTER",
        "args": {"items": "[1]", "step": {"type": "STEP_TYPE_ACTION", "args": {"action": "noop"}}},
    }
    placed: list[tuple[dict[str, Any], str, str]] = [
        ({"steps": [step], "zz": 1}, "/zz", "definition.unknown_field"),
        ({"steps": [{**step, "zz": 1}]}, "/steps/0/zz", "definition.unknown_field"),
        (
            {"steps": [step, late], "edges": [{"source_ref": "a", "target_ref": "b", "zz": 1}]},
            "/edges/0/zz",
            "definition.unknown_field",
        ),
        (
            {"steps": [step], "triggers": [{"event": "e", "zz": 1}]},
            "/triggers/0/zz",
            "definition.unknown_field",
        ),
        (
            {"steps": [{**step, "retry": {"zz": 1}}]},
            "/steps/0/retry/zz",
            "definition.unknown_field",
        ),
        (
            {"steps": [step], "concurrency": {"limit": 1, "zz": 1}},
            "/concurrency/zz",
            "definition.unknown_field",
        ),
        (
            {"steps": [{**step, "args": {"action": "noop", "zz": 1}}]},
            "/steps/0/args/zz",
            "definition.bad_args",
        ),
        (
            {"steps": [{**scatter, "args": {**scatter["args"], "zz": 1}}]},
            "/steps/0/args/zz",
            "definition.bad_args",
        ),
        (
            {"steps": [{**scatter, "args": {**scatter["args"], "step": {"zz": 1}}}]},
            "/steps/0/args/step/zz",
            "definition.bad_args",
        ),
    ]
    for definition, pointer, code in placed:
        report = http.post("/v1/workflows/validate", json={"family_slug": "x", **definition})
        found = [(p["code"], p["pointer"]) for p in report.json()["problems"]]
        assert (code, pointer) in found, (pointer, found)


def test_a_key_that_names_a_run_returns_it_whatever_the_schema_says(http: httpx.Client) -> None:
    assert "`Idempotency-Key` with another input\nis `422 idempotency.conflict`" in DOC
    steps = [{"ref": "d", "type": "STEP_TYPE_ACTION", "args": {"action": "noop"}}]
    for required in ("a", "b"):  # version 2 refuses what version 1 took
        schema = {"type": "object", "required": [required]}
        answer = http.post(
            "/v1/workflows", json={"family_slug": "keyed", "input_schema": schema, "steps": steps}
        )
        assert answer.status_code == 201, answer.text
        if required == "a":
            body = {"family_slug": "keyed", "input": {"a": 1}}
            first = http.post("/v1/runs", json=body, headers={"Idempotency-Key": "k-1"})
            assert first.status_code == 201, first.text
            batch = {"runs": [{"family_slug": "keyed", "input": {"a": 1}, "key": "b-1"}]}
            assert http.post("/v1/runs/batch", json=batch).status_code == 201
    again = http.post("/v1/runs", json=body, headers={"Idempotency-Key": "k-1"})
    assert (again.status_code, again.json()["id"]) == (201, first.json()["id"])
    other = {"family_slug": "keyed", "input": {"c": 1}}
    refused = http.post("/v1/runs", json=other, headers={"Idempotency-Key": "k-1"})
    assert (refused.status_code, refused.json()["code"]) == (422, "idempotency.conflict")
    batch = {"runs": [{"family_slug": "keyed", "input": {"c": 1}, "key": "b-1"}]}
    [kept] = http.post("/v1/runs/batch", json=batch).json()["runs"]
    assert kept["created"] is False


def test_a_schema_whose_ref_loops_is_refused_at_publish(http: httpx.Client) -> None:
    # Every run of such a version was a 500: checking its input recursed until the
    # JSON Schema library panicked.
    steps = [{"ref": "d", "type": "STEP_TYPE_ACTION", "args": {"action": "noop"}}]
    for schema, pointer in [
        ({"$ref": "#"}, "/input_schema/$ref"),
        (
            {"$defs": {"a": {"allOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"},
            "/input_schema/$defs/a/allOf/0/$ref",
        ),
    ]:
        definition = {"family_slug": "loops", "input_schema": schema, "steps": steps}
        answer = http.post("/v1/workflows", json=definition)
        assert answer.status_code == 422, answer.text
        [problem] = answer.json()["details"]
        assert (problem["code"], problem["pointer"]) == ("definition.bad_input_schema", pointer)


def test_a_name_no_event_or_signal_can_carry_is_refused(http: httpx.Client) -> None:
    # The API refuses such an event or signal, so a wait on one only ever timed out.
    assert "(at most 256 characters, no control character), else `definition.bad_args`" in DOC
    waits = {"STEP_TYPE_WAIT_FOR_EVENT": "event", "STEP_TYPE_WAIT_FOR_SIGNAL": "signal"}
    for step_type, field in waits.items():
        for name in ("n" * 257, "order\ncreated", "tab\there", "del\x7f"):
            step = {"ref": "w", "type": step_type, "args": {field: name}}
            report = http.post("/v1/workflows/validate", json={"family_slug": "x", "steps": [step]})
            found = [(p["code"], p["pointer"]) for p in report.json()["problems"]]
            assert found == [("definition.bad_args", f"/steps/0/args/{field}")], (name, found)
        fine = {"ref": "w", "type": step_type, "args": {field: "n" * 256}}
        report = http.post("/v1/workflows/validate", json={"family_slug": "x", "steps": [fine]})
        assert report.json()["valid"], report.text
    step = {"ref": "a", "type": "STEP_TYPE_ACTION", "args": {"action": "noop"}}
    trigger = {"family_slug": "x", "steps": [step], "triggers": [{"event": "order\tcreated"}]}
    found = http.post("/v1/workflows/validate", json=trigger).json()["problems"]
    assert [(p["code"], p["pointer"]) for p in found] == [
        ("definition.bad_trigger", "/triggers/0/event")
    ]
    # The API itself refuses an event so named.
    sent = http.post("/v1/events", json={"name": "order\tcreated"})
    assert sent.status_code == 422, sent.text
    assert builtin_steps.MAX_MESSAGE_NAME == 256
