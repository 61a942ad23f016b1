"""How `ductor_core.input_schemas` checks a schema and an input: on the
`jsonschema` library, with RE2 for patterns, the keywords that could run long
counted in steps, and no reference ever fetched. Imported on first use only.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from urllib.parse import unquote

import msgspec
import re2
from jsonschema import Draft6Validator, Draft7Validator, Draft201909Validator, Draft202012Validator
from jsonschema import validators as _validators
from jsonschema.exceptions import ValidationError
from jsonschema.protocols import Validator
from referencing import Registry
from referencing.exceptions import Unresolvable

from ductor_core.input_schemas import (
    MAX_MESSAGE_CHARS,
    MAX_PATTERN_CHARS,
    MAX_PROBLEMS,
    MAX_SCHEMA_BYTES,
    MAX_SCHEMA_DEPTH,
    InputCheck,
    InputProblem,
)

DRAFTS: Mapping[str, type[Validator]] = {
    "https://json-schema.org/draft/2020-12/schema": Draft202012Validator,
    "https://json-schema.org/draft/2019-09/schema": Draft201909Validator,
    "http://json-schema.org/draft-07/schema": Draft7Validator,
    "http://json-schema.org/draft-06/schema": Draft6Validator,
}
"""The dialects `$schema` may name (with or without a trailing `#`); 2020-12 without it."""

_REFUSED = {
    "$id": "'$id' is not supported: a reference may only point inside the schema",
    "$anchor": "'$anchor' is not supported: point at the subschema with '#/...'",
    "$dynamicRef": "'$dynamicRef' is not supported: use '$ref' to '#/...'",
    "$dynamicAnchor": "'$dynamicAnchor' is not supported: use '$ref' to '#/...'",
    "$recursiveRef": "'$recursiveRef' is not supported: use '$ref' to '#/...'",
    "$recursiveAnchor": "'$recursiveAnchor' is not supported: use '$ref' to '#/...'",
    "patternProperties": (
        "'patternProperties' is not supported: use 'propertyNames' with a 'pattern', "
        "or 'properties'"
    ),
}
# Keywords whose value is a subschema, an array of them, or an object of them.
_ONE = frozenset(
    {
        "additionalItems",
        "additionalProperties",
        "contains",
        "else",
        "if",
        "items",
        "not",
        "propertyNames",
        "then",
        "unevaluatedItems",
        "unevaluatedProperties",
    }
)
_MANY = frozenset({"allOf", "anyOf", "items", "oneOf", "prefixItems"})
_NAMED = frozenset(
    {"$defs", "definitions", "dependencies", "dependentSchemas", "patternProperties", "properties"}
)
# Keywords that apply their subschemas to the value itself, not to a part of it:
# a `$ref` these lead back to, without passing through one that reads into the
# value, is applied to the same value for ever.
_IN_PLACE_ONE = frozenset({"else", "if", "not", "then"})
_IN_PLACE_MANY = frozenset({"allOf", "anyOf", "oneOf"})
_IN_PLACE_NAMED = frozenset({"dependencies", "dependentSchemas"})


# --- publish-time checks -----------------------------------------------------------


def schema_problems(schema: Any) -> list[InputProblem]:
    """Every problem of `schema` as an input schema, with pointers from its root
    (""): at most `MAX_PROBLEMS`. An empty list means runs can be checked against it."""
    if not isinstance(schema, dict):
        return [InputProblem(pointer="", message="must be a JSON Schema object")]
    size = len(msgspec.json.encode(schema))
    if size > MAX_SCHEMA_BYTES:
        message = f"takes {size} bytes of JSON, more than {MAX_SCHEMA_BYTES}"
        return [InputProblem(pointer="", message=message)]
    if _depth(schema) > MAX_SCHEMA_DEPTH:
        message = f"nests objects and arrays more than {MAX_SCHEMA_DEPTH} deep"
        return [InputProblem(pointer="", message=message)]
    cls, problem = _dialect(schema)
    if problem is not None:
        return [problem]
    problems: list[InputProblem] = []
    for error in cls(cls.META_SCHEMA).iter_errors(schema):
        pointer = _pointer(error.absolute_path)
        problems.append(InputProblem(pointer=pointer, message=_cut(error.message)))
        if len(problems) >= MAX_PROBLEMS:
            return problems
    problems.extend(_walk(schema, schema, ""))
    if not problems:
        loop = _ref_loop(schema, refs_alone=cls in (Draft6Validator, Draft7Validator))
        if loop is not None:
            message = (
                "'$ref' leads back to where it started without reading into the input, "
                "so checking any input would never end"
            )
            problems.append(InputProblem(pointer=f"{loop}/$ref", message=message))
    return problems[:MAX_PROBLEMS]


def _depth(value: Any) -> int:
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            if depth > MAX_SCHEMA_DEPTH:
                return depth
            inner = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in inner)
    return deepest


def _dialect(schema: Mapping[str, Any]) -> tuple[type[Validator], InputProblem | None]:
    named = schema.get("$schema")
    if named is None:
        return Draft202012Validator, None
    found = DRAFTS.get(named.rstrip("#")) if isinstance(named, str) else None
    if found is None:
        message = (
            f"'$schema' must name one of {', '.join(DRAFTS)} (or be left out for 2020-12), "
            f"got {_show(named)}"
        )
        return Draft202012Validator, InputProblem(pointer="/$schema", message=message)
    return found, None


def _walk(root: Any, node: Any, pointer: str) -> Iterator[InputProblem]:
    """The problems of the subschema `node` (at `pointer`) beyond the meta-schema's."""
    if not isinstance(node, dict):
        return
    for keyword, message in _REFUSED.items():
        if keyword in node:
            yield InputProblem(pointer=f"{pointer}/{_escape(keyword)}", message=message)
    ref = node.get("$ref")
    if isinstance(ref, str) and not _resolves(root, ref):
        yield InputProblem(
            pointer=f"{pointer}/$ref",
            message=f"'$ref' must point inside this schema ('#' or '#/...'), got {_show(ref)}",
        )
    pattern = node.get("pattern")
    if isinstance(pattern, str):
        reason = _pattern_problem(pattern)
        if reason is not None:
            yield InputProblem(pointer=f"{pointer}/pattern", message=reason)
    for keyword, value in node.items():
        at = f"{pointer}/{_escape(keyword)}"
        if keyword in _ONE and isinstance(value, dict):
            yield from _walk(root, value, at)
        if keyword in _MANY and isinstance(value, list):
            for index, item in enumerate(value):
                yield from _walk(root, item, f"{at}/{index}")
        if keyword in _NAMED and isinstance(value, dict):
            for name, item in value.items():
                yield from _walk(root, item, f"{at}/{_escape(name)}")


def _resolves(root: Any, ref: str) -> bool:
    return _target(root, ref) is not None


def _target(root: Any, ref: str) -> str | None:
    """The pointer (escaped as `_pointer` writes it) of the subschema a local
    `$ref` names, or None when it names none."""
    if not ref.startswith("#"):
        return None
    fragment = unquote(ref[1:])
    if not fragment:
        return ""
    if not fragment.startswith("/"):
        return None
    node = root
    names: list[str] = []
    for token in fragment[1:].split("/"):
        name = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and name in node:
            node = node[name]
        elif isinstance(node, list) and name.isdigit() and int(name) < len(node):
            node = node[int(name)]
            name = str(int(name))
        else:
            return None
        names.append(name)
    return _pointer(names) if isinstance(node, dict | bool) else None


def _ref_loop(root: Mapping[str, Any], *, refs_alone: bool) -> str | None:
    """The pointer of a subschema whose `$ref` comes back to it through keywords
    that all apply to the same value (`allOf`, `not`, another `$ref`...), or None.

    Such a schema recurses for ever on some input (the library then fails in
    ways no `except` in Python reliably catches). A `$ref` that reaches itself
    through `properties`, `items` or any keyword that reads into the value is
    fine: each round reads a smaller part of the input. With `refs_alone` (draft-07
    and earlier), a `$ref` makes its siblings ignored, as the drafts say.
    """

    def nodes(pointer: str, node: Any) -> Iterator[str]:
        if not isinstance(node, dict):
            return
        ref = node.get("$ref")
        if isinstance(ref, str):
            target = _target(root, ref)
            if target is not None:
                yield target
            if refs_alone:
                return
        for keyword, value in node.items():
            at = f"{pointer}/{_escape(keyword)}"
            if keyword in _IN_PLACE_ONE and isinstance(value, dict):
                yield at
            elif keyword in _IN_PLACE_MANY and isinstance(value, list):
                yield from (f"{at}/{i}" for i, item in enumerate(value) if isinstance(item, dict))
            elif keyword in _IN_PLACE_NAMED and isinstance(value, dict):
                yield from (
                    f"{at}/{_escape(name)}"
                    for name, item in value.items()
                    if isinstance(item, dict)
                )

    def node_at(pointer: str) -> Any:
        node: Any = root
        for token in pointer.split("/")[1:]:
            name = token.replace("~1", "/").replace("~0", "~")
            node = node[int(name)] if isinstance(node, list) else node[name]
        return node

    # Depth-first over the subschemas applied in place, without recursion: a
    # node met again while still on the path closes a loop.
    done: set[str] = set()
    for start in _subschemas(root, ""):
        if start in done:
            continue
        on_path = {start}
        path: list[tuple[str, Iterator[str]]] = [(start, nodes(start, node_at(start)))]
        while path:
            pointer, successors = path[-1]
            following = next(successors, None)
            if following is None:
                path.pop()
                on_path.discard(pointer)
                done.add(pointer)
            elif following in on_path:
                # Name a `$ref` of the loop: the edge closing it may be an `allOf`.
                loop = [p for p, _ in path]
                loop = loop[loop.index(following) :]
                return next(p for p in reversed(loop) if "$ref" in node_at(p))
            elif following not in done:
                on_path.add(following)
                path.append((following, nodes(following, node_at(following))))
    return None


def _subschemas(node: Any, pointer: str) -> Iterator[str]:
    """The pointer of every subschema `_walk` visits, `node`'s first."""
    if not isinstance(node, dict):
        return
    yield pointer
    for keyword, value in node.items():
        at = f"{pointer}/{_escape(keyword)}"
        if keyword in _ONE and isinstance(value, dict):
            yield from _subschemas(value, at)
        if keyword in _MANY and isinstance(value, list):
            for index, item in enumerate(value):
                yield from _subschemas(item, f"{at}/{index}")
        if keyword in _NAMED and isinstance(value, dict):
            for name, item in value.items():
                yield from _subschemas(item, f"{at}/{_escape(name)}")


def _pattern_problem(pattern: str) -> str | None:
    if len(pattern) > MAX_PATTERN_CHARS:
        return f"'pattern' is longer than {MAX_PATTERN_CHARS} characters"
    try:
        _regex(pattern)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        return _cut(
            f"'pattern' is not an RE2 regular expression (no lookaround or backreference): {reason}"
        )
    return None


@functools.lru_cache(maxsize=1024)
def _regex(pattern: str) -> Any:
    options = re2.Options()
    options.log_errors = False
    options.never_capture = True
    options.max_mem = 8 << 20
    return re2.compile(pattern, options)


# --- checking inputs ---------------------------------------------------------------


def check_input(schema: Mapping[str, Any], value: Any, *, steps: int, root: str) -> InputCheck:
    """`input_schemas.check_input`, with its budget of `steps` worked out."""
    validator = _compiled(schema)
    if validator is None:
        return InputCheck()  # published before these checks, and not safe to run
    budget = steps
    problems: list[InputProblem] = []
    _state.left = budget
    try:
        for error in validator.iter_errors(value):
            problems.append(
                InputProblem(
                    pointer=root + _pointer(error.absolute_path),
                    message=_cut(_json_spelled(error)),
                )
            )
            if len(problems) >= MAX_PROBLEMS:
                break
    except _OutOfSteps:
        message = f"checking the input against input_schema takes more than {budget} steps"
        return _stopped(problems, root, message)
    except RecursionError:
        message = "checking the input against input_schema recurses too deeply"
        return _stopped(problems, root, message)
    except Unresolvable as exc:  # refused at publish; kept from ever reaching a registry
        return _stopped(
            problems, root, _cut(f"input_schema has a reference it cannot follow: {exc}")
        )
    finally:
        _state.left = 0
    return InputCheck(problems=tuple(problems))


def _stopped(problems: list[InputProblem], root: str, message: str) -> InputCheck:
    kept = problems[: MAX_PROBLEMS - 1]
    kept.append(InputProblem(pointer=root, message=message))
    return InputCheck(problems=tuple(kept), complete=False)


class _OutOfSteps(Exception):
    """The check ran out of steps."""


class _Budget(threading.local):
    left = 0


_state = _Budget()


def _spend(steps: int) -> None:
    _state.left -= steps
    if _state.left < 0:
        raise _OutOfSteps


Keyword = Callable[[Any, Any, Any, Any], Any]


def _paid(keyword: Keyword) -> Keyword:
    """`keyword`, each error it makes paid for as soon as it is made: a message
    quotes the value (the whole input, for a `type` at the root), and an
    applicator (`anyOf`, `oneOf`...) keeps its branches' errors. The message is
    cut once paid for, so what is kept stays small."""

    def check(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
        for error in keyword(validator, value, instance, schema) or ():
            _spend(1 + len(error.message) // 64)
            error.message = _cut(error.message)
            yield error

    return check


def _counted(keyword: Keyword) -> Keyword:
    paid = _paid(keyword)

    def check(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
        _spend(1 + (len(value) if isinstance(value, list | dict) else 0))
        yield from paid(validator, value, instance, schema)

    return check


def _required(
    validator: Any, required: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    # The problem points at the missing member itself.
    if not validator.is_type(instance, "object"):
        return
    for name in required:
        if name not in instance:
            yield ValidationError("is required", path=(name,))


def _pattern(validator: Any, pattern: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "string"):
        return
    _spend(1 + len(instance) // 256)
    if _regex(pattern).search(instance) is None:
        yield ValidationError(f"does not match the pattern {pattern!r}")


def _unique_items(
    validator: Any, unique: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    # Hashing each item makes this linear; the library compares pairs of objects.
    if not unique or not validator.is_type(instance, "array"):
        return
    seen: set[Any] = set()
    for index, item in enumerate(instance):
        key = _frozen(item)
        if key in seen:
            yield ValidationError("repeats an earlier item", path=(index,))
            return
        seen.add(key)


def _frozen(value: Any) -> Any:
    """A hashable stand-in for a JSON value: equal for equal values (1 and 1.0
    alike, true and 1 not), paid for by the value."""
    _spend(1)
    if isinstance(value, bool) or value is None:
        return ("b", value)
    if isinstance(value, int | float):
        return ("n", value)
    if isinstance(value, str):
        return ("s", value)
    if isinstance(value, list):
        return ("l", tuple(_frozen(item) for item in value))
    if isinstance(value, dict):
        return ("o", frozenset((name, _frozen(item)) for name, item in value.items()))
    return ("?", repr(value))


_OURS: Mapping[str, Keyword] = {
    "required": _required,
    "pattern": _pattern,
    "uniqueItems": _unique_items,
}


# The keywords that apply subschemas (where work multiplies) or loop over their
# value: counted. The others do a bounded amount of work per call, bounded by the
# schema's size, and are paid for by the applicator that reached them; the errors
# of every keyword are paid for (`_paid`).
_COUNTED = frozenset(
    {
        "$ref",
        "additionalItems",
        "additionalProperties",
        "allOf",
        "anyOf",
        "const",
        "contains",
        "dependencies",
        "dependentRequired",
        "dependentSchemas",
        "enum",
        "if",
        "items",
        "not",
        "oneOf",
        "prefixItems",
        "properties",
        "propertyNames",
        "required",
        "unevaluatedItems",
        "unevaluatedProperties",
    }
)


_counting_classes: dict[type[Validator], type[Validator]] = {}


def _counting(cls: type[Validator]) -> type[Validator]:
    """`cls` with the keywords that multiply work counted, every error paid for,
    and `required`, `pattern` and `uniqueItems` our own (these two count their
    own work)."""
    found = _counting_classes.get(cls)
    if found is None:
        keywords = {
            name: _counted(ours) if name in _COUNTED else _paid(ours)
            for name, keyword in cls.VALIDATORS.items()
            for ours in [_OURS.get(name, keyword)]
        }
        found = _counting_classes.setdefault(cls, _validators.extend(cls, validators=keywords))
    return found


_NO_REMOTE: Registry[Any] = Registry()
"""A registry that holds nothing and retrieves nothing: a reference the schema
itself does not hold is an error, never a fetch."""

_CACHE_SIZE = 256
_compiled_cache: OrderedDict[bytes, Validator | None] = OrderedDict()
_compiled_lock = threading.Lock()


def _compiled(schema: Mapping[str, Any]) -> Validator | None:
    """The validator for `schema`, built once per distinct schema (its canonical
    JSON): every version publishing the same schema shares it. None for a
    schema `schema_problems` refuses."""
    key = msgspec.json.encode(schema, order="sorted")
    with _compiled_lock:
        if key in _compiled_cache:
            _compiled_cache.move_to_end(key)
            return _compiled_cache[key]
    validator: Validator | None = None
    if not schema_problems(schema):
        cls, _ = _dialect(schema)
        validator = _counting(cls)(schema, registry=_NO_REMOTE)
    with _compiled_lock:
        _compiled_cache[key] = validator
        while len(_compiled_cache) > _CACHE_SIZE:
            _compiled_cache.popitem(last=False)
    return validator


# --- shared ------------------------------------------------------------------------


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def _pointer(path: Any) -> str:
    return "".join(f"/{_escape(str(token))}" for token in path)


def _json_spelled(error: ValidationError) -> str:
    """The library's message about an input value, with a null, true or false that it
    opens with written as JSON writes it, not as Python's None, True or False."""
    message = str(error.message)
    instance = error.instance
    if instance is None or isinstance(instance, bool):
        python = repr(instance)
        if message.startswith(python + " "):
            return msgspec.json.encode(instance).decode() + message[len(python) :]
    return message


def _cut(message: str) -> str:
    if len(message) <= MAX_MESSAGE_CHARS:
        return message
    return message[: MAX_MESSAGE_CHARS - 1] + "…"


def _show(value: Any) -> str:
    return _cut(msgspec.json.encode(value).decode())
