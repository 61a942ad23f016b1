from __future__ import annotations

import datetime

import pytest

from ductor_core.errors import DuctorError
from ductor_core.expressions import ENGINE_NAMES, engine_by_name
from ductor_routing import Routable
from ductor_routing.activations import Activations, referenced_attributes, referenced_variables

NOW = datetime.datetime(2026, 11, 29, 9, 0, tzinfo=datetime.UTC)
ROUTABLE = Routable(
    id="r1",
    kind="lead",
    attributes={"score": 70, "state": "CA", "nested": {"a": [1, 2]}, "flag": False, "x": None},
    price=5,
)
EXPRESSIONS = [
    "attributes.score >= 50",
    "has(attributes.missing) || attributes.state == 'CA'",
    "attributes.nested.a.size() == 2",
    "size(attributes) == 5",
    "attributes['state'] == 'CA'",
    "attributes.all(k, k != '')",
    "routable.attributes.score == attributes.score",
    "routable.price + 1 == 6 && now.getHours() == 9",
    "attributes.flag == false && attributes.x == null",
    "'attributes' == 'attributes' && attributes.score > 1",
    "attributes.missing == 1",
]


def test_reference_scanning() -> None:
    assert referenced_attributes(["attributes.a > 1", "attributes.b"]) == {"a", "b"}
    assert referenced_attributes(["attributes.size() > 1"]) is None
    assert referenced_attributes(["attributes['a']"]) is None
    assert referenced_attributes(["routable.attributes.a"]) == frozenset()
    assert referenced_variables(["routable.id == 'x' && now > now"]) == {"routable", "now"}


@pytest.mark.parametrize("engine_name", ENGINE_NAMES)
@pytest.mark.parametrize("source", EXPRESSIONS)
def test_narrow_activation_gives_the_same_answer_as_the_full_one(
    engine_name: str, source: str
) -> None:
    engine = engine_by_name(engine_name)
    program = engine.compile(source)
    full = {
        "routable": ROUTABLE.activation(),
        "attributes": ROUTABLE.attributes,
        "now": NOW,
    }
    narrow = Activations([source]).build(ROUTABLE, NOW)
    try:
        expected = program.evaluate(full)
    except DuctorError:
        with pytest.raises(DuctorError):
            program.evaluate(narrow)
        return
    assert program.evaluate(narrow) == expected
