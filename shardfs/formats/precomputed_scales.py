"""A Neuroglancer precomputed volume scale as an array, for the other views: its chunks, sharded or one
source file each (`.gz` ones decoded), and how their encodings decode."""

from __future__ import annotations

import posixpath
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from shardfs.cache import ByteCache
from shardfs.codecs import gunzip
from shardfs.errors import CorruptChunk
from shardfs.files import BytesFile, File, RangeFile
from shardfs.formats.encodings import decode_precomputed
from shardfs.formats.plan import Array
from shardfs.formats.precomputed_dirs import chunk_file
from shardfs.formats.precomputed_info import Grid, Scale, Volume
from shardfs.formats.precomputed_names import VolumeChunks
from shardfs.request import OWN, Request
from shardfs.shards.kv import Fetch
from shardfs.shards.neuroglancer_kv import NeuroglancerKV
from shardfs.stores.protocol import Store


@dataclass
class VolumeScale:
    """A volume scale as an array in C order: (z, y, x), or (c, z, y, x) with several channels. That is
    the memory order of a raw precomputed chunk, so raw chunks need no reordering anywhere."""

    store: Store
    naming: VolumeChunks
    kv: NeuroglancerKV | None  # None: an unsharded scale, one source file per chunk
    volume: Volume
    scale: Scale  # one with a grid
    chunk_limit: int  # the most one chunk may decode to
    cache: ByteCache  # the mount's: a large chunk decodes in its turn
    directory: str = field(init=False)
    grid: Grid = field(init=False)
    channels: int = field(init=False)

    def __post_init__(self) -> None:
        assert self.scale.grid is not None, self.scale
        self.directory, self.grid, self.channels = self.scale.directory, self.scale.grid, self.volume.channels

    def array(self) -> Array:
        lead = (self.channels,) if self.channels > 1 else ()
        return Array(
            shape=(*lead, *self.naming.size[::-1]),
            chunks=(*lead, *self.naming.chunk[::-1]),
            dtype=np.dtype(self.volume.data_type).newbyteorder("<"),
            fill_value=0,
            attributes={},
            compressor=None,
            opaque=self.grid.encoding != "raw",
            clipped=True,
            chunk=self.chunk,
            stored=self.stored,
            narrows=False,
            decode=self.decode,
            owner=self.store.owner(self.directory),
            multiscale={"resolution": list(self.grid.resolution), "voxel_offset": self.naming.offset},
            prefetch=self.prefetch,
        )

    def prefetch(self, positions: list[tuple[int, ...]]) -> list[Fetch]:
        """Chunks fetched ahead by position (a view's read-ahead); an unsharded scale's files are read as asked."""
        if self.kv is None:
            return []
        keys = {self.naming.morton.encode(list(pos[::-1][:3])): pos for pos in positions}
        return [fetch.renamed(keys.__getitem__) for fetch in self.kv.fetches(list(keys))]

    def chunk(self, pos: tuple[int, ...], request: Request = OWN) -> File | None:
        xyz = list(pos[::-1][:3])
        if self.kv is not None:
            found = self.kv.locate(self.naming.morton.encode(xyz), request)
            return None if found is None else chunk_file(self.kv, found, request)
        path = posixpath.join(self.directory, self.naming.name_of(xyz))
        for name, gzipped in ((path, False), (f"{path}.gz", True)):
            try:
                file = self.store.open(name)
            except FileNotFoundError:
                continue
            if not gzipped:
                return RangeFile(file, 0, file.size)
            try:
                data = gunzip(file.pieces(0, file.size, request), self.chunk_limit, request, self.cache)
                return BytesFile(data, file.owner, name)
            except ValueError as e:
                raise CorruptChunk(name, xyz, str(e)) from e
        return None

    def stored(self, prefix: tuple[int, ...] = ()) -> Iterator[tuple[int, ...]]:
        """Positions of the stored chunks that start with prefix: the shard index or the directory is read
        whole (Morton order has no prefix to narrow it by), and filtered."""
        lead = (0,) if self.channels > 1 else ()
        if self.kv is not None:
            codes: Iterator[int | None] = iter(self.kv.stored_keys())
        else:
            codes = (self.naming.key(name.removesuffix(".gz")) for name, _ in self.store.list(self.directory))
        for code in codes:
            xyz = None if code is None else self.naming.morton.decode(code)
            if xyz is not None and (pos := (*lead, *xyz[::-1]))[: len(prefix)] == prefix:
                yield pos

    def decode(self, data: bytes, shape: tuple[int, ...], request: Request = OWN) -> np.ndarray:
        """The encodings of precomputed (raw, jpeg, compressed_segmentation, ...) decode to the chunk's known
        size: nothing is counted against request."""
        x, y, z = shape[::-1][:3]
        decoded = decode_precomputed(
            data, self.grid.encoding, (x, y, z, self.channels), np.dtype(self.volume.data_type), self.scale.document
        )
        return decoded.reshape(shape)
