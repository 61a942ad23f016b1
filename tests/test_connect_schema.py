"""The Connect schemas in `proto/ductor/v1/` are the ones the method table writes,
`buf lint` (STANDARD rules) accepts them, every method is in the docs, and every
method names a REST call of the scope table (so it needs that call's scope)."""

from __future__ import annotations

from pathlib import Path

from ductor_server.transports.connect import METHODS
from ductor_server.transports.connect.schema import proto_files
from ductor_server.transports.rest.scopes import ROUTE_SCOPES

from .connect_node import buf

ROOT = Path(__file__).resolve().parents[1]
PROTO = ROOT / "proto" / "ductor" / "v1"


def test_the_committed_protos_are_the_method_tables() -> None:
    written = proto_files(METHODS)
    committed = {path.name: path.read_text() for path in PROTO.glob("*.proto")}
    assert committed.keys() == written.keys(), (
        "run: python -m ductor_server.transports.connect.schema"
    )
    for name, text in written.items():
        assert committed[name] == text, (
            f"{name} is stale: python -m ductor_server.transports.connect.schema"
        )


def test_buf_lint_accepts_the_protos() -> None:
    linted = buf("lint")
    assert linted.returncode == 0, linted.stdout + linted.stderr
    built = buf("build", "-o", "/dev/null")
    assert built.returncode == 0, built.stderr


def test_every_method_is_in_the_docs() -> None:
    doc = (ROOT / "docs" / "connect.md").read_text()
    for method in METHODS:
        assert f"`{method.name}`" in doc, method.name
        assert method.rest.split(" ", 1)[1] in doc or method.rest in doc, method.rest


def test_every_method_mirrors_a_route_of_the_scope_table() -> None:
    # A misspelt `rest` would fall back to `admin` silently.
    assert [m.rest for m in METHODS if m.rest not in ROUTE_SCOPES] == []
