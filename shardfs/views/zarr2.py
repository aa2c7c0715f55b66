"""`--view zarr2`: the source's arrays as a zarr v2 hierarchy, for readers that know no v3.

Zarr v2 keeps any byte order and any one numcodecs compressor, so a zarr v3 chunk of `bytes` plus
gzip, zstd or blosc (or nothing) is served zero-copy under `.zarray`'s `compressor`; other codec chains
(crc32c, chained compressors) are decoded and served raw. A precomputed volume becomes an OME-Zarr 0.4
multiscale of [c, z, y, x] arrays: a raw chunk is already that in memory, so inside chunks are zero-copy;
edge chunks are padded to the whole chunk with the fill value, as zarr requires, and other encodings decoded.
"""

from __future__ import annotations

import json
import math
import posixpath
from collections.abc import Iterator
from typing import Any

import numpy as np

from shardfs.cache import ByteCache
from shardfs.formats.plan import Array, Plan, grid_at, grid_index, grid_position
from shardfs.tree import File, LazyFile, Node
from shardfs.views.chunks import decoded, edge_shape, nbytes, numcodecs_config


class Zarr2Array:
    """One array as a zarr v2 array with keys `i.j.k` (a tree Provider). `lead` extra leading dimensions
    of size 1 (the channel of a one-channel precomputed volume) are added to every shape and position."""

    kind = "zarr v2 array"

    def __init__(self, array: Array, cache: ByteCache, directory: str, lead: int = 0) -> None:
        self.array, self.cache, self.directory, self.lead = array, cache, directory, lead
        self.ndim = lead + len(array.shape)
        self.zero_copy = not array.opaque
        self.meta = {
            "zarr_format": 2,
            "shape": [1] * lead + list(array.shape),
            "chunks": [1] * lead + list(array.chunks),
            "dtype": array.dtype.str,
            "compressor": numcodecs_config(array.compressor) if self.zero_copy and array.compressor else None,
            "fill_value": _json_number(array.fill_value),
            "order": "C",
            "filters": None,
            "dimension_separator": ".",
        }
        self.grid = tuple(-(-s // c) for s, c in zip(self.meta["shape"], self.meta["chunks"], strict=True))

    def describe(self) -> dict[str, Any]:
        how = "zero-copy" if self.zero_copy else "transcoded (decoded, raw)"
        if self.zero_copy and self.array.clipped:
            how += "; edge chunks padded"
        return {"shape": self.meta["shape"], "chunks": self.meta["chunks"], "chunk files": how}

    def hides(self, rel: str) -> bool:
        return False

    def _position(self, rel: str) -> tuple[int, ...] | None:
        """The grid position a chunk key names (`i.j.k`, or `0` for a 0-d array), or None if rel is not one."""
        at = grid_position(rel.split(".") if self.ndim else [rel if rel == "0" else ""])
        return None if at is None or len(at) != max(self.ndim, 1) else at[: self.ndim]

    def key_of(self, rel: str) -> int | None:
        pos = self._position(rel)
        return None if pos is None else grid_index(pos, self.grid)

    def rel_of(self, key: int) -> str | None:
        pos = grid_at(key, self.grid)
        return None if pos is None else ".".join(map(str, pos)) if self.ndim else "0"

    def child(self, rel: str) -> Node | None:
        pos = self._position(rel)
        if pos is None:
            return None
        inside = (p * c < s for p, c, s in zip(pos, self.meta["chunks"], self.meta["shape"], strict=True))
        if any(pos[: self.lead]) or not all(inside):
            raise FileNotFoundError(rel)
        return self.chunk(pos[self.lead :])

    def entries(self, rel: str) -> Iterator[tuple[str, bool]]:
        if rel:
            return
        for pos in self.array.stored():
            yield ".".join(map(str, [0] * self.lead + list(pos))) if self.ndim else "0", False

    def chunk(self, pos: tuple[int, ...]) -> File:
        stored = self.array.chunk(pos)
        if stored is None:
            raise FileNotFoundError(pos)
        array = self.array
        if self.zero_copy and (not array.clipped or edge_shape(array, pos) == array.chunks):
            return stored

        def make() -> bytes:
            values = decoded(array, pos, stored)
            if values.shape == array.chunks:
                return values.tobytes()
            whole = np.full(array.chunks, array.fill_value, array.dtype)
            whole[tuple(slice(0, n) for n in values.shape)] = values
            return whole.tobytes()

        size = nbytes(array.chunks, array.dtype)
        key = ("zarr2-chunk", self.directory, pos)
        return LazyFile(size, self.cache, key, make, getattr(stored, "nbytes", 0), stored.owner)


def _json_number(value: Any) -> Any:
    """A fill value as zarr v2 writes it in JSON: NaN and the infinities are strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


def ome_04(attributes: dict[str, Any]) -> dict[str, Any]:
    """OME-Zarr 0.5 keeps its metadata under `ome`, versioned once; 0.4 has it at the top, versioned in
    each multiscale (and plate, well, label). The content is otherwise the same."""
    ome = attributes.get("ome")
    if not isinstance(ome, dict):
        return attributes
    out = {k: v for k, v in attributes.items() if k != "ome"}
    for key, value in ome.items():
        if key == "multiscales" and isinstance(value, list):
            value = [{**m, "version": "0.4"} if isinstance(m, dict) else m for m in value]
        elif key in ("plate", "well", "image-label") and isinstance(value, dict):
            value = {**value, "version": "0.4"}
        if key != "version":
            out[key] = value
    return out


def precomputed_multiscale(plan: Plan) -> dict[str, Any]:
    """OME-Zarr 0.4 `multiscales` for a precomputed volume: axes c, z, y, x in nm, one dataset per
    scale with its resolution as scale and voxel_offset (in nm) as translation."""
    datasets = []
    for path, array in plan.arrays.items():
        resolution, offset = array.multiscale["resolution"][::-1], array.multiscale["voxel_offset"][::-1]
        origin = [o * r for o, r in zip(offset, resolution, strict=True)]
        datasets.append(
            {
                "path": path,
                "coordinateTransformations": [
                    {"type": "scale", "scale": [1, *resolution]},
                    {"type": "translation", "translation": [0, *origin]},
                ],
            }
        )
    space = [{"name": n, "type": "space", "unit": "nanometer"} for n in "zyx"]
    axes = [{"name": "c", "type": "channel"}, *space]
    return {"multiscales": [{"version": "0.4", "name": "", "axes": axes, "datasets": datasets}]}


def zarr2_view(plan: Plan) -> Plan:
    """The zarr v2 hierarchy of a source's arrays: `.zgroup`/`.zarray` with `.zattrs` beside."""
    view = Plan(plan.store, plan.cache, format="zarr2")
    groups = {path: ome_04(attrs) for path, attrs in plan.groups.items()}
    if plan.format == "precomputed":
        groups = {"": precomputed_multiscale(plan)}
    for path, array in plan.arrays.items():
        lead = 1 if plan.format == "precomputed" and len(array.shape) == 3 else 0
        served = Zarr2Array(array, plan.cache, path, lead)
        view.providers[path] = served
        view.files[posixpath.join(path, ".zarray")] = json.dumps(served.meta, indent=1).encode()
        view.files[posixpath.join(path, ".zattrs")] = json.dumps(ome_04(array.attributes), indent=1).encode()
        view.kinds.append(f"{path or '.'}: zarr v2 array, {served.describe()['chunk files']}")
    for path, attrs in groups.items():
        view.files[posixpath.join(path, ".zgroup")] = json.dumps({"zarr_format": 2}).encode()
        view.files[posixpath.join(path, ".zattrs")] = json.dumps(attrs, indent=1).encode()
    return view
