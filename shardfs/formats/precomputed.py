"""Neuroglancer precomputed: which directories are sharded, what their chunks are called unsharded,
and every `info` rewritten without `sharding`, so that readers take the unsharded path."""

from __future__ import annotations

import json
import logging
import math
import posixpath
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol

import numpy as np

from shardfs.cache import ByteCache
from shardfs.codecs import gunzip
from shardfs.errors import CorruptChunk, SourceError
from shardfs.formats import encodings
from shardfs.formats.encodings import decode_precomputed
from shardfs.formats.plan import LARGEST, Array, Plan, load_json
from shardfs.shards.morton import MortonCode
from shardfs.shards.neuroglancer import UINT64_MAX, Chunk, ShardedKV, ShardingSpec
from shardfs.stores.protocol import Store
from shardfs.tree import BytesFile, File, LazyFile, RangeFile

log = logging.getLogger("shardfs")

VOXEL_BYTES = {"uint8": 1, "int8": 1, "uint16": 2, "int16": 2, "uint32": 4, "int32": 4, "uint64": 8, "int64": 8,
               "float32": 4, "float64": 8}  # fmt: skip

# ---------------------------------------------------------------------------------------------------------------------
# Names of keys in the unsharded layout


class Naming(Protocol):
    def key(self, name: str) -> int | None:
        """The key a file name stands for, or None if the name is not one of ours."""

    def name(self, key: int) -> str | None:
        """The file name of a key, or None if the key names nothing (outside the grid)."""


class SegmentIds:
    """Meshes, skeletons, annotation ids and bare keys: the key in decimal."""

    def key(self, name: str) -> int | None:
        if not (name.isascii() and name.isdigit()):
            return None
        key = int(name)
        return key if key <= UINT64_MAX and str(key) == name else None

    def name(self, key: int) -> str:
        return str(key)


class GridCells:
    """Annotation spatial levels: `x_y_z`, keyed by the compressed Morton code over the level's grid."""

    def __init__(self, grid_shape: list[int]) -> None:
        self.morton = MortonCode(grid_shape)

    def key(self, name: str) -> int | None:
        try:
            pos = [int(p) for p in name.split("_")]
        except ValueError:
            return None
        if not self.morton.contains(pos) or "_".join(map(str, pos)) != name:
            return None
        return self.morton.encode(pos)

    def name(self, key: int) -> str | None:
        pos = self.morton.decode(key)
        return None if pos is None else "_".join(map(str, pos))


_INT = r"(0|-?[1-9][0-9]*)"  # canonical decimals only: one chunk, one name
_VOLUME_NAME = re.compile(f"{_INT}-{_INT}_{_INT}-{_INT}_{_INT}-{_INT}")


TABLE_CELLS = 1 << 13  # grid cells along all three dimensions up to which names are parsed by table


class VolumeChunks:
    """Volume scales: `x0-x1_y0-y1_z0-z1` in absolute voxels, clipped at the upper bound."""

    def __init__(self, size: list[int], chunk: list[int], offset: list[int], table_cells: int = TABLE_CELLS) -> None:
        self.size, self.chunk, self.offset = size, chunk, offset
        self._dims = list(zip(chunk, offset, size, strict=True))
        self.grid = [-(-s // c) for s, c in zip(size, chunk, strict=True)]
        self.morton = MortonCode(self.grid)
        self._table_cells = table_cells

    @cached_property
    def _tables(self) -> list[dict[str, tuple[int, int]]] | None:
        """Per dimension, "x0-x1" → (its bits of the key, its width in voxels): a cold lookup parses every
        name, and three dict probes cost a tenth of parsing and checking the numbers. Made at first use, not
        at mount: at most 1.6 MB and 70 ms (kept for the mount's life, outside the cache budget); grids
        longer than TABLE_CELLS are parsed."""
        if sum(self.grid) > self._table_cells:
            return None
        tables = []
        for d, n in enumerate(self.grid):
            c, _, s = self._dims[d]
            tables.append({self._bounds(d, p): (self.morton.encode(_along(d, p)), min(c, s - p * c)) for p in range(n)})
        return tables

    @cached_property
    def _names(self) -> list[list[str]] | None:
        """Per dimension, "x0-x1" of each grid position (the tables' keys, in order): a name is made of three,
        for every listed chunk and every read of a chunk the kernel holds by node id."""
        tables = self._tables
        return None if tables is None else [list(table) for table in tables]

    def _bounds(self, d: int, p: int) -> str:
        c, o, s = self._dims[d]
        return f"{o + p * c}-{o + min((p + 1) * c, s)}"

    def name_of(self, pos: Sequence[int]) -> str:
        return "_".join(self._bounds(d, p) for d, p in enumerate(pos))

    def voxels(self, name: str) -> int:
        """Voxels in the chunk a valid name names, clipped at the volume's upper bound as it is stored."""
        tables = self._tables
        if tables is not None:
            a, b, c = name.split("_")
            return tables[0][a][1] * tables[1][b][1] * tables[2][c][1]
        pos = self.morton.decode(self.key(name))  # type: ignore[arg-type]
        assert pos is not None, name
        return math.prod(min(c, s - p * c) for p, (c, _, s) in zip(pos, self._dims, strict=True))

    def key(self, name: str) -> int | None:
        tables = self._tables
        if tables is not None:
            x, y, z = tables
            parts = name.split("_")
            try:
                return x[parts[0]][0] | y[parts[1]][0] | z[parts[2]][0] if len(parts) == 3 else None
            except KeyError:
                return None
        m = _VOLUME_NAME.fullmatch(name)
        if m is None:
            return None
        bounds = list(map(int, m.groups()))
        pos = []
        for lo, hi, (c, o, s) in zip(bounds[0::2], bounds[1::2], self._dims, strict=True):
            p, misaligned = divmod(lo - o, c)
            if misaligned or not 0 <= p * c < s or hi != o + min(p * c + c, s):  # aligned, inside, clipped
                return None
            pos.append(p)
        return self.morton.encode(pos)

    def name(self, key: int) -> str | None:
        pos = self.morton.decode(key)
        if pos is None:
            return None
        names = self._names
        if names is None:
            return self.name_of(pos)
        x, y, z = names
        return f"{x[pos[0]]}_{y[pos[1]]}_{z[pos[2]]}"


def _along(d: int, p: int) -> list[int]:
    """The grid position p cells along dimension d, 0 along the others."""
    pos = [0, 0, 0]
    pos[d] = p
    return pos


# ---------------------------------------------------------------------------------------------------------------------
# Sharded directories as one file per key


def chunk_file(kv: ShardedKV, chunk: Chunk) -> File:
    """A raw chunk is read straight from its shard; a gzip one is decoded now, because its size is
    needed for stat anyway, and the node cache then serves every read of it."""
    if kv.spec.data_encoding == "raw":
        return RangeFile(chunk.file, chunk.start, chunk.stop)
    return BytesFile(kv.value(chunk), chunk.file.owner, chunk.shard)


@dataclass
class ChunkDir:
    """A sharded directory shown as one file per stored key; the shard files themselves are hidden."""

    kv: ShardedKV
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

    def child(self, name: str) -> File | None:
        key = self.naming.key(name)
        if key is None:
            return None
        chunk = self._stored(key, name)
        if self.raw_voxel_bytes and self.kv.spec.data_encoding == "gzip" and isinstance(self.naming, VolumeChunks):
            return self._decoded_on_read(chunk, self.naming.voxels(name) * self.raw_voxel_bytes)
        return chunk_file(self.kv, chunk)

    def _decoded_on_read(self, chunk: Chunk, length: int) -> File:
        """A gzip chunk of raw voxels: its size is known from the grid, so a lookup fetches nothing; the
        read fetches and decodes it. A chunk that does not
        decode to that size is corrupt: EIO when read."""

        def make() -> bytes:
            value = self.kv.value(chunk)
            if len(value) != length:
                raise CorruptChunk(
                    chunk.shard, chunk.key, f"decodes to {len(value)} bytes, not {length} raw voxel bytes"
                )
            return value

        key = ("chunk", chunk.file.path, chunk.file.version, chunk.key)
        return LazyFile(length, self.kv.cache, key, make, 0, chunk.file.owner)

    def _stored(self, key: int, name: str) -> Chunk:
        """Where key's bytes are; a name that parses but is not stored is ENOENT."""
        chunk = self.kv.locate(key)
        if chunk is None:
            raise FileNotFoundError(name)
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

    def child(self, name: str) -> File | None:
        number = self.key_of(name)
        if number is None:
            return None
        key = number >> 1
        chunk = self._stored(key, name)
        if number & 1:
            return chunk_file(self.kv, chunk)
        length = fragment_bytes(self.kv.value(chunk))
        if length is None or length > chunk.start - self.kv.spec.shard_index_size:
            raise CorruptChunk(chunk.shard, key, "manifest's fragment sizes overrun the data before it")
        return RangeFile(chunk.file, chunk.start - length, chunk.start)

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


# ---------------------------------------------------------------------------------------------------------------------
# Volume scales as arrays, for the other views


@dataclass
class VolumeScale:
    """A volume scale as an array in C order: (z, y, x), or (c, z, y, x) with several channels. That is
    the memory order of a raw precomputed chunk, so raw chunks need no reordering anywhere."""

    store: Store
    directory: str
    naming: VolumeChunks
    kv: ShardedKV | None  # None: an unsharded scale, one source file per chunk
    data_type: str
    channels: int
    scale: dict[str, Any]
    chunk_limit: int  # the most one chunk may decode to

    def array(self) -> Array:
        lead = (self.channels,) if self.channels > 1 else ()
        return Array(
            shape=(*lead, *self.naming.size[::-1]),
            chunks=(*lead, *self.naming.chunk[::-1]),
            dtype=np.dtype(self.data_type).newbyteorder("<"),
            fill_value=0,
            attributes={},
            compressor=None,
            opaque=self.scale.get("encoding", "raw") != "raw",
            clipped=True,
            chunk=self.chunk,
            stored=self.stored,
            narrows=False,
            decode=self.decode,
            owner=self.store.owner(self.directory),
            multiscale={"resolution": self.scale.get("resolution", [1, 1, 1]), "voxel_offset": self.naming.offset},
        )

    def chunk(self, pos: tuple[int, ...]) -> File | None:
        xyz = list(pos[::-1][:3])
        if self.kv is not None:
            found = self.kv.locate(self.naming.morton.encode(xyz))
            return None if found is None else chunk_file(self.kv, found)
        path = posixpath.join(self.directory, self.naming.name_of(xyz))
        for name, gzipped in ((path, False), (f"{path}.gz", True)):
            try:
                file = self.store.open(name)
            except FileNotFoundError:
                continue
            if not gzipped:
                return RangeFile(file, 0, file.size)
            try:
                return BytesFile(gunzip(file.pieces(0, file.size), self.chunk_limit), file.owner, name)
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

    def decode(self, data: bytes, shape: tuple[int, ...]) -> np.ndarray:
        x, y, z = shape[::-1][:3]
        decoded = decode_precomputed(
            data, self.scale.get("encoding", "raw"), (x, y, z, self.channels), np.dtype(self.data_type), self.scale
        )
        return decoded.reshape(shape)


# ---------------------------------------------------------------------------------------------------------------------
# Reading the dataset's info files


@dataclass
class Precomputed(Plan):
    """The mount plan for one precomputed dataset: rewritten info files and sharded directories."""

    seen: set[str] = field(default_factory=set)

    def add_info(self, directory: str, required: bool) -> None:
        path = posixpath.join(directory, "info")
        if path in self.seen:
            return  # a mesh or skeletons key that points back at a directory already planned
        self.seen.add(path)
        if required:
            self._plan_info(directory, path, required)
            return
        planned = (set(self.files), set(self.providers), set(self.arrays), len(self.kinds))
        try:
            self._plan_info(directory, path, required)
        except SourceError as e:
            self._serve_as_stored(directory, path, str(e), planned)
        except (TypeError, ValueError, AttributeError, KeyError, ZeroDivisionError) as e:
            why = f"{self.store.where(path)}: cannot make sense of it ({type(e).__name__}: {e})"
            self._serve_as_stored(directory, path, why, planned)

    def _serve_as_stored(self, directory: str, path: str, why: str, planned: tuple) -> None:
        """A sub-directory's info (meshes, skeletons) that cannot be planned leaves that directory as it is
        stored, its files passing through, and the rest of the dataset mounted: what it had planned is undone."""
        files, providers, arrays, kinds = planned
        for table, before in ((self.files, files), (self.providers, providers), (self.arrays, arrays)):
            for added in set(table) - before:
                del table[added]
        del self.kinds[kinds:]
        self.kinds.append(f"{directory}: served as stored: {why}")
        self.directories.add(directory)  # still reachable where the store cannot list
        log.warning("%s; served as it is stored", why, extra={"event": "served_as_stored", "path": path})

    def _plan_info(self, directory: str, path: str, required: bool) -> None:
        where = self.store.where(path)
        try:
            info = load_json(self.store, path)
            self.found.add(path)
        except FileNotFoundError:
            if required:
                raise SourceError(f"{where}: missing; a precomputed dataset starts with it") from None
            return
        if not isinstance(info, dict):
            raise SourceError(f"{where}: must hold a JSON object")
        kind = info.get("@type")
        if not isinstance(kind, str | None):
            raise SourceError(f"{where}: field '@type' must be a string, not {kind!r}")
        handlers = {
            "neuroglancer_multiscale_volume": self._volume,
            "neuroglancer_multilod_draco": self._meshes,
            "neuroglancer_skeletons": self._segments,
            "neuroglancer_annotations_v1": self._annotations,
            "neuroglancer_legacy_mesh": lambda info, d, w: None,
        }
        if kind is None and "scales" in info:
            kind = "neuroglancer_multiscale_volume"
        if kind is None and "sharding" in info:
            handler = self._segments
            kind = "sharded key-value directory"
        elif kind in handlers:
            handler = handlers[kind]
        else:
            raise SourceError(f"{where}: field '@type' is {kind!r}, not a precomputed kind shardfs knows")
        self.kinds.append(f"{directory or '.'}: {kind}")
        self.directories.add(directory)
        before = json.dumps(info, sort_keys=True)
        handler(info, directory, where)
        if json.dumps(info, sort_keys=True) != before:
            self.files[path] = json.dumps(info).encode()

    def _sharded(self, obj: dict, directory: str, where: str, field_name: str) -> ShardedKV | None:
        """Take `sharding` out of obj (so the rewritten info is unsharded) and open its directory."""
        if "sharding" not in obj:
            return None
        name = f"{field_name}.sharding" if field_name else "sharding"
        spec = ShardingSpec.from_json(obj.pop("sharding"), f"{where}: field '{name}'")
        return ShardedKV(self.store, directory, spec, self.cache)

    def _subdir(self, directory: str, key: object, where: str, field_name: str) -> str:
        if not isinstance(key, str) or not key or key.startswith("/") or "://" in key:
            raise SourceError(f"{where}: field '{field_name}' must be a relative path, not {key!r}")
        path = posixpath.normpath(posixpath.join(directory, key))
        if path == ".." or path.startswith("../"):
            raise SourceError(f"{where}: field '{field_name}' points outside the dataset")
        return "" if path == "." else path

    def _volume(self, info: dict, directory: str, where: str) -> None:
        scales = info.get("scales")
        if not isinstance(scales, list) or not scales:
            raise SourceError(f"{where}: field 'scales' must be a non-empty list")
        channels = info.get("num_channels", 1)
        data_type = info.get("data_type")
        if (
            not isinstance(data_type, str)
            or data_type not in VOXEL_BYTES
            or not isinstance(channels, int)
            or channels < 1
        ):
            raise SourceError(f"{where}: fields 'data_type' and 'num_channels' must name a precomputed voxel type")
        voxel_bytes = VOXEL_BYTES[info["data_type"]] * channels
        for i, scale in enumerate(scales):
            name = f"scales[{i}]"
            if not isinstance(scale, dict):
                raise SourceError(f"{where}: field '{name}' must be an object")
            scale_dir = self._subdir(directory, scale.get("key"), where, f"{name}.key")
            self.directories.add(scale_dir)
            kv = self._sharded(scale, scale_dir, where, name)
            try:
                naming = self._grid(scale, where, name)
            except SourceError:
                if kv is not None:
                    raise
                self.kinds.append(f"{scale_dir}: volume scale, unsharded (passes through; no view shows it)")
                continue  # an unsharded scale with no grid we can read passes through as stored
            self._known_encoding(scale.get("encoding", "raw"), where, name)
            # Any encoding of a chunk is smaller than twice its raw size; none may pass one file's cap.
            limit = min(2 * math.prod(naming.chunk) * voxel_bytes + 65536, self.cache.max_value)
            scale_array = VolumeScale(self.store, scale_dir, naming, kv, info["data_type"], channels, scale, limit)
            self.arrays[scale_dir] = scale_array.array()
            if kv is None:
                self.kinds.append(f"{scale_dir}: volume scale, unsharded (passes through)")
                continue
            kv.value_limit = limit
            details = {
                "size": naming.size, "chunk_size": naming.chunk, "voxel_offset": naming.offset,
                "encoding": scale.get("encoding"),
            }  # fmt: skip
            raw = voxel_bytes if scale.get("encoding", "raw") == "raw" else 0
            self.providers[scale_dir] = ChunkDir(kv, naming, "volume scale", details, raw)
        for sub in ("mesh", "skeletons"):
            if sub in info:
                self.add_info(self._subdir(directory, info[sub], where, sub), required=False)

    def _known_encoding(self, encoding: str, where: str, name: str) -> None:
        """A WARNING (and a line in `shardfs info` and `check`) for an encoding no writer uses: likely a typo
        (`compressed_segmentaton`), which would otherwise mount in silence and fail every transcoded read."""
        if encoding not in encodings.KNOWN:
            known = ", ".join(encodings.KNOWN)
            why = f"{where}: field '{name}.encoding' is {encoding!r}, not a known encoding ({known})"
            log.warning(
                "%s; a typo? its chunks are served as stored",
                why,
                extra={"event": "unknown_encoding", "in_report": True},
            )
            self.kinds.append(f"warning: {why}")

    def _grid(self, scale: dict, where: str, name: str) -> VolumeChunks:
        size = _ints(scale, "size", where, name, positive=True)
        offset = _ints(scale, "voxel_offset", where, name, default=[0, 0, 0])
        chunks = scale.get("chunk_sizes")
        if not (isinstance(chunks, list) and len(chunks) == 1):
            raise SourceError(f"{where}: field '{name}.chunk_sizes' must hold exactly one size for a sharded scale")
        resolution = scale.get("resolution")
        if not (isinstance(resolution, list) and len(resolution) == 3 and all(_positive_number(r) for r in resolution)):
            raise SourceError(f"{where}: field '{name}.resolution' must be a list of 3 positive numbers")
        if not isinstance(scale.get("encoding", "raw"), str):
            raise SourceError(f"{where}: field '{name}.encoding' must be a string")
        return VolumeChunks(size, _ints({"chunk_sizes": chunks[0]}, "chunk_sizes", where, name, positive=True), offset)

    def _meshes(self, info: dict, directory: str, where: str) -> None:
        kv = self._sharded(info, directory, where, "")
        if kv is not None:
            self.providers[directory] = MeshDir(kv, SegmentIds(), "multi-resolution meshes")

    def _segments(self, info: dict, directory: str, where: str) -> None:
        kv = self._sharded(info, directory, where, "")
        if kv is not None:
            kind = "skeletons" if info.get("@type") else "sharded key-value directory"
            self.providers[directory] = ChunkDir(kv, SegmentIds(), kind)

    def _annotations(self, info: dict, directory: str, where: str) -> None:
        parts: list[tuple[str, dict, Naming]] = []
        if isinstance(info.get("by_id"), dict):
            parts.append(("by_id", info["by_id"], SegmentIds()))
        for name in ("relationships", "spatial"):
            if not isinstance(info.get(name, []), list):
                raise SourceError(f"{where}: field '{name}' must be a list")
        for i, rel in enumerate(info.get("relationships") or []):
            parts.append((f"relationships[{i}]", rel, SegmentIds()))
        for i, level in enumerate(info.get("spatial") or []):
            name = f"spatial[{i}]"
            if isinstance(level, dict) and "sharding" in level:
                parts.append((name, level, GridCells(_ints(level, "grid_shape", where, name, positive=True))))
        for name, obj, naming in parts:
            if not isinstance(obj, dict):
                raise SourceError(f"{where}: field '{name}' must be an object")
            part_dir = self._subdir(directory, obj.get("key"), where, f"{name}.key")
            kv = self._sharded(obj, part_dir, where, name)
            if kv is not None:
                self.providers[part_dir] = ChunkDir(kv, naming, f"annotations {name}")


def _positive_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < float("inf")


def _ints(obj: dict, key: str, where: str, prefix: str, *, positive: bool = False, default: Any = None) -> list[int]:
    value = obj.get(key, default)
    ok = (
        isinstance(value, list)
        and len(value) == 3
        and all(
            isinstance(v, int) and not isinstance(v, bool) and (v > 0 or not positive) and abs(v) < LARGEST
            for v in value
        )
    )
    if not ok:
        what = "positive integers" if positive else "integers"
        raise SourceError(f"{where}: field '{prefix}.{key}' must be a list of 3 {what}, not {value!r}")
    return value


def open_precomputed(store: Store, cache: ByteCache) -> Precomputed:
    plan = Precomputed(store, cache, format="precomputed")
    plan.add_info("", required=True)
    return plan
