"""Neuroglancer precomputed: which directories are sharded, and every `info` rewritten without `sharding`, so
that readers take the unsharded path. What chunks are called is `precomputed_names.py`'s; the directories
shown are `precomputed_dirs.py`'s; volume scales for the views `precomputed_scales.py`'s."""

from __future__ import annotations

import json
import logging
import math
import posixpath
from dataclasses import dataclass, field
from typing import Any

from shardfs.cache import ByteCache
from shardfs.errors import SourceError
from shardfs.formats import encodings
from shardfs.formats.plan import LARGEST, MALFORMED, Category, Finding, Plan, load_json, senseless
from shardfs.formats.precomputed_dirs import ChunkDir, MeshDir
from shardfs.formats.precomputed_names import GridCells, Naming, SegmentIds, VolumeChunks
from shardfs.formats.precomputed_scales import VolumeScale
from shardfs.shards.neuroglancer import ShardingSpec
from shardfs.shards.neuroglancer_kv import NeuroglancerKV
from shardfs.stores.protocol import Store

log = logging.getLogger("shardfs")

VOXEL_BYTES = {"uint8": 1, "int8": 1, "uint16": 2, "int16": 2, "uint32": 4, "int32": 4, "uint64": 8, "int64": 8,
               "float32": 4, "float64": 8}  # fmt: skip


@dataclass
class Precomputed(Plan):
    """The mount plan for one precomputed dataset: rewritten info files and sharded directories."""

    seen: set[str] = field(default_factory=set)  # every info planned, shared with the parts planned apart
    unsharded: bool = False  # whether this plan's info had `sharding` taken out, and so is rewritten

    def add_info(self, directory: str, required: bool) -> None:
        """Plan the info in directory. A sub-directory's (meshes, skeletons) is planned apart and taken in
        whole: one that cannot be planned leaves that directory as it is stored, its files passing through,
        and the rest of the dataset mounted."""
        path = posixpath.join(directory, "info")
        if path in self.seen:
            return  # a mesh or skeletons key that points back at a directory already planned
        self.seen.add(path)
        if required:
            self._plan_info(directory, path, required)
            return
        part = Precomputed(self.store, self.cache, format=self.format, seen=self.seen)
        try:
            part._plan_info(directory, path, required)
        except SourceError as e:
            why = str(e)
        except MALFORMED as e:
            why = str(senseless(self.store.where(path), e))
        else:
            self.files.update(part.files)
            self.providers.update(part.providers)
            self.arrays.update(part.arrays)
            self.report += part.report
            why = ""
        # What it reached stays reachable where the store cannot list, planned or not.
        self.directories |= part.directories
        self.found |= part.found
        if why:
            self.report.append(Finding(why, Category.REFUSED))  # as zarr files an array it cannot present
            self.directories.add(directory)
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
        self.report.append(Finding(f"{directory or '.'}: {kind}"))
        self.directories.add(directory)
        handler(info, directory, where)
        if self.unsharded:
            self.files[path] = json.dumps(info).encode()

    def _sharded(self, obj: dict, directory: str, where: str, field_name: str) -> NeuroglancerKV | None:
        """Take `sharding` out of obj, part of this plan's info (so the rewritten info is unsharded), and open
        its directory."""
        if "sharding" not in obj:
            return None
        name = f"{field_name}.sharding" if field_name else "sharding"
        spec = ShardingSpec.from_json(obj.pop("sharding"), f"{where}: field '{name}'")
        self.unsharded = True
        return NeuroglancerKV(self.store, directory, spec, self.cache)

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
                self.report.append(Finding(f"{scale_dir}: volume scale, unsharded (passes through; no view shows it)"))
                continue  # an unsharded scale with no grid we can read passes through as stored
            self._known_encoding(scale.get("encoding", "raw"), where, name)
            # Any encoding of a chunk is smaller than twice its raw size; none may pass one file's cap.
            limit = min(2 * math.prod(naming.chunk) * voxel_bytes + 65536, self.cache.max_value)
            scale_array = VolumeScale(
                self.store, scale_dir, naming, kv, info["data_type"], channels, scale, limit, self.cache
            )
            self.arrays[scale_dir] = scale_array.array()
            if kv is None:
                self.report.append(Finding(f"{scale_dir}: volume scale, unsharded (passes through)"))
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
            self.report.append(Finding(f"{why}", Category.WARNING))

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
