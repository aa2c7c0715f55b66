"""Neuroglancer precomputed: what the unsharded layout calls each key (segment ids, annotation grid cells,
volume chunks by their voxel bounds), and the key each such name stands for."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from functools import cached_property
from typing import Protocol

from shardfs.shards.grid import grid_shape
from shardfs.shards.morton import MortonCode
from shardfs.shards.neuroglancer import UINT64_MAX


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
        self.grid = list(grid_shape(size, chunk))
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
