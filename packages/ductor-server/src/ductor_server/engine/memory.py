"""Handing the heap's free memory back to the operating system.

CPython frees objects into its allocators and the C library's heap, which keep
the pages: after a burst (a batch of starts, a backlog ticked through) the
process stays at its high-water mark. glibc's `malloc_trim` returns the free
pages. The runtime calls it once the engine goes quiet after work (see
`Runtime`), never in a busy loop; elsewhere (macOS, musl) it does nothing.
"""

from __future__ import annotations

import ctypes
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


__all__ = ["release_free_memory"]
