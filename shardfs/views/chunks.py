"""What the views share: a source array's chunk, copied as stored when its bytes fit the view, else
decoded and re-laid; and the files that carry either without decoding twice."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from shardfs.cache import ByteCache
from shardfs.errors import CorruptChunk
from shardfs.files import File
from shardfs.formats.plan import Array, Compressor
from shardfs.request import OWN, Request
from shardfs.stores.protocol import Owner

BLOSC_SHUFFLE = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}


@dataclass(slots=True)
class PrefixedFile:
    """A stored chunk behind a header of the view's own (N5's block header): zero-copy."""

    head: bytes
    body: File

    @property
    def owner(self) -> Owner:
        return self.body.owner

    def size(self) -> int:
        return len(self.head) + self.body.size()

    def read(self, offset: int, length: int, request: Request = OWN) -> bytes:
        n = len(self.head)
        if offset >= n:
            return self.body.read(offset - n, length, request)
        return self.head[offset : offset + length] + self.body.read(0, max(0, offset + length - n), request)


def edge_shape(array: Array, pos: tuple[int, ...]) -> tuple[int, ...]:
    """The part of chunk pos that lies inside the array."""
    return tuple(min(c, s - p * c) for p, c, s in zip(pos, array.chunks, array.shape, strict=True))


def decoded(array: Array, pos: tuple[int, ...], stored: File, request: Request = OWN) -> np.ndarray:
    """The values of a stored chunk, clipped to the array; a chunk that does not decode is CorruptChunk,
    naming its shard (or file) and position, so the read gives EIO and the log says where."""
    inside = edge_shape(array, pos)
    shape = inside if array.clipped else array.chunks
    try:
        values = array.decode(stored.read(0, stored.size(), request), shape, request)
    except ValueError as e:
        raise CorruptChunk(getattr(stored, "path", "") or "?", f"chunk {list(pos)}", str(e)) from e
    return values[tuple(slice(0, n) for n in inside)]


def numcodecs_config(compressor: Compressor) -> dict[str, Any]:
    """A zarr v3 compressor as numcodecs (and so zarr v2) configures it: the same bytes, another name."""
    config = compressor.config
    if compressor.name == "gzip":
        return {"id": "gzip", "level": config.get("level", 5)}
    if compressor.name == "zstd":
        return {"id": "zstd", "level": config.get("level", 0)}
    return {
        "id": "blosc",
        "cname": config.get("cname", "lz4"),
        "clevel": config.get("clevel", 5),
        "shuffle": BLOSC_SHUFFLE.get(config.get("shuffle", "noshuffle"), 0),
        "blocksize": config.get("blocksize", 0),
    }


def encode(compressor: Compressor, values: np.ndarray) -> bytes:
    """Compress values as the source's compressor did (blosc shuffles by their item size)."""
    import numcodecs  # on first use: its import costs every CLI command 0.2 s of CPU

    return bytes(numcodecs.get_codec(numcodecs_config(compressor)).encode(np.ascontiguousarray(values)))


def stored_under(array: Array, cache: ByteCache, key: tuple, prefix: tuple[int, ...]) -> Iterable[tuple[int, ...]]:
    """Positions of an array's stored chunks that start with prefix. A source that cannot narrow a listing by
    prefix (precomputed) is read whole once, into the byte-bounded cache as one array of positions, which
    each directory of a nested listing filters, so that `find` reads it once, not once per directory. More
    positions than one cached value may hold are filtered as they stream, every time."""
    if array.narrows:
        return array.stored(prefix)
    positions = stored_positions(array, cache, key)
    if positions is None:
        return (pos for pos in array.stored(()) if pos[: len(prefix)] == prefix)
    if prefix:
        positions = positions[(positions[:, : len(prefix)] == prefix).all(axis=1)]
    return map(tuple, positions.tolist())


def stored_positions(array: Array, cache: ByteCache, key: tuple) -> np.ndarray | None:
    """Every stored position of the array, (n, ndim) int64, read once into the byte-bounded cache; None if
    there are more than one cached value may hold."""
    return cache.get_or_make(key, lambda: _positions(array, cache.max_value))


def _positions(array: Array, limit: int) -> np.ndarray | None:
    """Every stored position of the array, (n, ndim) int64, or None past limit bytes."""
    ndim = len(array.shape)
    blocks, pending = [], []
    for count, pos in enumerate(array.stored(()), 1):
        pending.append(pos)
        if count * ndim * 8 > limit:
            return None
        if len(pending) == 65536:  # a tuple costs ten times its row of int64: packed as they come
            blocks.append(np.array(pending, np.int64))
            pending = []
    blocks.append(np.array(pending, np.int64).reshape(-1, ndim))
    return np.concatenate(blocks)


def next_level(at: tuple[int, ...], ndim: int, paths: Iterable[tuple[int, ...]]) -> Iterator[tuple[str, bool]]:
    """(name, is_dir) of the entries of directory `at` of chunk files nested one directory per dimension
    (`0/1/2`), given the grid paths of the chunks stored: the next index of those below it."""
    depth = len(at)
    for i in sorted({path[depth] for path in paths if path[:depth] == at}):
        yield str(i), depth + 1 < ndim


def number(value: Fraction) -> int | float:
    """An exact ratio as JSON writes it: whole numbers as integers."""
    return int(value) if value.denominator == 1 else float(value)


def nbytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    return math.prod(shape) * dtype.itemsize
