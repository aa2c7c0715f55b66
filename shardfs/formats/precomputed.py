"""Neuroglancer precomputed: which directories are sharded, and every `info` rewritten without `sharding`, so
that readers take the unsharded path. An info is read into typed values once (`precomputed_info.py`) and
planned from them; what chunks are called is `precomputed_names.py`'s; the directories shown are
`precomputed_dirs.py`'s; volume scales for the views `precomputed_scales.py`'s."""

from __future__ import annotations

import logging
import math
import posixpath
from dataclasses import dataclass, field

from shardfs.cache import ByteCache
from shardfs.errors import SourceError
from shardfs.formats import encodings
from shardfs.formats.plan import MALFORMED, Category, Finding, Plan, load_json, senseless
from shardfs.formats.precomputed_dirs import ChunkDir, MeshDir
from shardfs.formats.precomputed_info import (
    ANNOTATIONS,
    LEGACY_MESHES,
    MESHES,
    SKELETONS,
    VOLUME,
    VOXEL_BYTES,
    Info,
    KeyDir,
    Sharded,
    Volume,
)
from shardfs.formats.precomputed_names import GridCells, SegmentIds, VolumeChunks
from shardfs.formats.precomputed_scales import VolumeScale
from shardfs.shards.neuroglancer_kv import NeuroglancerKV
from shardfs.stores.protocol import Store

log = logging.getLogger("shardfs")

# An info's @type in the user's words (a volume's are its `type` and what it holds).
WHAT = {
    MESHES: "multi-resolution meshes",
    LEGACY_MESHES: "meshes (legacy)",
    SKELETONS: "skeletons",
    ANNOTATIONS: "annotations",
}


@dataclass
class Precomputed(Plan):
    """The mount plan for one precomputed dataset: rewritten info files and sharded directories."""

    seen: set[str] = field(default_factory=set)  # every info planned, shared with the parts planned apart

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
            document = load_json(self.store, path)
            self.found.add(path)
        except FileNotFoundError:
            if required:
                raise SourceError(f"{where}: missing; a precomputed dataset starts with it") from None
            return
        info = Info.from_json(document, directory, where)
        self.report.append(Finding(f"{directory or '.'}: {info.kind}"))
        if not directory:
            self.what = _what(info)
        self.directories.add(directory)
        if info.volume is not None:
            self._volume(info, info.volume)
        for keys in info.keys:
            self.providers[keys.sharded.directory] = self._key_dir(info.kind, keys)
        for below in info.below:
            self.add_info(below, required=False)
        if info.sharded:
            self.files[path] = info.shown()

    def _kv(self, sharded: Sharded) -> NeuroglancerKV:
        return NeuroglancerKV(self.store, sharded.directory, sharded.spec, self.cache)

    def _key_dir(self, kind: str, keys: KeyDir) -> ChunkDir:
        kv = self._kv(keys.sharded)
        if kind == MESHES:
            return MeshDir(kv, SegmentIds(), "multi-resolution meshes")
        if kind == ANNOTATIONS:
            naming = SegmentIds() if keys.grid_shape is None else GridCells(list(keys.grid_shape))
            return ChunkDir(kv, naming, f"annotations {keys.name}")
        return ChunkDir(kv, SegmentIds(), "skeletons" if kind == SKELETONS else kind)

    def _volume(self, info: Info, volume: Volume) -> None:
        voxel_bytes = VOXEL_BYTES[volume.data_type] * volume.channels
        for scale in volume.scales:
            self.directories.add(scale.directory)
            kv = None if scale.sharded is None else self._kv(scale.sharded)
            grid = scale.grid
            if grid is None:
                self.report.append(
                    Finding(f"{scale.directory}: volume scale, unsharded (passes through; no view shows it)")
                )
                continue
            naming = VolumeChunks(list(grid.size), list(grid.chunk_size), list(grid.voxel_offset))
            self._known_encoding(grid.encoding, info.where, scale.name)
            # Any encoding of a chunk is smaller than twice its raw size; none may pass one file's cap.
            limit = min(2 * math.prod(naming.chunk) * voxel_bytes + 65536, self.cache.max_value)
            scale_array = VolumeScale(self.store, naming, kv, volume, scale, limit, self.cache)
            self.arrays[scale.directory] = scale_array.array()
            if kv is None:
                self.report.append(Finding(f"{scale.directory}: volume scale, unsharded (passes through)"))
                continue
            kv.value_limit = limit
            details = {
                "size": naming.size, "chunk_size": naming.chunk, "voxel_offset": naming.offset,
                "encoding": scale.document.get("encoding"),
            }  # fmt: skip
            raw = voxel_bytes if grid.encoding == "raw" else 0
            self.providers[scale.directory] = ChunkDir(kv, naming, "volume scale", details, raw)

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


def open_precomputed(store: Store, cache: ByteCache) -> Precomputed:
    plan = Precomputed(store, cache, format="precomputed")
    plan.add_info("", required=True)
    return plan


def _what(info: Info) -> str:
    """The dataset whose root is info, in a few words: `precomputed segmentation with mesh and skeletons`."""
    kind, document = info.kind, info.document
    if kind == VOLUME:
        volume = document.get("type") if isinstance(document.get("type"), str) else "volume"
        parts = [key for key in ("mesh", "skeletons") if key in document]
        kind = f"{volume} with {' and '.join(parts)}" if parts else f"{volume}"
    return f"precomputed {WHAT.get(kind, kind)}"
