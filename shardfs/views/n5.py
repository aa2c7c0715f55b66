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
from shardfs.request import OWN, Request
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

    def child(self, rel: str, request: Request = OWN) -> Node | None:
        at = self._grid_path(rel)
        if at is None:
            return None
        if any(p >= g for p, g in zip(at, self.grid, strict=False)):
            raise FileNotFoundError(rel)
        # A directory inside the grid is answered without looking (one index probe per level would cost
        # more than it saves); listings show only directories that hold blocks.
        if len(at) < self.ndim:
            return Dir(self.array.owner)  # the grid's directories stand for the array's
        return self.block(tuple(at[::-1]), request)

    def file_of(self, key: int, request: Request = OWN) -> File:
        at = grid_at(key, self.grid) if self.ndim else None
        if at is None:
            raise FileNotFoundError(f"key {key}")
        return self.block(at[::-1], request)

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

    def block(self, pos: tuple[int, ...], request: Request = OWN) -> File:
        stored = self.array.chunk(pos, request)
        inside = edge_shape(self.array, pos)
        head = struct.pack(f">HH{self.ndim}I", 0, self.ndim, *inside[::-1])
        if stored is None and not self.filled:
            raise FileNotFoundError(pos)
        big = self.array.dtype.newbyteorder(">")
        if stored is not None and self.zero_copy and (self.array.clipped or inside == self.array.chunks):
            return PrefixedFile(head, stored)
        if stored is not None and self.zero_copy and self.array.compressor:  # an edge block, compressed
            values = decoded(self.array, pos, stored, request).astype(big)
            return BytesFile(head + encode(self.array.compressor, values), stored.owner)
        size = len(head) + nbytes(inside, big)

        def make(request: Request) -> np.ndarray:
            """Header and values written once, straight into the buffer that is served."""
            out = np.empty(size, np.uint8)
            out[: len(head)] = np.frombuffer(head, np.uint8)
            body = out[len(head) :].view(big).reshape(inside)
            # N5 reads a missing block as zeros, so one of another fill value is made.
            body[...] = self.array.fill_value if stored is None else decoded(self.array, pos, stored, request)
            return out

        owner = self.array.owner if stored is None else stored.owner
        return LazyFile(size, self.cache, ("n5-block", self.directory, pos), make, getattr(stored, "nbytes", 0), owner)


def n5_view(plan: Plan) -> Plan:
    """The N5 container of a source's arrays: groups stay groups, arrays become datasets, and each scale
    pyramid a multiscale group of levels `s0`, `s1`, ... (`level_names`)."""
    view = Plan(plan.store, plan.cache, format="n5")
    attributes: dict[str, dict[str, Any]] = {path: dict(attrs) for path, attrs in plan.groups.items()}
    axes = axes_of(plan)
    shown: dict[str, Dataset] = {}
    for path, array in plan.arrays.items():
        if array.dtype.name not in DATA_TYPES or not array.shape:
            view.report.append(
                Finding(f"not in the N5 view: {path or '.'}: N5 has no {array.dtype.name} or 0-d datasets")
            )
        elif max(array.chunks) >= 1 << 32:
            view.report.append(Finding(f"not in the N5 view: {path or '.'}: N5 block dimensions are 32-bit"))
        else:
            shown[path] = Dataset(array, plan.cache, path)
    spaces = {path: space(axes.get(path)) for path in shown}
    bases: dict[str, list[Fraction]] = {}  # of each pyramid level, its first level's voxel size
    names: dict[str, str] = {}  # of each pyramid level, its name in the view
    for group, levels in pyramids(plan).items():
        levels = [path for path in levels if path in shown]
        found = [spaces[path] for path in levels]
        if not found or None in found or len({len(size) for _, size in found}) != 1 or bases.keys() & levels:
            continue  # no level shown, one of no known size or of another rank, or one another pyramid's
        units, base = found[0]
        bases.update(dict.fromkeys(levels, base))
        moved = level_names(group, levels, set(shown) | set(attributes) | set(names.values()), view.report)
        if moved is None:
            continue
        names.update(moved)
        scales = [_factors(size, base) for _, size in found]
        attributes[group] = {**attributes.get(group, {}), **_labels(axes.get(levels[0])),
                             **voxel_attributes(units, base), "scales": scales}  # fmt: skip
    for path, dataset in shown.items():
        name = names.get(path, path)
        view.providers[name] = dataset
        units, size = spaces[path] or ([""] * dataset.ndim, [Fraction(1)] * dataset.ndim)
        attributes[name] = {**attributes.get(name, {}), **dataset.attributes, **_labels(axes.get(path)),
                            **voxel_attributes(units, size, bases.get(path))}  # fmt: skip
        view.report.append(Finding(f"{name or '.'}: N5 dataset, {dataset.describe()['blocks']}"))
    view.aliases = {path: name for path, name in names.items() if path != name and path not in view.providers}
    attributes[""] = {**attributes.get("", {}), "n5": VERSION}
    for path, attrs in attributes.items():
        view.files[posixpath.join(path, "attributes.json")] = json.dumps(attrs, indent=1).encode()
    return view


def level_names(group: str, levels: list[str], taken: set[str], report: list[Finding]) -> dict[str, str] | None:
    """The new names of a pyramid's levels in the view: `s0`, `s1`, ... (finest first) in its group, where
    Neuroglancer's n5 source and n5-viewer look for them (no listing says which datasets a group's `scales`
    are). A level named otherwise in the source keeps that name as an alias (`Plan.aliases`). None, and the
    group is no multiscale (its levels keep their names), where a name is another array's or group's."""
    wanted = [posixpath.join(group, f"s{i}") for i in range(len(levels))]
    if (taken - set(levels)) & set(wanted) or group in levels:
        report.append(Finding(f"{group or '.'}: not an N5 multiscale: its levels cannot be named s0, s1, ... there"))
        return None
    moved = {path: name for path, name in zip(levels, wanted, strict=True) if path != name}
    if moved:
        shown = ", ".join(f"{posixpath.basename(name)} ({path})" for path, name in moved.items())
        report.append(Finding(f"{group or '.'}: levels {shown}; the source names open too, unlisted"))
    return moved


def space(axes: Axes | None) -> tuple[list[str], list[Fraction]] | None:
    """(units as SI symbols, a voxel's size in them), fastest dimension first, if the source says them in
    units N5 readers name. Where it does not, a dataset is said to be unitless, of voxels of size 1, so that
    a reader does not take the nanometres Neuroglancer's n5 source assumes when `units` is missing."""
    si = axes.si() if axes is not None else None
    return None if si is None else (si[0][::-1], [Fraction(s) for s in si[1][::-1]])


def voxel_attributes(units: list[str], size: list[Fraction], base: list[Fraction] | None = None) -> dict[str, Any]:
    """A dataset's voxels as N5 readers read them: `units` and `resolution`, its size (tensorstore's n5
    driver, and Neuroglancer's n5 source without `pixelResolution`), and where no two axes have different
    units, n5-viewer's `pixelResolution`. Of a pyramid level (base: its first level's size), `pixelResolution`
    states the base and `downsamplingFactors` size / base: Neuroglancer and n5-viewer multiply the two. With
    mixed units there is no `pixelResolution` to state the base in, so no factors either (Neuroglancer
    would multiply `resolution` by them): the group's `scales` has them."""
    out: dict[str, Any] = {"units": units, "resolution": [number(s) for s in size]}
    if len(named := {unit for unit in units if unit}) <= 1:
        out["pixelResolution"] = {"unit": next(iter(named), ""), "dimensions": [number(s) for s in base or size]}
        if base is not None:
            out["downsamplingFactors"] = _factors(size, base)
    return out


def _factors(size: list[Fraction], base: list[Fraction]) -> list[int | float]:
    return [number(s / b) for s, b in zip(size, base, strict=True)]


def _labels(axes: Axes | None) -> dict[str, Any]:
    """N5's `axes`, fastest first, where the source names every axis apart."""
    names = axes.labels() if axes is not None else None
    return {"axes": names[::-1]} if names else {}
