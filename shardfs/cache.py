"""One byte-bounded LRU shared by every cache of a mount, so one budget bounds them all."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")

DEFAULT_MAX_VALUE = 256 << 20  # `--max-file-size`: the largest file a mount decodes
LARGE_VALUE = 2 << 20  # bytes past which a value is made one at a time (see large_value_turn)


def entry_cost(key: Hashable, value: object) -> int:
    """What keeping value under key costs in memory, so that many tiny entries count as what they are: the
    key (a tuple of names and numbers) and the value's own object, measured, plus the bytes the value says it
    holds beyond that (`nbytes`: a decoded index's rows, a node's file). The cache's table is counted apart."""
    if isinstance(value, bytes | bytearray):
        return key_cost(key) + sys.getsizeof(value)
    return key_cost(key) + sys.getsizeof(value) + getattr(value, "nbytes", 0)


def key_cost(key: Hashable) -> int:
    """A key's tuple and what is in it (the strings of a path shared with other objects are counted again:
    the count errs on the side of the budget)."""
    if isinstance(key, tuple):
        return sys.getsizeof(key) + sum(key_cost(part) for part in key)
    return sys.getsizeof(key)


def closure_cost(function: Callable) -> int:
    """A closure kept with a value (a node's `make`): the function object, its cells and what each holds, as
    key_cost measures it. What those objects refer to in turn is shared with others (a directory, an array)
    or counted by its holder (a stored chunk's bytes)."""
    cells = getattr(function, "__closure__", None) or ()  # none for a method or a partial
    return sys.getsizeof(function) + sum(sys.getsizeof(cell) + key_cost(_contents(cell)) for cell in cells)


def _contents(cell: object) -> object:
    try:
        return cell.cell_contents  # type: ignore[attr-defined]
    except ValueError:  # a cell not yet filled
        return None


class ByteCache:
    """Thread-safe LRU bounded in bytes: what its entries cost (`entry_cost`) and its own table, as measured,
    stay within the budget. The lock covers only dict operations, never I/O or decoding.

    A value larger than the whole budget is kept alone in one overflow slot instead, so reading a
    huge chunk in 128 KiB pieces decodes it once, and memory stays within budget plus one value, which
    is at most max_value bytes (`--max-file-size`: formats refuse to make a larger one).
    """

    def __init__(self, budget: int, max_value: int = DEFAULT_MAX_VALUE) -> None:
        self.budget = budget
        self.max_value = max_value
        self._large = threading.RLock()  # one large value made at a time (reentrant: read, then decoded in turn)
        # Least recently used first. The value alone is kept: its cost is measured again when it goes, which
        # gives the same figure, and a second table of sizes would cost as much as the entries of small values.
        self._lru: OrderedDict[Hashable, object] = OrderedDict()
        self._held = 0  # what the entries cost, without the table
        self._overflow: tuple[Hashable, object] | None = None
        self._making: dict[Hashable, threading.Lock] = {}  # held by the thread making that key
        self._lock = threading.Lock()
        self.hits = self.misses = self.evictions = 0

    def get_or_make(self, key: Hashable, make: Callable[[], T], keep: Callable[[T], bool] | None = None) -> T:
        """The cached value for key, or make()'s, cached unless keep says it is not worth keeping. One thread
        makes a given key at a time; others wanting it wait for that one, so N readers of a cold shard decode
        it once, not N times."""
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
            if keep is None or keep(value):
                self._keep(key, value)
            return value
        finally:
            with self._lock:
                self._making.pop(key).release()

    def make_together(self, keys: Iterable[Hashable], make: Callable[[list], dict]) -> list:
        """Values one read brings together (keys fetched ahead in one request): those of keys neither cached nor
        being made are made by make(those keys) → {key: value}, and kept; meanwhile they are being made by this
        thread, so that a `get(wait=True)` of one waits for them rather than reading them again. The keys made."""
        with self._lock:
            mine = [key for key in keys if self._cached(key) is _MISSING and key not in self._making]
            for key in mine:
                self._making[key] = threading.Lock()
                self._making[key].acquire()
        try:
            if mine:
                for key, value in make(mine).items():
                    self._keep(key, value)
            return mine
        finally:
            with self._lock:
                for key in mine:
                    self._making.pop(key).release()

    def _keep(self, key: Hashable, value: object) -> None:
        cost = entry_cost(key, value)  # measured outside the lock
        with self._lock:
            if cost > self.budget:
                self._overflow = (key, value)
                return
            self._lru[key] = value
            self._held += cost
            while self._held + sys.getsizeof(self._lru) > self.budget and len(self._lru) > 1:
                self._held -= entry_cost(*self._lru.popitem(last=False))
                self.evictions += 1

    def get(self, key: Hashable, wait: bool = False) -> object | None:
        """The cached value for key, or None; nothing is made. wait: if another thread is making it, wait for
        that one (a read that finds its bytes being fetched ahead takes them rather than fetching them again)."""
        with self._lock:
            value = self._cached(key)
            making = self._making.get(key) if wait else None
        if value is _MISSING and making is not None:
            with making:
                pass
            return self.get(key)
        return None if value is _MISSING else value

    @contextlib.contextmanager
    def large_value_turn(self) -> Iterator[None]:
        """This mount's turn to make a large value (see cache.large_value_turn)."""
        with self._large:
            self.drop_overflow()
            yield

    def drop_overflow(self) -> None:
        """Let go of the value over budget, before a large one is made: one such value at a time."""
        self._overflow = None

    def clear(self) -> None:
        """Forget every value, for when the source was rewritten in place. Makers under way finish."""
        with self._lock:
            self._lru = OrderedDict()
            self._held = 0
            self._overflow = None

    @property
    def nbytes(self) -> int:
        return self._held + sys.getsizeof(self._lru) + self.oversized

    @property
    def oversized(self) -> int:
        """Bytes of the one value kept over the budget, if any."""
        return entry_cost(*self._overflow) if self._overflow else 0

    @property
    def entries(self) -> int:
        return len(self._lru) + (self._overflow is not None)

    def _cached(self, key: Hashable) -> object:
        value = self._lru.get(key, _MISSING)
        if value is not _MISSING:
            self._lru.move_to_end(key)
        elif self._overflow is not None and self._overflow[0] == key:
            return self._overflow[1]
        return value


class Scoped:
    """One dataset's part of a mount's cache, when a mount shows many (a directory of datasets): its keys kept
    apart from the others' (each dataset names its files from its own root), under the one budget of all."""

    def __init__(self, cache: ByteCache, scope: str) -> None:
        self.cache = cache
        self.scope = scope

    @property
    def max_value(self) -> int:
        return self.cache.max_value

    def get_or_make(self, key: Hashable, make: Callable[[], T], keep: Callable[[T], bool] | None = None) -> T:
        return self.cache.get_or_make(("dataset", self.scope, key), make, keep)

    def get(self, key: Hashable, wait: bool = False) -> object | None:
        return self.cache.get(("dataset", self.scope, key), wait)

    def make_together(self, keys: Iterable[Hashable], make: Callable[[list], dict]) -> list:
        scoped = {("dataset", self.scope, key): key for key in keys}

        def made(mine: list) -> dict:
            return {("dataset", self.scope, key): value for key, value in make([scoped[k] for k in mine]).items()}

        return [scoped[key] for key in self.cache.make_together(scoped, made)]

    def large_value_turn(self) -> contextlib.AbstractContextManager[None]:
        """The mount's turn: every dataset of a mount shares its one budget."""
        return self.cache.large_value_turn()


_MISSING = object()
_ANYWHERE = threading.RLock()  # the turn of large values made outside a mount (`shardfs cat`)


def large_value_turn(nbytes: int, cache: ByteCache | None) -> contextlib.AbstractContextManager[None]:
    """Held while a large value (stored or decoded) is read or made: one at a time a mount (cache, its own,
    given to what decodes when the mount is made; None outside a mount: one at a time the process), and the
    last one over its budget is let go first, so that memory stays within the budget and the one file being
    made, however many threads decode at once. Each mount has its own turn, so one mount's large file waits
    for no other mount's."""
    if nbytes <= LARGE_VALUE:
        return contextlib.nullcontext()
    return _ANYWHERE if cache is None else cache.large_value_turn()


M_MMAP_THRESHOLD = -3


def return_freed_memory() -> None:
    """glibc raises its mmap threshold as large blocks are freed, up to 32 MiB, after which freed values
    stay in the heap and memory only grows. A fixed 1 MiB threshold maps each large value on its own, so
    what the cache lets go is given back, and peak memory is what the budget says."""
    libc = ctypes.util.find_library("c")
    if libc:
        ctypes.CDLL(libc).mallopt(M_MMAP_THRESHOLD, 1 << 20)
