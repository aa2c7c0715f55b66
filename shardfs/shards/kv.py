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
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field

from shardfs.cache import ByteCache
from shardfs.errors import CorruptChunk
from shardfs.stores.protocol import ByteRange, Store, StoredFile

log = logging.getLogger("shardfs")

SHOWN = 3  # problems spelled out per shard; the rest are counted, since one bad minishard may hold thousands


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

    def path(self, name: str) -> str:
        return f"{self.directory}/{name}" if self.directory else name

    @abstractmethod
    def locate(self, key: object) -> Extent | None:
        """Where key's bytes are, or None if it is absent. CorruptChunk if an index contradicts the file."""

    @abstractmethod
    def shards(self) -> Iterator[ShardFile]:
        """The shards present, each once, in one order whatever the store."""

    @abstractmethod
    def verify(self, shard: ShardFile) -> ShardReport:
        """Every index of one shard read and checked, as `shardfs check` does. OSError if it cannot be read."""

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

    def open_reading(self, path: str, want: ByteRange) -> tuple[StoredFile, bytes]:
        """A file and the bytes want asks for (fewer where it ends sooner), from one request."""
        return self.store.open_reading(path, want)

    def list_dir(self, path: str) -> Iterator[tuple[str, bool]]:
        return self.store.list(path)

    def is_file(self, path: str) -> bool:
        return self.store.type_of(path) == "file"

    def files_below(self, path: str) -> Iterator[str]:
        return files_below(self.store, path)


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
