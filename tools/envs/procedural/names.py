"""Word pools the worlds draw their records from (written for this project).

First names are chosen so that none is the tail of another ("Ann"/"Joann" would make a
name search ambiguous).
"""

from __future__ import annotations

import random
from collections.abc import Callable

__all__ = ["FIRST", "LAST", "people", "unique"]

FIRST = [
    "Alice", "Bruno", "Carla", "Dmitri", "Elena", "Farid", "Greta", "Hiro", "Ines", "Jonas",
    "Keiko", "Luca", "Maya", "Nikos", "Olga", "Pedro", "Quinn", "Rosa", "Samir", "Tessa",
    "Umar", "Vera", "Wendy", "Xavier", "Yara", "Zoltan", "Amara", "Boris", "Chloe", "Diego",
]  # fmt: skip
LAST = [
    "Moreno", "Novak", "Okafor", "Petrov", "Quist", "Rahman", "Silva", "Tanaka", "Ulrich", "Varga",
    "Weber", "Yilmaz", "Zhang", "Almeida", "Brandt", "Costa", "Dubois", "Eriksen", "Fischer", "Garcia",
]  # fmt: skip


def unique(rng: random.Random, count: int, make: Callable[[random.Random], str]) -> list[str]:
    """``count`` distinct strings from ``make(rng)`` (a callable), in draw order."""
    seen: dict[str, None] = {}
    for _ in range(count * 50):
        if len(seen) == count:
            break
        seen.setdefault(make(rng), None)
    if len(seen) < count:
        raise ValueError(f"the word pools cannot make {count} distinct names")
    return list(seen)


def people(rng: random.Random, count: int) -> list[str]:
    """``count`` distinct full names."""
    return unique(rng, count, lambda r: f"{r.choice(FIRST)} {r.choice(LAST)}")
