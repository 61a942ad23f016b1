"""docs/providers.md agrees with the built-in providers: every settings, secrets,
input and output field (and whether it is required), and every error code."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import msgspec
import pytest

from ductor_server.connections import calls
from ductor_server.providers import _exchange, builtin_providers

DOC = (Path(__file__).resolve().parents[4] / "docs" / "providers.md").read_text()
SECTIONS = dict(re.findall(r"^## `([a-z_]+)`\n(.*?)(?=^## |\Z)", DOC, re.MULTILINE | re.DOTALL))
HTTP_SHAPED = {"http", "webhook", "slack", "openai"}


def tables(section: str) -> dict[str, list[list[str]]]:
    """Each H3 heading of `section` with the rows of the table under it."""
    out: dict[str, list[list[str]]] = {}
    for heading, body in re.findall(r"^### (.+?)\n(.*?)(?=^### |\Z)", section, re.M | re.S):
        rows = [
            [cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in body.splitlines()
            if line.startswith("| `")
        ]
        out[heading] = rows
    return out


def fields(tp: type[msgspec.Struct]) -> dict[str, bool]:
    info = msgspec.inspect.type_info(tp)
    assert isinstance(info, msgspec.inspect.StructType)
    return {f.encode_name: f.required for f in info.fields}


def documented(rows: list[list[str]]) -> dict[str, bool]:
    return {row[0].strip("`"): row[2] == "required" for row in rows}


def test_every_builtin_has_a_section() -> None:
    assert set(SECTIONS) == {p.name for p in builtin_providers()}


@pytest.mark.parametrize("name", sorted(p.name for p in builtin_providers()))
def test_fields_are_documented_exactly(name: str) -> None:
    provider = builtin_providers().get(name)
    assert provider is not None
    doc = tables(SECTIONS[name])
    if fields(provider.settings):
        assert documented(doc["Settings"]) == fields(provider.settings)
    else:
        assert "Settings" in doc
        assert not doc["Settings"]
    assert documented(doc["Secrets"]) == fields(provider.secrets)
    for op in provider.operations.values():
        assert documented(doc[f"`{op.name}` input"]) == fields(op.input)
        out_fields = {row[0].strip("`") for row in doc[f"`{op.name}` output"]}
        assert out_fields == set(fields(op.output))


@pytest.mark.parametrize("name", sorted(p.name for p in builtin_providers()))
def test_error_codes_are_documented_exactly(name: str) -> None:
    provider = builtin_providers().get(name)
    source = inspect.getsource(inspect.getmodule(type(provider)))  # type: ignore[arg-type]
    raised = set(re.findall(rf'"({name}\.[a-z_]+)"', source))
    if re.search(rf'f"{name}\.\{{answer\.status\}}"', source):
        raised.add(f"{name}.<status>")
    if f'bad_input("{name}"' in source:
        raised.add(f"{name}.bad_input")
    if name in HTTP_SHAPED:  # from the shared exchange
        raised |= {f"{name}.{c}" for c in ("timeout", "connection", "response_too_large")}
        raised.add(f"{name}.bad_input")
    rows = tables(SECTIONS[name])["Errors"]
    codes = {row[0].strip("`") for row in rows}
    if name == "slack":
        raised.add("slack.<error>")
    if name == "openai":
        raised |= {c for c in codes if c.startswith("openai.") and c != "openai.<status>"}
        assert set(re.findall(r'"(openai\.[a-z_]+)"', source)) <= codes
        raised.add("openai.<status>")
    assert codes == raised
    for row in rows:
        assert row[1].startswith(("yes", "no")), row


def test_common_codes() -> None:
    common = re.search(r"## Errors\n(.*?)\n## ", DOC, re.S)
    assert common is not None
    codes = set(re.findall(r"^\| `([a-z_.]+)` \|", common.group(1), re.M))
    assert codes == {"outbound.forbidden", "operation.unknown"}
    # The codes a client sees: the step handler's, or the exchange's of every provider.
    sources = inspect.getsource(calls) + inspect.getsource(_exchange)
    assert all(f'"{code}"' in sources for code in codes)
