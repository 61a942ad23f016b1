from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from ductor_server import cli_routing

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "routing"


def test_simulate_writes_decisions_and_prints_the_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "decisions.jsonl"
    argv = ["simulate", "--config", str(EXAMPLE / "routing.json"), str(EXAMPLE / "events.jsonl")]
    rc = cli_routing.main([*argv, "--out", str(out), "--progress", "always"])
    captured = capsys.readouterr()
    assert rc == 0
    lines = out.read_text().splitlines()
    assert len(lines) == 39
    decisions = [json.loads(line) for line in lines]
    assert {d["outcome"] for d in decisions} == {"assigned", "unassigned", "invalid"}
    assert "solar-buyers" in captured.out
    assert "agreement" in captured.out
    assert "100% 40/40" in captured.err
    # the same run again gives the same bytes
    again = tmp_path / "again.jsonl"
    assert cli_routing.main([*argv, "--out", str(again), "--progress", "never"]) == 0
    assert again.read_bytes() == out.read_bytes()
    assert "simulating" not in capsys.readouterr().err


def test_summary_json_matches_the_decisions(tmp_path: Path) -> None:
    out = tmp_path / "decisions.jsonl"
    summary_path = tmp_path / "summary.json"
    argv = ["simulate", "--config", str(EXAMPLE / "routing.json"), str(EXAMPLE / "events.jsonl")]
    assert cli_routing.main([*argv, "--out", str(out), "--summary-json", str(summary_path)]) == 0
    summary = json.loads(summary_path.read_text())
    decisions = [json.loads(line) for line in out.read_text().splitlines()]
    assigned = [d for d in decisions if d["outcome"] == "assigned"]
    assert summary["assigned"] == len(assigned)
    assert summary["spend"] == sum(d["charge"] for d in assigned)
    by_worker: dict[str, int] = {}
    for d in assigned:
        by_worker[d["worker"]] = by_worker.get(d["worker"], 0) + 1
    assert {r["worker"]: r["assigned"] for r in summary["recipients"] if r["assigned"]} == by_worker


def test_simulate_to_stdout_keeps_the_table_off_it(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--config", str(EXAMPLE / "routing.json"), str(EXAMPLE / "events.jsonl")]
    assert cli_routing.main([*argv, "--out", "-"]) == 0
    captured = capsys.readouterr()
    rows = [json.loads(line) for line in captured.out.splitlines()]
    assert len(rows) == 39
    assert "solar-buyers" in captured.err


def test_bad_config_is_reported_with_its_pointer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "routing.json"
    config.write_text(json.dumps({"rule_set": {"default_pool": "missing"}}))
    events = tmp_path / "events.jsonl"
    events.write_text("")
    rc = cli_routing.main(["simulate", "--config", str(config), str(events)])
    assert rc == 2
    assert "/rule_set/default_pool" in capsys.readouterr().err
    rc = cli_routing.main(["simulate", "--config", str(tmp_path / "nope.json"), str(events)])
    assert rc == 2


def test_an_unwritable_out_file_is_an_error_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["simulate", "--config", str(EXAMPLE / "routing.json"), str(EXAMPLE / "events.jsonl")]
    rc = cli_routing.main([*argv, "--out", str(tmp_path / "missing-dir" / "decisions.jsonl")])
    assert rc == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ")
    assert "missing-dir" in err


def test_register_adds_the_routing_group() -> None:
    parser = argparse.ArgumentParser(prog="ductor")
    cli_routing.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["routing", "simulate", "--config", "c.json", "e.jsonl"])
    assert args.func is not None
    assert (args.config, args.events, args.out) == ("c.json", "e.jsonl", "decisions.jsonl")


def test_long_inputs_show_a_progress_bar_by_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "routing.json"
    config.write_text(
        json.dumps(
            {
                "kinds": {"job": {}},
                "workers": [{"id": "a"}, {"id": "b"}],
                "pools": [{"id": "p", "members": [{"worker": "a"}, {"worker": "b"}]}],
                "rule_set": {"default_pool": "p"},
            }
        )
    )
    events = tmp_path / "events.jsonl"
    lines = [
        json.dumps({"at": "2026-11-29T00:00:00Z", "routable": {"id": f"j{i}", "kind": "job"}})
        for i in range(cli_routing.PROGRESS_THRESHOLD)
    ]
    events.write_text("\n".join(lines) + "\n")
    out = tmp_path / "decisions.jsonl"
    assert (
        cli_routing.main(["simulate", "--config", str(config), str(events), "--out", str(out)]) == 0
    )
    err = capsys.readouterr().err
    assert f"100% {cli_routing.PROGRESS_THRESHOLD}/{cli_routing.PROGRESS_THRESHOLD}" in err
    workers = [json.loads(line)["worker"] for line in out.read_text().splitlines()]
    assert workers.count("a") == workers.count("b") == cli_routing.PROGRESS_THRESHOLD // 2
    # a short input stays quiet
    events.write_text("\n".join(lines[:10]) + "\n")
    assert (
        cli_routing.main(["simulate", "--config", str(config), str(events), "--out", str(out)]) == 0
    )
    assert "simulating" not in capsys.readouterr().err


def test_replays_are_identical_across_processes(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    outputs = []
    for hash_seed in ("1", "2"):
        out = tmp_path / f"decisions-{hash_seed}.jsonl"
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        subprocess.run(
            [
                sys.executable,
                "-m",
                "ductor_server.cli_routing",
                "simulate",
                "--config",
                str(EXAMPLE / "routing.json"),
                str(EXAMPLE / "events.jsonl"),
                "--out",
                str(out),
            ],
            check=True,
            env=env,
            capture_output=True,
            timeout=120,
        )
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1]
    assert outputs[0].count(b"\n") == 39


def test_an_events_file_that_fails_half_way_leaves_no_partial_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # It used to stop at the bad line with the decisions before it written over
    # the previous output; with --out naming the events file, it emptied it.
    events = tmp_path / "events.jsonl"
    lines = (EXAMPLE / "events.jsonl").read_text().splitlines()
    events.write_text("\n".join([*lines[:3], "not json", *lines[3:]]) + "\n")
    out = tmp_path / "decisions.jsonl"
    out.write_text("the previous run\n")
    argv = ["simulate", "--config", str(EXAMPLE / "routing.json"), str(events)]
    assert cli_routing.main([*argv, "--out", str(out)]) == 2
    assert "events line 4" in capsys.readouterr().err
    assert out.read_text() == "the previous run\n"
    before = events.read_bytes()
    assert cli_routing.main([*argv, "--out", str(events)]) == 2
    assert events.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["decisions.jsonl", "events.jsonl"]
