"""Fixtures of the hostile tests: a server process under a memory cap, its memory
read from /proc, and the row counts of its database."""

from __future__ import annotations

import importlib.util
import resource
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

# Far above what a healthy server uses (about 250 MiB of address space, 80 MiB
# resident), far below the machine: a bomb that got through would hit it and
# die instead of taking the machine with it.
MEMORY_CAP_BYTES = 2 * 1024**3

_HERE = Path(__file__).parent


def _load(name: str, path: Path) -> Any:
    """A sibling module by path (tests run with --import-mode=importlib: no sys.path)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read_memory(pid: int) -> dict[str, int]:
    """The process's memory in KiB, from /proc: `rss`, `peak_rss` (high water mark), `vm`."""
    fields = {"VmRSS": "rss", "VmHWM": "peak_rss", "VmSize": "vm"}
    found: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in fields:
            found[fields[key]] = int(value.split()[0])
    return found


def cap_memory(pid: int, limit: int = MEMORY_CAP_BYTES) -> None:
    """Cap the address space of a running process (RLIMIT_AS, soft and hard)."""
    resource.prlimit(pid, resource.RLIMIT_AS, (limit, limit))
    assert resource.prlimit(pid, resource.RLIMIT_AS) == (limit, limit)


@pytest.fixture
def cap_memory_of() -> Callable[[int], None]:
    """`cap_memory`: cap a running process's address space (2 GiB unless told)."""
    return cap_memory


@pytest.fixture
def capped_server(server: Any) -> Any:
    """The `server` fixture's process (each backend in turn), started and capped at 2 GiB."""
    server.start()
    cap_memory(server.proc.pid)
    return server


@pytest.fixture
def process_memory() -> Callable[[int], dict[str, int]]:
    """`read_memory`: a process's resident, peak resident and virtual size in KiB."""
    return read_memory


@pytest.fixture
def row_counts() -> Callable[[Any], dict[str, int]]:
    """Rows per table of a server's database (the malformed-request corpus's counter)."""
    module = _load("_hostile_malformed", _HERE / "test_malformed_requests.py")
    counts: Callable[[Any], dict[str, int]] = module.row_counts
    return counts


@pytest.fixture
def bomb_corpus() -> dict[str, tuple[str, str]]:
    """id -> (why, expression) of every bomb of the core corpus (runtime and structure)."""
    path = _HERE.parents[1] / "packages/ductor-core/tests/test_expressions_bombs.py"
    bombs: dict[str, tuple[str, str]] = _load("_core_bombs", path).BOMBS
    return bombs
