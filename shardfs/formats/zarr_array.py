"""A zarr v3 array as the tree shows it: a sharded one as the unsharded array with its innermost chunks (a
tree Provider over its shards, `shards/zarr_kv.py`), and an unsharded one's chunks for the views."""

from __future__ import annotations

import math
import posixpath
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from shardfs.files import Dir, File, Node, RangeFile
from shardfs.formats.plan import extent_file
from shardfs.request import OWN, Request
from shardfs.shards.grid import grid_at, grid_index, grid_shape
from shardfs.shards.kv import Fetch, files_below
from shardfs.shards.zarr import ChunkKeys
from shardfs.shards.zarr_kv import ZarrKV
from shardfs.stores.protocol import Store


class ZarrArray:
    """A sharded zarr v3 array presented with its innermost chunks (a tree Provider): chunk keys are named
    here, and found in its shards by `kv`."""

    def __init__(self, kv: ZarrKV) -> None:
        self.kv, self.keys = kv, kv.keys
        levels = kv.levels
        self.kind = "zarr v3 sharded array"
        self.details = {
            "shape": list(kv.shape),
            "shard shape": list(levels[0].shape),
            "inner chunk shape": list(kv.inner),
            "nesting levels": len(levels),
            "index": ", ".join(
                f"{'start' if lv.layout.at_start else 'end'}{'+crc32c' if lv.layout.checksum else ''}" for lv in levels
            ),
        }

    def describe(self) -> dict[str, Any]:
        grid = math.prod(self.kv.shard_grid)
        if not self.kv.store.can_list:  # none would be found: a count of 0 would say the shards are missing
            return {**self.details, "shard files": f"{grid} in the grid; not counted (the server cannot list them)"}
        return {**self.details, "shard files": f"{sum(1 for _ in self.kv.shards())} present of {grid}"}

    def hides(self, rel: str) -> bool:
        return self.keys.owns(rel)

    def key_of(self, rel: str) -> int | None:
        """A chunk key's position numbered on the grid; directories (c/1) have no number."""
        parsed = self.keys.parse(rel)
        return grid_index(parsed[0], self.kv.grid) if parsed is not None and parsed[1] else None

    def rel_of(self, key: int) -> str | None:
        pos = grid_at(key, self.kv.grid)
        return None if pos is None else self.keys.key(pos)

    def child(self, rel: str, request: Request = OWN) -> Node | None:
        parsed = self.keys.parse(rel)
        if parsed is None:
            return None
        pos, whole = parsed
        if not all(p < g for p, g in zip(pos, self.kv.grid, strict=False)):
            raise FileNotFoundError(rel)
        if not whole:
            if not self.kv.holds(pos):
                raise FileNotFoundError(rel)
            # It stands for the directory of the shards it draws on (c/1 for c/5 with 4 chunks a shard).
            return Dir(self.kv.store.owner(self.kv.shard_path(self.kv.shard_of(pos)).rstrip("/.")))
        return self._stored(pos, request)

    def file_of(self, key: int, request: Request = OWN) -> File:
        pos = grid_at(key, self.kv.grid)
        if pos is None:
            raise FileNotFoundError(f"key {key}")
        return self._stored(pos, request)

    def _stored(self, pos: tuple[int, ...], request: Request) -> File:
        """The inner chunk at pos; a chunk not stored is ENOENT."""
        found = self.chunk(pos, request)
        if found is None:
            raise FileNotFoundError(f"chunk {pos}")
        return found

    def chunk(self, pos: tuple[int, ...], request: Request = OWN) -> File | None:
        """The inner chunk at global grid position pos, or None if it is absent."""
        extent = self.kv.locate(pos, request)
        return None if extent is None else extent_file(extent, self.kv)

    def position_of(self, key: int) -> tuple[int, ...] | None:
        return grid_at(key, self.kv.grid)

    def key_at(self, position: tuple[int, ...]) -> int | None:
        return grid_index(position, self.kv.grid)

    def prefetch(self, keys: list[int]) -> list[Fetch]:
        positions = [pos for pos in (grid_at(key, self.kv.grid) for key in keys) if pos is not None]
        return [fetch.renamed(lambda pos: grid_index(pos, self.kv.grid)) for fetch in self.kv.fetches(positions)]  # type: ignore[arg-type]

    def entries(self, rel: str) -> Iterator[tuple[str, bool]]:
        """Exactly the keys of stored chunks, and the directories above them that hold any."""
        if not self.keys.ndim:  # a 0-d array: its one chunk, a file in the array directory
            if not rel and self.kv.any_stored():
                yield self.keys.key(()), False
            return
        if not rel and self.keys.top:
            if self.kv.any_stored():
                yield self.keys.top, True
            return
        parsed = self.keys.parse(rel) if rel else ((), False)
        if parsed is None or parsed[1]:
            return
        prefix = parsed[0]
        if self.keys.separator == "." or len(prefix) == self.keys.ndim - 1:
            for pos in self.kv.present_under(prefix):
                yield self.keys.key(pos).rsplit("/", 1)[-1], False
            return
        below = {pos[len(prefix)] for pos in self.kv.present_under(prefix)}  # at most one int per grid row
        for i in sorted(below):
            yield self.keys.key((*prefix, i)).rsplit("/", 1)[-1], True


@dataclass
class SourceChunks:
    """An unsharded array's chunks: one source file per chunk key."""

    store: Store
    directory: str
    keys: ChunkKeys
    chunks: tuple[int, ...]
    shape: tuple[int, ...]

    def chunk(self, pos: tuple[int, ...], request: Request = OWN) -> File | None:
        """A source file's opening waits on nothing a request's interrupt ends (a HEAD at worst)."""
        path = posixpath.join(self.directory, self.keys.key(pos))
        try:
            file = self.store.open(path)
        except FileNotFoundError:
            return None
        return RangeFile(file, 0, file.size)

    def stored(self, prefix: tuple[int, ...] = ()) -> Iterator[tuple[int, ...]]:
        """Positions of the chunk files that start with prefix: with `/` keys, only its directory is walked."""
        grid = grid_shape(self.shape, self.chunks)
        below = self.keys.key(prefix) if prefix and self.keys.separator == "/" else ""
        for path in files_below(self.store, posixpath.join(self.directory, below) if below else self.directory):
            parsed = self.keys.parse(path[len(self.directory) :].lstrip("/"))
            if parsed is None or not parsed[1] or parsed[0][: len(prefix)] != prefix:
                continue
            if all(p < g for p, g in zip(parsed[0], grid, strict=True)):
                yield parsed[0]
