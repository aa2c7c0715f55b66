"""`--view n5`: the source's arrays as an N5 container (spec: shared/specs/n5-filesystem-spec.txt).

N5 lists dimensions fastest first, so a C-order array of shape [z, y, x] is the N5 dataset [x, y, z] with
the same bytes in memory, and its block at grid position (i, j, k) is the file `k/j/i`. A block is a
big-endian header (mode 0, ndim, the block's dimensions) and then the data, big-endian too, compressed.

Zero-copy, the header then the stored bytes, wherever those are the block's: one-byte or big-endian
values, raw or under gzip or blosc, and no edge to clip (precomputed stores edges clipped already,
zarr does not). Everything else is decoded, clipped, made big-endian and written raw, whose size the
metadata gives, so listing never decodes.
"""

from __future__ import annotations

import json
import posixpath
import struct
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import numpy as np

from shardfs.cache import ByteCache
from shardfs.files import BytesFile, Dir, File, LazyFile, Node
from shardfs.formats.plan import Array, Finding, Plan
from shardfs.shards.grid import grid_at, grid_index, grid_position, grid_shape
from shardfs.shards.kv import Fetch
from shardfs.views.axes import Axes, axes_of, pyramids
from shardfs.views.chunks import (
    PrefixedFile,
    decoded,
    edge_shape,
    encode,
    nbytes,
    next_level,
    number,
    numcodecs_config,
    stored_positions,
)

VERSION = "4.0.0"
DATA_TYPES = {"uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64", "float32", "float64"}


def compression(array: Array) -> dict[str, Any] | None:
    """The N5 compression that reads the stored bytes as they are, or None if none does. Not zstd: N5 has
    it only as an extension, which Neuroglancer's n5 source (raw, gzip, blosc) and BigDataViewer lack."""
    if array.opaque or (array.dtype.itemsize > 1 and array.dtype.byteorder != ">"):
        return None
    if array.compressor is not None and array.compressor.name == "zstd":
        return None
    if array.compressor is None:
        return {"type": "raw"}
    config = numcodecs_config(array.compressor)
    kind = config.pop("id")
    if kind == "gzip":
        config["useZlib"] = False  # zarr's gzip is the gzip format, not zlib's
    return {"type": kind, **config}


class Dataset:
    """One array as an N5 dataset: its block files, nested by grid position (a tree Provider)."""

    kind = "N5 dataset"
    kv = None

    def __init__(self, array: Array, cache: ByteCache, directory: str) -> None:
        self.array, self.cache, self.directory = array, cache, directory
        self.ndim = len(array.shape)
        self.grid = grid_shape(array.shape, array.chunks)[::-1]  # N5 order
        self.zero_copy = compression(array)
        # N5 has no fill value: a reader takes a missing block for zero bytes. Where the source's fill value is
        # other bytes (NaN, and -0.0, which equals 0), every block of the grid is shown, those never written made
        # of the fill value.
        self.filled = any(np.asarray(array.fill_value, array.dtype).tobytes())
        self.attributes = {
            **array.attributes,
            "dimensions": list(array.shape[::-1]),
            "blockSize": list(array.chunks[::-1]),
            "dataType": array.dtype.name,
            "compression": self.zero_copy or {"type": "raw"},
        }

    def describe(self) -> dict[str, Any]:
        how = "zero-copy" if self.zero_copy else "transcoded (decoded, big-endian, raw)"
        return {"dimensions": self.attributes["dimensions"], "blockSize": self.attributes["blockSize"], "blocks": how}

    def hides(self, rel: str) -> bool:
        return False

    def _grid_path(self, rel: str) -> list[int] | None:
        at = grid_position(rel.split("/") if rel else [])
        return None if at is None or len(at) > self.ndim else list(at)

    def key_of(self, rel: str) -> int | None:
        """A block's grid path numbered on the grid (N5 order); directories have no number."""
        at = self._grid_path(rel) if rel else None
        return None if at is None else grid_index(at, self.grid)

    def rel_of(self, key: int) -> str | None:
        at = grid_at(key, self.grid) if self.ndim else None
        return None if at is None else "/".join(map(str, at))

    def child(self, rel: str) -> Node | None:
        at = self._grid_path(rel)
        if at is None:
            return None
        if any(p >= g for p, g in zip(at, self.grid, strict=False)):
            raise FileNotFoundError(rel)
        # A directory inside the grid is answered without looking (one index probe per level would cost
        # more than it saves); listings show only directories that hold blocks.
        if len(at) < self.ndim:
            return Dir(self.array.owner)  # the grid's directories stand for the array's
        return self.block(tuple(at[::-1]))

    def file_of(self, key: int) -> File:
        at = grid_at(key, self.grid) if self.ndim else None
        if at is None:
            raise FileNotFoundError(f"key {key}")
        return self.block(at[::-1])

    def position_of(self, key: int) -> tuple[int, ...] | None:
        return grid_at(key, self.grid)

    def key_at(self, position: tuple[int, ...]) -> int | None:
        return grid_index(position, self.grid)

    def prefetch(self, keys: list[int]) -> list[Fetch]:
        """The source's chunks under the blocks of keys, fetched ahead."""
        positions = [at[::-1] for at in (grid_at(key, self.grid) for key in keys) if at is not None and self.ndim]
        back = lambda pos: grid_index(pos[::-1], self.grid)  # noqa: E731
        return [fetch.renamed(back) for fetch in self.array.prefetch(positions)]

    def entries(self, rel: str) -> Iterator[tuple[str, bool]]:
        at = self._grid_path(rel)
        if at is None or len(at) == self.ndim:
            return
        if self.filled:
            yield from ((str(i), len(at) + 1 < self.ndim) for i in range(self.grid[len(at)]))
            return
        # N5 directories run fastest dimension first, against C order: no source narrows a listing by them,
        # so each directory filters the positions read once.
        positions = stored_positions(self.array, self.cache, ("n5-stored", self.directory))
        if positions is None:
            yield from next_level(tuple(at), self.ndim, (pos[::-1] for pos in self.array.stored(())))
            return
        below = positions[:, ::-1]
        if at:
            below = below[(below[:, : len(at)] == at).all(axis=1)]
        yield from next_level(tuple(at), self.ndim, map(tuple, below.tolist()))

    def block(self, pos: tuple[int, ...]) -> File:
        stored = self.array.chunk(pos)
        inside = edge_shape(self.array, pos)
        head = struct.pack(f">HH{self.ndim}I", 0, self.ndim, *inside[::-1])
        if stored is None and not self.filled:
            raise FileNotFoundError(pos)
        big = self.array.dtype.newbyteorder(">")
        if stored is not None and self.zero_copy and (self.array.clipped or inside == self.array.chunks):
            return PrefixedFile(head, stored)
        if stored is not None and self.zero_copy and self.array.compressor:  # an edge block, compressed
            values = decoded(self.array, pos, stored).astype(big)
            return BytesFile(head + encode(self.array.compressor, values), stored.owner)
        size = len(head) + nbytes(inside, big)

        def make() -> np.ndarray:
            """Header and values written once, straight into the buffer that is served."""
            out = np.empty(size, np.uint8)
            out[: len(head)] = np.frombuffer(head, np.uint8)
            body = out[len(head) :].view(big).reshape(inside)
            # N5 reads a missing block as zeros, so one of another fill value is made.
            body[...] = self.array.fill_value if stored is None else decoded(self.array, pos, stored)
            return out

        owner = self.array.owner if stored is None else stored.owner
        return LazyFile(size, self.cache, ("n5-block", self.directory, pos), make, getattr(stored, "nbytes", 0), owner)


def n5_view(plan: Plan) -> Plan:
    """The N5 container of a source's arrays: groups stay groups, arrays become datasets."""
    view = Plan(plan.store, plan.cache, format="n5")
    attributes: dict[str, dict[str, Any]] = {path: dict(attrs) for path, attrs in plan.groups.items()}
    axes = axes_of(plan)
    for path, array in plan.arrays.items():
        if array.dtype.name not in DATA_TYPES or not array.shape:
            view.report.append(
                Finding(f"not in the N5 view: {path or '.'}: N5 has no {array.dtype.name} or 0-d datasets")
            )
            continue
        if max(array.chunks) >= 1 << 32:
            view.report.append(Finding(f"not in the N5 view: {path or '.'}: N5 block dimensions are 32-bit"))
            continue
        dataset = Dataset(array, plan.cache, path)
        view.providers[path] = dataset
        attributes[path] = {**attributes.get(path, {}), **dataset.attributes}
        if path in axes:
            attributes[path].update(axis_attributes(axes[path]))
        view.report.append(Finding(f"{path or '.'}: N5 dataset, {dataset.describe()['blocks']}"))
    for group, levels in pyramids(plan).items():
        _pyramid(attributes, group, [path for path in levels if path in view.providers], axes)
    attributes[""] = {**attributes.get("", {}), "n5": VERSION}
    for path, attrs in attributes.items():
        view.files[posixpath.join(path, "attributes.json")] = json.dumps(attrs, indent=1).encode()
    return view


def axis_attributes(axes: Axes) -> dict[str, Any]:
    """A dataset's axes as N5 readers take them, fastest dimension first: `axes`, `units` and `resolution`
    (Neuroglancer's n5 source and tensorstore's n5 driver), and n5-viewer's `pixelResolution` (BigDataViewer,
    also read by Neuroglancer) where one unit serves every axis that has one."""
    out: dict[str, Any] = {}
    if names := axes.labels():
        out["axes"] = names[::-1]
    if si := axes.si():
        units, sizes = si[0][::-1], [number(Fraction(s)) for s in si[1][::-1]]
        out["units"], out["resolution"] = units, sizes
        if len(spatial := {u for u in units if u}) == 1:
            out["pixelResolution"] = {"unit": spatial.pop(), "dimensions": sizes}
    return out


def _pyramid(attributes: dict[str, dict[str, Any]], group: str, levels: list[str], axes: dict[str, Axes]) -> None:
    """What BigDataViewer, n5-viewer and Neuroglancer read of a scale pyramid, fastest dimension first: each
    level's `downsamplingFactors` (relative to the first), and the group's `scales` (all of them) with the
    first level's axes and resolution. Every list has an entry per dimension, the channel's too:
    Neuroglancer refuses lists of another length. (Both viewers open the group itself as a multiscale
    where the levels are named s0, s1, ...)"""
    sizes = [axes[path].scale if path in axes else None for path in levels]
    if not levels or None in sizes or len({len(size) for size in sizes}) != 1:
        return
    base = sizes[0][::-1]
    factors = [[number(Fraction(s) / Fraction(b)) for s, b in zip(size[::-1], base, strict=True)] for size in sizes]
    for path, factor in zip(levels, factors, strict=True):
        attributes[path]["downsamplingFactors"] = factor
    attributes[group] = {**attributes.get(group, {}), **axis_attributes(axes[levels[0]]), "scales": factors}
