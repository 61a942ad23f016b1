"""The process's memory: handing the heap's free pages back to the operating
system, and keeping the cyclic garbage collector off the objects that live as
long as the process.

CPython frees objects into its allocators and the C library's heap, which keep
the pages: after a burst (a batch of starts, a backlog ticked through) the
process stays at its high-water mark. glibc's `malloc_trim` returns the free
pages. The runtime calls it once the engine goes quiet after work (see
`Runtime`), never in a busy loop; elsewhere (macOS, musl) it does nothing.

The collector's full collections walk every object it tracks. In a server that
is mostly the imported modules, their classes and functions, and the built app,
which never die: under load each full collection took about 40 ms, and the
collections about a sixth of the process's CPU. `settle_heap` leaves them out.
"""

from __future__ import annotations

import ctypes
import gc
import sys
from collections.abc import Callable

_trim: Callable[[int], int] | None = None
_looked = False


def _malloc_trim() -> Callable[[int], int] | None:
    global _trim, _looked
    if not _looked:
        _looked = True
        if sys.platform.startswith("linux"):
            try:
                found = getattr(ctypes.CDLL(None), "malloc_trim", None)
            except OSError:
                found = None
            if found is not None:
                found.argtypes = [ctypes.c_size_t]
                found.restype = ctypes.c_int
                _trim = found
    return _trim


def release_free_memory() -> bool:
    """Give the heap's free pages back; False where the C library cannot."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


YOUNG_COLLECTION_THRESHOLD = 10_000
"""Tracked objects allocated (net of those freed) between two collections of the
youngest generation; CPython's default is 700."""


def settle_heap() -> None:
    """Once a server process has imported and built everything: collect, then
    leave every object alive now out of later collections (`gc.freeze`), and
    collect the youngest generation every `YOUNG_COLLECTION_THRESHOLD`
    allocations instead of 700.

    A frozen object is still freed when the last reference to it goes; only a
    reference cycle of frozen objects that became garbage would stay, and what
    a server builds at start lives as long as it does.
    """
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, middle, old)


__all__ = ["YOUNG_COLLECTION_THRESHOLD", "release_free_memory", "settle_heap"]
