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

    Threads may share a cache. Lookups and inserts take one short lock;
    compiling happens outside it, so a slow compile never holds up other
    threads. Two threads racing on the same new source may both compile it,
    but the first program stored wins and both get that one.
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
        compiled = compile_(source)
        with self._lock:
            program = self._programs.setdefault(source, compiled)
            self._programs.move_to_end(source)
            if len(self._programs) > self._maxsize:
                self._programs.popitem(last=False)
            return program

    def __len__(self) -> int:
        return len(self._programs)

    def __contains__(self, source: object) -> bool:
        return source in self._programs
