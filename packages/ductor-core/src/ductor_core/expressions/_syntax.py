"""A small CEL tokenizer and parser, used to estimate what an expression costs and
to find the variables it reads.

It builds a plain tree for the cost estimator; it never evaluates and imports
no CEL library. It accepts what either engine accepts (the union of their
grammars: trailing commas, three-argument `map`), so it refuses nothing for
syntax: a source it cannot read goes to the engine, whose syntax error wins.

Why not reuse celpy's parser: this one runs *before* the engine's parser, so a
source that would take celpy's parser long (a 4,000-token list literal takes
about 0.2 s) or recurse too deep is refused after one cheap pass over its
tokens; it serves both engines with one tree; and it never recurses deeper
than the limits it enforces.
"""

from __future__ import annotations

import re
from typing import NamedTuple

# One alternation, tried in order: comments and blanks are skipped, strings come
# before identifiers (so `r'x'` and `b'x'` are strings), floats before ints.
_TOKEN = re.compile(
    r"(?P<skip>[\t\n\f\r ]+|//[^\n]*)"
    # raw strings: a backslash is itself, so no escapes to skip
    r"|(?P<raw>(?:[rR][bB]?|[bB][rR])(?:'''.*?'''|\"\"\".*?\"\"\"|'[^'\n]*'|\"[^\"\n]*\"))"
    r"|(?P<string>[bB]?(?:'''(?:\\.|[^\\])*?'''|\"\"\"(?:\\.|[^\\])*?\"\"\""
    r"|'(?:\\.|[^'\\\n])*'|\"(?:\\.|[^\"\\\n])*\"))"
    # `1.` is a double, but in `1.size()` the dot selects (as cel-rust reads it)
    r"|(?P<double>(?:\d+\.\d+|\d+\.(?![A-Za-z_])|\.\d+)(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+)"
    r"|(?P<int>0[xX][0-9a-fA-F]+[uU]?|\d+[uU]?)"
    r"|(?P<ident>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<op>==|!=|<=|>=|&&|\|\||[-+*/%<>!?:.,()\[\]{}])",
    re.DOTALL,
)
_OPENING = frozenset("([{")
_CLOSING = frozenset(")]}")
_RELATIONS = frozenset({"==", "!=", "<", "<=", ">", ">=", "in"})
_KEYWORD_LITERALS = {"true": "bool", "false": "bool", "null": "null"}


class Unreadable(Exception):
    """The source is not CEL this parser reads; the engine will say why."""


class LimitExceeded(Exception):
    """The source breaks a structural limit before any estimate is made.

    Attributes:
        limit: which limit (`tokens`, `nesting`, `depth`).
        found: how much the source has (at least).
        maximum: the limit.
    """

    def __init__(self, limit: str, found: int, maximum: int) -> None:
        super().__init__(f"{limit}: {found} > {maximum}")
        self.limit = limit
        self.found = found
        self.maximum = maximum


class Token(NamedTuple):
    """One token: its kind (`string`, `bytes`, `int`, `uint`, `double`, `ident`, `op`).

    An operator's or a name's text is never a literal's (those keep their
    quotes and digits), so the parser may compare texts alone.
    """

    kind: str
    text: str
    column: int


def tokenize(source: str, *, max_tokens: int, max_nesting: int) -> list[Token]:
    """The tokens of `source`, checking the token count and bracket nesting as it goes.

    Raises:
        LimitExceeded: more than `max_tokens` tokens, or brackets nested deeper
            than `max_nesting` (checked before any parsing, so cheaply).
        Unreadable: a character no CEL token starts with.
    """
    tokens: list[Token] = []
    append = tokens.append
    nesting = 0
    position = 0
    for match in _TOKEN.finditer(source):
        start = match.start()
        if start != position:
            # finditer skipped a character no token starts with.
            raise Unreadable(f"unexpected character at column {position + 1}")
        position = match.end()
        kind = match.lastgroup
        if kind == "skip":
            continue
        text = match.group()
        if kind == "op":
            if text in _OPENING:
                nesting += 1
                if nesting > max_nesting:
                    raise LimitExceeded("nesting", nesting, max_nesting)
            elif text in _CLOSING:
                nesting -= 1
        elif kind == "string" or kind == "raw":
            prefix = text[: len(text) - len(text.lstrip("rRbB"))]
            kind = "bytes" if "b" in prefix.lower() else "string"
        elif kind == "int" and text[-1] in "uU":
            kind = "uint"
        append(Token(kind or "", text, start + 1))
        if len(tokens) > max_tokens:
            raise LimitExceeded("tokens", len(tokens), max_tokens)
    if position != len(source):
        raise Unreadable(f"unexpected character at column {position + 1}")
    return tokens


def literal_length(text: str) -> int:
    """An upper bound of the length of a string or bytes literal's value.

    Escapes only shorten a literal (`\\u00e9` is one character), so the UTF-8
    length of the text between the quotes bounds both the characters of a
    string and the bytes of a bytes literal (`b'é'` is two bytes).
    """
    body = text.lstrip("rRbB")
    quote = 3 if body[:3] in ("'''", '"""') else 1
    return max(0, len(body.encode("utf-8", "surrogatepass")) - 2 * quote)


_ESCAPE = re.compile(
    r"\\(?:[xX][0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[0-7]{3}|.)", re.DOTALL
)
_SIMPLE_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}


def _unescape(match: re.Match[str]) -> str:
    escape = match.group()[1:]
    if escape in _SIMPLE_ESCAPES:
        return _SIMPLE_ESCAPES[escape]
    if len(escape) == 1:
        return escape  # \\ \' \" \` \?
    if escape[0] in "xXuU":
        return chr(min(int(escape[1:], 16), 0x10FFFF))
    return chr(int(escape, 8))


def literal_text(text: str) -> str:
    """The value of a string or bytes literal, near enough to weigh a regex pattern."""
    prefix = text[: len(text) - len(text.lstrip("rRbB"))]
    body = text[len(prefix) :]
    quote = 3 if body[:3] in ("'''", '"""') else 1
    body = body[quote:-quote]
    return body if "r" in prefix.lower() else _ESCAPE.sub(_unescape, body)


# ------------------------------------------------------------------ the tree


class Node:
    """A node of the expression tree; `height` counts the nodes on its longest path
    (parentheses excepted)."""

    __slots__ = ("column", "height")

    column: int
    height: int


class Literal(Node):
    """A literal: `kind` as tokens have it; `length` and `text` for strings and bytes."""

    __slots__ = ("kind", "length", "text")

    def __init__(self, kind: str, length: int, column: int, text: str = "") -> None:
        self.kind = kind
        self.length = length
        self.column = column
        self.text = text
        self.height = 1


class Ident(Node):
    """A name: a variable, or a comprehension's own variable."""

    __slots__ = ("name",)

    def __init__(self, name: str, column: int) -> None:
        self.name = name
        self.column = column
        self.height = 1


class Select(Node):
    """`operand.field`."""

    __slots__ = ("field", "operand")

    def __init__(self, operand: Node, field: str, column: int) -> None:
        self.operand = operand
        self.field = field
        self.column = column
        self.height = operand.height + 1


class Index(Node):
    """`operand[index]`."""

    __slots__ = ("index", "operand")

    def __init__(self, operand: Node, index: Node, column: int) -> None:
        self.operand = operand
        self.index = index
        self.column = column
        self.height = max(operand.height, index.height) + 1


class Unary(Node):
    """`!operand` or `-operand`."""

    __slots__ = ("op", "operand")

    def __init__(self, op: str, operand: Node, column: int) -> None:
        self.op = op
        self.operand = operand
        self.column = column
        self.height = operand.height + 1


class Binary(Node):
    """`left op right`, for every binary operator including `&&`, `||` and `in`."""

    __slots__ = ("left", "op", "right")

    def __init__(self, op: str, left: Node, right: Node, column: int) -> None:
        self.op = op
        self.left = left
        self.right = right
        self.column = column
        self.height = max(left.height, right.height) + 1


class Conditional(Node):
    """`condition ? then : otherwise`."""

    __slots__ = ("condition", "otherwise", "then")

    def __init__(self, condition: Node, then: Node, otherwise: Node, column: int) -> None:
        self.condition = condition
        self.then = then
        self.otherwise = otherwise
        self.column = column
        self.height = max(condition.height, then.height, otherwise.height) + 1


class ListNode(Node):
    """A list literal."""

    __slots__ = ("items",)

    def __init__(self, items: list[Node], column: int) -> None:
        self.items = items
        self.column = column
        self.height = max((item.height for item in items), default=0) + 1


class MapNode(Node):
    """A map literal, or a message literal `Name{field: value}` (fields as string keys)."""

    __slots__ = ("entries",)

    def __init__(self, entries: list[tuple[Node, Node]], column: int) -> None:
        self.entries = entries
        self.column = column
        self.height = max((max(k.height, v.height) for k, v in entries), default=0) + 1


class Group(Node):
    """`(inner)`: no level of its own in the tree (`max_nesting` limits brackets)."""

    __slots__ = ("inner",)

    def __init__(self, inner: Node, column: int) -> None:
        self.inner = inner
        self.column = column
        self.height = inner.height


class Call(Node):
    """`name(args)` or `target.name(args)`; macros are calls too."""

    __slots__ = ("args", "name", "target")

    def __init__(self, name: str, target: Node | None, args: list[Node], column: int) -> None:
        self.name = name
        self.target = target
        self.args = args
        self.column = column
        heights = [arg.height for arg in args]
        if target is not None:
            heights.append(target.height)
        self.height = max(heights, default=0) + 1


COMPREHENSIONS = frozenset({"all", "exists", "exists_one", "existsOne", "map", "filter"})
"""The macros that bind a variable over a range: `range.name(variable, ...)`."""


def bound_names(node: Call) -> tuple[str, ...] | None:
    """The names a comprehension macro call binds in its other arguments
    (`xs.map(x, x * 2)` binds `x`), or None if `node` is no comprehension.

    A second name in a three-argument call (`m.all(k, v, p)`, the two-variable
    form of newer CEL) counts as bound too; cel-python's `.reduce(acc, x, init,
    step)` binds its first two.
    """
    args = node.args
    if node.target is None or not args or not isinstance(args[0], Ident):
        return None
    if node.name in COMPREHENSIONS and len(args) in (2, 3):
        if len(args) == 3 and isinstance(args[1], Ident):
            return (args[0].name, args[1].name)
        return (args[0].name,)
    if node.name == "reduce" and len(args) == 4 and isinstance(args[1], Ident):
        return (args[0].name, args[1].name)
    return None


# ---------------------------------------------------------------- the parser


class _Parser:
    """Recursive descent by precedence; operator chains loop instead of recursing."""

    def __init__(self, tokens: list[Token], max_depth: int) -> None:
        self.tokens = [*tokens, Token("end", "", 0)]
        self.position = 0
        self.max_depth = max_depth
        self.level = 0

    # token helpers (the list ends with an "end" token whose text is "")

    def peek(self) -> Token:
        return self.tokens[self.position]

    def at(self, text: str) -> bool:
        return self.tokens[self.position].text == text

    def take(self) -> Token:
        token = self.tokens[self.position]
        if token.kind == "end":
            raise Unreadable("unexpected end of expression")
        self.position += 1
        return token

    def expect(self, text: str) -> Token:
        token = self.take()
        if token.text != text:
            raise Unreadable(f"expected {text!r} at column {token.column}")
        return token

    def checked(self, node: Node) -> Node:
        if node.height > self.max_depth:
            raise LimitExceeded("depth", node.height, self.max_depth)
        return node

    # grammar

    def parse(self) -> Node:
        node = self.expr()
        token = self.peek()
        if token.kind != "end":
            raise Unreadable(f"unexpected {token.text!r} at column {token.column}")
        return node

    def expr(self) -> Node:
        # Every way into a nested expression passes here: count the levels so
        # that a deep source is refused before Python's own stack runs out.
        self.level += 1
        if self.level > self.max_depth:
            raise LimitExceeded("depth", self.level, self.max_depth)
        try:
            condition = self.disjunction()
            if not self.at("?"):
                return condition
            column = self.take().column
            then = self.disjunction()
            self.expect(":")
            otherwise = self.expr()
            return self.checked(Conditional(condition, then, otherwise, column))
        finally:
            self.level -= 1

    def disjunction(self) -> Node:
        node = self.conjunction()
        while self.at("||"):
            column = self.take().column
            node = self.checked(Binary("||", node, self.conjunction(), column))
        return node

    def conjunction(self) -> Node:
        node = self.relation()
        while self.at("&&"):
            column = self.take().column
            node = self.checked(Binary("&&", node, self.relation(), column))
        return node

    def relation(self) -> Node:
        node = self.addition()
        while True:
            token = self.peek()
            if token.text not in _RELATIONS:
                return node
            self.position += 1
            node = self.checked(Binary(token.text, node, self.addition(), token.column))

    def addition(self) -> Node:
        node = self.multiplication()
        while self.peek().text in ("+", "-"):
            token = self.take()
            node = self.checked(Binary(token.text, node, self.multiplication(), token.column))
        return node

    def multiplication(self) -> Node:
        node = self.unary()
        while self.peek().text in ("*", "/", "%"):
            token = self.take()
            node = self.checked(Binary(token.text, node, self.unary(), token.column))
        return node

    def unary(self) -> Node:
        operators: list[Token] = []
        while self.peek().text in ("!", "-"):
            operators.append(self.take())
        node = self.member()
        for token in reversed(operators):
            node = self.checked(Unary(token.text, node, token.column))
        return node

    def member(self) -> Node:
        node = self.primary()
        while True:
            if self.at("."):
                self.take()
                name = self.take()
                if name.kind != "ident":
                    raise Unreadable(f"expected a field name at column {name.column}")
                if self.at("("):
                    self.take()
                    node = Call(name.text, node, self.arguments(")"), name.column)
                else:
                    node = Select(node, name.text, name.column)
            elif self.at("["):
                column = self.take().column
                index = self.expr()
                self.expect("]")
                node = Index(node, index, column)
            elif self.at("{") and isinstance(node, Ident | Select):
                # A message literal `Type{field: value}`; neither engine has
                # message types here, but both parse it.
                column = self.take().column
                node = MapNode(self.entries(fields=True), column)
            else:
                return node
            self.checked(node)

    def primary(self) -> Node:
        token = self.take()
        if token.kind in ("string", "bytes"):
            return Literal(
                token.kind, literal_length(token.text), token.column, literal_text(token.text)
            )
        if token.kind in ("int", "uint", "double"):
            return Literal(token.kind, 0, token.column)
        if token.kind == "ident":
            if token.text in _KEYWORD_LITERALS:
                return Literal(_KEYWORD_LITERALS[token.text], 0, token.column)
            if self.at("("):
                self.take()
                return self.checked(Call(token.text, None, self.arguments(")"), token.column))
            return Ident(token.text, token.column)
        if token.text == ".":
            # A leading dot names the root scope: `.input`.
            name = self.take()
            if name.kind != "ident":
                raise Unreadable(f"expected a name at column {name.column}")
            self.position -= 1
            return self.primary()
        if token.text == "(":
            node = self.expr()
            self.expect(")")
            return Group(node, token.column)
        if token.text == "[":
            return self.checked(ListNode(self.arguments("]"), token.column))
        if token.text == "{":
            return self.checked(MapNode(self.entries(fields=False), token.column))
        raise Unreadable(f"unexpected {token.text!r} at column {token.column}")

    def arguments(self, closing: str) -> list[Node]:
        items: list[Node] = []
        while not self.at(closing):
            items.append(self.expr())
            if not self.at(","):
                break
            self.take()
        self.expect(closing)
        return items

    def entries(self, *, fields: bool) -> list[tuple[Node, Node]]:
        entries: list[tuple[Node, Node]] = []
        while not self.at("}"):
            if fields:
                name = self.take()
                if name.kind != "ident":
                    raise Unreadable(f"expected a field name at column {name.column}")
                key: Node = Literal("string", len(name.text), name.column, name.text)
            else:
                key = self.expr()
            self.expect(":")
            entries.append((key, self.expr()))
            if not self.at(","):
                break
            self.take()
        self.expect("}")
        return entries


def parse(source: str, *, max_tokens: int, max_nesting: int, max_depth: int) -> tuple[Node, int]:
    """Parse `source` into a tree no taller than `max_depth`; return it and its token count.

    Raises:
        LimitExceeded: too many tokens, brackets nested too deep, or a tree
            taller than `max_depth` (operator chains count one level per
            operator).
        Unreadable: not an expression this parser reads.
    """
    tokens = tokenize(source, max_tokens=max_tokens, max_nesting=max_nesting)
    if not tokens:
        raise Unreadable("empty expression")
    return _Parser(tokens, max_depth).parse(), len(tokens)
