"""Zarr v3: every array whose array→bytes codec is `sharding_indexed` shown as the unsharded array with
the innermost chunks, whose `zarr.json` says so; groups and unsharded arrays pass through unchanged.

Inner chunk files hold the chunk's bytes exactly as stored. Where bytes→bytes codecs follow a sharding
codec (zarr-python adds zstd there by default), the whole shard blob at that level is decoded once into
the cache and the inner chunks are sliced out of it.
"""

from __future__ import annotations

import copy
import functools
import itertools
import json
import logging
import math
import posixpath
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardfs.cache import ByteCache, large_value_turn
from shardfs.codecs import UNDO
from shardfs.errors import CorruptChunk, SourceError
from shardfs.formats.plan import LARGEST, Array, Compressor, Plan, grid_at, grid_index, grid_position, load_json
from shardfs.shards.zarr import IndexLayout
from shardfs.stores.protocol import Range, Store, StoredFile, Suffix
from shardfs.tree import BytesFile, Dir, File, Node, RangeFile

log = logging.getLogger("shardfs")

DRAFT_FORMAT = "https://purl.org/zarr/spec/protocol/core/3.0"
MAX_NESTING = 8  # sharding levels; writers use one or two, and each level is work for every lookup
# Codecs of the zarr v3 spec and its registered extensions; zarr-python also writes numcodecs' as `numcodecs.*`.
KNOWN_CODECS = (
    *("bytes", "transpose", "sharding_indexed", "gzip", "zstd", "blosc", "crc32c"),
    *("vlen-utf8", "vlen-bytes", "packbits"),
)


class Unsupported(Exception):
    """An array whose codec chain shardfs cannot present faithfully; it passes through as it is."""


# ---------------------------------------------------------------------------------------------------------------------
# Codec chains


@dataclass(frozen=True)
class Level:
    """One `sharding_indexed` level: shards of `shape` hold chunks of `inner`; `post` are the bytes→bytes
    codecs that encode each whole shard blob of this level."""

    shape: tuple[int, ...]
    inner: tuple[int, ...]
    layout: IndexLayout
    post: tuple[str, ...]


def _name(codec: Any) -> str:
    return codec.get("name") if isinstance(codec, dict) else codec


def unshard(codecs: list, chunk_shape: tuple[int, ...]) -> tuple[list[Level], list] | None:
    """The sharding levels and the innermost codecs, or None if the array is not sharded. Inner codecs
    are passed on as they are, so any array→bytes codec may sit inside (`bytes`, `vlen-utf8`, ...)."""
    levels: list[Level] = []
    shape = chunk_shape
    while True:
        if not isinstance(codecs, list):
            raise Unsupported(f"codecs {codecs!r} is not a list")
        names = [_name(c) for c in codecs]
        if "sharding_indexed" not in names:
            return (levels, codecs) if levels else None
        at = names.index("sharding_indexed")
        if at:
            raise Unsupported(f"array→array codecs {names[:at]} before sharding change the chunk layout")
        post = tuple(names[at + 1 :])
        if unknown := [n for n in post if n not in UNDO]:
            raise Unsupported(f"bytes→bytes codecs {unknown} after sharding are not supported")
        config = codecs[at].get("configuration") if isinstance(codecs[at], dict) else None
        inner = tuple(config.get("chunk_shape") or ()) if isinstance(config, dict) else ()
        if not positive_ints(inner, len(shape)) or any(s % i for s, i in zip(shape, inner, strict=True)):
            raise Unsupported(f"inner chunk shape {list(inner)} does not divide the shard shape {list(shape)}")
        if len(levels) == MAX_NESTING:
            raise Unsupported(f"sharding is nested more than {MAX_NESTING} levels deep")
        cps = tuple(s // i for s, i in zip(shape, inner, strict=True))
        levels.append(Level(shape, inner, _index_layout(config, cps), post))
        codecs, shape = config.get("codecs", []), inner


def unknown_codecs(codecs: Any) -> list[str]:
    """Codec names in a chain (sharding's inner and index chains too) that no zarr v3 writer uses: most
    likely a typo (`sharding_index`), which would otherwise pass through in silence, shards as chunks."""
    found, pending = [], [codecs]
    while pending and len(found) < 8:
        chain = pending.pop()
        for codec in chain if isinstance(chain, list) else []:
            name = _name(codec)
            if not isinstance(name, str) or not (name in KNOWN_CODECS or name.startswith("numcodecs.")):
                found.append(str(name))
            config = codec.get("configuration") if isinstance(codec, dict) else None
            if name == "sharding_indexed" and isinstance(config, dict) and len(pending) < MAX_NESTING:
                pending += [config.get("codecs"), config.get("index_codecs")]
    return found


def positive_ints(values: Any, ndim: int) -> bool:
    return (
        isinstance(values, (list, tuple))
        and len(values) == ndim
        and all(isinstance(v, int) and not isinstance(v, bool) and 0 < v < LARGEST for v in values)
    )


def _index_layout(config: dict, chunks_per_shard: tuple[int, ...]) -> IndexLayout:
    index_codecs = config.get("index_codecs", [{"name": "bytes"}, {"name": "crc32c"}])
    names = [_name(c) for c in index_codecs] if isinstance(index_codecs, list) else None
    if names not in (["bytes"], ["bytes", "crc32c"]):
        raise Unsupported(f"index_codecs {names} are not supported (bytes, optionally crc32c)")
    first = index_codecs[0]
    endian = ((first.get("configuration") if isinstance(first, dict) else None) or {}).get("endian", "little")
    location = config.get("index_location", "end")
    if location not in ("start", "end"):
        raise Unsupported(f"index_location {location!r} is neither 'start' nor 'end'")
    return IndexLayout(chunks_per_shard, location == "start", names[-1] == "crc32c", endian == "big")


def decode_blob(data: bytes, post: tuple[str, ...], limit: int) -> bytes:
    """Undo the bytes→bytes codecs that follow a sharding codec, last first, each bounded by limit."""
    for name in reversed(post):
        data = UNDO[name](data, limit)
    return data


# ---------------------------------------------------------------------------------------------------------------------
# Chunk keys


@dataclass(frozen=True)
class ChunkKeys:
    """A chunk key encoding, as the text before the first index and the separator between indices:
    zarr v3 `default` is `c/1/2` (or `c.1.2`), `v2` is `1.2` (or `1/2`), the 2022 draft is `c1/2`."""

    lead: str
    separator: str
    ndim: int

    @classmethod
    def from_json(cls, encoding: Any, ndim: int) -> ChunkKeys:
        encoding = encoding or {"name": "default"}
        name = _name(encoding)
        config = encoding.get("configuration") if isinstance(encoding, dict) else None
        separator = (config if isinstance(config, dict) else {}).get("separator", "/" if name == "default" else ".")
        if name not in ("default", "v2") or separator not in ("/", "."):
            raise Unsupported(f"chunk_key_encoding {encoding!r} is not supported")
        return cls(f"c{separator}" if name == "default" else "", separator, ndim)

    def key(self, pos: tuple[int, ...]) -> str:
        """The key of a chunk, or with fewer indices the directory that holds such keys."""
        if not pos and self.ndim == 0:
            return self.lead.rstrip("/.") or "0"
        return self.lead + self.separator.join(map(str, pos))

    @functools.cached_property
    def top(self) -> str:
        """The fixed directory every key lies in (`c` for `c/1/2`), or ''."""
        return self.lead[:-1] if self.lead.endswith("/") else ""

    def parse(self, rel: str) -> tuple[tuple[int, ...], bool] | None:
        """(position or position prefix, is a whole key) of a path under the array, or None if not a key."""
        if self.ndim == 0 and rel == self.key(()):
            return (), True
        if self.top and rel == self.top:
            return (), False
        if not rel.startswith(self.lead) or (self.separator == "." and "/" in rel):
            return None
        pos = grid_position(rel[len(self.lead) :].split(self.separator))
        if pos is None or len(pos) > self.ndim:
            return None
        if len(pos) < self.ndim and self.separator == ".":
            return None  # flat keys have no directories
        return pos, len(pos) == self.ndim

    def owns(self, rel: str) -> bool:
        """Whether a path lies in the chunk namespace (where the shard files are)."""
        first = rel.split("/", 1)[0]
        if self.top:
            return first == self.top
        return first.startswith(self.lead) and first[len(self.lead) :].replace(".", "").isdigit()


# ---------------------------------------------------------------------------------------------------------------------
# The array


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


class ZarrArray:
    """A sharded zarr v3 array presented with its innermost chunks (a tree Provider)."""

    def __init__(
        self, store: Store, cache: ByteCache, directory: str, shape: tuple[int, ...], levels: list[Level],
        keys: ChunkKeys, itemsize: int | None,
    ) -> None:  # fmt: skip
        self.store, self.cache, self.directory = store, cache, directory
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
        self.grid = tuple(-(-s // c) for s, c in zip(shape, self.inner, strict=True))
        self.per_shard = tuple(s // c for s, c in zip(levels[0].shape, self.inner, strict=True))
        self.shard_grid = tuple(-(-g // n) for g, n in zip(self.grid, self.per_shard, strict=True))
        # Per level and dimension: (innermost chunks per chunk of this level, chunks per shard, C-order stride).
        self._steps = [
            [
                (c // i, n, math.prod(lv.layout.chunks_per_shard[d + 1 :]))
                for d, (c, i, n) in enumerate(zip(lv.inner, self.inner, lv.layout.chunks_per_shard, strict=True))
            ]
            for lv in levels
        ]
        self.kind = "zarr v3 sharded array"
        self.details = {
            "shape": list(shape),
            "shard shape": list(levels[0].shape),
            "inner chunk shape": list(self.inner),
            "nesting levels": len(levels),
            "index": ", ".join(
                f"{'start' if lv.layout.at_start else 'end'}{'+crc32c' if lv.layout.checksum else ''}" for lv in levels
            ),
        }

    def describe(self) -> dict[str, Any]:
        grid = math.prod(self.shard_grid)
        if not self.store.can_list:  # none would be found: a count of 0 would say the shards are missing
            return {**self.details, "shard files": f"{grid} in the grid; not counted (the server cannot list them)"}
        return {**self.details, "shard files": f"{sum(1 for _ in self._shard_files(()))} present of {grid}"}

    def _shard_of(self, pos: tuple[int, ...]) -> tuple[int, ...]:
        """The shard position holding a chunk position, or a prefix of one."""
        return tuple(p // n for p, n in zip(pos, self.per_shard, strict=False))

    def _shard_path(self, shard: tuple[int, ...]) -> str:
        key = self.keys.key(shard)
        return f"{self.directory}/{key}" if self.directory else key

    def hides(self, rel: str) -> bool:
        return self.keys.owns(rel)

    def key_of(self, rel: str) -> int | None:
        """A chunk key's position numbered on the grid; directories (c/1) have no number."""
        parsed = self.keys.parse(rel)
        return grid_index(parsed[0], self.grid) if parsed is not None and parsed[1] else None

    def rel_of(self, key: int) -> str | None:
        pos = grid_at(key, self.grid)
        return None if pos is None else self.keys.key(pos)

    def child(self, rel: str) -> Node | None:
        parsed = self.keys.parse(rel)
        if parsed is None:
            return None
        pos, whole = parsed
        if not all(p < g for p, g in zip(pos, self.grid, strict=False)):
            raise FileNotFoundError(rel)
        if not whole:
            shard_prefix = self._shard_of(pos)
            if not any(self._may_hold(path, pos) for path in self._candidate_shards(shard_prefix)):
                raise FileNotFoundError(rel)
            # It stands for the directory of the shards it draws on (c/1 for c/5 with 4 chunks a shard).
            return Dir(self.store.owner(self._shard_path(shard_prefix).rstrip("/.")))
        found = self.locate(pos)
        if found is None:
            raise FileNotFoundError(rel)
        return found

    # -- locating one inner chunk ------------------------------------------------------------------------------------

    def locate(self, pos: tuple[int, ...]) -> File | None:
        """The inner chunk at global grid position pos, or None if it is absent."""
        try:
            blob = Blob.whole(self._open(self._shard_path(self._shard_of(pos))))
        except FileNotFoundError:
            return None  # a missing shard holds no chunks
        for depth, (level, steps) in enumerate(zip(self.levels, self._steps, strict=True)):
            blob = self._decoded(blob, level, depth)
            table = self._index(blob, level, depth)
            # The entry of pos at this level: its position in this level's chunks, within this level's shard.
            number = sum((p // r) % c * s for p, (r, c, s) in zip(pos, steps, strict=True))
            found = level.layout.entry(table, number)
            if found is None:
                return None
            blob = self._sub(blob, number, *found, pos)
        if blob.data is None:
            return RangeFile(blob.file, blob.start, blob.stop)
        return BytesFile(bytes(blob.data[blob.start : blob.stop]), blob.file.owner, blob.shard)

    def _sub(self, blob: Blob, number: int, offset: int, nbytes: int, what: object) -> Blob:
        """The blob of index entry number in blob, at [offset, offset + nbytes)."""
        if offset + nbytes > blob.stop - blob.start:
            raise CorruptChunk(blob.shard, what, f"index entry [{offset}, +{nbytes}) lies outside the shard")
        start = blob.start + offset
        return Blob(blob.file, start, start + nbytes, blob.data, (*blob.key, number))

    def _read(self, blob: Blob, start: int, stop: int) -> bytes:
        if blob.data is not None:
            return blob.data[blob.start + start : blob.start + stop]
        return blob.file.read(blob.start + start, blob.start + stop)

    def _decoded(self, blob: Blob, level: Level, depth: int) -> Blob:
        if not level.post:
            return blob

        def make() -> bytes:
            try:
                with large_value_turn(blob.stop - blob.start):
                    return decode_blob(self._read(blob, 0, blob.stop - blob.start), level.post, self.limits[depth])
            except ValueError as e:
                raise CorruptChunk(blob.shard, f"level {depth} shard blob", f"cannot decode {level.post}: {e}") from e

        data = self.cache.get_or_make(("zarr-blob", blob.key), make)
        return Blob(blob.file, 0, len(data), data, blob.key)

    def _open(self, path: str) -> StoredFile:
        """The shard at path, opened once (kept in the cache) by the read of its index where that index is
        stored as it is (no bytes→bytes codec over the shard): at its end by a suffix read, at its start by
        one from 0. A remote store learns the shard's size and version from that read's answer, so no
        request goes first to ask them; the index is then in the cache. FileNotFoundError if it is absent;
        CorruptChunk (naming it) if its index cannot be read, or it is shorter than its index."""

        def make() -> StoredFile:
            level = self.levels[0]
            if level.post:  # the whole shard is decoded first: its size is needed before any read
                return self.store.open(path)
            size = level.layout.size
            at_start = level.layout.at_start
            file, raw = self.store.open_reading(path, Range(0, size) if at_start else Suffix(size))
            self._index(Blob.whole(file), level, 0, raw if len(raw) == size else None)
            return file

        return self.cache.get_or_make(("zarr-shard", path), make)

    def _index(self, blob: Blob, level: Level, depth: int, raw: bytes | None = None) -> bytes:
        """The verified index of blob, read from it unless raw holds it already (as the read that opened
        the shard did)."""

        def make() -> bytes:
            try:
                start, stop = level.layout.where(blob.stop - blob.start)
                return level.layout.decode(self._read(blob, start, stop) if raw is None else raw)
            except ValueError as e:
                raise CorruptChunk(blob.shard, f"level {depth} index", str(e)) from e

        return self.cache.get_or_make(("zarr-index", blob.key, blob.data is not None), make)

    # -- listing ------------------------------------------------------------------------------------------------------

    def entries(self, rel: str) -> Iterator[tuple[str, bool]]:
        """Exactly the keys of stored chunks, and the directories above them that hold any."""
        if not self.keys.ndim:  # a 0-d array: its one chunk, a file in the array directory
            if not rel and len(self._listed(self._shard_path(())).positions):
                yield self.keys.key(()), False
            return
        if not rel and self.keys.top:
            if any(len(self._listed(path).positions) for path in self._shard_files(())):
                yield self.keys.top, True
            return
        parsed = self.keys.parse(rel) if rel else ((), False)
        if parsed is None or parsed[1]:
            return
        prefix = parsed[0]
        if self.keys.separator == "." or len(prefix) == self.keys.ndim - 1:
            for pos in self.present_under(prefix):
                yield self.keys.key(pos).rsplit("/", 1)[-1], False
            return
        below = {pos[len(prefix)] for pos in self.present_under(prefix)}  # at most one int per grid row
        for i in sorted(below):
            yield self.keys.key((*prefix, i)).rsplit("/", 1)[-1], True

    def present_under(self, prefix: tuple[int, ...] = ()) -> Iterator[tuple[int, ...]]:
        """Global positions of the stored chunks whose position starts with prefix, shard by shard."""
        for path in self._shard_files(self._shard_of(prefix)):
            present = self._listed(path).positions
            if prefix:
                present = present[(present[:, : len(prefix)] == prefix).all(axis=1)]
            yield from map(tuple, present.tolist())

    def _candidate_shards(self, shard_prefix: tuple[int, ...]) -> Iterator[str]:
        """Shard paths that may hold chunks below shard_prefix: computed when few (their presence is then
        cached, missing ones too, so a directory check costs no system call), else listed."""
        rest = self.shard_grid[len(shard_prefix) :]
        if math.prod(rest) > 64:
            yield from self._shard_files(shard_prefix)
            return
        for tail in itertools.product(*map(range, rest)):
            yield self._shard_path((*shard_prefix, *tail))

    def _shard_files(self, shard_prefix: tuple[int, ...]) -> Iterator[str]:
        """Paths of the shard files present whose shard position starts with shard_prefix."""
        if not self.keys.ndim:
            yield self._shard_path(())  # _present finds out whether it is there
            return
        if self.keys.separator == "/":
            if shard_prefix:
                yield from self._whole_keys(
                    files_below(self.store, posixpath.join(self.directory, self.keys.key(shard_prefix)))
                )
                return
            top = posixpath.join(self.directory, self.keys.top).rstrip("/")
            for name, is_dir in self.store.list(top):
                child = posixpath.join(top, name)
                if self.keys.owns(child[len(self.directory) :].lstrip("/")):
                    yield from self._whole_keys(files_below(self.store, child) if is_dir else [child])
            return
        for name, is_dir in self.store.list(self.directory):
            parsed = self.keys.parse(name)
            if parsed is not None and parsed[1] and parsed[0][: len(shard_prefix)] == shard_prefix and not is_dir:
                yield posixpath.join(self.directory, name)

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
            file = self._open(path)
            return self.cache.get_or_make(("zarr-present", path, file.version), lambda: Present.of(self.stored(file)))
        except FileNotFoundError:
            return self._nothing
        except CorruptChunk as e:
            log.error("listing skips a shard: %s", e, extra=e.log_fields("listing_skip"))
            return self._nothing
        except OSError as e:  # EACCES, EIO from the disk or the server, changed under the mount
            log.error("listing skips a shard: %s", e, extra={"event": "listing_skip", "shard": path})
        return None

    def _listed(self, path: str) -> Present:
        """What a listing shows of one shard file: a shard that cannot be read is skipped."""
        return self._present(path) or self._nothing

    def _may_hold(self, path: str, prefix: tuple[int, ...]) -> bool:
        """Whether the shard at path holds a chunk below the directory prefix names. One that cannot be read
        may: the directory is found, and its chunks' reads carry the error, which must not look like absence."""
        present = self._present(path)
        return present is None or prefix in present.prefixes

    def stored(self, file: StoredFile, verify: bool = False) -> np.ndarray:
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


def itemsize(data_type: Any) -> int | None:
    """Bytes per element of a fixed-size data type (zarr v3 names and the draft's '<i4' style), else None."""
    try:
        return np.dtype(data_type).itemsize or None if isinstance(data_type, str) else None
    except TypeError:
        return None


def files_below(store: Store, path: str) -> Iterator[str]:
    """Every file below a source directory, streamed."""
    for name, is_dir in store.list(path):
        child = posixpath.join(path, name)
        if is_dir:
            yield from files_below(store, child)
        else:
            yield child


def named_children(meta: dict) -> list[str]:
    """The children a group's own metadata names, for a store that cannot list: the first component of each
    consolidated metadata key, else the paths of its OME-Zarr multiscales datasets (0.5 or 0.4 layout)."""
    if isinstance((meta.get("consolidated_metadata") or {}).get("metadata"), dict):
        names = (key.split("/")[0] for key in named_keys(meta))
    else:
        attributes = meta.get("attributes") or {}
        multiscales = (attributes.get("ome") or {}).get("multiscales") or attributes.get("multiscales") or []
        names = (
            d["path"].split("/")[0]
            for m in multiscales if isinstance(m, dict)
            for d in m.get("datasets") or [] if isinstance(d, dict) and isinstance(d.get("path"), str)
        )  # fmt: skip
    return sorted({name for name in names if name not in ("", ".", "..")})


def named_keys(meta: dict) -> list[str]:
    """The keys of a group's consolidated metadata: the paths of its descendants, relative to it."""
    consolidated = (meta.get("consolidated_metadata") or {}).get("metadata")
    return [key for key in consolidated if isinstance(key, str)] if isinstance(consolidated, dict) else []


def path_key(origin: Iterable[int]) -> str:
    return f"chunk at {[int(o) for o in origin]}"


# ---------------------------------------------------------------------------------------------------------------------
# The hierarchy


@dataclass
class ZarrPlan(Plan):
    """The mount plan for a zarr v3 hierarchy: rewritten array metadata and sharded arrays."""

    consolidated: dict[str, dict] = field(default_factory=dict)  # groups with consolidated metadata, by path
    # Every node a group's consolidated metadata names, by its path from the root: a subgroup has none of its
    # own, so where the store cannot list, its children are known from its ancestor's.
    consolidated_nodes: set[str] = field(default_factory=set)

    def walk(self) -> None:
        """Every node from the root down, depth first, without recursion: nesting is the source's to choose."""
        pending = [""]
        while pending:
            pending += reversed(self._node(pending.pop()))
        for directory, meta in self.consolidated.items():
            self._reconsolidate(directory, meta)

    def _reconsolidate(self, directory: str, meta: dict) -> None:
        """A group's consolidated metadata repeats its descendants' metadata, and readers prefer it: an
        array shown unsharded must be so there too, or a reader takes its inner chunks for shards."""
        entries = meta["consolidated_metadata"].get("metadata")
        if not isinstance(entries, dict):
            return
        rewritten = {
            key: self.files[path]
            for key in entries
            if isinstance(key, str) and (path := posixpath.join(directory, key, "zarr.json")) in self.files
        }
        if rewritten:
            entries.update({key: json.loads(data) for key, data in rewritten.items()})
            self.files[posixpath.join(directory, "zarr.json")] = json.dumps(meta, indent=2).encode()

    def _node(self, directory: str) -> list[str]:
        """Plan the node in directory; the directories of its children, for a group. A malformed node below
        the root is served as stored; a malformed root refuses the mount."""
        root = not directory
        path = posixpath.join(directory, "zarr.json")
        where = self.store.where(path)
        try:
            meta = load_json(self.store, path)
            self.found.add(path)
            if root and isinstance(meta, dict) and meta.get("zarr_format") == DRAFT_FORMAT:
                self.walk_draft()
                return []
            if not isinstance(meta, dict) or meta.get("zarr_format") != 3:
                raise SourceError(f"{where}: field 'zarr_format' must be 3")
            node_type = meta.get("node_type")
            if not isinstance(meta.get("attributes", {}), dict):
                raise SourceError(f"{where}: field 'attributes' must be an object")
            if node_type == "array":
                self._array(directory, meta, where)
                return []
            if node_type != "group":
                raise SourceError(f"{where}: field 'node_type' must be 'group' or 'array', not {node_type!r}")
        except SourceError as e:
            self._refuse(e, root)
            return []
        except (TypeError, ValueError, AttributeError, KeyError, ZeroDivisionError) as e:
            self._refuse(SourceError(f"{where}: cannot make sense of it ({type(e).__name__}: {e})"), root)
            return []
        self.kinds.append(f"{directory or '.'}: zarr v3 group")
        self.groups[directory] = meta.get("attributes") or {}
        self.directories.add(directory)
        if isinstance(meta.get("consolidated_metadata"), dict):
            self.consolidated[directory] = meta
            self.consolidated_nodes.update(posixpath.join(directory, key) for key in named_keys(meta))
        names: Iterable[str] = (name for name, is_dir in self.store.list(directory) if is_dir)
        if not self.store.can_list:
            prefix = f"{directory}/" if directory else ""
            below = (path[len(prefix) :].split("/")[0] for path in self.consolidated_nodes if path.startswith(prefix))
            names = sorted({*named_children(meta), *below} - {"", ".", ".."})
        children = (posixpath.join(directory, name) for name in names)
        return [child for child in children if self.store.kind(posixpath.join(child, "zarr.json")) == "file"]

    def walk_draft(self) -> None:
        """The 2022 sharding storage transformer draft (zarr-python 2.14-2.18): metadata at
        meta/root/<path>.array.json, shards at data/root/<path>/c<i>/<j>, index at the end, no checksum."""
        self.kinds.append(".: zarr v3 draft hierarchy (2022 sharding storage transformer)")
        self.format = "zarr draft"
        for path in files_below(self.store, "meta"):
            if path.endswith(".array.json"):
                try:
                    self._draft_array(path)
                except SourceError as e:
                    self._refuse(e, root=False)
                except (TypeError, ValueError, AttributeError, KeyError, ZeroDivisionError) as e:
                    where = self.store.where(path)
                    self._refuse(SourceError(f"{where}: cannot make sense of it ({type(e).__name__}: {e})"), False)

    def _draft_array(self, path: str) -> None:
        where = self.store.where(path)
        meta = load_json(self.store, path)
        if not isinstance(meta, dict):
            raise SourceError(f"{where}: must hold a JSON object")
        name = path[len("meta/root") : -len(".array.json")].strip("/")
        transformers = meta.get("storage_transformers") or []
        if not transformers:
            self.kinds.append(f"{name or '.'}: zarr v3 draft array, unsharded (passes through)")
            return
        shape, grid = meta.get("shape"), meta.get("chunk_grid") or {}
        inner = grid.get("chunk_shape")
        if len(transformers) != 1 or transformers[0].get("type") != "indexed":
            raise SourceError(f"{where}: field 'storage_transformers' holds something other than one 'indexed'")
        per_shard = (transformers[0].get("configuration") or {}).get("chunks_per_shard")
        ndim = len(shape) if isinstance(shape, list) else -1
        if (
            not (positive_ints(inner, ndim) and positive_ints(per_shard, ndim))
            or grid.get("separator", "/") not in "/."
        ):
            raise SourceError(
                f"{where}: fields 'shape', 'chunk_grid' and 'chunks_per_shard' must agree, in positive integers"
            )
        level = Level(
            tuple(i * n for i, n in zip(inner, per_shard, strict=True)),
            tuple(inner),
            IndexLayout(tuple(per_shard), checksum=False),
            (),
        )
        keys = ChunkKeys("c", grid.get("separator", "/"), len(shape))
        rewritten = {k: v for k, v in meta.items() if k != "storage_transformers"}
        self.files[path] = json.dumps(rewritten, indent=4).encode()
        data = posixpath.join("data/root", name) if name else "data/root"
        array = ZarrArray(self.store, self.cache, data, tuple(shape), [level], keys, itemsize(meta.get("data_type")))
        self.providers[data] = array
        self.kinds.append(f"{name or '.'}: zarr v3 draft array, sharded")

    def _refuse(self, error: SourceError, root: bool) -> None:
        if root:
            raise error
        log.error("%s; served as it is stored", error)
        self.kinds.append(f"refused: {error}")

    def _array(self, directory: str, meta: dict, where: str) -> None:
        self.directories.add(directory)
        shape = meta.get("shape")
        if not isinstance(shape, list) or not all(isinstance(s, int) and 0 <= s < LARGEST for s in shape):
            raise SourceError(f"{where}: field 'shape' must be a list of non-negative integers")
        grid = meta.get("chunk_grid") or {}
        chunk_shape = (grid.get("configuration") or {}).get("chunk_shape")
        if grid.get("name") != "regular" or not positive_ints(chunk_shape, len(shape)):
            raise SourceError(f"{where}: field 'chunk_grid' must be regular, with a positive chunk size per dimension")
        codecs = meta.get("codecs")
        if not isinstance(codecs, list):
            raise SourceError(f"{where}: field 'codecs' must be a list")
        if unknown := unknown_codecs(codecs):
            why = f"{where}: field 'codecs' names unknown codec(s) {unknown} (known: {', '.join(KNOWN_CODECS)})"
            log.warning(
                "%s; a typo? its files are served as stored", why, extra={"event": "unknown_codec", "in_report": True}
            )
            self.kinds.append(f"warning: {why}")
        try:
            unsharded = unshard(codecs, tuple(chunk_shape))
            keys = ChunkKeys.from_json(meta.get("chunk_key_encoding"), len(shape))
            if unsharded is None:
                self.kinds.append(f"{directory or '.'}: zarr v3 array, unsharded (passes through)")
                source = SourceChunks(self.store, directory, keys, tuple(chunk_shape), tuple(shape))
                self._for_views(directory, meta, codecs, tuple(chunk_shape), source.chunk, source.stored, keys, where)
                return
            levels, inner_codecs = unsharded
        except Unsupported as e:
            log.error("%s: %s; served as it is stored", where, e)
            self.kinds.append(f"refused: {where}: {e}")
            return
        rewritten = copy.deepcopy(meta)
        rewritten["chunk_grid"]["configuration"]["chunk_shape"] = list(levels[-1].inner)
        rewritten["codecs"] = inner_codecs
        self.files[posixpath.join(directory, "zarr.json")] = json.dumps(rewritten, indent=2).encode()
        size = itemsize(meta.get("data_type"))
        array = ZarrArray(self.store, self.cache, directory, tuple(shape), levels, keys, size)
        self.providers[directory] = array
        self.kinds.append(
            f"{directory or '.'}: zarr v3 array, sharded ({len(levels)} level(s), {math.prod(shape)} elements)"
        )
        self._for_views(directory, meta, inner_codecs, array.inner, array.locate, array.present_under, keys, where)

    def _for_views(
        self, directory: str, meta: dict, codecs: list, chunks: tuple[int, ...],
        chunk: Callable[[tuple[int, ...]], File | None], stored: Callable[[tuple[int, ...]], Iterable[tuple[int, ...]]],
        keys: ChunkKeys, where: str,
    ) -> None:  # fmt: skip
        """Describe the array for --view n5/zarr2; one they cannot show is named in `shardfs info`."""
        try:
            dtype, compressor, opaque, decode = chunk_codecs(meta.get("data_type"), codecs, chunks)
            fill = fill_value(meta.get("fill_value"), dtype)
        except Unsupported as e:
            self.kinds.append(f"not in other views: {where}: {e}")
            return
        attributes = meta.get("attributes") or {}
        names = meta.get("dimension_names")
        if not (isinstance(names, list) and len(names) == len(chunks)) or not all(
            n is None or isinstance(n, str) for n in names
        ):
            names = None  # malformed names are the source's problem, not a reason to hide the array
        self.arrays[directory] = Array(
            tuple(meta["shape"]), chunks, dtype, fill, attributes, compressor, opaque, False, chunk, stored, True,
            decode, self.store.owner(directory), dimension_names=names and tuple(names), separator=keys.separator,
        )  # fmt: skip


@dataclass
class SourceChunks:
    """An unsharded array's chunks: one source file per chunk key."""

    store: Store
    directory: str
    keys: ChunkKeys
    chunks: tuple[int, ...]
    shape: tuple[int, ...]

    def chunk(self, pos: tuple[int, ...]) -> File | None:
        path = posixpath.join(self.directory, self.keys.key(pos))
        try:
            file = self.store.open(path)
        except FileNotFoundError:
            return None
        return RangeFile(file, 0, file.size)

    def stored(self, prefix: tuple[int, ...] = ()) -> Iterator[tuple[int, ...]]:
        """Positions of the chunk files that start with prefix: with `/` keys, only its directory is walked."""
        grid = [-(-s // c) for s, c in zip(self.shape, self.chunks, strict=True)]
        below = self.keys.key(prefix) if prefix and self.keys.separator == "/" else ""
        for path in files_below(self.store, posixpath.join(self.directory, below) if below else self.directory):
            parsed = self.keys.parse(path[len(self.directory) :].lstrip("/"))
            if parsed is None or not parsed[1] or parsed[0][: len(prefix)] != prefix:
                continue
            if all(p < g for p, g in zip(parsed[0], grid, strict=True)):
                yield parsed[0]


def chunk_codecs(
    data_type: Any, codecs: list, chunks: tuple[int, ...]
) -> tuple[np.dtype, Compressor | None, bool, Callable[[bytes, tuple[int, ...]], np.ndarray]]:
    """What a chunk's stored bytes are, for the views: (dtype in stored byte order, the one compressor over
    the raw bytes or None, whether they are neither (opaque), and how to decode them). Unsupported if they
    cannot be decoded here: array→array codecs, or an array→bytes codec other than `bytes`."""
    if itemsize(data_type) is None or np.dtype(data_type).kind not in "biuf":
        raise Unsupported(f"data type {data_type!r} has no equivalent in the other views")
    names = [_name(c) for c in codecs]
    if not names or names[0] != "bytes" or any(n not in UNDO for n in names[1:]):
        raise Unsupported(f"codecs {names} are not `bytes` followed by gzip, zstd, blosc or crc32c")
    config = codecs[0].get("configuration") if isinstance(codecs[0], dict) else None
    endian = (config or {}).get("endian", "little")
    dtype = np.dtype(data_type).newbyteorder("<" if endian == "little" else ">")
    post = tuple(names[1:])
    compressor = None
    if len(post) == 1 and post[0] != "crc32c":
        config = codecs[1].get("configuration") if isinstance(codecs[1], dict) else None
        compressor = Compressor(post[0], config or {})
    limit = 2 * math.prod(chunks) * dtype.itemsize + (1 << 20)

    def decode(data: bytes, shape: tuple[int, ...]) -> np.ndarray:
        raw = decode_blob(data, post, limit)
        if len(raw) != math.prod(shape) * dtype.itemsize:
            raise ValueError(f"decodes to {len(raw)} bytes, not the {math.prod(shape)} elements of {list(shape)}")
        return np.frombuffer(raw, dtype).reshape(shape)

    return dtype, compressor, bool(post) and compressor is None, decode


def fill_value(value: Any, dtype: np.dtype) -> Any:
    """A zarr v3 fill value as a Python number or bool; NaN and the infinities are spelled as strings there."""
    if isinstance(value, str) and value in ("NaN", "Infinity", "-Infinity") and dtype.kind == "f":
        return float(value.replace("Infinity", "inf"))
    if isinstance(value, bool | int | float) and not (isinstance(value, float) and dtype.kind in "biu"):
        return dtype.type(value).item()
    raise Unsupported(f"fill_value {value!r} is not a plain number for {dtype.name}")


def open_zarr(store: Store, cache: ByteCache) -> ZarrPlan:
    plan = ZarrPlan(store, cache, format="zarr")
    plan.walk()
    return plan
