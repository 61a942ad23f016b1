from __future__ import annotations

from typing import Any

import pytest

from ductor_routing import (
    AttributeSpec,
    AttributeType,
    Consent,
    Filter,
    FilterOp,
    KindSchema,
    Routable,
    validate_routable,
)
from ductor_routing.filters import compile_filter, describe_filter


@pytest.mark.parametrize(
    ("spec", "attrs", "expected"),
    [
        (Filter(attribute="state", value="CA"), {"state": "CA"}, True),
        (Filter(attribute="state", value="CA"), {"state": "NV"}, False),
        (Filter(attribute="state", value="CA"), {}, False),
        (Filter(attribute="n", value=1), {"n": True}, False),  # JSON true is not 1
        (Filter(attribute="n", value=1), {"n": 1.0}, True),
        (Filter(attribute="state", op=FilterOp.NE, value="CA"), {}, True),
        (Filter(attribute="state", op=FilterOp.NE, value="CA"), {"state": "CA"}, False),
        (Filter(attribute="s", op=FilterOp.IN, values=("a", "b")), {"s": "b"}, True),
        (Filter(attribute="s", op=FilterOp.IN, values=("a", "b")), {"s": ["a"]}, False),
        (Filter(attribute="s", op=FilterOp.NOT_IN, values=("a",)), {}, True),
        (Filter(attribute="s", op=FilterOp.NOT_IN, values=("a",)), {"s": "a"}, False),
        (Filter(attribute="x", op=FilterOp.GT, value=5), {"x": 6}, True),
        (Filter(attribute="x", op=FilterOp.GT, value=5), {"x": 5}, False),
        (Filter(attribute="x", op=FilterOp.GTE, value=5), {"x": 5}, True),
        (Filter(attribute="x", op=FilterOp.LT, value=5), {"x": 4.5}, True),
        (Filter(attribute="x", op=FilterOp.LTE, value=5), {"x": 6}, False),
        (Filter(attribute="x", op=FilterOp.GT, value=5), {"x": "9"}, False),  # no coercion
        (Filter(attribute="x", op=FilterOp.GT, value=0), {"x": True}, False),
        (Filter(attribute="x", op=FilterOp.LT, value="m"), {"x": "a"}, True),
        (Filter(attribute="x", op=FilterOp.EXISTS), {"x": None}, True),
        (Filter(attribute="x", op=FilterOp.EXISTS), {}, False),
        (Filter(attribute="x", op=FilterOp.EXISTS, value=False), {}, True),
        (Filter(attribute="a.b", value=2), {"a": {"b": 2}}, True),
        (Filter(attribute="a.b", value=2), {"a": 3}, False),
        (Filter(attribute="a.b.c", op=FilterOp.EXISTS), {"a": {"b": {}}}, False),
    ],
)
def test_filter_semantics(spec: Filter, attrs: dict[str, Any], expected: bool) -> None:
    assert compile_filter(spec)(attrs) is expected


def test_filter_descriptions() -> None:
    assert describe_filter(Filter(attribute="s", op=FilterOp.IN, values=("a",))) == "s in ['a']"
    assert describe_filter(Filter(attribute="s", op=FilterOp.NOT_IN, values=())) == "s not in []"
    assert describe_filter(Filter(attribute="x", op=FilterOp.GTE, value=3)) == "x >= 3"
    assert describe_filter(Filter(attribute="x", op=FilterOp.EXISTS)) == "x exists"
    assert describe_filter(Filter(attribute="x", op=FilterOp.EXISTS, value=False)) == "x absent"


def test_schema_checks_types_bounds_enums_and_extras() -> None:
    schema = KindSchema(
        attributes={
            "age": AttributeSpec(type=AttributeType.INTEGER, minimum=18, maximum=99),
            "ratio": AttributeSpec(type=AttributeType.NUMBER),
            "ok": AttributeSpec(type=AttributeType.BOOLEAN),
            "tier": AttributeSpec(type=AttributeType.STRING, enum=("gold", "silver")),
            "tags": AttributeSpec(type=AttributeType.ARRAY),
            "meta": AttributeSpec(type=AttributeType.OBJECT),
            "a/b": AttributeSpec(required=True),
        },
        additional=False,
        require_price=True,
    )
    good = Routable(
        id="r",
        kind="k",
        price=0,
        attributes={
            "age": 30,
            "ratio": 1,
            "ok": False,
            "tier": "gold",
            "tags": [],
            "meta": {},
            "a/b": None,
        },
    )
    assert validate_routable(schema, good) == ()
    bad = Routable(
        id="r",
        kind="k",
        price=-1,
        attributes={"age": True, "ratio": "1", "ok": 1, "tier": "bronze", "tags": {}, "zzz": 1},
    )
    problems = [(p.pointer, p.message) for p in validate_routable(schema, bad)]
    assert problems == [
        ("/attributes/age", "must be of type integer"),
        ("/attributes/ratio", "must be of type number"),
        ("/attributes/ok", "must be of type boolean"),
        ("/attributes/tier", "must be one of ['gold', 'silver']"),
        ("/attributes/tags", "must be of type array"),
        ("/attributes/a~1b", "required attribute is missing"),
        ("/attributes/zzz", "unknown attribute"),
        ("/price", "price must be >= 0"),
    ]
    young = Routable(id="r", kind="k", attributes={"age": 12, "a/b": 1})
    assert [p.message for p in validate_routable(schema, young)] == [
        "must be >= 18",
        "a price is required",
    ]


def test_consent_must_be_granted_when_required() -> None:
    schema = KindSchema(require_consent=True)
    denied = Routable(id="r", kind="k", consent=Consent(granted=False))
    granted = Routable(id="r", kind="k", consent=Consent(granted=True, scopes=("sms",)))
    assert [p.pointer for p in validate_routable(schema, denied)] == ["/consent"]
    assert validate_routable(schema, granted) == ()


def test_a_negative_price_is_invalid_even_when_no_price_is_required() -> None:
    schema = KindSchema()
    assert validate_routable(schema, Routable(id="r", kind="k", price=0)) == ()
    assert validate_routable(schema, Routable(id="r", kind="k")) == ()
    problems = validate_routable(schema, Routable(id="r", kind="k", price=-5))
    assert [(p.pointer, p.message) for p in problems] == [("/price", "price must be >= 0")]


@pytest.mark.parametrize(
    ("value", "allowed"),
    [
        (True, False),  # Python's True == 1
        (False, False),  # and False == 0
        (1, True),
        (1.0, True),  # a JSON number: 1.0 is 1
        ([True], False),
        ([1], True),
        ({"n": True}, False),
        ({"n": 1}, True),
        ("1", False),
    ],
)
def test_an_enum_tells_true_from_1_as_json_does(value: Any, allowed: bool) -> None:
    schema = KindSchema(attributes={"v": AttributeSpec(enum=(1, 0, [1], {"n": 1}))})
    problems = validate_routable(schema, Routable(id="r", kind="k", attributes={"v": value}))
    assert (problems == ()) is allowed, problems


def test_a_filter_that_could_never_do_what_it_says_is_a_config_error() -> None:
    # An `in` given a `value` ignored it and matched nothing, silently.
    from ductor_core.expressions import default_engine
    from ductor_routing import ConfigError, Member, Pool, Router, Rule, RuleSet, Worker

    member_filters = (
        Filter(attribute="state", op=FilterOp.IN, value="CA"),
        Filter(attribute="state", value="CA", values=("CA",)),
        Filter(attribute="score", op=FilterOp.GT, value=None),
        Filter(attribute="score", op=FilterOp.GTE, value=True),
        Filter(attribute="a..b", value=1),
        Filter(attribute="x", op=FilterOp.EXISTS, value="yes"),
        Filter(attribute="ok", op=FilterOp.IN, values=("CA",)),
    )
    with pytest.raises(ConfigError) as caught:
        Router(
            rule_set=RuleSet(
                rules=(
                    Rule(
                        id="r",
                        pool="p",
                        match=(Filter(attribute="v", op=FilterOp.NOT_IN, value=["x"]),),
                    ),
                )
            ),
            pools=[Pool(id="p", members=(Member(worker="w", filters=member_filters),))],
            workers=[Worker(id="w")],
            kinds={},
            engine=default_engine(),
        )
    assert [(p.pointer, p.message) for p in caught.value.details] == [
        ("/pools/0/members/0/filters/0/value", "'in' takes a list in 'values', not a 'value'"),
        ("/pools/0/members/0/filters/1/values", "'eq' takes one 'value', not 'values'"),
        ("/pools/0/members/0/filters/2/value", "'gt' compares with a number or a string"),
        ("/pools/0/members/0/filters/3/value", "'gte' compares with a number or a string"),
        ("/pools/0/members/0/filters/4/attribute", "must be a dotted path of non-empty names"),
        ("/pools/0/members/0/filters/5/value", "'exists' takes true, false or no value"),
        ("/rule_set/rules/0/match/0/value", "'not_in' takes a list in 'values', not a 'value'"),
    ]


def test_an_attribute_whose_minimum_is_above_its_maximum_is_a_config_error() -> None:
    # No value could pass such an attribute: every routable naming it was invalid.
    from ductor_core.expressions import default_engine
    from ductor_routing import ConfigError, Router, RuleSet

    def build(**attributes: AttributeSpec) -> Router:
        kinds = {"lead/x": KindSchema(attributes=attributes)}
        return Router(
            rule_set=RuleSet(), pools=[], workers=[], kinds=kinds, engine=default_engine()
        )

    build(n=AttributeSpec(minimum=5, maximum=5), m=AttributeSpec(minimum=1))
    with pytest.raises(ConfigError) as caught:
        build(ok=AttributeSpec(minimum=1, maximum=2), n=AttributeSpec(minimum=5, maximum=1.5))
    assert [(p.pointer, p.message) for p in caught.value.details] == [
        ("/kinds/lead~1x/attributes/n", "minimum 5 is above maximum 1.5: no value can pass"),
    ]
