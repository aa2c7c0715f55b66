"""Neuroglancer precomputed sharded directories shown as one file per stored key, named as the unsharded
layout names them: chunks, skeletons, annotations, and multi-resolution meshes' manifests and fragments."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardfs.errors import CorruptChunk
from shardfs.files import BytesFile, File, LazyFile, RangeFile
from shardfs.formats.plan import extent_file
from shardfs.formats.precomputed_names import Naming, VolumeChunks
from shardfs.request import OWN, Request
from shardfs.shards.kv import Extent, Fetch
from shardfs.shards.neuroglancer_kv import NeuroglancerKV


def chunk_file(kv: NeuroglancerKV, chunk: Extent, request: Request = OWN) -> File:
    """A raw chunk is read straight from its shard, or cut from its minishard's bytes where they came with the
    index; a gzip one is decoded now, because its size is needed for stat anyway, and the node cache then
    serves every read of it."""
    if kv.spec.data_encoding == "raw":
        return extent_file(chunk, kv)
    return BytesFile(kv.value(chunk, request), chunk.file.owner, chunk.shard)


@dataclass
class ChunkDir:
    """A sharded directory shown as one file per stored key; the shard files themselves are hidden."""

    kv: NeuroglancerKV
    naming: Naming
    kind: str
    details: dict[str, Any] = field(default_factory=dict)
    raw_voxel_bytes: int = 0  # a volume scale of `encoding: raw`: bytes a voxel decodes to (channels included)

    def hides(self, rel: str) -> bool:
        return rel.endswith(".shard") or self.kv.spec.shard_file(rel) is not None  # and the earlier layout's pairs

    def describe(self) -> dict[str, Any]:
        spec = self.kv.spec
        return {
            **self.details,
            "sharding": f"hash={spec.hash} preshift_bits={spec.preshift_bits} minishard_bits={spec.minishard_bits}"
            f" shard_bits={spec.shard_bits} minishard_index={spec.minishard_index_encoding} data={spec.data_encoding}",
            "shard files": f"{sum(1 for _ in self.kv.shards())} present of {1 << spec.shard_bits}",
        }

    def entries(self, rel: str) -> Iterator[tuple[str, bool]]:
        """Chunk files live in the directory itself; its subdirectories are the source's alone."""
        return ((name, False) for name in self.names()) if not rel else iter(())

    def key_of(self, rel: str) -> int | None:
        return self.naming.key(rel)

    def rel_of(self, key: int) -> str | None:
        return self.naming.name(key)

    def child(self, name: str, request: Request = OWN) -> File | None:
        key = self.key_of(name)
        return None if key is None else self.file_of(key, request)

    def file_of(self, key: int, request: Request = OWN) -> File:
        chunk = self._stored(key, request)
        if self.raw_voxel_bytes and self.kv.spec.data_encoding == "gzip" and isinstance(self.naming, VolumeChunks):
            return self._decoded_on_read(chunk, self.naming.voxels(key) * self.raw_voxel_bytes)
        return chunk_file(self.kv, chunk, request)

    def _decoded_on_read(self, chunk: Extent, length: int) -> File:
        """A gzip chunk of raw voxels: its size is known from the grid, so a lookup fetches nothing; the
        read fetches and decodes it. A chunk that does not
        decode to that size is corrupt: EIO when read."""

        def make(request: Request) -> bytes:
            value = self.kv.value(chunk, request)
            if len(value) != length:
                raise CorruptChunk(
                    chunk.shard, chunk.key, f"decodes to {len(value)} bytes, not {length} raw voxel bytes"
                )
            return value

        return LazyFile(
            length, self.kv.cache, self.kv.cache_key("value", chunk.file, chunk.key), make, 0, chunk.file.owner
        )

    def prefetch(self, keys: list[int]) -> list[Fetch]:
        return self.kv.fetches(keys)

    def position_of(self, key: int) -> tuple[int, ...] | None:
        return self.naming.morton.decode(key) if isinstance(self.naming, VolumeChunks) else None

    def key_at(self, position: tuple[int, ...]) -> int | None:
        if not isinstance(self.naming, VolumeChunks) or not self.naming.morton.contains(position):
            return None
        return self.naming.morton.encode(position)

    def _stored(self, key: int, request: Request) -> Extent:
        """Where key's bytes are; a key not stored is ENOENT."""
        chunk = self.kv.locate(key, request)
        if chunk is None:
            raise FileNotFoundError(f"key {key}")
        return chunk

    def names(self) -> Iterator[str]:
        for key in self.kv.stored_keys():
            name = self.naming.name(key)
            if name is not None:
                yield name


class MeshDir(ChunkDir):
    """Multi-resolution meshes: `<id>.index` is the stored manifest and `<id>` the fragment data
    stored raw just before it, as long as the manifest's fragment sizes add up to."""

    def key_of(self, rel: str) -> int | None:
        """Twice the segment id, and one more for its manifest."""
        base, dot, ext = rel.partition(".")
        key = self.naming.key(base)
        if key is None or (dot and ext != "index"):
            return None
        return 2 * key + bool(dot)

    def rel_of(self, key: int) -> str | None:
        name = self.naming.name(key >> 1)
        return None if name is None else f"{name}.index" if key & 1 else name

    def file_of(self, number: int, request: Request = OWN) -> File:
        key = number >> 1
        chunk = self._stored(key, request)
        if number & 1:
            return chunk_file(self.kv, chunk, request)
        length = fragment_bytes(self.kv.value(chunk, request))
        if length is None or length > chunk.start - self.kv.spec.shard_index_size:
            raise CorruptChunk(chunk.shard, key, "manifest's fragment sizes overrun the data before it")
        return RangeFile(chunk.file, chunk.start - length, chunk.start)

    def prefetch(self, numbers: list[int]) -> list[Fetch]:
        """The manifests fetched ahead, named as `<id>.index` (the fragment data is read when asked)."""
        ids = list(dict.fromkeys(number >> 1 for number in numbers))
        return [fetch.renamed(lambda key: 2 * int(key) + 1) for fetch in self.kv.fetches(ids)]  # type: ignore[call-overload]

    def names(self) -> Iterator[str]:
        for name in super().names():
            yield f"{name}.index"
            yield name


def fragment_bytes(manifest: bytes) -> int | None:
    """Sum of fragment sizes in a multi-LOD manifest, or None if the manifest is malformed.
    Layout: chunk_shape 3f, grid_origin 3f, num_lods u4, lod_scales, vertex_offsets[lod][3],
    num_fragments_per_lod, then per LOD fragment_positions[3][n] u4 and fragment_offsets[n] u4."""
    try:
        num_lods = int(np.frombuffer(manifest, "<u4", 1, 24)[0])
        at = 28 + 16 * num_lods
        counts = np.frombuffer(manifest, "<u4", num_lods, at).tolist()
        at += 4 * num_lods
        total = 0
        for n in counts:
            total += int(np.frombuffer(manifest, "<u4", n, at + 12 * n).sum(dtype=np.int64))
            at += 16 * n
    except ValueError:
        return None
    return total if at == len(manifest) else None
