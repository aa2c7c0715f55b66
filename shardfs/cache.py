"""One byte-bounded LRU shared by every cache of a mount, so one budget bounds them all."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import threading
import weakref
from collections.abc import Callable, Hashable, Iterator
from typing import TypeVar

from cachetools import LRUCache

T = TypeVar("T")

DEFAULT_MAX_VALUE = 256 << 20  # `--max-file-size`: the largest file a mount decodes
LARGE_VALUE = 2 << 20  # bytes past which a value is made one at a time (see large_value_turn)
# Bookkeeping per entry (key tuple, dict slot, object headers), so that many tiny entries still count: a
# looked-up chunk node (a File and its key) measured about 520 bytes in the daemon.
ENTRY_OVERHEAD = 512


def _nbytes(value: object) -> int:
    size = len(value) if isinstance(value, bytes | bytearray) else getattr(value, "nbytes", 0)
    return size + ENTRY_OVERHEAD


class ByteCache:
    """Thread-safe LRU bounded in bytes. The lock covers only dict operations, never I/O or decoding.

    A value larger than the whole budget is kept alone in one overflow slot instead, so reading a
    huge chunk in 128 KiB pieces decodes it once, and memory stays within budget plus one value, which
    is at most max_value bytes (`--max-file-size`: formats refuse to make a larger one).
    """

    def __init__(self, budget: int, max_value: int = DEFAULT_MAX_VALUE) -> None:
        self.budget = budget
        self.max_value = max_value
        _caches.add(self)
        self._lru = _CountingLRU(maxsize=budget, getsizeof=_nbytes)
        self._overflow: tuple[Hashable, object] | None = None
        self._making: dict[Hashable, threading.Lock] = {}  # held by the thread making that key
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def get_or_make(self, key: Hashable, make: Callable[[], T]) -> T:
        """The cached value for key, or make()'s, cached. One thread makes a given key at a time; others
        wanting it wait for that one, so N readers of a cold shard decode it once, not N times."""
        while True:
            with self._lock:
                value = self._cached(key)
                if value is not _MISSING:
                    self.hits += 1
                    return value  # type: ignore[return-value]
                making = self._making.get(key)
                if making is None:
                    self.misses += 1
                    gate = self._making[key] = threading.Lock()
                    gate.acquire()
                    break
            with making:  # wait for the maker, then look again; if it failed, this thread makes it in turn
                pass
        try:
            value = make()
            with self._lock:
                try:
                    self._lru[key] = value
                except ValueError:  # cachetools: larger than the whole budget
                    self._overflow = (key, value)
            return value
        finally:
            with self._lock:
                self._making.pop(key).release()

    def get(self, key: Hashable) -> object | None:
        """The cached value for key, or None; nothing is made."""
        with self._lock:
            value = self._cached(key)
        return None if value is _MISSING else value

    def drop_overflow(self) -> None:
        """Let go of the value over budget, before a large one is made: one such value at a time."""
        self._overflow = None

    def clear(self) -> None:
        """Forget every value, for when the source was rewritten in place. Makers under way finish."""
        with self._lock:
            self._lru.clear()
            self._overflow = None

    @property
    def evictions(self) -> int:
        return self._lru.evictions

    @property
    def nbytes(self) -> int:
        return self._lru.currsize + self.oversized

    @property
    def oversized(self) -> int:
        """Bytes of the one value kept over the budget, if any."""
        return _nbytes(self._overflow[1]) if self._overflow else 0

    @property
    def entries(self) -> int:
        return len(self._lru) + (self._overflow is not None)

    def _cached(self, key: Hashable) -> object:
        value = self._lru.get(key, _MISSING)
        if value is _MISSING and self._overflow is not None and self._overflow[0] == key:
            return self._overflow[1]
        return value


_MISSING = object()
_caches: weakref.WeakSet[ByteCache] = weakref.WeakSet()
_large = threading.RLock()  # reentrant: a large value read from the store is then decoded in the same turn


def large_value_turn(nbytes: int) -> contextlib.AbstractContextManager[None]:
    """Held while a large value (stored or decoded) is read or made: one at a time, and the last one over
    budget is let go first, so that memory stays within the budget and the one file being made, however
    many threads decode at once."""
    return _one_large_value() if nbytes > LARGE_VALUE else contextlib.nullcontext()


@contextlib.contextmanager
def _one_large_value() -> Iterator[None]:
    with _large:
        for cache in list(_caches):
            cache.drop_overflow()
        yield


M_MMAP_THRESHOLD = -3


def return_freed_memory() -> None:
    """glibc raises its mmap threshold as large blocks are freed, up to 32 MiB, after which freed values
    stay in the heap and memory only grows. A fixed 1 MiB threshold maps each large value on its own, so
    what the cache lets go is given back, and peak memory is what the budget says."""
    libc = ctypes.util.find_library("c")
    if libc:
        ctypes.CDLL(libc).mallopt(M_MMAP_THRESHOLD, 1 << 20)


class _CountingLRU(LRUCache[Hashable, object]):
    """cachetools' LRU, counting the entries it evicts to stay within budget."""

    evictions = 0

    def popitem(self) -> tuple[Hashable, object]:
        self.evictions += 1
        return super().popitem()
