"""Reading manifest files: YAML, or strict JSON read as JSON, into resources, every
problem with its file, line, column and JSON pointer.

Only reads files: no server, no store. Hostile input is bounded: file size, file
count, nesting depth; YAML aliases (the "billion laughs") and non-JSON values
(timestamps, binary, sets, NaN) are refused. Booleans and numbers are YAML 1.2's:
`country: NO` stays the string "NO", `1e3` is a number (as in JSON), `1:30` a string.
"""

from __future__ import annotations

import bisect
import copy
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

MAX_FILE_BYTES = 1_000_000
"""The largest manifest file read."""

MAX_FILES = 1_000
"""The most manifest files one directory may hold."""

MAX_DEPTH = 64
"""The deepest nesting of lists and mappings in a manifest file."""

SUFFIXES = (".yaml", ".yml", ".json")
"""The files of a directory that are read (others are ignored)."""

KINDS = {
    "Connection": "name",
    "Worker": "id",
    "Pool": "id",
    "RuleSet": "id",
    "Workflow": "family_slug",
}
"""Each resource kind and the field of its `spec` that names it."""

_TOP_FIELDS = ("kind", "spec")
_MAP = "tag:yaml.org,2002:map"
_SEQ = "tag:yaml.org,2002:seq"
_INT_LIMIT = 2**63
_SURROGATE = re.compile("[\ud800-\udfff]")
_PAIR = re.compile("[\ud800-\udbff][\udc00-\udfff]")
_JSON_STRING_OR_CONSTANT = re.compile(r'"(?:[^"\\]|\\.)*"|(-?Infinity|NaN)', re.DOTALL)


@dataclass(frozen=True)
class Problem:
    """What is wrong, and where: a file, a JSON pointer into it, and the line and
    column that pointer starts at (when known)."""

    file: str
    pointer: str
    message: str
    line: int | None = None
    column: int | None = None

    def __str__(self) -> str:
        if not self.file:  # the server's, about no file
            return self.message
        where = self.file
        if self.line is not None:
            where += f":{self.line}:{self.column}"
        return f"{where}: {self.pointer or '/'}: {self.message}"


def where(problem: Problem) -> tuple[str, int, int]:
    """A sort key putting problems in file order, then line and column order."""
    return (problem.file, problem.line or 0, problem.column or 0)


@dataclass(frozen=True)
class Resource:
    """One resource of a manifest file: `spec` is the body its REST call takes."""

    kind: str
    name: str
    spec: Any
    file: str
    base: str
    """The pointer of the resource in its file ("" or "/3" in a list)."""
    marks: dict[str, tuple[int, int]] = field(default_factory=dict, repr=False)

    @property
    def ref(self) -> str:
        """`Kind/name`, as the plan prints it."""
        return f"{self.kind}/{self.name}"

    def problem(self, inner: str, message: str) -> Problem:
        """A problem at `inner`, a pointer into `spec`."""
        return at(self.file, self.marks, f"{self.base}/spec{inner}", message)


def at(file: str, marks: dict[str, tuple[int, int]], pointer: str, message: str) -> Problem:
    """A problem at `pointer`, with the line and column of the deepest part of it the
    file has (a pointer to a missing field shows where its parent starts)."""
    probe = pointer
    while probe not in marks and probe:
        probe = probe.rsplit("/", 1)[0]
    line, column = marks.get(probe, (None, None))
    return Problem(file=file, pointer=pointer, message=message, line=line, column=column)


def escape(token: str) -> str:
    """One JSON pointer token (RFC 6901)."""
    return token.replace("~", "~0").replace("/", "~1")


class _Loader(yaml.SafeLoader):  # type: ignore[misc]
    """SafeLoader with the booleans and numbers of YAML 1.2 (its core schema, which
    reads every JSON number as JSON does) and no implicit timestamps."""


_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"
_BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
# YAML 1.2: `017` is 17, `1e3` a float; `1:30`, `1_000` and `0b11` are strings.
_INT = re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$")
_FLOAT = re.compile(
    r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)
_Loader.yaml_implicit_resolvers = {
    first: [
        (tag, regexp)
        for tag, regexp in resolvers
        if tag
        not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:timestamp", _INT_TAG, _FLOAT_TAG)
    ]
    for first, resolvers in copy.deepcopy(yaml.SafeLoader.yaml_implicit_resolvers).items()
}
_Loader.add_implicit_resolver("tag:yaml.org,2002:bool", _BOOL, list("tTfF"))
# Int first: a plain `12` matches both.
_Loader.add_implicit_resolver(_INT_TAG, _INT, list("-+0123456789"))
_Loader.add_implicit_resolver(_FLOAT_TAG, _FLOAT, list("-+.0123456789"))


def _decimal(text: str) -> int:
    """A decimal integer, or one just outside 64 bits for a text of more digits than
    64 bits hold (Python refuses to convert thousands of digits: a ValueError)."""
    negative = text.startswith("-")
    digits = text.lstrip("+-").lstrip("0")
    if len(digits) > len(str(_INT_LIMIT)):
        return -_INT_LIMIT - 1 if negative else _INT_LIMIT
    # Leading zeros count towards Python's limit too.
    number = int(digits or "0", 10)
    return -number if negative else number


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    """A YAML 1.2 integer: decimal (leading zeros and all), `0o` octal or `0x` hex."""
    text = str(loader.construct_scalar(node))
    if not _INT.fullmatch(text):
        raise yaml.constructor.ConstructorError(
            None, None, f"{text!r} is not an integer", node.start_mark
        )
    if text.startswith("0o"):
        return int(text[2:], 8)
    if text.startswith("0x"):
        return int(text[2:], 16)
    return _decimal(text)


def _construct_float(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> float:
    """A YAML 1.2 float (an explicit `!!float` too: PyYAML's own raises a bare
    ValueError on text that is no number)."""
    text = str(loader.construct_scalar(node))
    if not _FLOAT.fullmatch(text):
        raise yaml.constructor.ConstructorError(
            None, None, f"{text!r} is not a float", node.start_mark
        )
    if text.lower().lstrip("+-") == ".inf":
        return float("-inf") if text.startswith("-") else float("inf")
    if text.lower() == ".nan":
        return float("nan")
    return float(text)


def _construct_bool(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> bool:
    """A YAML 1.2 boolean (an explicit `!!bool yes` too, which YAML 1.1 read as true)."""
    text = str(loader.construct_scalar(node))
    if not _BOOL.fullmatch(text):
        raise yaml.constructor.ConstructorError(
            None, None, f"{text!r} is not a boolean (true or false)", node.start_mark
        )
    return text.lower() == "true"


def _construct_timestamp(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> _NotJson:
    """An explicit `!!timestamp`, refused as not JSON whatever its text (PyYAML's own
    raises a bare error on a text that is no time)."""
    return _NotJson()


class _NotJson:
    """A value no JSON document holds (the builder reports it)."""


_Loader.add_constructor(_INT_TAG, _construct_int)
_Loader.add_constructor(_FLOAT_TAG, _construct_float)
_Loader.add_constructor("tag:yaml.org,2002:bool", _construct_bool)
_Loader.add_constructor("tag:yaml.org,2002:timestamp", _construct_timestamp)


def _mark(mark: Any) -> tuple[int, int]:
    return (mark.line + 1, mark.column + 1)


def _screen(text: str, name: str) -> Problem | None:
    """The first reason not to build the file's document: a syntax error, an alias,
    nesting beyond MAX_DEPTH, or more than one document (read as events, so no
    input is nested on the stack)."""
    depth = 0
    documents = 0
    try:
        for event in yaml.parse(text, Loader=_Loader):
            if isinstance(event, yaml.AliasEvent):
                return Problem(
                    name,
                    "",
                    "YAML aliases (*name) are not supported: write the value out",
                    *_mark(event.start_mark),
                )
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    return Problem(
                        name,
                        "",
                        f"nested deeper than {MAX_DEPTH} levels",
                        *_mark(event.start_mark),
                    )
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
            elif isinstance(event, yaml.DocumentStartEvent):
                documents += 1
                if documents > 1:
                    return Problem(
                        name,
                        "",
                        "more than one YAML document: put the resources in one list instead",
                        *_mark(event.start_mark),
                    )
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        reason = exc.problem or exc.context or "invalid YAML"
        if mark is None:
            return Problem(name, "", f"invalid YAML: {reason}")
        return Problem(name, "", f"invalid YAML: {reason}", *_mark(mark))
    except yaml.YAMLError as exc:
        return Problem(name, "", f"invalid YAML: {exc}")
    return None


def _strict_json(text: str, name: str) -> Problem | None:
    """Why a `.json` file is not JSON (YAML, which reads it next, is more lenient; so is
    Python's `json`, which reads NaN and Infinity)."""
    constants: list[str] = []
    try:
        # No int(): thousands of digits would raise a ValueError (the reader, next,
        # reports an integer outside 64 bits).
        json.loads(text, parse_constant=constants.append, parse_int=len)
    except json.JSONDecodeError as exc:
        return Problem(name, "", f"invalid JSON: {exc.msg}", exc.lineno, exc.colno)
    except RecursionError:
        return Problem(name, "", f"nested deeper than {MAX_DEPTH} levels")
    if not constants:
        return None
    # The text is JSON but for these words, which only strings can hide.
    found = next(m for m in _JSON_STRING_OR_CONSTANT.finditer(text) if m.group(1))
    start = found.start(1)
    line = text.count("\n", 0, start) + 1
    column = start - (text.rfind("\n", 0, start) + 1) + 1
    return Problem(name, "", f"invalid JSON: {found.group(1)} is not a JSON number", line, column)


class _Builder:
    """Turns a composed YAML node tree into JSON values and the position of each pointer."""

    def __init__(self, loader: _Loader, name: str) -> None:
        self.loader = loader
        self.name = name
        self.marks: dict[str, tuple[int, int]] = {}
        self.problems: list[Problem] = []

    def fail(self, pointer: str, node: yaml.Node, message: str) -> None:
        self.problems.append(Problem(self.name, pointer, message, *_mark(node.start_mark)))

    def build(self, node: yaml.Node, pointer: str) -> Any:
        self.marks[pointer] = _mark(node.start_mark)
        if isinstance(node, yaml.CollectionNode) and node.tag not in (_MAP, _SEQ):
            # `!!set`, `!!omap` or an app's own tag: the value would not be the JSON
            # mapping or list the file shows.
            message = f"not a JSON value ({node.tag}): write a plain mapping or list"
            self.fail(pointer, node, message)
            return None
        if isinstance(node, yaml.MappingNode):
            out: dict[str, Any] = {}
            for key_node, value_node in node.value:
                key = (
                    self.scalar(key_node, pointer)
                    if isinstance(key_node, yaml.ScalarNode)
                    else None
                )
                if not isinstance(key, str):
                    self.fail(pointer, key_node, "mapping keys must be strings")
                    continue
                child = f"{pointer}/{escape(key)}"
                if key in out:
                    self.fail(child, key_node, f"duplicate key {key!r}")
                    continue
                out[key] = self.build(value_node, child)
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self.build(item, f"{pointer}/{i}") for i, item in enumerate(node.value)]
        assert isinstance(node, yaml.ScalarNode)
        return self.scalar(node, pointer)

    def scalar(self, node: yaml.ScalarNode, pointer: str) -> Any:
        try:
            value = self.loader.construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            self.fail(pointer, node, f"cannot read the value: {getattr(exc, 'problem', exc)}")
            return None
        if isinstance(value, str):
            return self.text(value, node, pointer)
        if isinstance(value, bool) or value is None:
            return value
        if isinstance(value, int):
            if not -_INT_LIMIT <= value < _INT_LIMIT:
                self.fail(pointer, node, "integer outside 64 bits")
            return value
        if isinstance(value, float):
            if value != value or value in (float("inf"), float("-inf")):
                self.fail(pointer, node, "not a JSON number (NaN or infinity)")
            return value
        self.fail(pointer, node, f"not a JSON value ({node.tag}): quote it to make it a string")
        return None

    def text(self, value: str, node: yaml.ScalarNode, pointer: str) -> str | None:
        """A string, with each pair of `\\u` escapes of a surrogate pair made the one
        character it stands for, as JSON reads it (YAML leaves the halves apart)."""
        if not _SURROGATE.search(value):
            return value
        lone = _lone_surrogate(value)
        if lone is not None:
            self.fail(pointer, node, lone)
            return None
        return value.encode("utf-16-le", "surrogatepass").decode("utf-16-le")


def _lone_surrogate(value: str) -> str | None:
    """What is wrong with a string holding half a surrogate pair without the other."""
    lone = _SURROGATE.search(_PAIR.sub("", value))
    if lone is None:
        return None
    return (
        f"a \\u escape of half a surrogate pair (U+{ord(lone.group()):04X}) with no"
        " other half: not a Unicode character"
    )


_JSON_SPACE = re.compile(r"[ \t\n\r]*")
_JSON_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_JSON_WORDS = {"true": True, "false": False, "null": None}
# The string reader of `json` itself: a string from after its opening quote, and
# where the string ends (typeshed does not declare it).
_scanstring: Callable[[str, int], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]


class _JsonReader:
    """A `.json` file (already known to be strict JSON) into JSON values, read as JSON
    and not as YAML (which reads some JSON otherwise: a tab between tokens, a key over
    1,024 characters, a raw U+2028 in a string), with the position of each pointer."""

    def __init__(self, text: str, name: str) -> None:
        self.text = text
        self.name = name
        self.pos = 0
        self.marks: dict[str, tuple[int, int]] = {}
        self.problems: list[Problem] = []
        self._lines = [0] + [m.end() for m in re.finditer("\n", text)]

    def mark(self, pos: int) -> tuple[int, int]:
        line = bisect.bisect_right(self._lines, pos)
        return line, pos - self._lines[line - 1] + 1

    def fail(self, pointer: str, pos: int, message: str) -> None:
        self.problems.append(Problem(self.name, pointer, message, *self.mark(pos)))

    def space(self) -> None:
        self.pos = _JSON_SPACE.match(self.text, self.pos).end()  # type: ignore[union-attr]

    def read(self) -> Any:
        """The document (None when nested too deep: a problem says so)."""
        self.space()
        try:
            return self.value("", 0)
        except _TooDeep:
            return None

    def value(self, pointer: str, depth: int) -> Any:
        start = self.pos
        self.marks[pointer] = self.mark(start)
        char = self.text[start]
        if char in "{[":
            if depth + 1 > MAX_DEPTH:
                self.fail("", start, f"nested deeper than {MAX_DEPTH} levels")
                raise _TooDeep
            return (
                self.mapping(pointer, depth + 1) if char == "{" else self.list(pointer, depth + 1)
            )
        if char == '"':
            value, self.pos = _scanstring(self.text, start + 1)
            if (lone := _lone_surrogate(value)) is not None:
                self.fail(pointer, start, lone)
                return None
            return value
        for word, constant in _JSON_WORDS.items():
            if self.text.startswith(word, start):
                self.pos = start + len(word)
                return constant
        found = _JSON_NUMBER.match(self.text, start)
        assert found is not None  # the text is strict JSON
        self.pos = found.end()
        if found.group(1) is None and found.group(2) is None:
            number = _decimal(found.group())
            if not -_INT_LIMIT <= number < _INT_LIMIT:
                self.fail(pointer, start, "integer outside 64 bits")
            return number
        real = float(found.group())
        if real in (float("inf"), float("-inf")):
            self.fail(pointer, start, "not a JSON number (NaN or infinity)")
        return real

    def mapping(self, pointer: str, depth: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        self.pos += 1
        self.space()
        while self.text[self.pos] != "}":
            key_at = self.pos
            key, self.pos = _scanstring(self.text, key_at + 1)
            child = f"{pointer}/{escape(key)}"
            self.space()
            self.pos += 1  # the colon
            self.space()
            if (lone := _lone_surrogate(key)) is not None:
                self.fail(pointer, key_at, lone)
            elif key in out:
                self.fail(child, key_at, f"duplicate key {key!r}")
            value = self.value(child, depth)
            out.setdefault(key, value)
            self.after_item()
        self.pos += 1
        return out

    def list(self, pointer: str, depth: int) -> list[Any]:
        out: list[Any] = []
        self.pos += 1
        self.space()
        while self.text[self.pos] != "]":
            out.append(self.value(f"{pointer}/{len(out)}", depth))
            self.after_item()
        self.pos += 1
        return out

    def after_item(self) -> None:
        """Past the space and the comma (if any) after an item of an object or array."""
        self.space()
        if self.text[self.pos] == ",":
            self.pos += 1
            self.space()


class _TooDeep(Exception):
    """A `.json` file nested deeper than MAX_DEPTH (reported; reading stops)."""


def read_file(path: Path, name: str) -> tuple[list[Resource], list[Problem]]:
    """The resources of one manifest file, or its problems (never both halves)."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        return [], [Problem(name, "", f"cannot read the file: {exc.strerror}")]
    if size > MAX_FILE_BYTES:
        return [], [
            Problem(name, "", f"the file is {size} bytes, over the limit of {MAX_FILE_BYTES}")
        ]
    try:
        raw = path.read_bytes()
    except OSError as exc:
        return [], [Problem(name, "", f"cannot read the file: {exc.strerror}")]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        return [], [Problem(name, "", "the file is not UTF-8", line, column)]
    if path.suffix.lower() == ".json":
        strict = _strict_json(text, name)
        if strict is not None:
            return [], [strict]
        reader = _JsonReader(text, name)
        document = reader.read()
        if reader.problems:
            return [], reader.problems
        return _resources(document, reader.marks, name)
    screened = _screen(text, name)
    if screened is not None:
        return [], [screened]
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return [], [Problem(name, "", "the file is empty: it needs a resource or a list")]
        builder = _Builder(loader, name)
        document = builder.build(node, "")
    except yaml.YAMLError as exc:  # the screen read the same events; kept for safety
        return [], [Problem(name, "", f"invalid YAML: {exc}")]
    finally:
        loader.dispose()
    if builder.problems:
        return [], builder.problems
    return _resources(document, builder.marks, name)


def _resources(
    document: Any, marks: dict[str, tuple[int, int]], name: str
) -> tuple[list[Resource], list[Problem]]:
    """The resources of a file's document: one resource, or a list of them."""
    if isinstance(document, list):
        entries = [(f"/{i}", item) for i, item in enumerate(document)]
        if not entries:
            return [], [at(name, marks, "", "the list is empty")]
    else:
        entries = [("", document)]
    resources: list[Resource] = []
    problems: list[Problem] = []
    for base, entry in entries:
        found = _resource(entry, base, name, marks)
        if isinstance(found, Resource):
            resources.append(found)
        else:
            problems.extend(found)
    return resources, problems


def _resource(
    entry: Any, base: str, name: str, marks: dict[str, tuple[int, int]]
) -> Resource | list[Problem]:
    if not isinstance(entry, dict):
        return [at(name, marks, base, "a resource is a mapping with `kind` and `spec`")]
    problems = [
        at(
            name,
            marks,
            f"{base}/{escape(key)}",
            f"unknown field {key!r} (a resource has kind and spec)",
        )
        for key in entry
        if key not in _TOP_FIELDS
    ]
    kind = entry.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:  # a list or mapping cannot be looked up
        known = ", ".join(KINDS)
        shown = repr(kind)[:64] if "kind" in entry else "missing"
        problems.append(at(name, marks, f"{base}/kind", f"kind is {shown}: one of {known}"))
    spec = entry.get("spec")
    if not isinstance(spec, dict):
        problems.append(
            at(name, marks, f"{base}/spec", "spec must be a mapping (the resource's body)")
        )
    if problems or not isinstance(kind, str) or not isinstance(spec, dict):
        return problems
    field_name = KINDS[kind]
    resource_name = spec.get(field_name, "default" if kind == "RuleSet" else None)
    if not isinstance(resource_name, str) or not resource_name.strip():
        return [
            at(
                name,
                marks,
                f"{base}/spec/{field_name}",
                f"a {kind} needs `{field_name}`: a non-empty string",
            )
        ]
    return Resource(kind=kind, name=resource_name, spec=spec, file=name, base=base, marks=marks)


def _manifest_paths(root: Path) -> Iterator[Path]:
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if any(part.startswith(".") for part in relative.parts):
            continue
        if path.suffix.lower() in SUFFIXES and path.is_file():
            yield path


def read_manifests(source: Path) -> tuple[list[Resource], list[Problem]]:
    """Every resource under `source` (a manifest file, or a directory read recursively
    for *.yaml, *.yml and *.json, hidden entries skipped), and every problem of every
    file. A resource named twice is a problem at its second place."""
    if source.is_file():
        paths = [source]
        names = {source: str(source)}
    elif source.is_dir():
        paths = []
        for path in _manifest_paths(source):
            paths.append(path)
            if len(paths) > MAX_FILES:
                return [], [Problem(str(source), "", f"more than {MAX_FILES} manifest files")]
        names = {p: str(p) for p in paths}
    else:
        return [], [Problem(str(source), "", "no such file or directory")]
    if not paths:
        return [], [Problem(str(source), "", "no manifest files (*.yaml, *.yml, *.json) found")]
    resources: list[Resource] = []
    problems: list[Problem] = []
    for path in paths:
        found, wrong = read_file(path, names[path])
        resources.extend(found)
        problems.extend(wrong)
    seen: dict[tuple[str, str], Resource] = {}
    rule_set: Resource | None = None
    kept: list[Resource] = []
    for resource in resources:
        key = (resource.kind, resource.name)
        first = seen.get(key)
        if first is not None:
            problems.append(
                resource.problem(
                    "/" + KINDS[resource.kind],
                    f"{resource.ref} is also defined at {first.file}{first.base or ''}",
                )
            )
            continue
        if resource.kind == "RuleSet":
            if rule_set is not None:
                problems.append(
                    resource.problem(
                        "",
                        f"a tenant has one rule set: {rule_set.ref} is defined at {rule_set.file}",
                    )
                )
                continue
            rule_set = resource
        seen[key] = resource
        kept.append(resource)
    return kept, problems


__all__ = [
    "KINDS",
    "MAX_DEPTH",
    "MAX_FILES",
    "MAX_FILE_BYTES",
    "Problem",
    "Resource",
    "read_file",
    "read_manifests",
    "where",
]
