"""Zarr v3 `sharding_indexed`: where an inner chunk's bytes are within a shard, or that it is absent; what
chunk and shard files are called. Reading shards is `zarr_kv.py`'s.

The index is `chunks_per_shard + [2]` uint64 (offset, nbytes) in C order, at the end or the start
of the shard, optionally followed by a crc32c of it; offsets are absolute within the shard and
2^64-1 in both fields marks an empty chunk.
"""

from __future__ import annotations

import functools
import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardfs.cache import ByteCache
from shardfs.codecs import UNDO, crc32c
from shardfs.errors import Unsupported
from shardfs.request import OWN, Request
from shardfs.shards.grid import grid_position

EMPTY = (1 << 64) - 1


@dataclass(frozen=True)
class IndexLayout:
    """How one sharding level stores its index."""

    chunks_per_shard: tuple[int, ...]
    at_start: bool = False
    checksum: bool = True
    big_endian: bool = False

    @property
    def entries(self) -> int:
        return math.prod(self.chunks_per_shard)

    @property
    def size(self) -> int:
        return 16 * self.entries + (4 if self.checksum else 0)

    def where(self, shard_size: int) -> tuple[int, int]:
        """The index's byte range in a shard of shard_size bytes; ValueError if it cannot fit."""
        if shard_size < self.size:
            raise ValueError(f"shard is {shard_size} bytes, shorter than its {self.size}-byte index")
        return (0, self.size) if self.at_start else (shard_size - self.size, shard_size)

    def decode(self, raw: bytes) -> bytes:
        """The verified offset/nbytes table, as stored; ValueError on a checksum mismatch."""
        table = raw[: 16 * self.entries]
        if self.checksum and crc32c(table) != int.from_bytes(raw[-4:], "little"):
            raise ValueError("shard index checksum (crc32c) does not match")
        return table

    def entry(self, table: bytes, i: int) -> tuple[int, int] | None:
        """(offset, nbytes) of entry i, or None if it is empty."""
        offset, nbytes = struct.unpack_from(">QQ" if self.big_endian else "<QQ", table, 16 * i)
        return None if offset == EMPTY and nbytes == EMPTY else (offset, nbytes)

    def present(self, table: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Of the non-empty entries: their numbers (n,), positions within the shard (n, ndim), and
        (offset, nbytes) rows (n, 2)."""
        rows = np.frombuffer(table, ">u8" if self.big_endian else "<u8").reshape(-1, 2)
        filled = np.flatnonzero(~((rows[:, 0] == EMPTY) & (rows[:, 1] == EMPTY)))
        if not self.chunks_per_shard:  # a 0-d array: one entry, no coordinates
            return filled, np.zeros((len(filled), 0), np.int64), rows[filled]
        return filled, np.stack(np.unravel_index(filled, self.chunks_per_shard), axis=-1), rows[filled]


@dataclass(frozen=True)
class Level:
    """One `sharding_indexed` level: shards of `shape` hold chunks of `inner`; `post` are the bytes→bytes
    codecs that encode each whole shard blob of this level."""

    shape: tuple[int, ...]
    inner: tuple[int, ...]
    layout: IndexLayout
    post: tuple[str, ...]


def decode_blob(
    data: bytes, post: tuple[str, ...], limit: int, request: Request = OWN, cache: ByteCache | None = None
) -> bytes:  # fmt: skip
    """Undo the bytes→bytes codecs that follow a sharding codec, last first, each bounded by limit, all by
    request's budget; a large output in cache's turn (see codecs.gunzip)."""
    for name in reversed(post):
        data = UNDO[name](data, limit, request, cache)
    return data


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
        name = encoding.get("name") if isinstance(encoding, dict) else encoding
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
