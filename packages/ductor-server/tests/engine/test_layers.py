"""Nothing outside storage reaches into a backend or imports a private storage name.

The module-level rules (layers, the engine never importing the bridge) are
import-linter contracts in the root pyproject.toml; this test covers what a
contract cannot see: underscore names imported from a public storage module."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import ductor_server

PACKAGE = Path(ductor_server.__file__).parent


def _imports(path: Path) -> Iterator[tuple[str, list[str]]]:
    """(module, imported names) of every import in a file, relative ones resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = parts[: len(parts) - node.level]
                module = ".".join([*base, module] if module else base)
            yield module, [alias.name for alias in node.names]


def _files(under: str) -> list[Path]:
    return sorted((PACKAGE / under).rglob("*.py"))


def test_only_storage_reaches_into_backends_and_private_storage_names() -> None:
    offenders: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.is_relative_to(PACKAGE / "storage"):
            continue
        for module, names in _imports(path):
            if not module.startswith("ductor_server.storage"):
                continue
            private_module = any(part.startswith("_") for part in module.split("."))
            backend = module in {"ductor_server.storage.postgres", "ductor_server.storage.sqlite"}
            private_names = [n for n in names if n.startswith("_")]
            if private_module or backend or private_names:
                offenders.append(f"{path.relative_to(PACKAGE)}: {module} {private_names}")
    assert offenders == []
