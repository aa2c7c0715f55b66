"""Zarr v3 sharded arrays read through a store: an inner chunk's bytes, the chunks each shard stores, the
shards present, and a check of one shard (see `kv.py`). The index maths is `zarr.py`'s.

Inner chunks are keyed by their global grid position. Where bytes→bytes codecs follow a sharding codec
(zarr-python adds zstd there by default), the whole shard blob at that level is decoded once into the cache
and the inner chunks are sliced out of it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from shardfs.cache import ByteCache, large_value_turn
from shardfs.errors import CorruptChunk
from shardfs.request import OWN, Request
from shardfs.shards.grid import grid_shape
from shardfs.shards.kv import PROBED_SHARDS, Extent, ShardedKV, ShardFile, ShardReport, skipped
from shardfs.shards.zarr import ChunkKeys, Level, decode_blob
from shardfs.stores.protocol import Range, Store, StoredFile, Suffix


@dataclass(frozen=True)
class Present:
    """Global positions (n, ndim) of the chunks one shard stores, and every proper prefix of them,
    so that whether a directory c/i/j holds any chunk is one set probe."""

    positions: np.ndarray
    prefixes: frozenset[tuple[int, ...]]

    @classmethod
    def of(cls, positions: np.ndarray) -> Present:
        rows = positions.tolist()
        return cls(positions, frozenset(tuple(r[:k]) for r in rows for k in range(len(r))))

    @property
    def nbytes(self) -> int:
        return self.positions.nbytes + 120 * len(self.prefixes)


@dataclass(slots=True)
class Blob:
    """One shard's bytes at some nesting level: a range of its file, or decoded bytes in the cache."""

    file: StoredFile
    start: int
    stop: int
    data: bytes | bytearray | None = None
    # Which blob this is: the shard and its version, then the index entry numbers leading down to it. Cache
    # keys use it, because offsets inside decoded bytes repeat from one inner shard to the next.
    key: tuple = ()

    @classmethod
    def whole(cls, file: StoredFile) -> Blob:
        return cls(file, 0, file.size, key=(file.path, file.version))

    @property
    def shard(self) -> str:
        return self.file.path


class ZarrKV(ShardedKV):
    """A sharded zarr v3 array's shards, keyed by the global grid positions of its innermost chunks."""

    def __init__(
        self, store: Store, cache: ByteCache, directory: str, shape: tuple[int, ...], levels: list[Level],
        keys: ChunkKeys, itemsize: int | None,
    ) -> None:  # fmt: skip
        super().__init__(store, directory, cache)
        # The most a shard blob of each level may decode to: its raw size twice over (no codec expands
        # more), its index, and codec headers; never more than one file's cap, the only bound of
        # variable-size types.
        self.limits = [
            min(2 * math.prod(lv.shape) * itemsize + lv.layout.size + (1 << 20), cache.max_value)
            if itemsize
            else cache.max_value
            for lv in levels
        ]
        self.levels, self.keys, self.shape = levels, keys, shape
        self._nothing = Present.of(np.empty((0, len(shape)), np.int64))
        self.inner = levels[-1].inner
        self.grid = grid_shape(shape, self.inner)
        self.per_shard = tuple(s // c for s, c in zip(levels[0].shape, self.inner, strict=True))
        self.shard_grid = grid_shape(self.grid, self.per_shard)
        # Per level and dimension: (innermost chunks per chunk of this level, chunks per shard, C-order stride).
        self._steps = [
            [
                (c // i, n, math.prod(lv.layout.chunks_per_shard[d + 1 :]))
                for d, (c, i, n) in enumerate(zip(lv.inner, self.inner, lv.layout.chunks_per_shard, strict=True))
            ]
            for lv in levels
        ]

    def shard_of(self, pos: tuple[int, ...]) -> tuple[int, ...]:
        """The shard position holding a chunk position, or a prefix of one."""
        return tuple(p // n for p, n in zip(pos, self.per_shard, strict=False))

    def index_of(self, key: object) -> tuple[int, ...]:
        """A chunk's shard: its index locates it."""
        return self.shard_of(key)  # type: ignore[arg-type]

    def shard_path(self, shard: tuple[int, ...]) -> str:
        return self.path(self.keys.key(shard))

    # -- locating one inner chunk ------------------------------------------------------------------------------------

    def locate(self, pos: tuple[int, ...], request: Request = OWN) -> Extent | None:  # type: ignore[override]
        """The inner chunk at global grid position pos, or None if it is absent."""
        try:
            blob = Blob.whole(self.open_shard(self.shard_path(self.shard_of(pos)), request))
        except FileNotFoundError:
            return None  # a missing shard holds no chunks
        for depth, (level, steps) in enumerate(zip(self.levels, self._steps, strict=True)):
            blob = self._decoded(blob, level, depth, request)
            table = self._index(blob, level, depth, request=request)
            # The entry of pos at this level: its position in this level's chunks, within this level's shard.
            number = sum((p // r) % c * s for p, (r, c, s) in zip(pos, steps, strict=True))
            found = level.layout.entry(table, number)
            if found is None:
                return None
            blob = self._sub(blob, number, *found, pos)
        return Extent(blob.file, pos, blob.start, blob.stop, blob.data)

    def _sub(self, blob: Blob, number: int, offset: int, nbytes: int, what: object) -> Blob:
        """The blob of index entry number in blob, at [offset, offset + nbytes)."""
        if offset + nbytes > blob.stop - blob.start:
            raise CorruptChunk(blob.shard, what, f"index entry [{offset}, +{nbytes}) lies outside the shard")
        start = blob.start + offset
        return Blob(blob.file, start, start + nbytes, blob.data, (*blob.key, number))

    def _read(self, blob: Blob, start: int, stop: int, request: Request) -> bytes:
        if blob.data is not None:
            return blob.data[blob.start + start : blob.start + stop]
        return blob.file.read(blob.start + start, blob.start + stop, request)

    def _decoded(self, blob: Blob, level: Level, depth: int, request: Request = OWN) -> Blob:
        if not level.post:
            return blob

        def make() -> bytes:
            try:
                with large_value_turn(blob.stop - blob.start, self.cache):
                    stored = self._read(blob, 0, blob.stop - blob.start, request)
                    return decode_blob(stored, level.post, self.limits[depth], request, self.cache)
            except ValueError as e:
                raise CorruptChunk(blob.shard, f"level {depth} shard blob", f"cannot decode {level.post}: {e}") from e

        data = self.cache.get_or_make(("blob", *blob.key), make)
        return Blob(blob.file, 0, len(data), data, blob.key)

    def open_shard(self, path: str, request: Request = OWN) -> StoredFile:
        """The shard at path, opened once (kept in the cache) by the read of its index where that index is
        stored as it is (no bytes→bytes codec over the shard): at its end by a suffix read, at its start by
        one from 0. A remote store learns the shard's size and version from that read's answer, so no
        request goes first to ask them; the index is then in the cache. FileNotFoundError if it is absent;
        CorruptChunk (naming it) if its index cannot be read, or it is shorter than its index."""

        def make() -> StoredFile:
            level = self.levels[0]
            if level.post:  # the whole shard is decoded first: its size is needed before any read
                return self.open_file(path)
            size = level.layout.size
            at_start = level.layout.at_start
            file, raw = self.open_reading(path, Range(0, size) if at_start else Suffix(size), request)
            self._index(Blob.whole(file), level, 0, raw if len(raw) == size else None, request)
            return file

        return self.cache.get_or_make(self.opened_cache_key(path), make)

    def _index(
        self, blob: Blob, level: Level, depth: int, raw: bytes | None = None, request: Request = OWN
    ) -> bytes:  # fmt: skip
        """The verified index of blob, read from it unless raw holds it already (as the read that opened
        the shard did)."""

        def make() -> bytes:
            try:
                start, stop = level.layout.where(blob.stop - blob.start)
                return level.layout.decode(self._read(blob, start, stop, request) if raw is None else raw)
            except ValueError as e:
                raise CorruptChunk(blob.shard, f"level {depth} index", str(e)) from e

        return self.cache.get_or_make(("index", *blob.key, blob.data is not None), make)

    # -- what is stored ------------------------------------------------------------------------------------------------

    def any_stored(self) -> bool:
        """Whether a listing shows any chunk of the array."""
        return any(len(self._listed(path).positions) for path in self._shard_files(()))

    def holds(self, prefix: tuple[int, ...]) -> bool:
        """Whether a directory (a position prefix) holds a chunk, or may: a shard that cannot be read may, so
        the directory is found and its chunks' reads carry the error, which must not look like absence."""
        shard_prefix = self.shard_of(prefix)
        if self._unprobed(shard_prefix):
            return True  # nothing can say: the reads below it do
        return any(self._may_hold(path, prefix) for path in self._candidate_shards(shard_prefix))

    def present_under(self, prefix: tuple[int, ...] = ()) -> Iterator[tuple[int, ...]]:
        """Global positions of the stored chunks whose position starts with prefix, shard by shard."""
        for path in self._shard_files(self.shard_of(prefix)):
            present = self._listed(path).positions
            if prefix:
                present = present[(present[:, : len(prefix)] == prefix).all(axis=1)]
            yield from map(tuple, present.tolist())

    def shards(self) -> Iterator[ShardFile]:
        for path in self._shard_files(()):
            parsed = self.keys.parse(path[len(self.directory) :].lstrip("/"))
            # a 0-d array's one shard path is named whether or not it is there
            if parsed is not None and (self.keys.ndim or self.is_file(path)):
                yield ShardFile(path, parsed[0])

    def verify(self, shard: ShardFile) -> ShardReport:
        """The listing's own walk, told to verify every entry: any bad index level makes the shard unreadable."""
        report = ShardReport()
        try:
            report.chunks = len(self.positions_in(self.open_file(shard.path), verify=True))
        except CorruptChunk as e:
            report.add(e.reason)
        return report

    def _candidate_shards(self, shard_prefix: tuple[int, ...]) -> Iterator[str]:
        """Shard paths that may hold chunks below shard_prefix: computed when few (their presence is then
        cached, missing ones too, so a directory check costs no system call), else listed."""
        rest = self.shard_grid[len(shard_prefix) :]
        if math.prod(rest) > 64:
            yield from self._shard_files(shard_prefix)
            return
        for tail in itertools.product(*map(range, rest)):
            yield self.shard_path((*shard_prefix, *tail))

    def _shard_files(self, shard_prefix: tuple[int, ...]) -> Iterator[str]:
        """Paths of the shard files present whose shard position starts with shard_prefix."""
        if not self.keys.ndim:
            yield self.shard_path(())  # _present finds out whether it is there
            return
        if not self.store.can_list:
            yield from self._probed(shard_prefix)
            return
        if self.keys.separator == "/":
            if shard_prefix:
                yield from self._whole_keys(self.files_below(self.path(self.keys.key(shard_prefix))))
                return
            top = self.path(self.keys.top).rstrip("/")
            for name, is_dir in self.list_dir(top):
                child = f"{top}/{name}" if top else name
                if self.keys.owns(child[len(self.directory) :].lstrip("/")):
                    yield from self._whole_keys(self.files_below(child) if is_dir else [child])
            return
        for name, is_dir in self.list_dir(self.directory):
            parsed = self.keys.parse(name)
            if parsed is not None and parsed[1] and parsed[0][: len(shard_prefix)] == shard_prefix and not is_dir:
                yield self.path(name)

    def _probed(self, shard_prefix: tuple[int, ...]) -> Iterator[str]:
        """Where the store cannot list (HTTP): each shard of the grid below shard_prefix asked for (the GET of its
        index, which opens it), up to PROBED_SHARDS of them; past that none, said, as precomputed's."""
        rest = self.shard_grid[len(shard_prefix) :]
        if not self.probeable(math.prod(rest)):
            return
        paths = (self.shard_path((*shard_prefix, *tail)) for tail in itertools.product(*map(range, rest)))
        yield from self.probed(paths, lambda path: None if self._present(path) is self._nothing else path)

    def _unprobed(self, shard_prefix: tuple[int, ...]) -> bool:
        """Whether the shards below shard_prefix can be neither listed nor probed (too many)."""
        return not self.store.can_list and math.prod(self.shard_grid[len(shard_prefix) :]) > PROBED_SHARDS

    def _whole_keys(self, paths: Iterable[str]) -> Iterator[str]:
        """Only files named by a whole chunk key are shards (a stray file at c/1 in a 2-d array is not)."""
        for path in paths:
            parsed = self.keys.parse(path[len(self.directory) :].lstrip("/"))
            if parsed is not None and parsed[1]:
                yield path

    def _present(self, path: str) -> Present | None:
        """The inner chunks stored in one shard file: computed once per version of the shard and cached.
        A missing shard holds none, and so does a corrupt one (logged); one that cannot be read (the disk or
        the server failed) is None, logged: what it holds is not known."""
        try:
            file = self.open_shard(path)
            return self.cache.get_or_make(self.cache_key("present", file), lambda: Present.of(self.positions_in(file)))
        except FileNotFoundError:
            return self._nothing
        except CorruptChunk as e:
            skipped(path, e)
            return self._nothing
        except OSError as e:  # EACCES, EIO from the disk or the server, changed under the mount
            skipped(path, e)
        return None

    def _listed(self, path: str) -> Present:
        """What a listing shows of one shard file: a shard that cannot be read is skipped."""
        return self._present(path) or self._nothing

    def _may_hold(self, path: str, prefix: tuple[int, ...]) -> bool:
        present = self._present(path)
        return present is None or prefix in present.prefixes

    def positions_in(self, file: StoredFile, verify: bool = False) -> np.ndarray:
        """Global positions (n, ndim) of the inner chunks stored in one shard file inside the array,
        vectorized through every nesting level. CorruptChunk if an index cannot be read or, with verify
        (`shardfs check`), if any innermost entry lies outside its blob: listing shows such a chunk and its
        read fails, as precomputed does."""
        shard = self.keys.parse(file.path[len(self.directory) :].lstrip("/"))
        if shard is None or not shard[1]:
            return self._nothing.positions
        origin = np.multiply(shard[0], self.levels[0].shape, dtype=np.int64)
        return self._walk(Blob.whole(file), 0, origin, verify)

    def _walk(self, blob: Blob, depth: int, origin: np.ndarray, verify: bool) -> np.ndarray:
        level = self.levels[depth]
        blob = self._decoded(blob, level, depth)
        numbers, within, rows = level.layout.present(self._index(blob, level, depth))
        starts = origin + within * np.asarray(level.inner, dtype=np.int64)  # element coordinates of each chunk
        last = depth + 1 == len(self.levels)
        if verify or not last:
            size = np.uint64(blob.stop - blob.start)
            offsets, sizes = rows[:, 0], rows[:, 1]
            for i in np.flatnonzero((sizes > size) | (offsets > size - np.minimum(sizes, size)))[:1].tolist():
                self._sub(blob, numbers[i], *rows[i].tolist(), path_key(starts[i]))  # raises CorruptChunk
        if last:
            pos = starts // np.asarray(self.inner, dtype=np.int64)
            return pos[(pos < np.asarray(self.grid, dtype=np.int64)).all(axis=1)]
        # Inner shards own disjoint bytes. Were two entries to share some, a walk could visit the same
        # bytes over and over, exponentially in the depth: refused, so listing is bounded by bytes stored.
        order = np.argsort(rows[:, 0], kind="stable")
        ends = (rows[order, 0] + rows[order, 1]).astype(np.int64)
        if len(order) > 1 and (rows[order[1:], 0].astype(np.int64) < ends[:-1]).any():
            raise CorruptChunk(blob.shard, f"level {depth} index", "inner shards overlap")
        below = [
            self._walk(self._sub(blob, number, offset, nbytes, path_key(start)), depth + 1, start, verify)
            for number, start, (offset, nbytes) in zip(numbers.tolist(), starts, rows.tolist(), strict=True)
        ]
        return np.concatenate(below) if below else np.empty((0, len(self.shape)), np.int64)


def path_key(origin: Iterable[int]) -> str:
    return f"chunk at {[int(o) for o in origin]}"
