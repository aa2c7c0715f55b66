"""`--view n5`: the source's arrays as an N5 container (spec: shared/specs/n5-filesystem-spec.txt).

N5 lists dimensions fastest first, so a C-order array of shape [z, y, x] is the N5 dataset [x, y, z] with
the same bytes in memory, and its block at grid position (i, j, k) is the file `k/j/i`. A block is a
big-endian header (mode 0, ndim, the block's dimensions) and then the data, big-endian too, compressed.

Zero-copy, the header then the stored bytes, wherever those are the block's: one-byte or big-endian
values, raw or under gzip, zstd or blosc, and no edge to clip (precomputed stores edges clipped already,
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
from shardfs.formats.plan import Array, Plan, grid_at, grid_index, grid_position
from shardfs.tree import BytesFile, Dir, File, LazyFile, Node
from shardfs.views.chunks import PrefixedFile, decoded, edge_shape, encode, nbytes, numcodecs_config

VERSION = "4.0.0"
DATA_TYPES = {"uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64", "float32", "float64"}


def compression(array: Array) -> dict[str, Any] | None:
    """The N5 compression that reads the stored bytes as they are, or None if none does."""
    if array.opaque or (array.dtype.itemsize > 1 and array.dtype.byteorder != ">"):
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

    def __init__(self, array: Array, cache: ByteCache, directory: str) -> None:
        self.array, self.cache, self.directory = array, cache, directory
        self.ndim = len(array.shape)
        self.grid = [-(-s // c) for s, c in zip(array.shape, array.chunks, strict=True)][::-1]  # N5 order
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

    def entries(self, rel: str) -> Iterator[tuple[str, bool]]:
        at = self._grid_path(rel)
        if at is None or len(at) == self.ndim:
            return
        depth = len(at)
        if self.filled:
            below: set[int] | range = range(self.grid[depth])
        else:
            below = {pos[::-1][depth] for pos in self.array.stored() if list(pos[::-1][:depth]) == at}
        for i in sorted(below):
            yield str(i), depth + 1 < self.ndim

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
    for path, array in plan.arrays.items():
        if array.dtype.name not in DATA_TYPES or not array.shape:
            view.kinds.append(f"not in the N5 view: {path or '.'}: N5 has no {array.dtype.name} or 0-d datasets")
            continue
        if max(array.chunks) >= 1 << 32:
            view.kinds.append(f"not in the N5 view: {path or '.'}: N5 block dimensions are 32-bit")
            continue
        dataset = Dataset(array, plan.cache, path)
        view.providers[path] = dataset
        attributes[path] = {**attributes.get(path, {}), **dataset.attributes}
        view.kinds.append(f"{path or '.'}: N5 dataset, {dataset.describe()['blocks']}")
    if plan.format == "precomputed":
        _multiscale(plan, attributes)
    attributes[""] = {**attributes.get("", {}), "n5": VERSION}
    for path, attrs in attributes.items():
        view.files[posixpath.join(path, "attributes.json")] = json.dumps(attrs, indent=1).encode()
    return view


def _multiscale(plan: Plan, attributes: dict[str, dict[str, Any]]) -> None:
    """What BigDataViewer and n5-viewer read of a scale pyramid: root `scales`, and per dataset
    `downsamplingFactors` (relative to the first scale) and `pixelResolution` in nm."""
    scales = [(path, a) for path, a in plan.arrays.items() if path in attributes]
    if not scales:
        return
    base = scales[0][1].multiscale["resolution"]
    factors = []
    for path, array in scales:
        resolution = array.multiscale["resolution"]
        factor = [_number(Fraction(r) / Fraction(b or 1)) for r, b in zip(resolution, base, strict=True)]
        factor += [1] * (len(array.shape) - 3)  # the channel dimension, last in N5 order
        factors.append(factor)
        attributes[path].update(
            downsamplingFactors=factor,
            pixelResolution={"unit": "nm", "dimensions": list(resolution)},
        )
    pixels = {"unit": "nm", "dimensions": base}
    attributes[""] = {**attributes.get("", {}), "scales": factors, "pixelResolution": pixels}


def _number(value: Fraction) -> int | float:
    return int(value) if value.denominator == 1 else float(value)
