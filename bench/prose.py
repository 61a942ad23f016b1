"""Made-up text that compresses about as well as prose, for benches whose
steps answer large outputs (a run of one letter would compress to nothing and
hide what storing it costs)."""

from __future__ import annotations

import random
from functools import cache


@cache
def _words() -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    return ["".join(random.Random(n).choices(letters, k=2 + n % 9)) for n in range(2000)]


def prose(seed: int | str, size: int) -> str:
    """`size` characters of words, the same for the same seed."""
    return " ".join(random.Random(seed).choices(_words(), k=size // 4))[:size]
