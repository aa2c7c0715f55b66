"""`--view zarr2`: the source's arrays as a zarr v2 hierarchy, for readers that know no v3.

Zarr v2 keeps any byte order and any one numcodecs compressor, so a zarr v3 chunk of `bytes` plus
gzip, zstd or blosc (or nothing) is served zero-copy under `.zarray`'s `compressor`; other codec chains
(crc32c, chained compressors) are decoded and served raw. A precomputed volume becomes an OME-Zarr 0.4
multiscale of [c, z, y, x] arrays: a raw chunk is already that in memory, so inside chunks are zero-copy;
edge chunks are padded to the whole chunk with the fill value, as zarr requires, and other encodings decoded.

Chunk keys are `i/j/k` in OME-Zarr (its readers open every array with `/`) and the source's own
separator elsewhere; axis names go to xarray's `_ARRAY_DIMENSIONS`.
"""

from __future__ import annotations

import json
import math
import posixpath
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import numpy as np

from shardfs.cache import ByteCache
from shardfs.files import Dir, File, LazyFile, Node
from shardfs.formats.plan import Array, Finding, Plan
from shardfs.request import OWN, Request
from shardfs.shards.grid import grid_at, grid_index, grid_position, grid_shape
from shardfs.shards.kv import Fetch
from shardfs.views.axes import axes_of
from shardfs.views.chunks import decoded, edge_shape, nbytes, next_level, number, numcodecs_config, stored_under


class Zarr2Array:
    """One array as a zarr v2 array (a tree Provider) with chunk keys `i.j.k`, or with separator `/` nested
    one directory per dimension, `i/j/k`. `lead` extra leading dimensions of size 1 (the channel of a
    one-channel precomputed volume) are added to every shape and position."""

    kind = "zarr v2 array"
    kv = None

    def __init__(self, array: Array, cache: ByteCache, directory: str, separator: str, lead: int = 0) -> None:
        self.array, self.cache, self.directory, self.lead = array, cache, directory, lead
        self.ndim = lead + len(array.shape)
        self.separator = separator
        self.nested = separator == "/" and self.ndim > 0
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
            "dimension_separator": separator,
        }
        self.grid = grid_shape(self.meta["shape"], self.meta["chunks"])

    def describe(self) -> dict[str, Any]:
        how = "zero-copy" if self.zero_copy else "transcoded (decoded, raw)"
        if self.zero_copy and self.array.clipped:
            how += "; edge chunks padded"
        return {"shape": self.meta["shape"], "chunks": self.meta["chunks"], "chunk files": how}

    def hides(self, rel: str) -> bool:
        return False

    def _path(self, rel: str) -> tuple[int, ...] | None:
        """The grid position a chunk key names (`0` for a 0-d array), or with `/` the position prefix a
        directory of keys names; None if rel is neither."""
        if not self.ndim:
            return () if rel == "0" else None
        at = grid_position(rel.split(self.separator))
        if at is None or len(at) > self.ndim or (len(at) < self.ndim and not self.nested):
            return None
        return at

    def key_of(self, rel: str) -> int | None:
        at = self._path(rel)
        return None if at is None or len(at) < self.ndim else grid_index(at, self.grid)

    def rel_of(self, key: int) -> str | None:
        pos = grid_at(key, self.grid)
        return None if pos is None else self.separator.join(map(str, pos)) if self.ndim else "0"

    def child(self, rel: str, request: Request = OWN) -> Node | None:
        at = self._path(rel)
        if at is None:
            return None
        if any(at[: self.lead]) or any(p >= g for p, g in zip(at, self.grid, strict=False)):
            raise FileNotFoundError(rel)
        # A directory inside the grid is answered without looking, as the N5 view's are; listings show only
        # directories that hold chunks.
        if len(at) < self.ndim:
            return Dir(self.array.owner)
        return self.chunk(at[self.lead :], request)

    def file_of(self, key: int, request: Request = OWN) -> File:
        at = grid_at(key, self.grid)
        if at is None or any(at[: self.lead]):
            raise FileNotFoundError(f"key {key}")
        return self.chunk(at[self.lead :], request)

    def position_of(self, key: int) -> tuple[int, ...] | None:
        return grid_at(key, self.grid)

    def key_at(self, position: tuple[int, ...]) -> int | None:
        return grid_index(position, self.grid)

    def prefetch(self, keys: list[int]) -> list[Fetch]:
        """The source's chunks under the chunks of keys, fetched ahead."""
        found = (grid_at(key, self.grid) for key in keys)
        positions = [at[self.lead :] for at in found if at is not None and not any(at[: self.lead])]
        back = lambda pos: grid_index((0,) * self.lead + tuple(pos), self.grid)  # noqa: E731
        return [fetch.renamed(back) for fetch in self.array.prefetch(positions)]

    def entries(self, rel: str) -> Iterator[tuple[str, bool]]:
        at = self._path(rel) if rel else ()
        if at is None or len(at) >= max(self.ndim, 1) or any(at[: self.lead]):
            return
        below = stored_under(self.array, self.cache, ("zarr2-stored", self.directory), at[self.lead :])
        paths = ((0,) * self.lead + tuple(pos) for pos in below)
        if self.nested:
            yield from next_level(at, self.ndim, paths)
        else:
            for pos in paths:
                yield self.separator.join(map(str, pos)) if self.ndim else "0", False

    def chunk(self, pos: tuple[int, ...], request: Request = OWN) -> File:
        stored = self.array.chunk(pos, request)
        if stored is None:
            raise FileNotFoundError(pos)
        array = self.array
        if self.zero_copy and (not array.clipped or edge_shape(array, pos) == array.chunks):
            return stored

        def make(request: Request) -> bytes:
            values = decoded(array, pos, stored, request)
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
    """OME-Zarr 0.4 `multiscales` for a precomputed volume: axes c, z, y, x in nm, one dataset per scale,
    with its resolution as scale. Precomputed places a voxel's corner (voxel i spans voxel_offset + i to
    voxel_offset + i + 1, times the resolution); OME-Zarr places its centre, so the translation is
    (voxel_offset + 0.5) x resolution, each scale by its own voxel."""
    datasets = []
    for path, array in plan.arrays.items():
        resolution, offset = array.multiscale["resolution"][::-1], array.multiscale["voxel_offset"][::-1]
        centre = [(o + Fraction(1, 2)) * Fraction(r) for o, r in zip(offset, resolution, strict=True)]
        datasets.append(
            {
                "path": path,
                "coordinateTransformations": [
                    {"type": "scale", "scale": [1, *resolution]},
                    {"type": "translation", "translation": [0, *map(number, centre)]},
                ],
            }
        )
    space = [{"name": n, "type": "space", "unit": "nanometer"} for n in "zyx"]
    axes = [{"name": "c", "type": "channel"}, *space]
    return {"multiscales": [{"version": "0.4", "name": "", "axes": axes, "datasets": datasets}]}


OME_KEYS = ("ome", "multiscales", "labels", "image-label", "plate", "well")


def separator(plan: Plan, path: str) -> str:
    """The chunk key separator of an array in the view: `/` in OME-Zarr (which requires it since 0.2, and
    whose readers open every array with it: ome-zarr-py's store turns `.` keys into `/`), else the source
    array's own, so its chunk files keep their names less zarr v3's `c/`."""
    if plan.format == "precomputed":
        return "/"
    above = [""] + [path[:i] for i, c in enumerate(path) if c == "/"]
    ome = any(key in plan.groups.get(group, {}) for group in above for key in OME_KEYS)
    return "/" if ome else plan.arrays[path].separator


def zarr2_view(plan: Plan) -> Plan:
    """The zarr v2 hierarchy of a source's arrays: `.zgroup`/`.zarray` with `.zattrs` beside, where the
    axes' names are xarray's `_ARRAY_DIMENSIONS` (Neuroglancer reads them too)."""
    view = Plan(plan.store, plan.cache, format="zarr2")
    groups = {path: ome_04(attrs) for path, attrs in plan.groups.items()}
    if plan.format == "precomputed":
        groups = {"": precomputed_multiscale(plan)}
    axes = axes_of(plan)
    for path, array in plan.arrays.items():
        lead = 1 if plan.format == "precomputed" and len(array.shape) == 3 else 0
        served = Zarr2Array(array, plan.cache, path, separator(plan, path), lead)
        view.providers[path] = served
        attributes = dict(ome_04(array.attributes))  # a copy: the source's attributes are the plan's
        if path in axes and (names := axes[path].labels()):
            attributes["_ARRAY_DIMENSIONS"] = ["c"] * lead + names
        view.files[posixpath.join(path, ".zarray")] = json.dumps(served.meta, indent=1).encode()
        view.files[posixpath.join(path, ".zattrs")] = json.dumps(attributes, indent=1).encode()
        first = served.separator.join("0" * served.ndim) or "0"  # the first chunk's file: it shows the separator
        view.report.append(
            Finding(f"{path or '.'}: zarr v2 array, chunk files like {first}, {served.describe()['chunk files']}")
        )
    for path, attrs in groups.items():
        view.files[posixpath.join(path, ".zgroup")] = json.dumps({"zarr_format": 2}).encode()
        view.files[posixpath.join(path, ".zattrs")] = json.dumps(attrs, indent=1).encode()
    return view
