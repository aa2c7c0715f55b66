"""`neuroglancer_uint64_sharded_v1`: which shard and minishard hold a key, and where its bytes are.

Everything read from a shard is untrusted: offsets and sizes are checked against the file's real
size before anything is read or allocated, and a contradiction raises `CorruptChunk` for that key
alone.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import re
import struct
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property

import mmh3
import numpy as np

from shardfs.cache import ByteCache
from shardfs.codecs import gunzip
from shardfs.errors import CorruptChunk, OverLimit, SourceError
from shardfs.stores.local import JoinedFile, Store, StoredFile

log = logging.getLogger("shardfs")

UINT64_MAX = (1 << 64) - 1
LISTING_BLOCK = 1 << 20  # bytes of shard index read at a time while listing
LISTING_BUDGET = 64 << 20  # index bytes a listing may read without listing a name (see ListingBudget)
LISTING_READ = 4 << 10  # the least a minishard index read costs it, and what a name listed gives back
PROBED_SHARDS = 4096  # the most shard names asked for, one by one, to list a directory that cannot be listed
PROBES_AT_ONCE = 16
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
    """The decoded index of one minishard: key -> absolute [start, stop) of its bytes, in stored order.

    The sums are numpy's (uint64, wrapping as the spec's do); the result is a dict, because a
    minishard is decoded once and then probed by key, and inside FUSE callbacks each numpy call
    costs microseconds where a dict probe costs a tenth of one.
    """

    entries: dict[int, tuple[int, int]]

    # Approximate bytes per entry (dict slot, tuple, three ints), so the cache budget holds.
    ENTRY_BYTES = 200

    @classmethod
    def decode(cls, raw: bytes, shard_index_size: int) -> MinishardIndex:
        if len(raw) % 24:
            raise ValueError(f"minishard index is {len(raw)} bytes, not a multiple of 24")
        ids, offsets, sizes = np.frombuffer(raw, "<u8").reshape(3, -1)
        keys = np.cumsum(ids, dtype=np.uint64)
        # Each start is relative to the end of the previous chunk, so each stop is a running sum.
        stops = np.cumsum(offsets + sizes, dtype=np.uint64) + np.uint64(shard_index_size)
        starts = stops - sizes
        return cls(dict(zip(keys.tolist(), zip(starts.tolist(), stops.tolist(), strict=True), strict=True)))

    @property
    def nbytes(self) -> int:
        return len(self.entries) * self.ENTRY_BYTES

    def find(self, key: int) -> tuple[int, int] | None:
        """The stored [start, stop) of key, or None if it is absent."""
        return self.entries.get(key)


EMPTY = MinishardIndex({})


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
        with one half missing, or whose `.index` is not exactly the shard index."""
        with contextlib.suppress(FileNotFoundError):
            return self.store.open(self.shard_path(shard))
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
            file = self.open(shard, key)
        except FileNotFoundError:
            return None  # a missing shard holds no keys
        found = self.minishard(file, minishard, key).find(key)
        if found is None:
            return None
        start, stop = found
        if not start <= stop <= file.size:
            raise CorruptChunk(file.path, key, f"data range [{start}, {stop}) lies outside the file")
        return Chunk(file, key, start, stop)

    def minishard(
        self, file: StoredFile, minishard: int, key: object = "?", entry: tuple[int, int] | None = None
    ) -> MinishardIndex:
        """entry: its shard index entry, if already read (a listing has the block): no request for it."""
        make = lambda: self._read_minishard(file, minishard, key, entry)  # noqa: E731
        return self.cache.get_or_make(("minishard", file.path, file.version, minishard), make)

    def _read_minishard(
        self, file: StoredFile, minishard: int, key: object, entry: tuple[int, int] | None
    ) -> MinishardIndex:
        index_size = self._index_size(file, key)
        if entry is None:
            entry = struct.unpack("<QQ", file.read(16 * minishard, 16 * minishard + 16))
        start, stop = entry[0] + index_size, entry[1] + index_size
        if not start <= stop <= file.size:
            why = f"minishard {minishard} index range [{start}, {stop}) lies outside the file"
            raise CorruptChunk(file.path, key, why)
        if start == stop:
            return EMPTY
        try:
            raw = self._read_encoded(file, start, stop, self.spec.minishard_index_encoding, MINISHARD_INDEX_LIMIT)
            return MinishardIndex.decode(raw, index_size)
        except ValueError as e:
            raise CorruptChunk(file.path, key, f"minishard {minishard} index: {e}") from e

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
        """Each shard present, once, with what it is called (its `.shard`, or its pair), streamed from the
        directory."""
        if not self.store.can_list:
            yield from self._probed()
            return
        for name, is_dir in self.store.list(self.directory):
            found = None if is_dir else self.spec.shard_file(name)
            if found is not None and self._listed_by(*found):
                yield found[0], self._called(*found)

    def _listed_by(self, shard: int, suffix: str) -> bool:
        """Whether a shard is listed by its file of this suffix: the first of SUFFIXES present is the one."""
        earlier = SUFFIXES[: SUFFIXES.index(suffix)]
        return not any(self._present(self.shard_path(shard, s)) for s in earlier)

    def _called(self, shard: int, suffix: str) -> str:
        return self.shard_path(shard) if suffix == "shard" else self.pair_path(shard)

    def _probed(self) -> Iterator[tuple[int, str]]:
        """Where the store cannot list (HTTP), the shards the spec names, each asked for (HEAD, a few at a
        time). Up to PROBED_SHARDS of them: past that a listing shows nothing, and says so once."""
        count = 1 << self.spec.shard_bits
        if count > PROBED_SHARDS:
            log.warning("%s: %d shards to probe, more than %d: not listed", self.store.where(self.directory),
                        count, PROBED_SHARDS)  # fmt: skip
            return
        with ThreadPoolExecutor(PROBES_AT_ONCE) as pool:
            yield from (found for found in pool.map(self._probe, range(count)) if found is not None)

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

    def minishards(
        self, file: StoredFile, budget: ListingBudget | None = None
    ) -> Iterator[tuple[int, MinishardIndex | CorruptChunk]]:
        """Each non-empty minishard of one shard file with its index, or the CorruptChunk that keeps it from
        being read: listing skips those, `shardfs check` reports them. The shard index is read in blocks,
        only where the file holds data (a sparse file's holes are empty minishards), so the work is
        bounded by the bytes stored, not by `minishard_bits`; a listing's budget, if given, is spent before
        each block and each minishard index is read (BudgetSpent when it runs out). A file shorter than its
        shard index raises CorruptChunk."""
        index_size = self._index_size(file, "?")
        block = 0
        while (block := file.next_data(block) // 16 * 16) < index_size:
            stop = min(block + LISTING_BLOCK, index_size)
            if budget is not None:
                budget.spend(stop - block, file.path)
            entries = np.frombuffer(file.read(block, stop), "<u8").reshape(-1, 2)
            for i in np.flatnonzero(entries[:, 1] != entries[:, 0]).tolist():
                start, end = entries[i].tolist()
                if budget is not None and start <= end <= file.size - index_size:  # else corrupt, and not read
                    # what is read (or refused after the limit), and at least one request's worth
                    budget.spend(max(min(end - start, MINISHARD_INDEX_LIMIT + 1024), LISTING_READ), file.path)
                try:
                    index: MinishardIndex | CorruptChunk = self.minishard(file, block // 16 + i, entry=(start, end))
                except CorruptChunk as e:
                    index = e
                yield block // 16 + i, index
            block = stop

    def stored_keys(self) -> Iterator[int]:
        """Every stored key, shard by shard, holding one minishard index at a time, within one listing's
        budget of index bytes. Keys that do not hash to where they were found are left out, so that every
        listed name can be looked up. Corrupt or unreadable shards are logged and skipped, and so is what
        is past the budget: a listing shows what can be read."""
        budget = ListingBudget()
        try:
            for shard, path in self.shards():
                yield from self._keys_in(shard, path, budget)
        except BudgetSpent as e:
            if not self._budget_said:
                self._budget_said = True
                log.warning("%s: a listing reads at most %d bytes of index without listing a name, and the %d-byte "
                            "shard index of %s is past them: the names from there on are not listed (each is "
                            "still found by name)", self.store.where(self.directory), LISTING_BUDGET,
                            self.spec.shard_index_size, self.store.where(e.shard),
                            extra={"event": "listing_budget", "shard": e.shard})  # fmt: skip

    def _keys_in(self, shard: int, path: str, budget: ListingBudget) -> Iterator[int]:
        try:
            file = self.open(shard)
            for minishard, index in self.minishards(file, budget):
                if isinstance(index, CorruptChunk):
                    log.error("listing skips part of a shard: %s", index, extra=index.log_fields("listing_skip"))
                    continue
                listed = 0
                for key in index.entries:
                    if self.spec.shard_and_minishard(key) == (shard, minishard):
                        listed += 1
                        yield key
                budget.refund(LISTING_READ * listed)
        except CorruptChunk as e:
            log.error("listing skips a shard: %s", e, extra=e.log_fields("listing_skip"))
        except FileNotFoundError:
            pass  # removed since it was listed
        except OSError as e:  # unreadable (EACCES, EIO from the disk or the server, changed under the mount)
            _skipped(path, e)


def _skipped(path: str, e: OSError) -> None:
    log.warning("listing skips a shard: %s", e, extra={"event": "listing_skip", "shard": path})
