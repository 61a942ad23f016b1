"""A bounded, thread-safe map from expression source to compiled program.

Holds no engine logic; each engine owns one cache.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

P = TypeVar("P")


class ProgramCache(Generic[P]):
    """Compiled programs by source, least recently used dropped past `maxsize`.

    Every access takes one lock, so threads may share a cache; a source is
    compiled at most once while it stays cached (compiling happens under the
    lock, which is fine: compiling is rare and programs are reused).
    """

    def __init__(self, maxsize: int = 4096) -> None:
        if maxsize < 1:
            raise ValueError("maxsize must be at least 1")
        self._maxsize = maxsize
        self._programs: OrderedDict[str, P] = OrderedDict()
        self._lock = threading.Lock()

    def get_or_compile(self, source: str, compile_: Callable[[str], P]) -> P:
        """The cached program for `source`, compiling it on a miss."""
        with self._lock:
            program = self._programs.get(source)
            if program is not None:
                self._programs.move_to_end(source)
                return program
            program = compile_(source)
            self._programs[source] = program
            if len(self._programs) > self._maxsize:
                self._programs.popitem(last=False)
            return program

    def __len__(self) -> int:
        return len(self._programs)

    def __contains__(self, source: object) -> bool:
        return source in self._programs
