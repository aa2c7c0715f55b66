"""Zarr v3 `sharding_indexed`: where an inner chunk's bytes are within a shard, or that it is absent.

The index is `chunks_per_shard + [2]` uint64 (offset, nbytes) in C order, at the end or the start
of the shard, optionally followed by a crc32c of it; offsets are absolute within the shard and
2^64-1 in both fields marks an empty chunk.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import numpy as np

from shardfs.codecs import crc32c

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
