"""The sharded key-value layer both formats read through: a key's byte extent (or its absence), the shards
present, every stored key within a listing's budget, and a check of one shard. Each format's index maths
lives beside it (`neuroglancer.py`, `zarr.py`); its reading of shards in `neuroglancer_kv.py` and
`zarr_kv.py`. This module holds what they share: the few places the store is asked for bytes, one scheme of
cache keys, and what a listing that skips a shard says.
"""

from __future__ import annotations

import logging
import posixpath
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

from shardfs.cache import ByteCache
from shardfs.errors import CorruptChunk
from shardfs.request import OWN, Request
from shardfs.stores.protocol import ByteRange, Store, StoredFile

log = logging.getLogger("shardfs")

SHOWN = 3  # problems spelled out per shard; the rest are counted, since one bad minishard may hold thousands
# Read-ahead (fs/readahead.py): keys' ranges of one shard read in one request where no more than GAP bytes lie
# between two of them, up to MOST bytes a request (a few round trips' worth of bytes at 100 MB/s: a request
# is then mostly transfer, not waiting). Those between are read and not kept: at most GAP a key.
PREFETCH_GAP = 64 << 10
PREFETCH_MOST = 1 << 20
PROBED_SHARDS = 4096  # the most shard names asked for, one by one, to list a directory that cannot be listed
PROBES_AT_ONCE = 16
T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class ShardFile:
    """A shard present in the source: what it is called (its path; `<n>.index+<n>.data` for a precomputed
    pair) and where it lies in its format's shards (a number, or a position on the shard grid)."""

    path: str
    at: int | tuple[int, ...]


@dataclass(slots=True)
class Extent:
    """Where one key's stored bytes are, in one version of its shard: [start, stop) of the file, or of data,
    the shard's bytes decoded whole where codecs cover the whole shard (zarr)."""

    file: StoredFile
    key: object  # as errors name it
    start: int
    stop: int
    data: bytes | bytearray | None = None

    @property
    def shard(self) -> str:
        return self.file.path


@dataclass(frozen=True)
class HeldChunks:
    """Stored bytes read before they were asked for, [start, start + len(data)) of their shard: a minishard's
    chunks read with its index, or a key fetched ahead. Reads of the keys within are served from them."""

    start: int
    data: bytes

    @property
    def nbytes(self) -> int:
        return len(self.data)

    def cut(self, start: int, stop: int) -> bytes | None:
        """The bytes [start, stop), or None where they are not all held."""
        if self.start <= start <= stop <= self.start + len(self.data):
            return self.data[start - self.start : stop - self.start]
        return None


@dataclass(frozen=True)
class Fetch:
    """Keys to fetch ahead together, and how: run() locates them (one index read, which they share) and reads
    their ranges in as few requests as lie close, returning the bytes fetched for each key found (0: held
    already). Independent of every other Fetch, so several run at once."""

    keys: list
    run: Callable[[], dict]

    def renamed(self, name: Callable[[object], object]) -> Fetch:
        """The same fetch, its keys as a provider names them (name: a key of the store's → the provider's)."""
        return Fetch([name(key) for key in self.keys], lambda: {name(key): n for key, n in self.run().items()})


@dataclass
class ShardReport:
    """What checking one shard found: its sound chunks, and what is wrong with it, the first few problems in
    words and how many in all."""

    chunks: int = 0
    first: list[str] = field(default_factory=list)
    count: int = 0

    def add(self, what: str) -> None:
        self.count += 1
        if len(self.first) < SHOWN:
            self.first.append(what)

    def __str__(self) -> str:
        more = self.count - len(self.first)
        return "; ".join(self.first) + (f" (and {more} more)" if more else "")


class ShardedKV(ABC):
    """A directory of shards read through a store, with what is read from them in the shared cache.

    Cache keys are `(what, shard, ...)`: what was read ("shard" for a shard opened by the read of its
    index, then "index", "minishard", ...), the shard (its path, and once it is open its version, so that
    nothing read from one version serves another), then where in it."""

    def __init__(self, store: Store, directory: str, cache: ByteCache) -> None:
        self.store, self.directory, self.cache = store, directory, cache
        self.round_trips = store.reads_at_once > 1  # reads wait on a network: bytes are worth reading ahead

    def path(self, name: str) -> str:
        return f"{self.directory}/{name}" if self.directory else name

    @abstractmethod
    def locate(self, key: object, request: Request = OWN) -> Extent | None:
        """Where key's bytes are, or None if it is absent. CorruptChunk if an index contradicts the file.
        request: whose lookup this is (what it decodes is counted against it; an interrupt ends its waits)."""

    @abstractmethod
    def shards(self) -> Iterator[ShardFile]:
        """The shards present, each once, in one order whatever the store."""

    @abstractmethod
    def verify(self, shard: ShardFile) -> ShardReport:
        """Every index of one shard read and checked, as `shardfs check` does. OSError if it cannot be read."""

    # -- a store that cannot list (HTTP) ----------------------------------------------------------------------------

    def probeable(self, count: int) -> bool:
        """Whether count shards may be asked for one by one to list a directory (PROBED_SHARDS at most); past that
        the listing shows none, and says so."""
        if count <= PROBED_SHARDS:
            return True
        log.warning("%s: %d shards to probe, more than %d: not listed", self.store.where(self.directory), count,
                    PROBED_SHARDS)  # fmt: skip
        return False

    @staticmethod
    def probed(items: Iterable[T], probe: Callable[[T], R | None]) -> Iterator[R]:
        """What probe finds of items, in their order, PROBES_AT_ONCE asked for at a time: the shards a directory
        holds, where the store cannot list it."""
        with ThreadPoolExecutor(PROBES_AT_ONCE) as pool:
            yield from (found for found in pool.map(probe, items) if found is not None)

    # -- read-ahead --------------------------------------------------------------------------------------------------

    def index_of(self, key: object) -> Hashable:
        """Which index locates key (a shard's, a minishard's): keys that share one are fetched together."""
        return None

    def fetches(self, keys: Sequence[object]) -> list[Fetch]:
        """Keys to fetch ahead, grouped by the index that locates them, in the order they were given."""
        groups: dict[Hashable, list[object]] = defaultdict(list)
        for key in keys:
            groups[self.index_of(key)].append(key)
        return [Fetch(group, lambda group=group: self.prefetch(group)) for group in groups.values()]

    def prefetch(self, keys: Sequence[object]) -> dict[object, int]:
        """Locate keys and read their stored bytes ahead of their reads: ranges of one shard's version within
        PREFETCH_GAP of each other in one request (PREFETCH_MOST at most), each key's bytes kept in the cache
        under that version. The bytes fetched for each key found (those read between go to the first of a
        request); absent keys, and those decoded whole with their shard, are left out."""
        found = [e for e in map(self.locate, keys) if e is not None and e.data is None]
        fetched: dict[object, int] = {}
        for run in _close_runs(sorted(found, key=lambda e: (e.file.path, e.file.version, e.start))):
            fetched.update((e.key, 0) for e in run)
            self._read_together(
                {self.cache_key("chunk", e.file, e.key): e for e in run if self.held(e) is None}, fetched
            )
        return fetched

    def _read_together(self, extents: dict[Hashable, Extent], fetched: dict[object, int]) -> None:
        """Chunks lying close in one shard's version read in one request and kept, their bytes counted in fetched
        (the bytes between go to the first). Until they arrive, a read of one of them waits for this request
        rather than sending its own (`held`); those already kept or being read are left out."""

        def read(keys: list) -> dict:
            todo = [extents[key] for key in keys]
            start, stop = todo[0].start, max(e.stop for e in todo)
            data = todo[0].file.read(start, stop)
            fetched.update((e.key, e.stop - e.start) for e in todo)
            fetched[todo[0].key] += len(data) - sum(e.stop - e.start for e in todo)
            return {
                key: HeldChunks(e.start, data[e.start - start : e.stop - start])
                for key, e in zip(keys, todo, strict=True)
            }

        self.cache.make_together(extents, read)

    def held(self, chunk: Extent) -> bytes | None:
        """The chunk's stored bytes, if they were read ahead of its read and are still kept (over a network)."""
        if not self.round_trips:
            return None
        found = self.cache.get(self.cache_key("chunk", chunk.file, chunk.key), wait=True)
        return found.cut(chunk.start, chunk.stop) if isinstance(found, HeldChunks) else None

    # -- the cache -------------------------------------------------------------------------------------------------

    def opened_cache_key(self, shard: Hashable) -> tuple:
        """The cache key of a shard opened, as the format names it (its number, or its path)."""
        return ("shard", self.directory, shard)

    @staticmethod
    def cache_key(what: str, file: StoredFile, *where: Hashable) -> tuple:
        """The cache key of something read from one version of an opened shard."""
        return (what, file.path, file.version, *where)

    # -- the store, asked here only ------------------------------------------------------------------------------------

    def open_file(self, path: str) -> StoredFile:
        """FileNotFoundError if it is absent."""
        return self.store.open(path)

    def open_reading(self, path: str, want: ByteRange, request: Request = OWN) -> tuple[StoredFile, bytes]:
        """A file and the bytes want asks for (fewer where it ends sooner), from one request."""
        return self.store.open_reading(path, want, request)

    def list_dir(self, path: str) -> Iterator[tuple[str, bool]]:
        return self.store.list(path)

    def is_file(self, path: str) -> bool:
        return self.store.type_of(path) == "file"

    def files_below(self, path: str) -> Iterator[str]:
        return files_below(self.store, path)


def _close_runs(extents: list[Extent]) -> Iterator[list[Extent]]:
    """Extents sorted by shard version and start, in runs that one request each reads: one version, each within
    PREFETCH_GAP of the one before, PREFETCH_MOST bytes at most. One larger than that alone is left out."""
    run: list[Extent] = []
    for extent in extents:
        if extent.stop - extent.start > PREFETCH_MOST:
            continue
        if run and (
            (extent.file.path, extent.file.version) != (run[0].file.path, run[0].file.version)
            or extent.start - max(e.stop for e in run) > PREFETCH_GAP
            or extent.stop - run[0].start > PREFETCH_MOST
        ):
            yield run
            run = []
        run.append(extent)
    if run:
        yield run


def files_below(store: Store, path: str) -> Iterator[str]:
    """Every file below a source directory, streamed."""
    for name, is_dir in store.list(path):
        child = posixpath.join(path, name)
        if is_dir:
            yield from files_below(store, child)
        else:
            yield child


def skipped(shard: str, e: Exception, what: str = "a shard") -> None:
    """A listing goes on past what it cannot read: a corrupt shard is an ERROR (the source is wrong), an
    unreadable one a WARNING (the disk or the server failed, perhaps only for now)."""
    if isinstance(e, CorruptChunk):
        log.error("listing skips %s: %s", what, e, extra=e.log_fields("listing_skip"))
    else:
        log.warning("listing skips %s: %s", what, e, extra={"event": "listing_skip", "shard": shard})
