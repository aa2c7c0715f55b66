"""Neuroglancer precomputed sharded directories read through a store: a key's bytes, every stored key
within a listing's budget, the shards present, and a check of one shard (see `kv.py`). The index maths is
`neuroglancer.py`'s; this module decides what is read, when, and what is kept."""

from __future__ import annotations

import errno
import logging
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial

import numpy as np

from shardfs.cache import ByteCache
from shardfs.codecs import gunzip
from shardfs.errors import CorruptChunk, OverLimit
from shardfs.request import OWN, Request
from shardfs.shards.kv import Extent, HeldChunks, ShardedKV, ShardFile, ShardReport, skipped
from shardfs.shards.listing import (
    LISTING_BLOCK,
    LISTING_BUDGET,
    LISTING_READ,
    BudgetSpent,
    ListingBudget,
    Read,
    in_order,
)
from shardfs.shards.neuroglancer import (
    EMPTY,
    MINISHARD_INDEX_LIMIT,
    SUFFIXES,
    MinishardIndex,
    ShardingSpec,
    adjacent,
    preceding_ends,
    span_start,
)
from shardfs.stores.protocol import JoinedFile, Range, Store, StoredFile

log = logging.getLogger("shardfs")

SHARD_INDEX_READ = 64 << 10  # a shard index up to this size (minishard_bits <= 12) comes whole with its shard's opening
# A key's minishard index is read with the bytes before it, back to the index before, in one request (in
# tensorstore's layout, the minishard's chunks: a cold chunk then costs one round trip, not two in sequence),
# where the store's reads wait on a network, those bytes are at most WHOLE_MINISHARD_BYTES, and the minishards
# decoded so far in the directory hold at most WHOLE_MINISHARD_CHUNKS chunks on average: a random read then
# fetches about that many times the bytes it serves, never more than that many bytes.
WHOLE_MINISHARD_BYTES = 1 << 20
WHOLE_MINISHARD_CHUNKS = 8


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
    ends: np.ndarray | None = None  # where each minishard index ends (preceding_ends), with a whole index

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.index, self.ends) if a is not None)


class NeuroglancerKV(ShardedKV):
    """A `neuroglancer_uint64_sharded_v1` directory, with its minishard indexes in the shared cache, each under
    the version of the shard it was read from."""

    def __init__(self, store: Store, directory: str, spec: ShardingSpec, cache: ByteCache) -> None:
        super().__init__(store, directory, cache)
        self.spec = spec
        # The largest decoded value: one file's cap, unless the format knows better (volumes do).
        self.value_limit = cache.max_value
        self._budget_said = False  # whether a listing's running out of budget was logged (once a directory)
        self._decoded = [0, 0]  # minishard indexes decoded in this directory, and their chunks (racy counts)

    def shard_path(self, shard: int, suffix: str = "shard") -> str:
        return self.path(self.spec.shard_name(shard, suffix))

    def pair_path(self, shard: int) -> str:
        """What a shard stored as `<n>.index` + `<n>.data` is called in messages."""
        return f"{self.shard_path(shard, 'index')}+{self.spec.shard_name(shard, 'data')}"

    def open_shard(
        self, shard: int, minishard: int = 0, key: object = "?", request: Request = OWN
    ) -> tuple[OpenShard, tuple[int, int]]:
        """The shard, opened once (kept in the cache) by the read of its shard index, or of minishard's entry
        where the index is too large to read whole; and minishard's entry. A remote store learns the shard's
        version from that read's answer: no request goes first to ask it. The shard's bytes are its
        `<n>.shard`, else the pair `<n>.index` + `<n>.data` read as one file, which is what a `.shard` is.
        FileNotFoundError if neither is there; CorruptChunk (naming the file) for a pair with one half missing,
        or whose `.index` is not exactly the shard index, or a file shorter than its shard index."""
        first: list[tuple[int, int]] = []

        def make() -> OpenShard:
            index_size = self.spec.shard_index_size
            whole = index_size <= SHARD_INDEX_READ
            start, stop = (0, index_size) if whole else (16 * minishard, 16 * minishard + 16)
            file, raw = self._shard_bytes(shard, key, start, stop, request)
            if len(raw) != stop - start:  # shorter than its shard index: CorruptChunk below, for every key
                return OpenShard(shard, file, None, None)
            rows = np.frombuffer(raw, "<u8").reshape(-1, 2)
            if not whole:
                first.append(tuple(rows[0].tolist()))
                return OpenShard(shard, file, None, None)
            return OpenShard(shard, file, rows, adjacent(rows, index_size, file.size), preceding_ends(rows))

        opened = self.cache.get_or_make(self.opened_cache_key(shard), make)
        self._index_size(opened.file, key)
        if opened.index is not None:
            return opened, tuple(opened.index[minishard].tolist())
        if first:
            return opened, first[0]
        return opened, struct.unpack("<QQ", opened.file.read(16 * minishard, 16 * minishard + 16, request))

    def _shard_bytes(
        self, shard: int, key: object, start: int, stop: int, request: Request
    ) -> tuple[StoredFile, bytes]:  # fmt: skip
        """The shard's file and its bytes [start, stop) (fewer where it ends sooner)."""
        try:
            return self.open_reading(self.shard_path(shard), Range(start, stop - start), request)
        except FileNotFoundError:
            pass
        file = self._pair(shard, key)
        return file, file.read(start, min(stop, file.size), request)

    def _pair(self, shard: int, key: object) -> JoinedFile:
        """The earlier layout's `<n>.index` + `<n>.data`, read as one file."""
        index, data = (self._file_or_none(self.shard_path(shard, suffix)) for suffix in ("index", "data"))
        if index is None and data is None:
            raise FileNotFoundError(errno.ENOENT, "no shard file", self.store.where(self.shard_path(shard)))
        if index is None or data is None:
            missing = self.shard_path(shard, "index" if index is None else "data")
            raise CorruptChunk(self.pair_path(shard), key, f"{missing} is missing, and the other half is there")
        if index.size != self.spec.shard_index_size:
            why = f"{index.path} is {index.size} bytes, not the {self.spec.shard_index_size}-byte shard index"
            raise CorruptChunk(self.pair_path(shard), key, why)
        return JoinedFile.of(self.pair_path(shard), index, data)

    def _file_or_none(self, path: str) -> StoredFile | None:
        try:
            return self.open_file(path)
        except FileNotFoundError:
            return None

    def locate(self, key: int, request: Request = OWN) -> Extent | None:  # type: ignore[override]
        shard, minishard = self.spec.shard_and_minishard(key)
        try:
            opened, entry = self.open_shard(shard, minishard, key, request)
        except FileNotFoundError:
            return None  # a missing shard holds no keys
        found = self.minishard(opened, minishard, entry, key, whole=True, request=request).find(key)
        if found is None:
            return None
        start, stop = found
        file = opened.file
        if not start <= stop <= file.size:
            raise CorruptChunk(file.path, key, f"data range [{start}, {stop}) lies outside the file")
        return Extent(file, key, start, stop)

    def minishard(
        self, opened: OpenShard, minishard: int, entry: tuple[int, int], key: object = "?", whole: bool = False,
        request: Request = OWN,
    ) -> MinishardIndex:  # fmt: skip
        """One minishard's index, whose shard index entry is entry, cached under its shard's version. whole: a
        key's read, which may have the minishard's chunks come with the index (see WHOLE_MINISHARD_BYTES); a
        listing reads indexes alone."""
        make = lambda: self._read_minishard(opened, minishard, key, entry, whole, request)  # noqa: E731
        return self.cache.get_or_make(self.cache_key("minishard", opened.file, minishard), make)

    def _read_minishard(
        self, opened: OpenShard, minishard: int, key: object, entry: tuple[int, int], whole: bool, request: Request
    ) -> MinishardIndex:  # fmt: skip
        file = opened.file
        index_size = self._index_size(file, key)
        start, stop = entry[0] + index_size, entry[1] + index_size
        if not start <= stop <= file.size:
            why = f"minishard {minishard} index range [{start}, {stop}) lies outside the file"
            raise CorruptChunk(file.path, key, why)
        if start == stop:
            return EMPTY
        first = self._chunks_start(opened, start, stop) if whole else None
        try:
            if first is None:
                index = MinishardIndex.decode(self._minishard_bytes(opened, start, stop, request), index_size)
            else:
                raw = file.read(first, stop, request)
                index = MinishardIndex.decode(self._decode_index(raw[start - first :], request), index_size)
                if len(index.keys) and min(index.starts) >= first and max(index.stops) <= start:
                    held = HeldChunks(first, raw[: start - first])
                    self.cache.get_or_make(self.cache_key("chunks", file, minishard), lambda: held)
        except ValueError as e:
            raise CorruptChunk(file.path, key, f"minishard {minishard} index: {e}") from e
        self._decoded[0] += 1
        self._decoded[1] += len(index.keys)
        return index

    def _chunks_start(self, opened: OpenShard, start: int, stop: int) -> int | None:
        """Where the bytes to read with a minishard index [start, stop) begin (see WHOLE_MINISHARD_BYTES), or None
        to read the index alone: a local store, a shard index not read whole, indexes batched (cloud-volume's
        layout, where they lie together at the end), nothing before it, too many bytes, or minishards that
        hold too many chunks so far (none decoded yet: the first is read alone, and counted)."""
        if not self.round_trips or opened.ends is None or not self._decoded[0]:
            return None
        if opened.batch is not None and opened.batch[0] <= start <= stop <= opened.batch[1]:
            return None
        if self._decoded[1] > WHOLE_MINISHARD_CHUNKS * self._decoded[0]:
            return None
        index_size = self.spec.shard_index_size
        first = span_start(opened.ends, start - index_size) + index_size
        return first if first < start and stop - first <= WHOLE_MINISHARD_BYTES else None

    def _minishard_bytes(self, opened: OpenShard, start: int, stop: int, request: Request = OWN) -> bytes:
        """A minishard index's decoded bytes: cut from its shard's batch where it has one (all its minishard
        indexes, read by the first of them wanted, and kept in the cache), else read alone."""
        file = opened.file
        if opened.batch is None or not opened.batch[0] <= start <= stop <= opened.batch[1]:
            encoding = self.spec.minishard_index_encoding
            return self._read_encoded(file, start, stop, encoding, MINISHARD_INDEX_LIMIT, request=request)
        first, last = opened.batch
        batch = self.cache.get_or_make(self.cache_key("minishards", file), lambda: file.read(first, last, request))
        return self._decode_index(batch[start - first : stop - first], request)

    def _decode_index(self, raw: bytes, request: Request = OWN) -> bytes:
        """A minishard index's stored bytes with its encoding undone."""
        if self.spec.minishard_index_encoding != "gzip":
            return raw
        return gunzip(raw, MINISHARD_INDEX_LIMIT, request, self.cache)

    def _index_size(self, file: StoredFile, key: object) -> int:
        size = self.spec.shard_index_size
        if file.size < size:
            raise CorruptChunk(file.path, key, f"file is {file.size} bytes, shorter than its {size}-byte shard index")
        return size

    def _read_encoded(
        self, file: StoredFile, start: int, stop: int, encoding: str, limit: int, held: bytes | None = None,
        request: Request = OWN,
    ) -> bytes:  # fmt: skip
        """Read and decode a stored range (`raw` or `gzip`), the output bounded by limit (ValueError past
        it); a range longer than its decoded limit is refused unread. held: its bytes, if read already."""
        if stop - start > limit + 1024:
            raise OverLimit(f"{stop - start} stored bytes exceed the {limit}-byte limit", limit, stop - start)
        if held is not None:
            return gunzip(held, limit, request, self.cache) if encoding == "gzip" else held
        if encoding == "gzip":  # a large value is read as it is decoded, so as not to be held twice
            small = stop - start <= self.store.piece_size
            data = file.read(start, stop, request) if small else file.pieces(start, stop, request)
            return gunzip(data, limit, request, self.cache)
        return file.read(start, stop, request)

    def value(self, chunk: Extent, request: Request = OWN) -> bytes:
        """The stored value with `data_encoding` undone."""
        try:
            return self._read_encoded(
                chunk.file, chunk.start, chunk.stop, self.spec.data_encoding, self.value_limit, self.held(chunk),
                request,
            )  # fmt: skip
        except ValueError as e:
            raise CorruptChunk(chunk.shard, chunk.key, str(e)) from e

    def held(self, chunk: Extent) -> bytes | None:
        """The chunk's stored bytes, if they were fetched ahead or came with its minishard's index, and are still
        kept (only ever over a network)."""
        if not self.round_trips or not isinstance(chunk.key, int):
            return None
        found = self.cache.get(self.cache_key("chunks", chunk.file, self.index_of(chunk.key)[1]), wait=True)
        return found.cut(chunk.start, chunk.stop) if isinstance(found, HeldChunks) else super().held(chunk)

    def index_of(self, key: object) -> tuple[int, int]:
        """A key's shard and minishard: the minishard index locates it."""
        return self.spec.shard_and_minishard(int(key))  # type: ignore[call-overload]

    def shards(self) -> Iterator[ShardFile]:
        """Each shard present, once, called by its `.shard`, or its pair, in the order of their numbers: a
        directory lists in one order whatever the store (a local directory's own order, a bucket's by key,
        HTTP's probes by number), so `ls -f`, rsync and tar see the same tree from each."""
        if not self.store.can_list:
            yield from self._probed()
            return
        named = (self.spec.shard_file(name) for name, is_dir in self.list_dir(self.directory) if not is_dir)
        for found in sorted(found for found in named if found is not None):
            if self._listed_by(*found):
                yield self._called(*found)

    def _listed_by(self, shard: int, suffix: str) -> bool:
        """Whether a shard is listed by its file of this suffix: the first of SUFFIXES present is the one."""
        earlier = SUFFIXES[: SUFFIXES.index(suffix)]
        return not any(self._present(self.shard_path(shard, s)) for s in earlier)

    def _called(self, shard: int, suffix: str) -> ShardFile:
        return ShardFile(self.shard_path(shard) if suffix == "shard" else self.pair_path(shard), shard)

    def _probed(self) -> Iterator[ShardFile]:
        """Where the store cannot list (HTTP), the shards the spec names, each asked for (HEAD, a few at a
        time)."""
        yield from self.probed(self._to_probe(), self._probe)

    def _to_probe(self) -> range:
        """Every shard the spec names, up to PROBED_SHARDS of them: past that a listing shows nothing, and
        says so."""
        count = 1 << self.spec.shard_bits
        return range(count) if self.probeable(count) else range(0)

    def _probe(self, shard: int) -> ShardFile | None:
        """A shard by its `.shard`, else by its `.index` (a lone `.data` is found only when a key is read)."""
        for suffix in SUFFIXES[:2]:
            if self._present(self.shard_path(shard, suffix)):
                return self._called(shard, suffix)
        return None

    def _present(self, path: str) -> bool:
        """Whether a shard's file is there to be listed; one the server fails to answer for is logged and
        counted absent, so that the others still list."""
        try:
            return self._file_or_none(path) is not None  # opened, not asked its kind: no listing request for a prefix
        except OSError as e:
            skipped(path, e)
            return False

    def verify(self, shard: ShardFile) -> ShardReport:
        """Every non-empty minishard index is decoded; each key must hash to where it is stored (else no read
        finds it) and its bytes must lie inside the file (else its read is EIO). A pair of `.index` + `.data`
        that cannot be read as one file is a problem of its own."""
        report = ShardReport()
        try:
            opened = self.open_shard(shard.at)[0]  # type: ignore[arg-type]
            for minishard, index in self._minishards(opened):
                if isinstance(index, CorruptChunk):
                    report.add(index.reason)
                    continue
                for key, (start, stop) in index.items():
                    if (home := self.spec.shard_and_minishard(key)) != (opened.shard, minishard):
                        report.add(
                            f"chunk {key} is in minishard {minishard}, but its hash puts it in minishard {home[1]} of"
                            f" shard {home[0]}"
                        )
                    elif not start <= stop <= opened.file.size:
                        report.add(f"chunk {key} data range [{start}, {stop}) lies outside the file")
                    else:
                        report.chunks += 1
        except CorruptChunk as e:  # the shard index itself, or a pair
            report.add(e.reason)
        return report

    def _minishards(self, opened: OpenShard) -> Iterator[tuple[int, MinishardIndex | CorruptChunk]]:
        """Each non-empty minishard of one shard with its index, or the CorruptChunk that keeps it from being
        read, one at a time. CorruptChunk for a shard index that cannot be read; OSError for a read that
        fails."""
        for read in self._reads(opened):
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
            shards = in_order(pool, at_once, opening, budget)
            failed: set[str] = set()
            for opened, minishard, index in in_order(pool, at_once, self._listing_reads(shards), budget):
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
            return (shard.at for shard in self.shards())  # type: ignore[misc]
        return iter(self._to_probe())

    def _listed_shard(self, shard: int) -> OpenShard | None:
        """A shard opened for a listing; None if it is absent, or logged and None if it cannot be read."""
        try:
            return self.open_shard(shard)[0]
        except FileNotFoundError:
            return None
        except (CorruptChunk, OSError) as e:  # OSError: EACCES, EIO from the disk or the server, changed under us
            skipped(self.shard_path(shard), e)
        return None

    def _listing_reads(self, shards: Iterator[OpenShard | None]) -> Iterator[Read]:
        for opened in shards:
            if opened is None:
                continue
            try:
                yield from self._reads(opened)
            except FileNotFoundError:
                pass  # removed since it was listed
            except (CorruptChunk, OSError) as e:
                skipped(opened.file.path, e)

    def _keys_in(
        self, opened: OpenShard, minishard: int, index: MinishardIndex | Exception, budget: ListingBudget, failed: set
    ) -> Iterator[int]:
        """The keys of one minishard that hash to it; each gives back LISTING_READ of the budget. After a read
        of a shard fails, the rest of it is skipped, said once."""
        path = opened.file.path
        if path in failed:
            return
        if isinstance(index, CorruptChunk):
            skipped(path, index, "part of a shard")
            return
        if isinstance(index, Exception):
            failed.add(path)
            if not isinstance(index, FileNotFoundError):  # else removed since it was listed
                skipped(path, index)
            return
        listed = 0
        for key in index:
            if self.spec.shard_and_minishard(key) == (opened.shard, minishard):
                listed += 1
                yield key
        budget.refund(LISTING_READ * listed)
