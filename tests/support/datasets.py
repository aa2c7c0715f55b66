"""Small datasets' maths, owing nothing to shardfs: where a key lies by the spec (its shard and minishard, its
byte range), the small gzip volume of conftest's `pristine` and its chunks by shard, a shard replaced as a
writer uploads one, and zarr v3 shard indexes edited. Peer writers live in tests/support/peers.py."""

from __future__ import annotations

import itertools
import os
import struct
from collections.abc import Callable
from pathlib import Path

import mmh3
import numpy as np
import tensorstore as ts
import zarr
from google_crc32c import value as crc32c
from zarr.codecs import ShardingCodec

from tests.support import peers


def home(spec: dict, key: int) -> tuple[int, int]:
    """(shard, minishard) of a key, by the spec's maths written out here, owing nothing to shardfs."""
    hashed = mmh3.hash64((key >> spec["preshift_bits"]).to_bytes(8, "little"), 0, False, False)[0]
    return (hashed >> spec["minishard_bits"]) & ((1 << spec["shard_bits"]) - 1), hashed & (
        (1 << spec["minishard_bits"]) - 1
    )


def replace(shard: Path, twin_chunk: Path, grow: bool) -> None:
    """A new object under the same name, as a writer uploads one: the chunk's bytes inverted (its indexes
    unchanged, so an old index finds other bytes there), a new file (a new ETag), modified 10 s later (a new
    Last-Modified), one byte longer if grow, else of the same size."""
    data = bytearray(shard.read_bytes())
    chunk = twin_chunk.read_bytes()
    at = data.find(chunk)
    assert at >= 0 and data.find(chunk, at + 1) < 0
    data[at : at + len(chunk)] = bytes(b ^ 0xFF for b in chunk)
    when = int(shard.stat().st_mtime) + 10
    fresh = shard.with_name(shard.name + ".new")
    fresh.write_bytes(bytes(data) + (b"\0" if grow else b""))
    os.utime(fresh, (when, when))
    os.replace(fresh, shard)


SHARDING = {
    "@type": "neuroglancer_uint64_sharded_v1",
    "preshift_bits": 0,
    "hash": "identity",  # keys spread predictably over 4 shards x 2 minishards
    "minishard_bits": 1,
    "shard_bits": 2,
    "minishard_index_encoding": "raw",
    "data_encoding": "gzip",
}


GRID = (4, 4, 1)  # chunks of 16 x 16 x 16 in a 64 x 64 x 16 volume


def write_small_volume(root: Path, data: np.ndarray, sharding: dict | None) -> None:
    scale = {"size": [64, 64, 16], "chunk_size": [16, 16, 16], "resolution": [1, 1, 1], "encoding": "raw"}
    store = ts.open(
        {
            "driver": "neuroglancer_precomputed",
            "kvstore": f"file://{root}",
            "multiscale_metadata": {"type": "image", "data_type": "uint8", "num_channels": 1},
            "scale_metadata": {**scale, "sharding": sharding} if sharding else scale,
            "create": True,
        }
    ).result()
    store[...] = data


def stored_range(shard: bytes, key: int) -> tuple[int, int]:
    """[start, stop) of key in a shard of two raw minishards, decoded as the spec describes: the shard index
    gives each minishard index's range after the 32-byte shard index; its rows are key deltas, start deltas
    (from the end of the previous chunk, the first from the end of the shard index) and sizes."""
    lo, hi = struct.unpack_from("<QQ", shard, 16 * (key & 1))
    deltas, gaps, sizes = np.frombuffer(shard, "<u8", (hi - lo) // 8, 32 + lo).reshape(3, -1).astype(np.int64)
    stops = 32 + np.cumsum(gaps + sizes)
    i = int(np.flatnonzero(np.cumsum(deltas) == key)[0])
    return int(stops[i] - sizes[i]), int(stops[i])


def chunks_by_shard(root: Path) -> dict[str, list[tuple[str, int, int, int]]]:
    """(name, key, start, stop) of every chunk, by shard file, from the pristine copy and the spec's maths alone:
    shard by peers.volume_chunk_shards, key the compressed Morton code, the byte range by `stored_range`."""
    shard_of = peers.volume_chunk_shards(root, "1_1_1")
    found: dict[str, list] = {}
    for pos in itertools.product(*map(range, GRID)):
        name = "_".join(f"{16 * p}-{16 * p + 16}" for p in pos)
        key = peers.compressed_morton_code(pos, GRID)
        start, stop = stored_range((root / "1_1_1" / shard_of[name]).read_bytes(), key)
        found.setdefault(shard_of[name], []).append((name, key, start, stop))
    assert sorted(found) == ["0.shard", "1.shard", "2.shard", "3.shard"]
    return found


def innermost(array: zarr.Array) -> tuple[int, ...]:
    codec = array.metadata.codecs[0]
    while isinstance(codec, ShardingCodec):
        shape = codec.chunk_shape
        codec = codec.codecs[0]
    return tuple(shape)


def rewrite_index(path: Path, edit: Callable[[np.ndarray], None], cps: int) -> None:
    """Edit a shard's index table and store a matching crc32c, so only the edit is wrong."""
    data = bytearray(path.read_bytes())
    at = len(data) - (16 * cps + 4)
    table = np.frombuffer(bytes(data[at : at + 16 * cps]), "<u8").reshape(-1, 2).copy()
    edit(table)
    data[at : at + 16 * cps] = table.tobytes()
    data[-4:] = struct.pack("<I", crc32c(bytes(data[at : at + 16 * cps])))
    path.write_bytes(bytes(data))
