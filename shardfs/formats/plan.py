"""What a source format contributes to a mount: rewritten metadata files and computed directories, and,
for the cross-format views, its groups and arrays described in one common shape."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import numpy as np

from shardfs.cache import ByteCache
from shardfs.errors import SourceError
from shardfs.files import BytesFile, FetchedAheadFile, File, Provider, RangeFile
from shardfs.request import Request
from shardfs.shards.kv import Extent, Fetch, ShardedKV
from shardfs.stores.protocol import Owner, Store

LARGEST = 1 << 62  # sizes, shapes and offsets past it would overflow the int64 maths of chunk positions
METADATA_LIMIT = 64 << 20  # bytes of one metadata file (`info`, `zarr.json`) parsed
METADATA_DEPTH = 64  # nesting of its JSON: real metadata has under 10
# What code walking metadata of an unexpected shape raises (a string where a list was, a key missing, a zero
# where a size was): the file is refused in words, as for a SourceError, never with a traceback.
MALFORMED = (TypeError, ValueError, AttributeError, KeyError, ZeroDivisionError)


@dataclass(frozen=True)
class Compressor:
    """The one bytes→bytes codec over a chunk's raw bytes, in zarr v3 terms: gzip, zstd or blosc."""

    name: str
    config: dict[str, Any]


@dataclass
class Array:
    """One array of a source, as the views need it. Everything is in C order, slowest dimension first;
    chunk positions are on the chunk grid. Views copy stored bytes when they fit and decode them when not."""

    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    dtype: np.dtype  # with the byte order of the stored bytes
    fill_value: Any  # a Python number or bool
    attributes: dict[str, Any]
    # Stored chunk bytes are the raw bytes, compressed by this (None: raw). If opaque, they are neither,
    # and only decode() can read them (jpeg, crc32c, chained codecs, ...).
    compressor: Compressor | None
    opaque: bool
    clipped: bool  # edge chunks are stored clipped to the array (precomputed), not whole (zarr)
    # A stored chunk, or None if it was never written, looked up for a request.
    chunk: Callable[[tuple[int, ...], Request], File | None]
    # Positions of the stored chunks that start with a prefix (all, with () or none given), streamed: a
    # view's nested directory lists those below it without going through the whole array.
    stored: Callable[[tuple[int, ...]], Iterable[tuple[int, ...]]]
    # Whether stored(prefix) reads only what lies below the prefix (zarr: by shard file and directory), or
    # everything and filters (precomputed: Morton order and hashed shards have no prefix to narrow by).
    narrows: bool
    # Stored bytes, stored shape, for a request (its decode budget) → C-order array.
    decode: Callable[[bytes, tuple[int, ...], Request], np.ndarray]
    owner: Owner  # the array directory's: who may search the directories a view makes for it
    multiscale: dict[str, Any] = field(default_factory=dict)  # precomputed: resolution and voxel_offset (x, y, z)
    dimension_names: tuple[str | None, ...] | None = None  # zarr v3's `dimension_names`, if it has them
    separator: str = "/"  # between the indices of its chunk keys in the source (zarr's `c/1/2` or `1.2`)
    # How to fetch stored chunks ahead of their reads, by position (a view's read-ahead): none for an unsharded
    # source's files, read as they are asked for.
    prefetch: Callable[[list[tuple[int, ...]]], list[Fetch]] = lambda positions: []


def senseless(where: str, e: Exception) -> SourceError:
    """The refusal of the metadata file at where, for an error MALFORMED names."""
    return SourceError(f"{where}: cannot make sense of it ({type(e).__name__}: {e})")


def extent_file(extent: Extent, kv: ShardedKV) -> File:
    """A key's stored bytes as a file: read from its shard's range as it is asked for, or cut from the shard's
    decoded bytes; over a network, from those fetched ahead of it (kv.held), even if they come after the file
    was looked up (a reader that stats before it reads)."""
    if extent.data is not None:
        return BytesFile(bytes(extent.data[extent.start : extent.stop]), extent.file.owner, extent.shard)
    if not kv.round_trips:
        return RangeFile(extent.file, extent.start, extent.stop)
    return FetchedAheadFile(extent.file, extent.start, extent.stop, lambda: kv.held(extent))


def load_json(store: Store, path: str) -> Any:
    """A metadata file parsed, bounded in size and nesting so that no file can exhaust the parser or the
    code that walks its result; SourceError naming the file otherwise. FileNotFoundError if absent."""
    file = store.open(path)
    where = store.where(path)
    if file.size > METADATA_LIMIT:
        raise SourceError(f"{where}: {file.size} bytes, more than the {METADATA_LIMIT}-byte limit for metadata")
    try:
        value = json.loads(file.read(0, file.size))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SourceError(f"{where}: not valid JSON ({e})") from None
    except RecursionError:
        value = None  # deeper than the parser goes, so deeper than allowed
    else:
        if _depth(value) <= METADATA_DEPTH:
            return value
    raise SourceError(f"{where}: JSON nested more than {METADATA_DEPTH} levels deep")


def _depth(value: Any) -> int:
    """Nesting of a parsed JSON value, walked without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


class Category(IntEnum):
    """What a line of a source's report says, in the order `shardfs info` shows them."""

    FOUND = 0  # what a directory holds
    REFUSED = 1  # served as stored: shardfs cannot present it (`shardfs check` does not check it)
    NOT_IN_VIEWS = 2  # left out of --view n5/zarr2
    WARNING = 3  # most likely a typo in the metadata
    NOTE = 4


PREFIXES = {Category.REFUSED: "refused: ", Category.NOT_IN_VIEWS: "not in other views: ",
            Category.WARNING: "warning: ", Category.NOTE: "note: "}  # fmt: skip


@dataclass(frozen=True)
class Finding:
    """One line of what was found in a source, for `shardfs info` and `shardfs check`."""

    text: str
    category: Category = Category.FOUND

    def __str__(self) -> str:
        return PREFIXES.get(self.category, "") + self.text


@dataclass
class Plan:
    store: Store
    cache: ByteCache
    files: dict[str, bytes] = field(default_factory=dict)  # metadata rewritten without sharding
    providers: dict[str, Provider] = field(default_factory=dict)  # sharded directories, by path
    report: list[Finding] = field(default_factory=list)  # what was found, for `shardfs info`
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)  # attributes of each group, by path
    arrays: dict[str, Array] = field(default_factory=dict)  # every array the views can show, by path
    format: str = ""  # "zarr" or "precomputed": what the views translate from
    # Directories the metadata names (scales, meshes, groups, arrays): where the store cannot list (HTTP),
    # these are how the tree knows them.
    directories: set[str] = field(default_factory=set)
    found: set[str] = field(default_factory=set)  # the metadata files read (`info`, `zarr.json`): listed likewise
    # Other names of shown directories, found by lookup and never listed, so a walk or a copy takes each once:
    # the N5 view's pyramid levels under their source names.
    aliases: dict[str, str] = field(default_factory=dict)
    what: str = ""  # the dataset at the root, in a few words (`shardfs info` of a directory of datasets names it)
