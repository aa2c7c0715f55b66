"""One byte-bounded LRU shared by every cache of a mount, so one budget bounds them all."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import TypeVar

from cachetools import LRUCache

T = TypeVar("T")

# Bookkeeping per entry (key tuple, dict slot, object headers), so that many tiny entries still count.
ENTRY_OVERHEAD = 200


def _nbytes(value: object) -> int:
    size = len(value) if isinstance(value, bytes) else getattr(value, "nbytes", 0)
    return size + ENTRY_OVERHEAD


class ByteCache:
    """Thread-safe LRU bounded in bytes. The lock covers only dict operations, never I/O or decoding.

    A value larger than the whole budget is kept alone in one overflow slot instead, so reading a
    huge chunk in 128 KiB pieces decodes it once, and memory stays within budget plus one value.
    """

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._lru: LRUCache[Hashable, object] = LRUCache(maxsize=budget, getsizeof=_nbytes)
        self._overflow: tuple[Hashable, object] | None = None
        self._lock = threading.Lock()

    def get_or_make(self, key: Hashable, make: Callable[[], T]) -> T:
        """The cached value for key, or make()'s, cached. Two threads may both make on a miss: cheaper than waiting."""
        with self._lock:
            value = self._lru.get(key, _MISSING)
            overflow = self._overflow
        if value is not _MISSING:
            return value  # type: ignore[return-value]
        if overflow is not None and overflow[0] == key:
            return overflow[1]  # type: ignore[return-value]
        value = make()
        with self._lock:
            try:
                self._lru[key] = value
            except ValueError:  # cachetools: larger than the whole budget
                self._overflow = (key, value)
        return value


_MISSING = object()
