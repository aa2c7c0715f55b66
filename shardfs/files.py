"""What the virtual tree is made of: files, directories and the providers that compute them. Below the tree
(formats and views make these nodes; the tree only places them), so no layer imports upward for them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from shardfs.cache import ByteCache, closure_cost, key_cost
from shardfs.request import OWN, Request
from shardfs.stores.protocol import Owner, StoredFile

if TYPE_CHECKING:
    from shardfs.shards.kv import Fetch, ShardedKV


class File(Protocol):
    owner: Owner

    def size(self) -> int: ...

    def read(self, offset: int, length: int, request: Request = OWN) -> bytes:
        """Up to length bytes from offset, for request (what it decodes is counted against it; an interrupt of
        it ends a wait on the network)."""


@dataclass(frozen=True, slots=True)
class Dir:
    """A directory node, searchable as the source directory it stands for; what it lists comes from
    `Tree.listdir`."""

    owner: Owner


Node = File | Dir


class Provider(Protocol):
    """A directory whose contents are computed, such as one file per key of a sharded directory.
    Paths given to it are relative to its own directory ('' is the directory itself)."""

    kind: str  # what it is, in the user's words, for `shardfs info`
    kv: ShardedKV | None  # the shards whose keys it shows (what `shardfs check` reads); None for a view

    def describe(self) -> dict[str, Any]:
        """Its parameters, for `shardfs info`."""

    def child(self, rel: str, request: Request = OWN) -> Node | None:
        """The node at rel; None if rel is not the provider's (then the source decides).
        Raises FileNotFoundError for a path it owns that does not exist. request: whose lookup it is."""

    def entries(self, rel: str) -> Iterator[tuple[str, bool]]:
        """(name, is_dir) of its entries in directory rel, streamed."""

    def hides(self, rel: str) -> bool:
        """Whether a source path is hidden (the shards themselves)."""

    def key_of(self, rel: str) -> int | None:
        """A number ≥ 0 naming the path rel, as `child` parses it (a chunk's Morton code, or its index on the
        grid), or None for what has none (directories, names not the provider's). One name, one number: only
        canonical names have one, and `rel_of` gives the name back. Whether it exists is `child`'s to say."""

    def rel_of(self, key: int) -> str | None:
        """The path whose `key_of` is key; None if there is none."""

    def file_of(self, key: int, request: Request = OWN) -> File:
        """The file at the path whose `key_of` is key, found from the key alone: what `child` gives for that
        path. Raises FileNotFoundError if it does not exist."""

    def prefetch(self, keys: list[int]) -> list[Fetch]:
        """How to fetch the files of keys ahead of their reads (fs/readahead.py), in groups that run apart;
        none where nothing is worth fetching ahead (a source's own files, read as they are asked for)."""

    def position_of(self, key: int) -> tuple[int, ...] | None:
        """Where key's chunk lies on its array's grid (a volume's, an array's), or None where keys name no grid
        position (segment ids): a viewer reads chunks next to those it read (fs/readahead.py)."""

    def key_at(self, position: tuple[int, ...]) -> int | None:
        """The key of the chunk at a grid position, or None off the grid."""


@dataclass(slots=True)
class BytesFile:
    """Bytes made once (rewritten metadata, a decoded chunk), kept as decoded: a large value is not copied."""

    data: bytes | bytearray
    owner: Owner  # the source file's the bytes come from
    path: str = ""  # that source file, if the bytes were decoded from it: errors name it

    @property
    def nbytes(self) -> int:
        return len(self.data)

    def size(self) -> int:
        return len(self.data)

    def read(self, offset: int, length: int, request: Request = OWN) -> bytes:
        return bytes(memoryview(self.data)[offset : offset + length])


@dataclass(slots=True)
class LazyFile:
    """A decoded or transcoded chunk whose size is known from metadata alone (raw bytes), so `stat` and
    `ls -l` decode nothing. A file read whole by one request is made and handed over, not kept: the kernel
    keeps its pages (FUSE no_open), so no later read would find it here. One read in pieces makes the bytes
    into the byte-bounded cache, and later pieces share them."""

    length: int
    cache: ByteCache
    key: tuple
    make: Callable[[Request], Any]  # bytes, or an array of them, made for a request
    held: int  # what make holds until then: a stored chunk already in memory, or nothing
    owner: Owner  # the stored chunk's, or the array directory's for a block made of the fill value

    @property
    def nbytes(self) -> int:
        """What this node keeps in memory beyond its own object, for the node cache's budget: the stored chunk
        make holds, its key, and make itself, a closure of a few hundred bytes (measured). 0 when make holds no
        stored bytes: such a node is not kept (found again is cheaper), and its closure goes with it."""
        return self.held + key_cost(self.key) + closure_cost(self.make) if self.held else 0

    def size(self) -> int:
        return self.length

    def read(self, offset: int, length: int, request: Request = OWN) -> bytes:
        if offset == 0 and length >= self.length:
            return bytes(self.make(request))
        return bytes(self.cache.get_or_make(self.key, lambda: self.make(request))[offset : offset + length])


@dataclass(slots=True)
class RangeFile:
    """A byte range of one version of a source file: a raw chunk read straight from its shard, nothing
    copied in between; if the file changed since the range was found, the read fails."""

    file: StoredFile
    start: int
    stop: int

    @property
    def owner(self) -> Owner:
        return self.file.owner

    @property
    def path(self) -> str:
        return self.file.path

    def size(self) -> int:
        return self.stop - self.start

    def read(self, offset: int, length: int, request: Request = OWN) -> bytes:
        start = self.start + offset
        return self.file.read(start, min(start + length, self.stop), request)


@dataclass(slots=True)
class FetchedAheadFile(RangeFile):
    """A range whose bytes may be fetched ahead after the kernel looked the file up (read-ahead, over a
    network): each read takes them where they came meanwhile (held), else reads the range as RangeFile does."""

    held: Callable[[], bytes | None]

    def read(self, offset: int, length: int, request: Request = OWN) -> bytes:
        held = self.held()
        return held[offset : offset + length] if held is not None else RangeFile.read(self, offset, length, request)
