"""The static cost estimate of a CEL expression, for both engines; refuses the costly ones.

Walks the tree of `_syntax` once and returns an upper bound of the work an
evaluation can do, in units of about one node evaluated, and the sizes of the
values it can build. Imports no CEL library and evaluates nothing.

The model, in the manner of cel-go's estimator:

- Every node costs at least 1, and so does a pair of parentheses.
- A comprehension (`all`, `exists`, `exists_one`, `existsOne`, `map`,
  `filter`) costs its range plus, for each element the range may hold, one
  unit and its body.
- Sizes are upper bounds tracked along the tree as a `Shape`: the items of a
  list or map, the characters of a string or bytes, and the shape of the
  items. A literal's size is exact; a value read from a variable (`input`,
  `steps`, ...) has the assumed sizes of `CostLimits` (`assumed_items`,
  `assumed_chars`), and so does every item and field inside it. `s + s`
  doubles the size of `s`, so a chain of doublings grows exponentially.
- Building a string costs 1 per 10 characters and a list 1 per 10 items (so
  a doubling chain costs what it allocates); comparing values or looking
  through a list costs 1 per 10 items and 1 per 1,000 characters;
  `matches` costs the string's tenths times the pattern's quarters, as in
  cel-go, plus compiling the pattern (cel-rust compiles it on every call):
  a literal pattern by its weight (`regex_weight`), any other the worst
  case; a custom function pays for copying its arguments in and for
  building its result.
- At run time on cel-rust only, a comprehension that builds a list (`map`,
  `filter`) also pays for cel-rust copying the list built so far, deeply, at
  every step: the square of its items times what one item weighs, in
  twentieths of a unit (`accumulated`); an item from outside weighs what the
  items of the heaviest list in the variables weigh on average (`heft`).
- Handing the result back (conversion to JSON) costs 1 per 10 items and 1
  per 100 characters it holds, counting shared items each time (`[a, a]`
  nested 30 deep is 2^30 items); the items of a value from outside count as
  leaves.
- A built string longer than `max_string_length` or list longer than
  `max_list_length` is refused whatever its cost.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field

from ductor_core.errors import ExpressionError
from ductor_core.expressions._limits import CostLimits
from ductor_core.expressions._syntax import (
    COMPREHENSIONS,
    Binary,
    Call,
    Conditional,
    Group,
    Ident,
    Index,
    LimitExceeded,
    ListNode,
    Literal,
    MapNode,
    Node,
    Select,
    Unary,
    Unreadable,
    bound_names,
    parse,
)

# Costs and sizes saturate here instead of growing without end (a doubling
# chain of 2,000 steps would otherwise make numbers of 600 digits).
_CAP = 2**62

_CHEAP_SCALARS = frozenset(
    {
        "size",
        "int",
        "uint",
        "double",
        "bool",
        "timestamp",
        "duration",
        "type",
        "getFullYear",
        "getMonth",
        "getDate",
        "getDayOfMonth",
        "getDayOfWeek",
        "getDayOfYear",
        "getHours",
        "getMinutes",
        "getSeconds",
        "getMilliseconds",
        "has_key",
        "max",
        "min",
        "sum",
    }
)
_SCANS = frozenset({"contains", "startsWith", "endsWith"})
# Compiling a regex: cel-rust compiles the pattern on every call of
# matches() (no cache), in up to about 50 ms for a pattern its size limit
# still takes (`.{10000}`, `\\w{1000}`); a unit is about a microsecond there.
# A pattern known from a literal costs its weight (below); any other, the worst.
_REGEX_UNKNOWN = 50_000
_REGEX_ATOMS = {".": 40}
_REGEX_ESCAPES = {"d": 200, "D": 200, "w": 500, "W": 500, "s": 500, "S": 500, "p": 500, "P": 500}
_REPEAT = re.compile(r"\{(\d*)(?:,(\d*))?\}")
# `string(1e308)` prints 309 digits; no other scalar prints longer.
_LONGEST_SCALAR_TEXT = 400
# `upper('ß')` is 'SS': case mapping at most triples a string.
_CASE_GROWTH = 3


def _sat(value: int) -> int:
    return value if value < _CAP else _CAP


def _tenths(value: int) -> int:
    return -(-value // 10)


def regex_weight(pattern: str) -> int:
    """About how big a regex compiles: atoms times the repetitions around them.

    A character weighs 1, a class its members (a negated one 30), `.` 40,
    `\\d` 200 and the Unicode classes (`\\w`, `\\s`, `\\p{..}`) 500; `x{n,m}`
    is m copies of x. Measured on cel-rust, a unit of weight is about a tenth
    of a microsecond to compile.
    """
    totals = [0]  # per open group: the weight so far
    last = [0]  # per open group: the weight of the last atom, for a repetition
    position = 0
    end = len(pattern)
    while position < end:
        char = pattern[position]
        position += 1
        atom = 0
        if char == "\\" and position < end:
            atom = _REGEX_ESCAPES.get(pattern[position], 1)
            position += 1
        elif char == "[":
            start = position
            if position < end and pattern[position] == "^":
                position += 1
            if position < end and pattern[position] == "]":
                position += 1
            while position < end and pattern[position] != "]":
                position += 2 if pattern[position] == "\\" else 1
            body = pattern[start:position]
            position += 1
            heavy = sum(weight for key, weight in _REGEX_ESCAPES.items() if "\\" + key in body)
            atom = 30 if body.startswith("^") else max(len(body), 1) + heavy
        elif char == "(":
            totals.append(0)
            last.append(0)
            continue
        elif char == ")" and len(totals) > 1:
            atom = totals.pop()
            last.pop()
        elif char == "{":
            repeat = _REPEAT.match(pattern, position - 1)
            if repeat is not None:
                low, high = repeat.group(1), repeat.group(2)
                times = max(int(low or 0), int(high or 0), 1) + (high == "")
                position = repeat.end()
                totals[-1] = _sat(totals[-1] + last[-1] * (times - 1))
                last[-1] = _sat(last[-1] * times)
                continue
            atom = 1
        elif char in "*+?|":
            continue
        else:
            atom = _REGEX_ATOMS.get(char, 1)
        totals[-1] = _sat(totals[-1] + atom)
        last[-1] = atom
    return _sat(sum(totals))


@dataclass(frozen=True, slots=True)
class Shape:
    """Upper bounds of a value's sizes.

    Attributes:
        items: how many items (list) or entries (map) it can have.
        chars: how long it can be, as a string or bytes.
        item: the shape of its items (of a map: its keys and values); None
            for a value from outside, whose items have the assumed sizes.
        keyed: it may be a map (whose entries are dearer to copy than items).
    """

    items: int
    chars: int
    item: Shape | None
    keyed: bool = False


SCALAR = Shape(0, 0, None)


@dataclass(frozen=True, slots=True)
class CostEstimate:
    """What the estimator found for one expression.

    Attributes:
        cost: the worst-case cost, in units of about one node evaluated.
        depth: the height of the expression's tree.
        tokens: how many tokens the source has.
        longest_string: the longest string (or bytes) it can build.
        longest_list: the longest list or map it can build.
        hottest: where the node evaluated most often is, and how often, as
            (column, name, times); None without comprehensions.
        result_cost: the part of `cost` that is handing the result back
            (converting it to JSON).
        assumed_items: the size assumed for each list and map from outside.
        assumed_chars: the size assumed for each string from outside.
    """

    cost: int
    depth: int
    tokens: int
    longest_string: int
    longest_list: int
    hottest: tuple[int, str, int] | None
    result_cost: int
    assumed_items: int
    assumed_chars: int


class _Estimator:
    """One walk over a tree with one set of assumed sizes."""

    def __init__(self, assumed_items: int, assumed_chars: int, heft: int | None = None) -> None:
        self.unknown = Shape(assumed_items, assumed_chars, None)
        # None: the list-building copies are not priced (the compile-time estimate).
        self.heft = heft
        self.longest_string = 0
        self.longest_list = 0
        self.hottest: tuple[int, str, int] | None = None

    # shapes

    def items_of(self, shape: Shape) -> Shape:
        return shape.item if shape.item is not None else self.unknown

    def join(self, a: Shape | None, b: Shape | None) -> Shape | None:
        """The least shape that bounds both (None, an unknown value, bounds all)."""
        if a is None and b is None:
            return None
        left = a if a is not None else self.unknown
        right = b if b is not None else self.unknown
        if left is right:
            return left
        return Shape(
            max(left.items, right.items),
            max(left.chars, right.chars),
            self.join_items(left, right),
            left.keyed or right.keyed,
        )

    def join_items(self, left: Shape, right: Shape) -> Shape | None:
        """The shape bounding the items of both; a value with no items has none to add."""
        if left.items and right.items:
            return self.join(left.item, right.item)
        if left.items:
            return left.item
        if right.items:
            return right.item
        return None

    def built(self, shape: Shape) -> Shape:
        """Note the sizes of a value the expression builds."""
        self.longest_string = max(self.longest_string, shape.chars)
        self.longest_list = max(self.longest_list, shape.items)
        return shape

    def held(self, shape: Shape) -> tuple[int, int]:
        """The items and characters a value holds in all, shared ones counted each time.

        A value from outside holds its assumed items and characters; its items
        count as leaves, with none of their own.
        """
        items = chars = 0
        factor = 1
        current = shape
        while True:
            chars = _sat(chars + _sat(factor * current.chars))
            if not current.items:
                return items, chars
            factor = _sat(factor * current.items)
            items = _sat(items + factor)
            if current.item is None:
                return items, chars
            current = current.item

    def accumulated(self, count: int, item: Shape) -> int:
        """What cel-rust copies building a list of `count` such items, one at a time.

        Its `map()` and `filter()` append each item to a deep copy of the list
        built so far: `count`**2 / 2 items copied, at about 100 ns (a twentieth
        of a unit) for each thing an item holds: 1 for itself, 1 per list item,
        3 per map entry, 1 per 512 characters. A value from outside weighs what
        the items of the heaviest list of the variables do on average.
        """
        if count <= 1 or self.heft is None:
            return 0
        base = self.unknown.items
        outside = max(1, self.heft // _sat(base * base))
        weight = self.weight(item, outside)
        return -(-_sat(_sat(count * count) * weight) // 20)

    def weight(self, shape: Shape, outside: int) -> int:
        """What copying one value of `shape` costs cel-rust, in list items (see `accumulated`)."""
        if shape.item is None:
            return outside if shape.items else 1 + shape.chars // 512
        per_item = 2 if shape.keyed else 0
        return _sat(1 + _sat(shape.items * _sat(per_item + self.weight(shape.item, outside))))

    def copy(self, shape: Shape) -> int:
        """The cost of converting a value to JSON or from it: strings are copied whole."""
        items, chars = self.held(shape)
        return _tenths(items) + -(-chars // 100)

    def build(self, shape: Shape) -> int:
        """The cost of making a value anew (a custom function's result)."""
        items, chars = self.held(shape)
        return _tenths(items) + _tenths(chars)

    def compare(self, a: Shape, b: Shape) -> int:
        """The cost of comparing two values, beyond the operator itself."""
        items = min(a.items, b.items)
        cost = _tenths(items) + -(-min(a.chars, b.chars) // 1000)
        if items and a.item is not None and b.item is not None:
            cost = _sat(cost + items * self.compare(a.item, b.item))
        return cost

    def copy_in(self, node: Node, scope: dict[str, Shape]) -> int:
        """The cost of putting the value of `node` into a list, a map or a map() result.

        A value read from a variable (`input.c`, not a comprehension's own
        variable or a field of it) is copied whole into what is built, as a
        built value is: it may hold the assumed items and characters. The
        items of a comprehension's range were paid for with the range.
        """
        while isinstance(node, (Group, Select, Index)):
            node = node.inner if isinstance(node, Group) else node.operand
        if isinstance(node, Ident) and node.name not in scope:
            return self.build(self.unknown)
        return 0

    # the walk

    def cost(self, node: Node, scope: dict[str, Shape], times: int) -> tuple[int, Shape]:
        """(cost, shape) of `node`; `times` is how often it may be evaluated."""
        if isinstance(node, Literal):
            if node.kind in ("string", "bytes"):
                return 1, Shape(0, node.length, None)
            return 1, SCALAR
        if isinstance(node, Ident):
            return 1, scope.get(node.name, self.unknown)
        if isinstance(node, Select):
            cost, shape = self.cost(node.operand, scope, times)
            return _sat(cost + 1), self.items_of(shape)
        if isinstance(node, Index):
            cost, shape = self.cost(node.operand, scope, times)
            index_cost, index_shape = self.cost(node.index, scope, times)
            # A map looked up by a key that is not hashable as is is searched.
            lookup = _tenths(shape.items) if index_shape.items or index_shape.chars else 1
            return _sat(cost + index_cost + lookup), self.items_of(shape)
        if isinstance(node, Unary):
            cost, _ = self.cost(node.operand, scope, times)
            return _sat(cost + 1), SCALAR
        if isinstance(node, Binary):
            return self.binary(node, scope, times)
        if isinstance(node, Group):
            # cel-python walks about ten tree levels for a pair of brackets.
            cost, shape = self.cost(node.inner, scope, times)
            return _sat(cost + 1), shape
        if isinstance(node, Conditional):
            condition, _ = self.cost(node.condition, scope, times)
            then_cost, then_shape = self.cost(node.then, scope, times)
            else_cost, else_shape = self.cost(node.otherwise, scope, times)
            joined = self.join(then_shape, else_shape)
            return _sat(condition + max(then_cost, else_cost) + 1), joined or self.unknown
        if isinstance(node, ListNode):
            total = 1
            item: Shape | None = SCALAR
            for index, element in enumerate(node.items):
                element_cost, element_shape = self.cost(element, scope, times)
                total = _sat(total + element_cost + self.copy_in(element, scope))
                item = element_shape if index == 0 else self.join(item, element_shape)
            return total, self.built(Shape(len(node.items), 0, item))
        if isinstance(node, MapNode):
            total = 1
            item = SCALAR
            for index, (key, value) in enumerate(node.entries):
                key_cost, key_shape = self.cost(key, scope, times)
                value_cost, value_shape = self.cost(value, scope, times)
                total = _sat(total + key_cost + value_cost + self.copy_in(value, scope))
                pair = self.join(key_shape, value_shape)
                item = pair if index == 0 else self.join(item, pair)
            return total, self.built(Shape(len(node.entries), 0, item, keyed=True))
        if isinstance(node, Call):
            return self.call(node, scope, times)
        raise TypeError(f"no cost rule for {type(node).__name__}")  # pragma: no cover

    def binary(self, node: Binary, scope: dict[str, Shape], times: int) -> tuple[int, Shape]:
        left_cost, left = self.cost(node.left, scope, times)
        right_cost, right = self.cost(node.right, scope, times)
        cost = _sat(left_cost + right_cost + 1)
        op = node.op
        if op in ("==", "!=", "<", "<=", ">", ">="):
            return _sat(cost + self.compare(left, right)), SCALAR
        if op == "in":
            each = 1 + self.compare(left, self.items_of(right))
            return _sat(cost + _tenths(_sat(right.items * each))), SCALAR
        if op == "+":
            # Numbers, or a concatenation: a value from outside may be either.
            if not (left.items or left.chars or right.items or right.chars):
                return cost, SCALAR
            joined = Shape(
                _sat(left.items + right.items),
                _sat(left.chars + right.chars),
                self.join_items(left, right),
            )
            return _sat(cost + _tenths(joined.items) + _tenths(joined.chars)), self.built(joined)
        return cost, SCALAR

    def call(self, node: Call, scope: dict[str, Shape], times: int) -> tuple[int, Shape]:
        name = node.name
        if name in COMPREHENSIONS and (bound := bound_names(node)) is not None:
            return self.comprehension(node, bound[0], scope, times)
        if node.target is None and name == "has" and len(node.args) == 1:
            cost, _ = self.cost(node.args[0], scope, times)
            return cost, SCALAR
        if node.target is not None and name == "reduce" and len(node.args) == 4:
            # cel-python reads `.reduce(acc, x, init, step)` as a fold whose
            # accumulator may grow at each step: no bound exists.
            return _CAP, self.unknown
        arguments = [node.target] if node.target is not None else []
        arguments.extend(node.args)
        total = 1
        shapes: list[Shape] = []
        for argument in arguments:
            argument_cost, shape = self.cost(argument, scope, times)
            total = _sat(total + argument_cost)
            shapes.append(shape)
        first_shape = shapes[0] if shapes else SCALAR
        if name in _CHEAP_SCALARS and name not in ("max", "min", "sum", "has_key"):
            return total, SCALAR
        if name == "dyn":
            return total, first_shape
        if name in _SCANS:
            return _sat(total + -(-first_shape.chars // 100)), SCALAR
        if name == "matches":
            pattern = shapes[1] if len(shapes) > 1 else SCALAR
            scan = _tenths(first_shape.chars + 1) * -(-(pattern.chars + 1) // 4)
            return _sat(total + scan + self.regex_compile(arguments[-1])), SCALAR
        if name == "string":
            text = Shape(0, max(first_shape.chars, _LONGEST_SCALAR_TEXT), None)
            return _sat(total + _tenths(text.chars)), self.built(text)
        if name == "bytes":
            # UTF-8 takes up to 4 bytes a character.
            data = Shape(0, _sat(first_shape.chars * 4), None)
            return _sat(total + _tenths(data.chars)), self.built(data)
        # Custom functions: arguments and result cross into Python as JSON.
        total = _sat(total + sum(self.copy(shape) for shape in shapes))
        result = self.custom_result(name, shapes)
        if result is None:
            return total, self.unknown
        return _sat(total + self.build(result)), self.built(result)

    def regex_compile(self, node: Node) -> int:
        """The cost of compiling the pattern `node` gives, on each call."""
        while isinstance(node, Group):
            node = node.inner
        if isinstance(node, Literal) and node.kind == "string":
            return 1 + _tenths(regex_weight(node.text))
        return _REGEX_UNKNOWN

    def custom_result(self, name: str, shapes: list[Shape]) -> Shape | None:
        """The result shape of a built-in custom function; None when not known."""
        first = shapes[0] if shapes else SCALAR
        if name in ("lower", "upper", "trim"):
            return Shape(0, _sat(first.chars * _CASE_GROWTH), None)
        if name == "split":
            return Shape(_sat(first.chars + 1), 0, Shape(0, first.chars, None))
        if name == "join":
            separator = shapes[1].chars if len(shapes) > 1 else 0
            each = self.items_of(first).chars + separator
            return Shape(0, _sat(first.items * each), None)
        if name in ("get", "coalesce"):
            joined: Shape | None = self.items_of(first) if name == "get" else first
            for shape in shapes[1:] if name == "coalesce" else shapes[2:]:
                joined = self.join(joined, shape)
            return joined
        if name in ("max", "min", "sum", "has_key"):
            return SCALAR
        if name == "local_time":
            return Shape(10, 0, Shape(0, 10, None), keyed=True)
        return None

    def comprehension(
        self, node: Call, variable: str, scope: dict[str, Shape], times: int
    ) -> tuple[int, Shape]:
        assert node.target is not None
        range_cost, range_shape = self.cost(node.target, scope, times)
        count = range_shape.items
        runs = _sat(times * max(count, 1))
        if self.hottest is None or runs > self.hottest[2]:
            self.hottest = (node.column, node.name, runs)
        inner = dict(scope)
        inner[variable] = self.items_of(range_shape)
        body_cost = 1
        body_shape = SCALAR
        for argument in node.args[1:]:
            cost, body_shape = self.cost(argument, inner, runs)
            body_cost = _sat(body_cost + cost)
        if node.name == "map":
            body_cost = _sat(body_cost + self.copy_in(node.args[-1], inner))
        total = _sat(range_cost + 1 + _sat(count * body_cost))
        if node.name in ("map", "filter"):
            item = body_shape if node.name == "map" else self.items_of(range_shape)
            total = _sat(total + self.accumulated(count, item))
            return total, self.built(Shape(count, 0, item))
        return total, SCALAR


def _estimate_tree(
    tree: Node, tokens: int, assumed_items: int, assumed_chars: int, heft: int | None = None
) -> CostEstimate:
    estimator = _Estimator(assumed_items, assumed_chars, heft)
    cost, shape = estimator.cost(tree, {}, 1)
    # The result is handed back as JSON: a value that shares its items
    # (`[a, a]`) is copied out in full.
    result_cost = estimator.copy(shape)
    cost = _sat(cost + result_cost)
    return CostEstimate(
        cost=cost,
        depth=tree.height,
        tokens=tokens,
        longest_string=estimator.longest_string,
        longest_list=estimator.longest_list,
        hottest=estimator.hottest,
        result_cost=result_cost,
        assumed_items=assumed_items,
        assumed_chars=assumed_chars,
    )


# --------------------------------------------------------------- the errors


def too_costly_error(
    source: str, message: str, *, limit: str, found: int, maximum: int, phase: str
) -> ExpressionError:
    """The `expression.too_costly` error for `source`, with the numbers in `details`."""
    error = ExpressionError(
        f"too costly: {message}", expression=source, code="expression.too_costly"
    )
    error.details = {"limit": limit, "found": found, "maximum": maximum, "phase": phase}
    return error


def _number(value: int) -> str:
    return "more than 2**62" if value >= _CAP else f"{value:,}"


def _refusal(source: str, estimate: CostEstimate, limits: CostLimits, phase: str) -> None:
    """Raise if `estimate` breaks one of `limits`."""
    if estimate.longest_string > limits.max_string_length:
        raise too_costly_error(
            source,
            f"it can build a string of {_number(estimate.longest_string)} characters; "
            f"the limit is {limits.max_string_length:,}",
            limit="string_length",
            found=estimate.longest_string,
            maximum=limits.max_string_length,
            phase=phase,
        )
    if estimate.longest_list > limits.max_list_length:
        raise too_costly_error(
            source,
            f"it can build a list of {_number(estimate.longest_list)} items; "
            f"the limit is {limits.max_list_length:,}",
            limit="list_length",
            found=estimate.longest_list,
            maximum=limits.max_list_length,
            phase=phase,
        )
    if estimate.cost > limits.max_cost:
        hint = ""
        if estimate.result_cost * 2 > estimate.cost:
            hint = f"; copying its result out alone costs {_number(estimate.result_cost)}"
        elif estimate.hottest is not None and estimate.hottest[2] > 1:
            column, name, runs = estimate.hottest
            hint = f"; its {name}() at column {column} may run its body {_number(runs)} times"
        sizes = (
            "lists from variables assumed to hold up to"
            if phase == "compile"
            else "the variables of this evaluation hold lists of up to"
        )
        raise too_costly_error(
            source,
            f"estimated cost {_number(estimate.cost)} is over the limit of {limits.max_cost:,}"
            f" ({sizes} {estimate.assumed_items:,} items,"
            f" strings of {estimate.assumed_chars:,} characters{hint})",
            limit="cost",
            found=estimate.cost,
            maximum=limits.max_cost,
            phase=phase,
        )


_STRUCTURE = {
    "tokens": "it has {found:,} tokens or more; the limit is {maximum:,}",
    "nesting": "brackets are nested {found:,} deep or more; the limit is {maximum:,}",
    "depth": "its tree is {found:,} levels deep or more; the limit is {maximum:,}",
}


# ---------------------------------------------------------------- analysis


@dataclass(slots=True)
class CostAnalysis:
    """A compiled expression's tree and estimate, kept to re-check at run time.

    An evaluation whose variables hold bigger lists or strings than the
    assumed sizes is estimated again, taking the most items of any list and
    the longest string in its variables as the size of every list and string
    (rounded up by at most a third; each estimate is kept for the next time).
    On cel-rust it is also estimated again when a list weighs more than
    `assumed_items` plain values (its `heft`), pricing what `map()` and
    `filter()` copy (`_Estimator.accumulated`).
    """

    source: str
    tree: Node
    estimate: CostEstimate
    limits: CostLimits
    _by_size: dict[tuple[int, int, int | None], CostEstimate] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def admit(self, items: int, chars: int, heft: int | None = None) -> int:
        """The estimated cost with variables of these sizes; raise `expression.too_costly`
        if they make it too costly.

        Args:
            items: the most items of any list or map in the variables.
            chars: the longest string or bytes in the variables.
            heft: cel-rust only: the most any list weighs (`Sizes.heft`); None
                leaves the list-building copies unpriced.
        """
        limits = self.limits
        light = limits.assumed_items * limits.assumed_items
        if (
            items <= limits.assumed_items
            and chars <= limits.assumed_chars
            and (heft is None or heft <= light)
        ):
            return self.estimate.cost
        items, chars = _round_up(items), _round_up(chars)
        estimate = self._estimate(
            max(limits.assumed_items, items), max(limits.assumed_chars, chars), None
        )
        _refusal(self.source, estimate, limits, "evaluate")
        if heft is None:
            return estimate.cost
        # The copies map() and filter() make grow with the square of the lists'
        # real lengths: they are priced at those, not at the assumed ones.
        heavy = self._estimate(items, chars, _round_up(heft))
        _refusal(self.source, heavy, limits, "evaluate")
        return max(estimate.cost, heavy.cost)

    def _estimate(self, items: int, chars: int, heft: int | None) -> CostEstimate:
        key = (items, chars, heft)
        estimate = self._by_size.get(key)
        if estimate is None:
            estimate = _estimate_tree(self.tree, self.estimate.tokens, *key)
            with self._lock:
                self._by_size[key] = estimate
        return estimate


def _round_up(value: int) -> int:
    """`value` rounded up to a power of two or three quarters of one (at most +33%)."""
    if value <= 2:
        return max(value, 1)
    power = 1 << (value - 1).bit_length()
    three_quarters = power - power // 4
    return three_quarters if value <= three_quarters else power


def _parse(source: str, limits: CostLimits) -> tuple[Node, int]:
    try:
        return parse(
            source,
            max_tokens=limits.max_tokens,
            max_nesting=limits.max_nesting,
            max_depth=limits.max_depth,
        )
    except LimitExceeded as exc:
        raise too_costly_error(
            source,
            _STRUCTURE[exc.limit].format(found=exc.found, maximum=exc.maximum),
            limit=exc.limit,
            found=exc.found,
            maximum=exc.maximum,
            phase="compile",
        ) from None
    except RecursionError:
        # Only with limits set past what Python's stack holds.
        raise _too_deep(source, limits) from None


def _too_deep(source: str, limits: CostLimits) -> ExpressionError:
    return too_costly_error(
        source,
        "it is nested deeper than Python's stack allows",
        limit="depth",
        found=-1,
        maximum=limits.max_depth,
        phase="compile",
    )


def analyse(source: str, limits: CostLimits) -> CostAnalysis | None:
    """Estimate `source` under `limits`; raise `expression.too_costly` if over them.

    Returns None when the source is not an expression the estimator reads
    (the engine's parser then reports the syntax error).

    Raises:
        ExpressionError: `expression.too_costly`, with `details` naming the
            limit (`tokens`, `nesting`, `depth`, `cost`, `string_length`,
            `list_length`), what was found and the maximum.
    """
    try:
        tree, tokens = _parse(source, limits)
    except Unreadable:
        return None
    try:
        estimate = _estimate_tree(tree, tokens, limits.assumed_items, limits.assumed_chars)
    except RecursionError:
        raise _too_deep(source, limits) from None
    _refusal(source, estimate, limits, "compile")
    return CostAnalysis(source, tree, estimate, limits)


def estimate_cost(source: str, limits: CostLimits | None = None) -> CostEstimate:
    """The cost estimate of `source`, without compiling it on any engine.

    Args:
        source: a CEL expression.
        limits: the sizes to assume and the structural limits; the defaults
            when None. The cost is reported even when it is over `max_cost`.

    Raises:
        ExpressionError: `expression.too_costly` when the source breaks a
            structural limit (tokens, nesting, depth) and cannot be estimated;
            `expression.syntax` when it cannot be read.
    """
    limits = limits or CostLimits()
    try:
        tree, tokens = _parse(source, limits)
    except Unreadable as exc:
        raise ExpressionError(
            f"syntax error: {exc}", expression=source, code="expression.syntax"
        ) from None
    try:
        return _estimate_tree(tree, tokens, limits.assumed_items, limits.assumed_chars)
    except RecursionError:
        raise _too_deep(source, limits) from None
