"""`neuroglancer_uint64_sharded_v1`: which shard and minishard hold a key, and where its bytes are.

Everything read from a shard is untrusted: offsets and sizes are checked against the file's real
size before anything is read or allocated, and a contradiction raises `CorruptChunk` for that key
alone.
"""

from __future__ import annotations

import errno
import logging
import re
import struct
import sys
from array import array
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property, partial
from typing import NamedTuple, TypeVar

import mmh3
import numpy as np

from shardfs.cache import ByteCache
from shardfs.codecs import gunzip
from shardfs.errors import CorruptChunk, OverLimit, SourceError
from shardfs.stores.protocol import JoinedFile, Range, Store, StoredFile

log = logging.getLogger("shardfs")
T = TypeVar("T")

UINT64_MAX = (1 << 64) - 1
LISTING_BLOCK = 1 << 20  # bytes of shard index read at a time while listing
LISTING_BUDGET = 64 << 20  # index bytes a listing may read without listing a name (see ListingBudget)
LISTING_READ = 4 << 10  # the least a minishard index read costs it, and what a name listed gives back
PROBED_SHARDS = 4096  # the most shard names asked for, one by one, to list a directory that cannot be listed
PROBES_AT_ONCE = 16
SHARD_INDEX_READ = 64 << 10  # a shard index up to this size (minishard_bits <= 12) comes whole with its shard's opening
MINISHARD_BATCH = 1 << 20  # minishard indexes lying next to each other are read in one request, up to this many bytes
ENCODINGS = ("raw", "gzip")
# What a shard's files are called: `<n>.shard`, or the earlier layout's `<n>.index` (the shard index) and
# `<n>.data` (the rest), whose concatenation is the `.shard`. A shard is listed by the first one present.
SUFFIXES = ("shard", "index", "data")


@dataclass(frozen=True)
class ShardingSpec:
    preshift_bits: int
    hash: str
    minishard_bits: int
    shard_bits: int
    minishard_index_encoding: str = "raw"
    data_encoding: str = "raw"

    @classmethod
    def from_json(cls, obj: object, where: str) -> ShardingSpec:
        """Parse a `sharding` member; `where` names the file and field for the error message."""
        if not isinstance(obj, dict):
            raise SourceError(f"{where} must be an object, not {obj!r}"[:300])
        if obj.get("@type") != "neuroglancer_uint64_sharded_v1":
            raise SourceError(f"{where}: '@type' must be 'neuroglancer_uint64_sharded_v1'")
        values = {}
        for name in ("preshift_bits", "minishard_bits", "shard_bits"):
            v = obj.get(name)
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= 64:
                raise SourceError(f"{where}: '{name}' must be an integer from 0 to 64, not {v!r}")
            values[name] = v
        if values["minishard_bits"] + values["shard_bits"] > 64:
            raise SourceError(f"{where}: 'minishard_bits' + 'shard_bits' exceeds 64")
        if obj.get("hash") not in ("identity", "murmurhash3_x86_128"):
            raise SourceError(f"{where}: 'hash' must be 'identity' or 'murmurhash3_x86_128', not {obj.get('hash')!r}")
        for name in ("minishard_index_encoding", "data_encoding"):
            if obj.get(name, "raw") not in ENCODINGS:
                raise SourceError(f"{where}: '{name}' must be 'raw' or 'gzip', not {obj.get(name)!r}")
            values[name] = obj.get(name, "raw")
        return cls(hash=obj["hash"], **values)

    @property
    def shard_index_size(self) -> int:
        return 16 << self.minishard_bits

    def hashed(self, key: int) -> int:
        shifted = key >> self.preshift_bits
        if self.hash == "identity":
            return shifted
        return mmh3.hash64(shifted.to_bytes(8, "little"), 0, False, False)[0]  # seed 0, x86 variant, unsigned

    def shard_and_minishard(self, key: int) -> tuple[int, int]:
        h = self.hashed(key)
        return (h >> self.minishard_bits) & ((1 << self.shard_bits) - 1), h & ((1 << self.minishard_bits) - 1)

    @cached_property
    def _digits(self) -> int:
        return max(1, -(-self.shard_bits // 4))  # 0 bits still name one file, "0.shard"

    @cached_property
    def _name_format(self) -> str:
        return f"{{:0{self._digits}x}}.{{}}"

    @cached_property
    def _name_pattern(self) -> re.Pattern[str]:
        return re.compile(f"([0-9a-f]{{{self._digits}}})\\.({'|'.join(SUFFIXES)})")

    def shard_name(self, shard: int, suffix: str = "shard") -> str:
        return self._name_format.format(shard, suffix)

    def shard_file(self, name: str) -> tuple[int, str] | None:
        """The shard a file name stands for and its suffix (one of SUFFIXES), or None for any other file."""
        found = self._name_pattern.fullmatch(name)
        if found is None:
            return None
        shard = int(found[1], 16)
        return (shard, found[2]) if shard >> self.shard_bits == 0 else None


MINISHARD_INDEX_LIMIT = 16 << 20  # ~700k chunks in one minishard; writers aim for a few thousand


@dataclass(frozen=True)
class MinishardIndex:
    """The decoded index of one minishard: key -> absolute [start, stop) of its bytes.

    The sums are numpy's (uint64, wrapping as the spec's do). The rows are kept as three arrays sorted by
    key, 24 bytes a chunk where a dict of tuples took ~200 (so the cache holds eight times as many chunks'
    indexes), and probed with bisect, in C: under a microsecond, with no numpy call in a FUSE callback. Of
    keys stored twice the last row counts. Iteration gives the keys in stored order.
    """

    keys: array[int]  # sorted
    starts: array[int]
    stops: array[int]
    stored: array[int] | None  # the keys in stored order, where that is not sorted order

    @classmethod
    def decode(cls, raw: bytes, shard_index_size: int) -> MinishardIndex:
        if len(raw) % 24:
            raise ValueError(f"minishard index is {len(raw)} bytes, not a multiple of 24")
        ids, offsets, sizes = np.frombuffer(raw, "<u8").reshape(3, -1)
        keys = np.cumsum(ids, dtype=np.uint64)
        # Each start is relative to the end of the previous chunk, so each stop is a running sum.
        stops = np.cumsum(offsets + sizes, dtype=np.uint64) + np.uint64(shard_index_size)
        order = np.argsort(keys, kind="stable")
        last = np.append(keys[order[1:]] != keys[order[:-1]], True)[: len(order)]  # the last row of each key
        rows = order[last]
        kept = np.sort(rows)
        stored = None if np.array_equal(kept, rows) else _array(keys[kept])
        return cls(_array(keys[rows]), _array(stops[rows] - sizes[rows]), _array(stops[rows]), stored)

    @property
    def nbytes(self) -> int:
        arrays = (self.keys, self.starts, self.stops, self.stored)
        return sum(sys.getsizeof(a) for a in arrays if a is not None)

    def find(self, key: int) -> tuple[int, int] | None:
        """The stored [start, stop) of key, or None if it is absent."""
        i = bisect_left(self.keys, key)
        if i == len(self.keys) or self.keys[i] != key:
            return None
        return self.starts[i], self.stops[i]

    def __iter__(self) -> Iterator[int]:
        return iter(self.keys if self.stored is None else self.stored)

    def items(self) -> Iterator[tuple[int, tuple[int, int]]]:
        """(key, (start, stop)) in stored order."""
        for key in self:
            yield key, self.find(key)  # type: ignore[misc]


def _array(values: np.ndarray) -> array[int]:
    return array("Q", values.astype("=u8").tobytes())


EMPTY = MinishardIndex.decode(b"", 0)


class BudgetSpent(Exception):
    """A listing has read all the index it may: the rest of the directory is not listed."""

    def __init__(self, shard: str) -> None:
        super().__init__(shard)
        self.shard = shard


@dataclass
class ListingBudget:
    """The index one listing may read without listing a name, so that no shard (a remote one claiming a
    256 GiB shard index, which no hole-skipping can shorten) stalls `ls` unboundedly: every shard index byte
    read counts, and every minishard index read at least LISTING_READ (a request's worth); each name listed
    gives LISTING_READ back, up to the whole budget. A real directory lists long before it runs out, however
    large; one that holds too little for what it makes us read stops, after a bounded number of requests."""

    left: int = LISTING_BUDGET

    def spend(self, nbytes: int, shard: str) -> None:
        """BudgetSpent, before the read, if nbytes is more than is left."""
        if nbytes > self.left:
            raise BudgetSpent(shard)
        self.left -= nbytes

    def refund(self, nbytes: int) -> None:
        self.left = min(self.left + nbytes, LISTING_BUDGET)


@dataclass(slots=True)
class Chunk:
    """Where one key's stored bytes are, in one version of its shard."""

    file: StoredFile
    key: int
    start: int
    stop: int

    @property
    def shard(self) -> str:
        return self.file.path


@dataclass(frozen=True)
class OpenShard:
    """One version of a shard, opened by the request that reads its shard index: the whole index when it is
    at most SHARD_INDEX_READ bytes (rows of (start, stop), relative to the end of the shard index), else
    none (its entries are read one at a time). batch: the absolute [start, stop) of all its minishard
    indexes, where they lie next to each other within MINISHARD_BATCH bytes, so that one read gets them all."""

    shard: int
    file: StoredFile
    index: np.ndarray | None
    batch: tuple[int, int] | None

    @property
    def nbytes(self) -> int:
        return 0 if self.index is None else self.index.nbytes


class Read(NamedTuple):
    """One step of reading a shard's indexes for a listing: cost, the index bytes it reads (spent from the
    listing's budget before it is taken); call, the read, if it is one to run (None: the caller reads)."""

    cost: int
    call: Callable[[], object] | None
    shard: str


class ShardedKV:
    """A sharded key-value directory read through a store, with its minishard indexes in the shared cache,
    each under the version of the shard it was read from."""

    def __init__(self, store: Store, directory: str, spec: ShardingSpec, cache: ByteCache) -> None:
        self.store = store
        self.directory = directory
        self.spec = spec
        self.cache = cache
        # The largest decoded value: one file's cap, unless the format knows better (volumes do).
        self.value_limit = cache.max_value
        self._budget_said = False  # whether a listing's running out of budget was logged (once a directory)

    def shard_path(self, shard: int, suffix: str = "shard") -> str:
        name = self.spec.shard_name(shard, suffix)
        return f"{self.directory}/{name}" if self.directory else name

    def pair_path(self, shard: int) -> str:
        """What a shard stored as `<n>.index` + `<n>.data` is called in messages."""
        return f"{self.shard_path(shard, 'index')}+{self.spec.shard_name(shard, 'data')}"

    def open(self, shard: int, key: object = "?") -> StoredFile:
        """The shard's bytes: `<n>.shard`, else the pair `<n>.index` + `<n>.data` read as one file, which is
        what a `.shard` is. FileNotFoundError if neither is there; CorruptChunk (naming the file) for a pair
        with one half missing, or whose `.index` is not exactly the shard index, or a file shorter than its
        shard index."""
        return self.opened(shard, 0, key)[0].file

    def opened(self, shard: int, minishard: int = 0, key: object = "?") -> tuple[OpenShard, tuple[int, int]]:
        """The shard, opened once (kept in the cache) by the read of its shard index, or of minishard's entry
        where the index is too large to read whole; and minishard's entry. A remote store learns the shard's
        version from that read's answer: no request goes first to ask it."""
        first: list[tuple[int, int]] = []

        def make() -> OpenShard:
            index_size = self.spec.shard_index_size
            whole = index_size <= SHARD_INDEX_READ
            start, stop = (0, index_size) if whole else (16 * minishard, 16 * minishard + 16)
            file, raw = self._open_reading(shard, key, start, stop)
            if len(raw) != stop - start:  # shorter than its shard index: CorruptChunk below, for every key
                return OpenShard(shard, file, None, None)
            rows = np.frombuffer(raw, "<u8").reshape(-1, 2)
            if not whole:
                first.append(tuple(rows[0].tolist()))
                return OpenShard(shard, file, None, None)
            return OpenShard(shard, file, rows, _adjacent(rows, index_size, file.size))

        opened = self.cache.get_or_make(("shard", self.directory, shard), make)
        self._index_size(opened.file, key)
        if opened.index is not None:
            return opened, tuple(opened.index[minishard].tolist())
        if first:
            return opened, first[0]
        return opened, struct.unpack("<QQ", opened.file.read(16 * minishard, 16 * minishard + 16))

    def _open_reading(self, shard: int, key: object, start: int, stop: int) -> tuple[StoredFile, bytes]:
        """The shard's file and its bytes [start, stop) (fewer where it ends sooner)."""
        try:
            return self.store.open_reading(self.shard_path(shard), Range(start, stop - start))
        except FileNotFoundError:
            pass
        file = self._pair(shard, key)
        return file, file.read(start, min(stop, file.size))

    def _pair(self, shard: int, key: object) -> JoinedFile:
        """The earlier layout's `<n>.index` + `<n>.data`, read as one file."""
        index, data = (self._opened(self.shard_path(shard, suffix)) for suffix in ("index", "data"))
        if index is None and data is None:
            raise FileNotFoundError(errno.ENOENT, "no shard file", self.store.where(self.shard_path(shard)))
        if index is None or data is None:
            missing = self.shard_path(shard, "index" if index is None else "data")
            raise CorruptChunk(self.pair_path(shard), key, f"{missing} is missing, and the other half is there")
        if index.size != self.spec.shard_index_size:
            why = f"{index.path} is {index.size} bytes, not the {self.spec.shard_index_size}-byte shard index"
            raise CorruptChunk(self.pair_path(shard), key, why)
        return JoinedFile.of(self.pair_path(shard), index, data)

    def _opened(self, path: str) -> StoredFile | None:
        try:
            return self.store.open(path)
        except FileNotFoundError:
            return None

    def locate(self, key: int) -> Chunk | None:
        """Where key's bytes are, or None if it is absent. CorruptChunk if the index contradicts the file."""
        shard, minishard = self.spec.shard_and_minishard(key)
        try:
            opened, entry = self.opened(shard, minishard, key)
        except FileNotFoundError:
            return None  # a missing shard holds no keys
        found = self.minishard(opened, minishard, entry, key).find(key)
        if found is None:
            return None
        start, stop = found
        file = opened.file
        if not start <= stop <= file.size:
            raise CorruptChunk(file.path, key, f"data range [{start}, {stop}) lies outside the file")
        return Chunk(file, key, start, stop)

    def minishard(self, opened: OpenShard, minishard: int, entry: tuple[int, int], key: object = "?") -> MinishardIndex:
        """One minishard's index, whose shard index entry is entry, cached under its shard's version."""
        make = lambda: self._read_minishard(opened, minishard, key, entry)  # noqa: E731
        return self.cache.get_or_make(("minishard", opened.file.path, opened.file.version, minishard), make)

    def _read_minishard(self, opened: OpenShard, minishard: int, key: object, entry: tuple[int, int]) -> MinishardIndex:
        file = opened.file
        index_size = self._index_size(file, key)
        start, stop = entry[0] + index_size, entry[1] + index_size
        if not start <= stop <= file.size:
            why = f"minishard {minishard} index range [{start}, {stop}) lies outside the file"
            raise CorruptChunk(file.path, key, why)
        if start == stop:
            return EMPTY
        try:
            return MinishardIndex.decode(self._minishard_bytes(opened, start, stop), index_size)
        except ValueError as e:
            raise CorruptChunk(file.path, key, f"minishard {minishard} index: {e}") from e

    def _minishard_bytes(self, opened: OpenShard, start: int, stop: int) -> bytes:
        """A minishard index's decoded bytes: cut from its shard's batch where it has one (all its minishard
        indexes, read by the first of them wanted, and kept in the cache), else read alone."""
        encoding, file = self.spec.minishard_index_encoding, opened.file
        if opened.batch is None or not opened.batch[0] <= start <= stop <= opened.batch[1]:
            return self._read_encoded(file, start, stop, encoding, MINISHARD_INDEX_LIMIT)
        first, last = opened.batch
        batch = self.cache.get_or_make(("minishards", file.path, file.version), lambda: file.read(first, last))
        raw = batch[start - first : stop - first]
        return gunzip(raw, MINISHARD_INDEX_LIMIT) if encoding == "gzip" else raw

    def _index_size(self, file: StoredFile, key: object) -> int:
        size = self.spec.shard_index_size
        if file.size < size:
            raise CorruptChunk(file.path, key, f"file is {file.size} bytes, shorter than its {size}-byte shard index")
        return size

    def _read_encoded(self, file: StoredFile, start: int, stop: int, encoding: str, limit: int) -> bytes:
        """Read and decode a stored range (`raw` or `gzip`), the output bounded by limit (ValueError past
        it); a range longer than its decoded limit is refused unread."""
        if stop - start > limit + 1024:
            raise OverLimit(f"{stop - start} stored bytes exceed the {limit}-byte limit", limit, stop - start)
        if encoding == "gzip":  # a large value is read as it is decoded, so as not to be held twice
            small = stop - start <= self.store.piece_size
            return gunzip(file.read(start, stop) if small else file.pieces(start, stop), limit)
        return file.read(start, stop)

    def value(self, chunk: Chunk) -> bytes:
        """The stored value with `data_encoding` undone."""
        try:
            return self._read_encoded(chunk.file, chunk.start, chunk.stop, self.spec.data_encoding, self.value_limit)
        except ValueError as e:
            raise CorruptChunk(chunk.shard, chunk.key, str(e)) from e

    def shards(self) -> Iterator[tuple[int, str]]:
        """Each shard present, once, with what it is called (its `.shard`, or its pair), in the order of their
        numbers: a directory lists in one order whatever the store (a local directory's own order, a bucket's
        by key, HTTP's probes by number), so `ls -f`, rsync and tar see the same tree from each."""
        if not self.store.can_list:
            yield from self._probed()
            return
        named = (self.spec.shard_file(name) for name, is_dir in self.store.list(self.directory) if not is_dir)
        for found in sorted(found for found in named if found is not None):
            if self._listed_by(*found):
                yield found[0], self._called(*found)

    def _listed_by(self, shard: int, suffix: str) -> bool:
        """Whether a shard is listed by its file of this suffix: the first of SUFFIXES present is the one."""
        earlier = SUFFIXES[: SUFFIXES.index(suffix)]
        return not any(self._present(self.shard_path(shard, s)) for s in earlier)

    def _called(self, shard: int, suffix: str) -> str:
        return self.shard_path(shard) if suffix == "shard" else self.pair_path(shard)

    def _probed(self) -> Iterator[tuple[int, str]]:
        """Where the store cannot list (HTTP), the shards the spec names, each asked for (HEAD, a few at a
        time)."""
        with ThreadPoolExecutor(PROBES_AT_ONCE) as pool:
            yield from (found for found in pool.map(self._probe, self._to_probe()) if found is not None)

    def _to_probe(self) -> range:
        """Every shard the spec names, up to PROBED_SHARDS of them: past that a listing shows nothing, and
        says so."""
        count = 1 << self.spec.shard_bits
        if count > PROBED_SHARDS:
            log.warning("%s: %d shards to probe, more than %d: not listed", self.store.where(self.directory),
                        count, PROBED_SHARDS)  # fmt: skip
            return range(0)
        return range(count)

    def _probe(self, shard: int) -> tuple[int, str] | None:
        """A shard by its `.shard`, else by its `.index` (a lone `.data` is found only when a key is read)."""
        for suffix in SUFFIXES[:2]:
            if self._present(self.shard_path(shard, suffix)):
                return shard, self._called(shard, suffix)
        return None

    def _present(self, path: str) -> bool:
        """Whether a shard's file is there to be listed; one the server fails to answer for is logged and
        counted absent, so that the others still list."""
        try:
            return self._opened(path) is not None  # opened, not asked its kind: no listing request for a prefix
        except OSError as e:
            _skipped(path, e)
            return False

    def minishards(self, shard: int) -> Iterator[tuple[int, MinishardIndex | CorruptChunk]]:
        """Each non-empty minishard of one shard with its index, or the CorruptChunk that keeps it from being
        read (`shardfs check` reports those), one at a time. CorruptChunk for a shard index that cannot be
        read; OSError for a read that fails."""
        for read in self._reads(self.opened(shard)[0]):
            if read.call is not None:
                _, minishard, index = read.call()
                if not isinstance(index, CorruptChunk | MinishardIndex):
                    raise index
                yield minishard, index

    def _reads(self, opened: OpenShard) -> Iterator[Read]:
        """The reads that get a shard's minishard indexes, in order. The shard index came whole with its
        opening, or is read here in blocks, only where the file holds data (a sparse file's holes are empty
        minishards), so the work is bounded by the bytes stored, not by `minishard_bits`. Each block is a cost
        taken before it is read, each minishard index one taken before its call runs, and at least
        LISTING_READ (a request's worth). CorruptChunk if the file is shorter than its shard index."""
        file = opened.file
        index_size = self._index_size(file, "?")
        if opened.index is not None:
            yield Read(index_size, None, file.path)
            yield from self._row_reads(opened, 0, opened.index)
            return
        block = 0
        while (block := file.next_data(block) // 16 * 16) < index_size:
            stop = min(block + LISTING_BLOCK, index_size)
            yield Read(stop - block, None, file.path)
            yield from self._row_reads(opened, block // 16, np.frombuffer(file.read(block, stop), "<u8").reshape(-1, 2))
            block = stop

    def _row_reads(self, opened: OpenShard, first: int, rows: np.ndarray) -> Iterator[Read]:
        stored = opened.file.size - self.spec.shard_index_size
        for i in np.flatnonzero(rows[:, 1] != rows[:, 0]).tolist():
            start, end = rows[i].tolist()
            # what is read (or refused after the limit), and at least one request's worth; nothing if corrupt
            cost = max(min(end - start, MINISHARD_INDEX_LIMIT + 1024), LISTING_READ) if start <= end <= stored else 0
            yield Read(cost, partial(self._listed_minishard, opened, first + i, (start, end)), opened.file.path)

    def _listed_minishard(
        self, opened: OpenShard, minishard: int, entry: tuple[int, int]
    ) -> tuple[OpenShard, int, MinishardIndex | Exception]:
        """A minishard's index, or what kept it from being read, for a listing to skip."""
        try:
            return opened, minishard, self.minishard(opened, minishard, entry)
        except (CorruptChunk, OSError) as e:
            return opened, minishard, e

    def stored_keys(self) -> Iterator[int]:
        """Every stored key, shard by shard, in one order however often listed. Up to the store's
        `reads_at_once` shards are opened, and minishard indexes read, at once, ahead of the names
        yielded, within one listing's budget of index bytes. Keys that do not hash to where they were found
        are left out, so that every listed name can be looked up. Corrupt or unreadable shards are logged
        and skipped, and so is what is past the budget: a listing shows what can be read."""
        budget = ListingBudget()
        pool = self.store.reads()
        at_once = self.store.reads_at_once if pool is not None else 1
        try:
            opening = (Read(0, partial(self._listed_shard, shard), self.directory) for shard in self._listed())
            shards = _in_order(pool, at_once, opening, budget)
            failed: set[str] = set()
            for opened, minishard, index in _in_order(pool, at_once, self._listing_reads(shards), budget):
                yield from self._keys_in(opened, minishard, index, budget, failed)
        except BudgetSpent as e:
            if not self._budget_said:
                self._budget_said = True
                log.warning("%s: a listing reads at most %d bytes of index without listing a name, and the %d-byte "
                            "shard index of %s is past them: the names from there on are not listed (each is "
                            "still found by name)", self.store.where(self.directory), LISTING_BUDGET,
                            self.spec.shard_index_size, self.store.where(e.shard),
                            extra={"event": "listing_budget", "shard": e.shard})  # fmt: skip

    def _listed(self) -> Iterator[int]:
        """The shards a listing opens: those the directory lists, or where it cannot be listed (HTTP) every
        one the spec names, up to PROBED_SHARDS of them (an absent one lists nothing)."""
        if self.store.can_list:
            return (shard for shard, _ in self.shards())
        return iter(self._to_probe())

    def _listed_shard(self, shard: int) -> OpenShard | None:
        """A shard opened for a listing; None if it is absent, or logged and None if it cannot be read."""
        try:
            return self.opened(shard)[0]
        except FileNotFoundError:
            return None
        except CorruptChunk as e:
            log.error("listing skips a shard: %s", e, extra=e.log_fields("listing_skip"))
        except OSError as e:  # unreadable (EACCES, EIO from the disk or the server, changed under the mount)
            _skipped(self.shard_path(shard), e)
        return None

    def _listing_reads(self, shards: Iterator[OpenShard | None]) -> Iterator[Read]:
        for opened in shards:
            if opened is None:
                continue
            try:
                yield from self._reads(opened)
            except CorruptChunk as e:
                log.error("listing skips a shard: %s", e, extra=e.log_fields("listing_skip"))
            except FileNotFoundError:
                pass  # removed since it was listed
            except OSError as e:
                _skipped(opened.file.path, e)

    def _keys_in(
        self, opened: OpenShard, minishard: int, index: MinishardIndex | Exception, budget: ListingBudget, failed: set
    ) -> Iterator[int]:
        """The keys of one minishard that hash to it; each gives back LISTING_READ of the budget. After a read
        of a shard fails, the rest of it is skipped, said once."""
        path = opened.file.path
        if path in failed:
            return
        if isinstance(index, CorruptChunk):
            log.error("listing skips part of a shard: %s", index, extra=index.log_fields("listing_skip"))
            return
        if isinstance(index, Exception):
            failed.add(path)
            if not isinstance(index, FileNotFoundError):  # else removed since it was listed
                _skipped(path, index)  # type: ignore[arg-type]
            return
        listed = 0
        for key in index:
            if self.spec.shard_and_minishard(key) == (opened.shard, minishard):
                listed += 1
                yield key
        budget.refund(LISTING_READ * listed)


def _in_order(pool: Executor | None, at_once: int, reads: Iterator[Read], budget: ListingBudget) -> Iterator[T]:
    """The calls of reads run in pool, up to at_once at a time, their results yielded in the order of reads
    (in this thread, one by one, without a pool). Each read's cost is taken from budget before its call is
    submitted, once the results before it have been yielded if it does not fit (their names give back): a
    listing stops where one reading one index at a time would (BudgetSpent)."""
    pending: deque[Future[T]] = deque()
    try:
        for read in reads:
            while pending and (len(pending) >= at_once or read.cost > budget.left):
                yield pending.popleft().result()
            budget.spend(read.cost, read.shard)
            if read.call is None:
                continue
            if pool is None:
                yield read.call()  # type: ignore[misc]
            else:
                pending.append(pool.submit(read.call))  # type: ignore[arg-type]
        while pending:
            yield pending.popleft().result()
    finally:  # a listing ended early: what is being read finishes, the rest is not read (the pool is shared)
        for future in pending:
            future.cancel()


def _adjacent(rows: np.ndarray, index_size: int, size: int) -> tuple[int, int] | None:
    """Where in the file a shard index's non-empty rows are, [start, stop), if they follow one another with no
    gap (in any order), inside the file and within MINISHARD_BATCH bytes; else None."""
    used = rows[rows[:, 1] != rows[:, 0]]
    if len(used) < 2 or (used[:, 0] > used[:, 1]).any():
        return None
    used = used[np.argsort(used[:, 0], kind="stable")]
    if (used[1:, 0] != used[:-1, 1]).any():
        return None
    start, stop = int(used[0, 0]) + index_size, int(used[-1, 1]) + index_size
    return (start, stop) if stop - start <= MINISHARD_BATCH and stop <= size else None


def _skipped(path: str, e: OSError) -> None:
    log.warning("listing skips a shard: %s", e, extra={"event": "listing_skip", "shard": path})
