"""Reading manifest files: values as JSON, problems with file, line, column and pointer."""

from __future__ import annotations

import json
from pathlib import Path

from ductor_server.manifests import read_manifests
from ductor_server.manifests.files import MAX_DEPTH, Problem, read_file


def write(root: Path, name: str, text: str) -> Path:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_values_are_json_with_yaml_1_2_booleans_and_no_timestamps(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "w.yaml",
        "kind: Worker\nspec:\n  id: w\n  attributes:\n    country: NO\n    on: yes\n"
        "    since: 2024-01-02\n    flag: true\n    n: 3\n    x: 1.5\n    none: null\n",
    )
    [resource], problems = read_file(path, "w.yaml")
    assert problems == []
    assert resource.spec["attributes"] == {
        "country": "NO",
        "on": "yes",
        "since": "2024-01-02",
        "flag": True,
        "n": 3,
        "x": 1.5,
        "none": None,
    }
    assert (resource.kind, resource.name, resource.ref) == ("Worker", "w", "Worker/w")


def test_a_json_file_is_strict_json_without_nan_or_infinity(tmp_path: Path) -> None:
    for number in ("NaN", "Infinity", "-Infinity"):
        path = write(
            tmp_path,
            "w.json",
            '{"kind": "Worker", "spec": {"id": "w",\n  "attributes": {"NaN": "Infinity", '
            f'"x": {number}}}}}}}\n',
        )
        assert read_file(path, "w.json") == (
            [],
            [Problem("w.json", "", f"invalid JSON: {number} is not a JSON number", 2, 42)],
        )


def test_a_problem_names_the_line_of_its_pointer_or_of_the_nearest_parent(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "p.yaml",
        "- kind: Pool\n  spec:\n    id: p\n    members:\n      - {worker: a/b~c}\n",
    )
    [resource], _ = read_file(path, "p.yaml")
    assert resource.base == "/0"
    found = resource.problem("/members/0/worker", "unknown worker")
    assert str(found) == "p.yaml:5:18: /0/spec/members/0/worker: unknown worker"
    missing = resource.problem("/members/0/caps/0/limit", "must be >= 0")
    assert (missing.line, missing.column) == (5, 9)  # where members/0 starts


def test_keys_with_slash_and_tilde_escape_in_pointers(tmp_path: Path) -> None:
    path = write(
        tmp_path, "w.yaml", "kind: Worker\nspec:\n  id: w\n  attributes: {a/b: 1, c~d: 2, a/b: 3}\n"
    )
    _, problems = read_file(path, "w.yaml")
    assert [str(p) for p in problems] == ["w.yaml:4:32: /spec/attributes/a~1b: duplicate key 'a/b'"]


def test_a_directory_is_read_recursively_in_name_order_skipping_hidden_and_other_files(
    tmp_path: Path,
) -> None:
    write(tmp_path, "b.yaml", "kind: Worker\nspec: {id: b}\n")
    write(tmp_path, "a/z.yml", "kind: Worker\nspec: {id: z}\n")
    write(tmp_path, "c.json", '{"kind": "Worker", "spec": {"id": "c"}}')
    write(tmp_path, ".git/x.yaml", "not: [valid\n")
    write(tmp_path, "README.md", "# notes\n")
    resources, problems = read_manifests(tmp_path)
    assert problems == []
    assert [r.name for r in resources] == ["z", "b", "c"]
    [single], _ = read_manifests(tmp_path / "b.yaml")
    assert single.name == "b"


def test_a_resource_defined_twice_and_a_second_rule_set_are_problems(tmp_path: Path) -> None:
    write(
        tmp_path, "a.yaml", "- kind: Worker\n  spec: {id: w}\n- kind: RuleSet\n  spec: {id: one}\n"
    )
    write(tmp_path, "b.yaml", "- kind: Worker\n  spec: {id: w}\n- kind: RuleSet\n  spec: {}\n")
    resources, problems = read_manifests(tmp_path)
    assert [r.ref for r in resources] == ["Worker/w", "RuleSet/one"]
    assert [str(p) for p in problems] == [
        f"{tmp_path}/b.yaml:2:14: /0/spec/id: Worker/w is also defined at {tmp_path}/a.yaml/0",
        f"{tmp_path}/b.yaml:4:9: /1/spec: a tenant has one rule set: RuleSet/one is defined at"
        f" {tmp_path}/a.yaml",
    ]


def test_names_and_shapes(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "x.yaml",
        "- {kind: Workflow, spec: {title: t}}\n- {kind: Worker, spec: {id: ' '}}\n"
        "- {kind: Pool, spec: {id: p}, status: {}}\n- {spec: {id: q}}\n",
    )
    _, problems = read_file(path, "x.yaml")
    assert [str(p) for p in problems] == [
        "x.yaml:1:26: /0/spec/family_slug: a Workflow needs `family_slug`: a non-empty string",
        "x.yaml:2:29: /1/spec/id: a Worker needs `id`: a non-empty string",
        "x.yaml:3:39: /2/status: unknown field 'status' (a resource has kind and spec)",
        "x.yaml:4:3: /3/kind: kind is missing: one of Connection, Worker, Pool, RuleSet, Workflow",
    ]


def test_nesting_is_bounded_before_anything_is_built(tmp_path: Path) -> None:
    ok = write(
        tmp_path,
        "ok.yaml",
        "kind: Worker\nspec: {id: w, attributes: "
        + "[" * (MAX_DEPTH - 3)
        + "]" * (MAX_DEPTH - 3)
        + "}\n",
    )
    assert read_file(ok, "ok.yaml")[1] == []
    deep = write(tmp_path, "deep.yaml", "a:\n" + "".join("  " * i + "- \n" for i in range(1, 200)))
    [problem] = read_file(deep, "deep.yaml")[1]
    assert problem.message == f"nested deeper than {MAX_DEPTH} levels"
    assert problem.line == 65


def test_missing_source_and_empty_directory(tmp_path: Path) -> None:
    assert [str(p) for p in read_manifests(tmp_path / "nope")[1]] == [
        f"{tmp_path}/nope: /: no such file or directory"
    ]
    assert [str(p) for p in read_manifests(tmp_path)[1]] == [
        f"{tmp_path}: /: no manifest files (*.yaml, *.yml, *.json) found"
    ]


def test_a_directory_of_too_many_files_is_refused_whole(tmp_path: Path) -> None:
    from ductor_server.manifests.files import MAX_FILES

    for i in range(MAX_FILES + 1):
        write(tmp_path, f"w{i:04}.yaml", f"kind: Worker\nspec: {{id: w{i}}}\n")
    resources, problems = read_manifests(tmp_path)
    assert resources == []
    assert [str(p) for p in problems] == [f"{tmp_path}: /: more than {MAX_FILES} manifest files"]


def test_a_tag_that_makes_a_set_or_another_collection_is_a_problem(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "t.yaml",
        "kind: Worker\nspec:\n  id: w\n  attributes:\n    tags: !!set {a, b}\n"
        "    pairs: !!omap [a: 1]\n    mine: !thing {a: 1}\n    plain: !!map {a: 1}\n"
        "    list: !!seq [1]\n",
    )
    assert [str(p) for p in read_file(path, "t.yaml")[1]] == [
        "t.yaml:5:11: /spec/attributes/tags: not a JSON value (tag:yaml.org,2002:set):"
        " write a plain mapping or list",
        "t.yaml:6:12: /spec/attributes/pairs: not a JSON value (tag:yaml.org,2002:omap):"
        " write a plain mapping or list",
        "t.yaml:7:11: /spec/attributes/mine: not a JSON value (!thing):"
        " write a plain mapping or list",
    ]


def test_numbers_are_read_as_yaml_1_2_and_json_read_them(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "n.yaml",
        "kind: Worker\nspec:\n  id: w\n  attributes:\n    e: 1e3\n    big: 2.5E+2\n"
        "    small: -4e-1\n    half: .5\n    zero: 017\n    octal: 0o17\n    hex: 0x1F\n"
        "    time: 1:30\n    grouped: 1_000\n    words: 0b11\n",
    )
    [resource], problems = read_file(path, "n.yaml")
    assert problems == []
    assert resource.spec["attributes"] == {
        "e": 1000.0,
        "big": 250.0,
        "small": -0.4,
        "half": 0.5,
        "zero": 17,
        "octal": 15,
        "hex": 31,
        "time": "1:30",
        "grouped": "1_000",
        "words": "0b11",
    }
    data = write(
        tmp_path,
        "n.json",
        '{"kind": "Worker", "spec": {"id": "w", "attributes": '
        '{"e": 1e3, "big": 2.5E+2, "small": -4e-1, "n": -0, "x": 10}}}',
    )
    [resource], problems = read_file(data, "n.json")
    assert problems == []
    assert resource.spec["attributes"] == {
        "e": 1000.0,
        "big": 250.0,
        "small": -0.4,
        "n": 0,
        "x": 10,
    }


def test_an_escaped_surrogate_pair_is_one_character_and_a_lone_one_a_problem(
    tmp_path: Path,
) -> None:
    pair = r'"\ud83d\ude00"'
    for name, text in (
        ("e.json", '{"kind": "Worker", "spec": {"id": "w", "attributes": {"e": ' + pair + "}}}"),
        ("e.yaml", "kind: Worker\nspec:\n  id: w\n  attributes:\n    e: " + pair + "\n"),
    ):
        [resource], problems = read_file(write(tmp_path, name, text), name)
        assert problems == []
        assert resource.spec["attributes"] == {"e": "\U0001f600"}
    text = 'kind: Worker\nspec:\n  id: w\n  attributes:\n    e: "a\\ud83d"\n'
    lone = write(tmp_path, "l.yaml", text)
    assert [str(p) for p in read_file(lone, "l.yaml")[1]] == [
        "l.yaml:5:8: /spec/attributes/e: a \\u escape of half a surrogate pair (U+D83D) with"
        " no other half: not a Unicode character",
    ]


def test_a_json_file_is_read_as_json_even_where_yaml_would_read_it_otherwise(
    tmp_path: Path,
) -> None:
    text = (
        '{"kind": "Worker",\n\t"spec": {"id": "w", "attributes": {\n'
        '  "' + "k" * 1100 + '": 1, "key"\n  : 2,\n'
        '  "line": "a\u2028b\u0085c", "raw": "x\x7fy\x9f"}}}\n'
    )
    path = tmp_path / "w.json"
    path.write_text(text, newline="")
    [resource], problems = read_file(path, "w.json")
    assert problems == []
    assert resource.spec == json.loads(text)["spec"]
    assert resource.problem("/attributes/key", "m").line == 4


def test_a_json_file_has_the_same_problems_a_yaml_file_has(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "w.json",
        '{"kind": "Worker", "spec": {"id": "w",\n "id": "x", "n": 9223372036854775808,'
        ' "f": 1e400, "s": "\\ud800"}}',
    )
    assert [str(p) for p in read_file(path, "w.json")[1]] == [
        "w.json:2:2: /spec/id: duplicate key 'id'",
        "w.json:2:18: /spec/n: integer outside 64 bits",
        "w.json:2:44: /spec/f: not a JSON number (NaN or infinity)",
        "w.json:2:56: /spec/s: a \\u escape of half a surrogate pair (U+D800) with no other"
        " half: not a Unicode character",
    ]
    deep = write(
        tmp_path, "deep.json", '{"kind": "Worker", "spec": {"a": ' + "[" * 63 + "]" * 63 + "}}"
    )
    assert [str(p) for p in read_file(deep, "deep.json")[1]] == [
        f"deep.json:1:96: /: nested deeper than {MAX_DEPTH} levels"
    ]


def test_an_explicit_tag_on_a_value_it_cannot_read_is_a_problem_at_its_place(
    tmp_path: Path,
) -> None:
    path = write(
        tmp_path,
        "t.yaml",
        "kind: Worker\nspec:\n  id: w\n  attributes:\n    f: !!float abc\n    h: !!float 0x1F\n"
        "    e: !!float ''\n    b: !!bool maybe\n    y: !!bool yes\n    d: !!timestamp soon\n"
        "    m: !!timestamp 2024-13-45\n    ok: !!float 2\n    t: !!bool TRUE\n",
    )
    problems = [str(p) for p in read_file(path, "t.yaml")[1]]
    assert problems == [
        "t.yaml:5:8: /spec/attributes/f: cannot read the value: 'abc' is not a float",
        "t.yaml:6:8: /spec/attributes/h: cannot read the value: '0x1F' is not a float",
        "t.yaml:7:8: /spec/attributes/e: cannot read the value: '' is not a float",
        "t.yaml:8:8: /spec/attributes/b: cannot read the value: 'maybe' is not a boolean"
        " (true or false)",
        "t.yaml:9:8: /spec/attributes/y: cannot read the value: 'yes' is not a boolean"
        " (true or false)",
        "t.yaml:10:8: /spec/attributes/d: not a JSON value (tag:yaml.org,2002:timestamp):"
        " quote it to make it a string",
        "t.yaml:11:8: /spec/attributes/m: not a JSON value (tag:yaml.org,2002:timestamp):"
        " quote it to make it a string",
    ]
    fine = write(tmp_path, "f.yaml", "kind: Worker\nspec: {id: w, a: !!float 2, b: !!bool TRUE}\n")
    [resource], problems = read_file(fine, "f.yaml")
    assert problems == []
    assert resource.spec == {"id": "w", "a": 2.0, "b": True}


def test_an_integer_of_thousands_of_digits_is_outside_64_bits(tmp_path: Path) -> None:
    digits = "1" + "0" * 5000
    yaml_file = write(tmp_path, "n.yaml", f"kind: Worker\nspec: {{id: w, n: {digits}}}\n")
    assert [str(p) for p in read_file(yaml_file, "n.yaml")[1]] == [
        "n.yaml:2:18: /spec/n: integer outside 64 bits"
    ]
    padded = write(tmp_path, "z.yaml", f"kind: Worker\nspec: {{id: w, n: {'0' * 5000}7}}\n")
    [resource], problems = read_file(padded, "z.yaml")
    assert problems == []
    assert resource.spec == {"id": "w", "n": 7}
    json_file = write(
        tmp_path, "n.json", f'{{"kind": "Worker", "spec": {{"id": "w", "n": -{digits}}}}}'
    )
    assert [str(p) for p in read_file(json_file, "n.json")[1]] == [
        "n.json:1:45: /spec/n: integer outside 64 bits"
    ]
