"""Finds the versioned SQL migration files of a backend and splits them into statements.

Applying them is each backend's job (it knows how to lock); this module reads only.
"""

from __future__ import annotations

from importlib import resources

from ductor_server.storage.errors import SchemaTooNew


def split_statements(script: str) -> list[str]:
    """Split a migration script into statements at semicolons that end a line.

    `--` comment lines are dropped. Our migrations never put a semicolon at the
    end of a line inside a statement, which keeps this split exact.
    """
    statements: list[str] = []
    current: list[str] = []
    for line in script.splitlines():
        if line.strip().startswith("--"):
            continue
        current.append(line)
        if line.rstrip().endswith(";"):
            text = "\n".join(current).strip().rstrip(";").strip()
            if text:
                statements.append(text)
            current = []
    tail = "\n".join(current).strip()
    if tail:
        statements.append(tail)
    return statements


def migration_files(backend: str) -> list[tuple[str, list[str]]]:
    """The backend's migrations as (name, statements), ordered by file name."""
    folder = resources.files("ductor_server.storage").joinpath("migrations", backend)
    found = sorted(
        (entry.name, entry.read_text(encoding="utf-8"))
        for entry in folder.iterdir()
        if entry.name.endswith(".sql")
    )
    return [(name.removesuffix(".sql"), split_statements(text)) for name, text in found]


def refuse_unknown(backend: str, recorded: set[str]) -> None:
    """Raise `SchemaTooNew` when `recorded` (the names in `schema_migrations`) holds
    a migration that is not among the backend's files: a newer version applied it.

    Raises:
        SchemaTooNew: naming the unknown migrations, in order.
    """
    known = {name for name, _ in migration_files(backend)}
    unknown = sorted(recorded - known)
    if unknown:
        raise SchemaTooNew(unknown)
