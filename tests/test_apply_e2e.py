"""`ductor apply` and `serve --seed` against real server processes on both backends:
apply, apply again (unchanged), a dry run of a changed file, directories of bad and
hostile files (nothing changes, every problem listed with file and pointer), and
seeding at start."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ductor_server.connections import new_secret_key

from .conftest import ServerProcess

pytestmark = pytest.mark.timeout(180)

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "config"
TOKEN = "crm-token-0123456789abcdef"


def prepared(server: ServerProcess) -> ServerProcess:
    """`server` with the connection secret in its environment (and, for `serve`, a
    key to seal it with)."""
    server.extra_env["CRM_TOKEN"] = TOKEN
    if server.database_url:
        server.extra_env["DUCTOR_SECRET_KEYS"] = new_secret_key("k1")
    return server


def state(server: ServerProcess) -> dict[str, Any]:
    """What the tenant has, read over the API."""
    with server.client() as http:
        families = http.get("/v1/workflows").json()
        versions = {
            f["family_slug"]: len(http.get(f"/v1/workflows/{f['family_slug']}").json()["versions"])
            for f in families
        }
        rules = http.get("/v1/rules/versions").json()
        return {
            "workflows": versions,
            "workers": {w["id"]: w["capacity"] for w in http.get("/v1/workers").json()},
            "pools": [p["id"] for p in http.get("/v1/pools").json()],
            "rule_versions": len(rules) if isinstance(rules, list) else 0,
            "connections": {
                c["name"]: (c["config"], sorted(c["secrets"]))
                for c in http.get("/v1/connections").json()
            },
        }


def apply(server: ServerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return server.cli("apply", *args, check=False)


def test_apply_twice_then_a_dry_run_of_a_change(server: ServerProcess, tmp_path: Path) -> None:
    prepared(server).start()
    config = tmp_path / "config"
    shutil.copytree(EXAMPLE, config)

    first = apply(server, str(config))
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines() == [
        "created   Connection/crm",
        "created   Worker/ada",
        "created   Worker/grace",
        "created   Pool/sales",
        "created   RuleSet/default",
        "created   Workflow/new-lead",
        "applied: 6 created, 0 updated, 0 unchanged",
    ]
    applied = state(server)
    assert applied == {
        "workflows": {"new-lead": 1},
        "workers": {"ada": {"leads": 5}, "grace": {"leads": 5}},
        "pools": ["sales"],
        "rule_versions": 1,
        "connections": {"crm": ({"base_url": "https://crm.example.com/api"}, ["bearer_token"])},
    }

    again = apply(server, str(config))
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[:-1] == [
        "unchanged Connection/crm",
        "unchanged Worker/ada",
        "unchanged Worker/grace",
        "unchanged Pool/sales",
        "unchanged RuleSet/default",
        "unchanged Workflow/new-lead",
    ]
    assert again.stdout.splitlines()[-1] == "applied: 0 created, 0 updated, 6 unchanged"
    assert state(server) == applied  # no new workflow or rule set version either

    routing = config / "routing.yaml"
    routing.write_text(
        routing.read_text().replace("capacity: {leads: 5}", "capacity: {leads: 8}", 1)
    )
    workflow = config / "new-lead.yaml"
    workflow.write_text(workflow.read_text().replace("title: New lead", "title: New lead (v2)"))
    dry = apply(server, str(config), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines() == [
        "unchanged Connection/crm",
        "update    Worker/ada (capacity)",
        "unchanged Worker/grace",
        "unchanged Pool/sales",
        "unchanged RuleSet/default",
        "update    Workflow/new-lead (version 2)",
        "dry run: 0 to create, 2 to update, 4 unchanged; nothing changed",
    ]
    assert state(server) == applied

    changed = apply(server, str(config))
    assert changed.returncode == 0, changed.stderr
    assert "updated   Worker/ada (capacity)" in changed.stdout
    now = state(server)
    assert now["workers"]["ada"] == {"leads": 8}
    assert now["workflows"] == {"new-lead": 2}
    assert "applied: 0 created, 0 updated, 6 unchanged" in apply(server, str(config)).stdout


BAD_FILES = {
    # Read fine, but the server's validators refuse: every problem, with its place.
    "routing.yaml": """\
- kind: Worker
  spec:
    id: bob
    capacity: {leads: five}
    colour: red
- kind: Pool
  spec:
    id: desk
    strategy: {name: fastest}
    members:
      - {worker: nobody}
- kind: RuleSet
  spec:
    rules: [{id: r1, pool: ghost, when: "attributes.x >"}]
""",
    "flows/wf.json": """{
  "kind": "Workflow",
  "spec": {"family_slug": "wf", "steps": [{"ref": "a", "type": "STEP_TYPE_NOPE"}], "edges": []}
}
""",
    "crm.yaml": """\
kind: Connection
spec:
  name: CRM
  provider: http
  config: {base_url: 42}
  secrets:
    bearer_token: written-in-the-file
""",
    # Do not read at all.
    "broken.yaml": "kind: Worker\nspec: {id: x\n",
    "trailing.json": '{"kind": "Worker", "spec": {"id": "y",}}\n',
    "two.yaml": "kind: Worker\nspec: {id: a}\n---\nkind: Worker\nspec: {id: b}\n",
    "odd.yaml": "- kind: Gadget\n  spec: {}\n- kind: Worker\n  spec: [1]\n- 7\n",
    # A good file: it must not be applied while the others are wrong.
    "good.yaml": "kind: Worker\nspec: {id: fine}\n",
}

EXPECTED = [
    "broken.yaml:3:1: /: invalid YAML: expected ',' or '}', but got '<stream end>'",
    "crm.yaml:3:9: /spec/name: a connection name is lowercase letters",
    "crm.yaml:5:22: /spec/config/base_url: Expected `str`, got `int`",
    "crm.yaml:7:19: /spec/secrets/bearer_token: a secret is never written in a file",
    "flows/wf.json:3:64: /spec/steps/0/type: definition.unknown_step_type",
    "odd.yaml:1:9: /0/kind: kind is 'Gadget'",
    "odd.yaml:4:9: /1/spec: spec must be a mapping",
    "odd.yaml:5:3: /2: a resource is a mapping with `kind` and `spec`",
    "routing.yaml:4:15: /0/spec/capacity: Expected `int`, got `str`",
    "routing.yaml:5:13: /0/spec/colour: unknown field 'colour'",
    "routing.yaml:9:15: /1/spec/strategy: unknown strategy 'fastest'",
    "routing.yaml:11:18: /1/spec/members/0/worker: unknown worker 'nobody'",
    "routing.yaml:14:28: /2/spec/rules/0/pool: unknown pool 'ghost'",
    "routing.yaml:14:41: /2/spec/rules/0/when: syntax error",
    "trailing.json:1:39: /: invalid JSON: Expecting property name",
    "two.yaml:3:1: /: more than one YAML document",
]


def test_a_directory_of_bad_files_changes_nothing_and_lists_every_problem(
    server: ServerProcess, tmp_path: Path
) -> None:
    prepared(server).start()
    bad = tmp_path / "bad"
    for name, text in BAD_FILES.items():
        (bad / name).parent.mkdir(parents=True, exist_ok=True)
        (bad / name).write_text(text)
    before = state(server)
    for args in ((str(bad),), (str(bad), "--dry-run")):
        done = apply(server, *args)
        assert done.returncode == 1
        assert done.stdout == ""
        lines = done.stderr.splitlines()
        assert lines[-1] == f"{len(EXPECTED)} problem(s): nothing was applied", done.stderr
        assert len(lines) == len(EXPECTED) + 1, done.stderr
        for line, expected in zip(lines, EXPECTED, strict=False):
            assert line.startswith(f"error: {bad}/{expected}"), (line, expected)
    assert state(server) == before  # the good worker too was left out


def test_hostile_files_get_one_clear_line_each(server: ServerProcess, tmp_path: Path) -> None:
    prepared(server).start()
    hostile = tmp_path / "hostile"
    hostile.mkdir()
    (hostile / "huge.yaml").write_text(
        "kind: Worker\nspec: {id: big, name: '" + "x" * 1_100_000 + "'}\n"
    )
    (hostile / "deep.yaml").write_text("[" * 5000 + "]" * 5000 + "\n")
    (hostile / "deep.json").write_text("[" * 100_000 + "]" * 100_000 + "\n")
    laughs = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    laughs += [
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]" for i in range(8)
    ]
    (hostile / "laughs.yaml").write_text("\n".join(laughs) + "\n")
    (hostile / "binary.yaml").write_bytes(b"kind: Worker\nspec: {id: \xff\xfe}\n")
    (hostile / "types.yaml").write_text(
        "kind: 12\nspec: {id: [1, 2]}\n"
        "---\n"  # ignored: the file is refused for its second document first
    )
    (hostile / "values.yaml").write_text(
        "kind: Worker\nspec:\n  id: w\n  weight: .nan\n  attributes: {born: !!binary aGk=,"
        " 1: one, big: 99999999999999999999999}\n"
    )
    (hostile / "names.yaml").write_text("kind: Worker\nspec:\n  id: ''\n---\n")
    (hostile / "shapes.yaml").write_text(
        "- kind: [Worker]\n  spec: {id: a}\n- kind: {Worker: 1}\n  spec: {id: b}\n"
    )
    (hostile / "empty.yaml").write_text("# nothing here\n")
    size = (hostile / "huge.yaml").stat().st_size
    done = apply(server, str(hostile))
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    expected = [
        "binary.yaml:2:12: /: the file is not UTF-8",
        "deep.json: /: nested deeper than 64 levels",
        "deep.yaml:1:65: /: nested deeper than 64 levels",
        "empty.yaml: /: the file is empty",
        f"huge.yaml: /: the file is {size} bytes, over the limit of 1000000",
        "laughs.yaml:2:8: /: YAML aliases (*name) are not supported",
        "names.yaml:4:1: /: more than one YAML document",
        "shapes.yaml:1:9: /0/kind: kind is ['Worker']: one of Connection",
        "shapes.yaml:3:9: /1/kind: kind is {'Worker': 1}: one of Connection",
        "types.yaml:3:1: /: more than one YAML document",
        "values.yaml:4:11: /spec/weight: not a JSON number (NaN or infinity)",
        "values.yaml:5:22: /spec/attributes/born: not a JSON value (tag:yaml.org,2002:binary)",
        "values.yaml:5:37: /spec/attributes: mapping keys must be strings",
        "values.yaml:5:50: /spec/attributes/big: integer outside 64 bits",
    ]
    assert lines[-1] == f"{len(expected)} problem(s): nothing was applied", done.stderr
    for line, wanted in zip(lines, expected, strict=False):
        assert line.startswith(f"error: {hostile}/{wanted}"), (line, wanted)
    assert state(server)["workers"] == {}


def test_serve_seed_applies_at_start(server: ServerProcess, tmp_path: Path) -> None:
    seed = ("--seed", str(EXAMPLE))
    if server.database_url:
        seed += ("--seed-tenant", "acme")  # the tenant the fixture's key is minted for
    prepared(server).start(*seed)
    log = server.log()
    assert "seed: created   Workflow/new-lead" in log
    assert "applied: 6 created, 0 updated, 0 unchanged" in log
    seeded = state(server)
    assert seeded["workflows"] == {"new-lead": 1}
    assert seeded["connections"]["crm"][1] == ["bearer_token"]
    # Applying the same directory over the API finds nothing to do: one plan logic.
    again = apply(server, str(EXAMPLE))
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[-1] == "applied: 0 created, 0 updated, 6 unchanged"
    # A restart seeds again and changes nothing.
    server.stop()
    server.start(*seed)
    assert server.log().count("applied: 0 created, 0 updated, 6 unchanged") == 1
    assert state(server) == seeded


def test_a_bad_seed_stops_the_start_and_changes_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "pool.yaml").write_text("kind: Pool\nspec: {id: p, members: [{worker: ghost}]}\n")
    (bad / "w.yaml").write_text("kind: Worker\nspec: {id: real}\n")
    data = tmp_path / "data"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ductor_server.cli",
            "dev",
            "--data-dir",
            str(data),
            "--seed",
            str(bad),
            "--port",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert (
        f"error: {bad}/pool.yaml:2:34: /spec/members/0/worker: unknown worker 'ghost'"
        in done.stderr
    )
    assert f"seed {bad}: 1 problem(s): nothing was applied" in done.stderr
    assert "(embedded) on" not in done.stdout  # it never served
