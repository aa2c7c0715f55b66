"""Positions on a chunk grid: spelled in a name, and numbered in C order (the number a chunk file's node id
carries)."""

from __future__ import annotations

from collections.abc import Sequence


def grid_shape(shape: Sequence[int], chunks: Sequence[int]) -> tuple[int, ...]:
    """Chunks along each dimension of an array of shape: a partial chunk at an edge counts as one."""
    return tuple(-(-s // c) for s, c in zip(shape, chunks, strict=True))


def grid_position(parts: list[str]) -> tuple[int, ...] | None:
    """Chunk indices spelled in canonical decimal (one chunk, one name: no '01', no '+1'), or None."""
    if not all(p.isascii() and p.isdigit() and str(int(p)) == p for p in parts):
        return None
    return tuple(map(int, parts))


def grid_index(pos: Sequence[int], grid: Sequence[int]) -> int | None:
    """The number of a chunk position on a grid in C order (the key a chunk file's node id carries), or
    None for a position off the grid or of another rank."""
    if len(pos) != len(grid):
        return None
    index = 0
    for p, g in zip(pos, grid, strict=True):
        if not 0 <= p < g:
            return None
        index = index * g + p
    return index


def grid_at(index: int, grid: Sequence[int]) -> tuple[int, ...] | None:
    """The chunk position `grid_index` numbered index, or None if it numbers none."""
    pos = []
    for g in reversed(grid):
        index, p = divmod(index, g) if g else (index, -1)
        pos.append(p)
    return None if index or min(pos, default=0) < 0 else tuple(reversed(pos))
