"""A Neuroglancer precomputed `info` as the typed values planning reads, checked once in the order its fields
were always checked, each error naming the file and field in one sentence; and the info shown, which is the
document as read with `sharding` taken out wherever it shards a directory, every other field kept."""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass
from typing import Any

from shardfs.errors import SourceError
from shardfs.formats.plan import LARGEST
from shardfs.shards.neuroglancer import ShardingSpec

VOXEL_BYTES = {"uint8": 1, "int8": 1, "uint16": 2, "int16": 2, "uint32": 4, "int32": 4, "uint64": 8, "int64": 8,
               "float32": 4, "float64": 8}  # fmt: skip
VOLUME = "neuroglancer_multiscale_volume"
MESHES = "neuroglancer_multilod_draco"
SKELETONS = "neuroglancer_skeletons"
ANNOTATIONS = "neuroglancer_annotations_v1"
LEGACY_MESHES = "neuroglancer_legacy_mesh"
KEY_VALUE = "sharded key-value directory"  # an info with no `@type` but `sharding`: bare keys
Path = tuple[str | int, ...]  # the keys and indexes from the document's root to one of its objects


@dataclass(frozen=True)
class Sharded:
    """A directory whose keys are sharded: its spec, and the object in the document that holds it."""

    directory: str
    spec: ShardingSpec
    at: Path


@dataclass(frozen=True)
class Grid:
    """A volume scale's chunks: the voxel grid along x, y, z, the voxels' resolution and the chunks' encoding."""

    size: tuple[int, int, int]
    chunk_size: tuple[int, int, int]
    voxel_offset: tuple[int, int, int]
    resolution: tuple[int | float, ...]
    encoding: str  # "raw" where the info states none


@dataclass(frozen=True)
class Scale:
    """One of `scales`. grid None: an unsharded scale whose grid cannot be read (it passes through as stored)."""

    name: str  # the field, `scales[i]`, as messages name it
    directory: str
    sharded: Sharded | None
    grid: Grid | None
    document: dict[str, Any]  # the scale's object as read: its decoders' parameters, and its encoding as stated


@dataclass(frozen=True)
class Volume:
    data_type: str
    channels: int
    scales: tuple[Scale, ...]


@dataclass(frozen=True)
class KeyDir:
    """A sharded directory of keys other than a volume scale: the info's own (meshes, skeletons, bare keys) or an
    annotation part's."""

    name: str  # the field ("by_id", "spatial[0]"); "" for the info's own directory
    sharded: Sharded
    grid_shape: tuple[int, int, int] | None  # an annotation spatial level's: keys are its grid cells, not ids


@dataclass(frozen=True)
class Info:
    """One `info` file: its kind, and whatever of volume scales, sharded directories and sub-directories with
    infos of their own (mesh, skeletons) it names."""

    document: dict[str, Any]
    where: str  # the file, as messages name it
    kind: str  # its `@type` (inferred where absent), or KEY_VALUE
    volume: Volume | None
    keys: tuple[KeyDir, ...]
    below: tuple[str, ...]  # directories of `mesh` and `skeletons`, planned apart

    @classmethod
    def from_json(cls, document: object, directory: str, where: str) -> Info:
        """The info read from document at directory; SourceError naming where and the field if it is malformed."""
        if not isinstance(document, dict):
            raise SourceError(f"{where}: must hold a JSON object")
        kind = document.get("@type")
        if not isinstance(kind, str | None):
            raise SourceError(f"{where}: field '@type' must be a string, not {kind!r}")
        if kind is None and "scales" in document:
            kind = VOLUME
        if kind is None and "sharding" in document:
            kind = KEY_VALUE
        elif kind not in (VOLUME, MESHES, SKELETONS, ANNOTATIONS, LEGACY_MESHES):
            raise SourceError(f"{where}: field '@type' is {kind!r}, not a precomputed kind shardfs knows")
        volume, keys, below = None, (), ()
        if kind == VOLUME:
            volume = _volume(document, directory, where)
            below = tuple(_subdir(directory, document[s], where, s) for s in ("mesh", "skeletons") if s in document)
        elif kind == ANNOTATIONS:
            keys = _annotations(document, directory, where)
        elif kind != LEGACY_MESHES:
            sharded = _sharded(document, directory, where, "", ())
            keys = () if sharded is None else (KeyDir("", sharded, None),)
        return cls(document, where, kind, volume, keys, below)

    @property
    def sharded(self) -> list[Sharded]:
        """Every directory this info shards, volume scales first."""
        scales = self.volume.scales if self.volume is not None else ()
        return [s.sharded for s in scales if s.sharded is not None] + [k.sharded for k in self.keys]

    def shown(self) -> bytes:
        """The info of the unsharded layout: the document with `sharding` taken out of each object that shards a
        directory, the objects along the way copied (the document is not edited) and all else kept in order."""
        shown: Any = self.document
        for sharded in self.sharded:
            shown = _without_sharding(shown, sharded.at)
        return json.dumps(shown).encode()


def _without_sharding(obj: Any, at: Path) -> Any:
    if not at:
        return {k: v for k, v in obj.items() if k != "sharding"}
    copy = list(obj) if isinstance(obj, list) else dict(obj)
    copy[at[0]] = _without_sharding(obj[at[0]], at[1:])
    return copy


def _volume(document: dict[str, Any], directory: str, where: str) -> Volume:
    scales = document.get("scales")
    if not isinstance(scales, list) or not scales:
        raise SourceError(f"{where}: field 'scales' must be a non-empty list")
    channels = document.get("num_channels", 1)
    data_type = document.get("data_type")
    if not isinstance(data_type, str) or data_type not in VOXEL_BYTES or not isinstance(channels, int) or channels < 1:
        raise SourceError(f"{where}: fields 'data_type' and 'num_channels' must name a precomputed voxel type")
    return Volume(data_type, channels, tuple(_scale(scale, i, directory, where) for i, scale in enumerate(scales)))


def _scale(scale: object, i: int, directory: str, where: str) -> Scale:
    name = f"scales[{i}]"
    if not isinstance(scale, dict):
        raise SourceError(f"{where}: field '{name}' must be an object")
    scale_dir = _subdir(directory, scale.get("key"), where, f"{name}.key")
    sharded = _sharded(scale, scale_dir, where, name, ("scales", i))
    try:
        grid = _grid(scale, where, name)
    except SourceError:
        if sharded is not None:
            raise
        grid = None  # an unsharded scale with no grid we can read passes through as stored
    return Scale(name, scale_dir, sharded, grid, scale)


def _grid(scale: dict[str, Any], where: str, name: str) -> Grid:
    size = _ints(scale, "size", where, name, positive=True)
    offset = _ints(scale, "voxel_offset", where, name, default=[0, 0, 0])
    chunks = scale.get("chunk_sizes")
    if not (isinstance(chunks, list) and len(chunks) == 1):
        raise SourceError(f"{where}: field '{name}.chunk_sizes' must hold exactly one size for a sharded scale")
    resolution = scale.get("resolution")
    if not (isinstance(resolution, list) and len(resolution) == 3 and all(_positive_number(r) for r in resolution)):
        raise SourceError(f"{where}: field '{name}.resolution' must be a list of 3 positive numbers")
    encoding = scale.get("encoding", "raw")
    if not isinstance(encoding, str):
        raise SourceError(f"{where}: field '{name}.encoding' must be a string")
    chunk_size = _ints({"chunk_sizes": chunks[0]}, "chunk_sizes", where, name, positive=True)
    return Grid(size, chunk_size, offset, tuple(resolution), encoding)


def _annotations(document: dict[str, Any], directory: str, where: str) -> tuple[KeyDir, ...]:
    """The sharded parts of an annotation info: by_id, relationships, spatial levels; each part's key is checked,
    sharded or not."""
    parts: list[tuple[str, Any, Path, tuple[int, int, int] | None]] = []
    if isinstance(document.get("by_id"), dict):
        parts.append(("by_id", document["by_id"], ("by_id",), None))
    for name in ("relationships", "spatial"):
        if not isinstance(document.get(name, []), list):
            raise SourceError(f"{where}: field '{name}' must be a list")
    for i, rel in enumerate(document.get("relationships") or []):
        parts.append((f"relationships[{i}]", rel, ("relationships", i), None))
    for i, level in enumerate(document.get("spatial") or []):
        name = f"spatial[{i}]"
        if isinstance(level, dict) and "sharding" in level:
            parts.append((name, level, ("spatial", i), _ints(level, "grid_shape", where, name, positive=True)))
    keys = []
    for name, obj, at, grid_shape in parts:
        if not isinstance(obj, dict):
            raise SourceError(f"{where}: field '{name}' must be an object")
        part_dir = _subdir(directory, obj.get("key"), where, f"{name}.key")
        sharded = _sharded(obj, part_dir, where, name, at)
        if sharded is not None:
            keys.append(KeyDir(name, sharded, grid_shape))
    return tuple(keys)


def _sharded(obj: dict[str, Any], directory: str, where: str, field_name: str, at: Path) -> Sharded | None:
    if "sharding" not in obj:
        return None
    name = f"{field_name}.sharding" if field_name else "sharding"
    return Sharded(directory, ShardingSpec.from_json(obj["sharding"], f"{where}: field '{name}'"), at)


def _subdir(directory: str, key: object, where: str, field_name: str) -> str:
    if not isinstance(key, str) or not key or key.startswith("/") or "://" in key:
        raise SourceError(f"{where}: field '{field_name}' must be a relative path, not {key!r}")
    path = posixpath.normpath(posixpath.join(directory, key))
    if path == ".." or path.startswith("../"):
        raise SourceError(f"{where}: field '{field_name}' points outside the dataset")
    return "" if path == "." else path


def _positive_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < float("inf")


def _ints(
    obj: dict, key: str, where: str, prefix: str, *, positive: bool = False, default: Any = None
) -> tuple[int, int, int]:
    """obj[key] as 3 integers (positive ones, if so asked), each below LARGEST in size."""
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
    return value[0], value[1], value[2]
