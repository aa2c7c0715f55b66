"""`neuroglancer_uint64_sharded_v1`: which shard and minishard hold a key, what a shard file is called, and
how its indexes decode. Reading shards is `neuroglancer_kv.py`'s.

Everything read from a shard is untrusted: offsets and sizes are checked against the file's real
size before anything is read or allocated, and a contradiction raises `CorruptChunk` for that key
alone.
"""

from __future__ import annotations

import re
import sys
from array import array
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

import mmh3
import numpy as np

from shardfs.errors import SourceError

UINT64_MAX = (1 << 64) - 1
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


def non_empty(rows: np.ndarray) -> np.ndarray:
    """A shard index's rows of minishards that hold something (an empty one's start is its end)."""
    return rows[rows[:, 1] != rows[:, 0]]


def preceding_ends(rows: np.ndarray) -> np.ndarray:
    """The sorted ends of a shard index's non-empty rows: where each minishard index ends, relative to the end of
    the shard index (see span_start)."""
    return np.sort(non_empty(rows)[:, 1])


def span_start(ends: np.ndarray, start: int) -> int:
    """Where the bytes that lie between the minishard index before (the one ending last at or before start) and
    a minishard index starting at start begin, relative to the end of the shard index: 0 if none ends before.
    In tensorstore's layout a minishard's chunks are exactly those bytes; the spec promises no layout, so what
    is read there is checked against the decoded index before it is used."""
    i = int(np.searchsorted(ends, start, side="right"))
    return int(ends[i - 1]) if i else 0


def adjacent(rows: np.ndarray, index_size: int, size: int) -> tuple[int, int] | None:
    """Where in the file a shard index's non-empty rows are, [start, stop), if they follow one another with no
    gap (in any order), inside the file and within MINISHARD_BATCH bytes; else None."""
    used = non_empty(rows)
    if len(used) < 2 or (used[:, 0] > used[:, 1]).any():
        return None
    used = used[np.argsort(used[:, 0], kind="stable")]
    if (used[1:, 0] != used[:-1, 1]).any():
        return None
    start, stop = int(used[0, 0]) + index_size, int(used[-1, 1]) + index_size
    return (start, stop) if stop - start <= MINISHARD_BATCH and stop <= size else None
