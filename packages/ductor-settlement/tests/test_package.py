"""The package's public face: one hop to every public name, and no I/O or clock imports."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import ductor_settlement

MODULES = (
    "canonical",
    "dsse",
    "errors",
    "holds",
    "ledger",
    "metering",
    "money",
    "plans",
    "pricing",
    "receipts",
    "returns",
)
SOURCE = Path(ductor_settlement.__file__).parent


def test_public_face_names_its_version() -> None:
    assert ductor_settlement.__version__ == "0.1.0"
    assert "__version__" in ductor_settlement.__all__


def test_every_exported_name_resolves_once() -> None:
    names = ductor_settlement.__all__
    assert len(names) == len(set(names))
    for name in names:
        assert hasattr(ductor_settlement, name), name


def test_every_public_name_of_every_module_is_one_hop_from_the_package() -> None:
    missing = []
    for module_name in MODULES:
        module = importlib.import_module(f"ductor_settlement.{module_name}")
        for name in module.__all__:
            if name not in ductor_settlement.__all__ and name not in (
                "CURRENCY_PATTERN",
                "currency_problem",
                "micros_problem",
            ):
                missing.append(f"{module_name}.{name}")
            assert getattr(module, name) is not None
    assert missing == []


def test_no_module_imports_io_or_reads_the_clock() -> None:
    forbidden_modules = {"socket", "http", "urllib", "requests", "httpx", "time", "os", "asyncio"}
    offenders = []
    for path in sorted(SOURCE.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module is not None:
                roots = {node.module.split(".")[0]}
            else:
                roots = set()
            offenders += [f"{path.name}: import {root}" for root in roots & forbidden_modules]
            if isinstance(node, ast.Attribute) and node.attr in {"now", "utcnow", "today"}:
                offenders.append(f"{path.name}:{node.lineno} .{node.attr}")
            if isinstance(node, ast.Name) and node.id == "open":
                offenders.append(f"{path.name}:{node.lineno} open")
    assert offenders == []
