"""Where bytes live. Every read is a byte range of one version of one file, so a chunk never costs a
whole shard and an index is never applied to bytes it was not read from.

A mount is a service other users reach, so the local store resolves every path beneath its root one
component at a time, each opened relative to its parent's descriptor with `O_NOFOLLOW`: a link is never
followed, and swapping a directory for a link between a check and a use has no window to exploit. The
owner and mode a node is shown with are narrowed by every directory on the way to it, so the mount lets
read exactly what the source would, never more.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import io
import os
import stat
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

from shardfs.context import Context

T = TypeVar("T")
# The bits a class of users needs on a directory to pass it: search for owner, group, others.
_SEARCH = (0o100, 0o010, 0o001)


@dataclass(frozen=True, slots=True)
class Owner:
    """Who may read a node: uid, gid and the read/search bits it is shown with (never write)."""

    uid: int
    gid: int
    mode: int

    @classmethod
    def of(cls, st: os.stat_result) -> Owner:
        bits = 0o555 if stat.S_ISDIR(st.st_mode) else 0o444
        return cls(st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode) & bits)

    def beneath(self, directories: tuple[Owner, ...]) -> Owner:
        """This node as reached through directories: a class of users keeps its bits only if every one of
        them surely lets that class search it. Unknown group memberships count against, so this never
        grants more than the source does, and for the usual modes (0755, 0750, 0700) it grants the same."""
        mode = self.mode
        for d in directories:
            ux, gx, ox = (bool(d.mode & bit) for bit in _SEARCH)
            if not (ux and gx and ox):
                mode &= ~0o007  # anyone may be its owner, in its group or neither
            if not (ux and gx and (ox or d.gid == self.gid)):
                mode &= ~0o070  # a member of our group may be its owner, or outside its group
            if not ((d.uid == self.uid and ux) or (gx and ox)):
                mode &= ~0o700
        return Owner(self.uid, self.gid, mode)

    def also(self, other: Owner) -> Owner:
        """This file's owner, narrowed to those who surely may read other too: bytes made of two files are
        readable only by whoever may read both. Reading other is what searching a directory of its read
        bits would be, so `beneath` decides it, unknown group memberships counting against as there."""
        return self.beneath((Owner(other.uid, other.gid, (other.mode & 0o444) >> 2),))


class StoreChanged(OSError):
    """A file changed under the mount: what an index says of it no longer holds. The read is EIO."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(errno.EIO, f"changed under the mount ({why})", path)


@dataclass(frozen=True, slots=True)
class StoredFile:
    """One version of one file of the source. An index read from it is cached under its version, and
    data read through that index comes from the same version, or the read fails."""

    path: str
    size: int
    version: tuple
    owner: Owner
    store: Store = field(compare=False, repr=False)

    def read(self, start: int, stop: int) -> bytes:
        """Exactly bytes [start, stop) of this version; StoreChanged if they cannot be had."""
        return self.store.read(self, start, stop) if stop > start else b""

    def next_data(self, offset: int) -> int:
        """The first offset at or after offset that may hold data (sparse files skip their holes)."""
        return self.store.next_data(self, offset)

    def pieces(self, start: int, stop: int) -> Iterator[bytes]:
        """Bytes [start, stop) of this version, read a piece at a time as they are consumed."""
        step = self.store.piece_size
        return (self.read(at, min(at + step, stop)) for at in range(start, stop, step))


@dataclass(frozen=True, slots=True)
class JoinedFile(StoredFile):
    """Two stored files read as their concatenation: offsets below head's size are head's, the others tail's
    at offset - head's size. (The earlier precomputed layout stores a shard as its index and the rest.) Its
    version is both files', and every read checks each file's own, so neither half is read at another one."""

    head: StoredFile
    tail: StoredFile

    @classmethod
    def of(cls, path: str, head: StoredFile, tail: StoredFile) -> JoinedFile:
        """path: what the two are called together, in messages and cache keys."""
        version = (head.version, tail.version)
        return cls(path, head.size + tail.size, version, tail.owner.also(head.owner), tail.store, head, tail)

    def read(self, start: int, stop: int) -> bytes:
        cut = self.head.size  # each part is b"" where the range misses it, and b"" + part is part, uncopied
        return self.head.read(start, min(stop, cut)) + self.tail.read(max(start, cut) - cut, stop - cut)

    def next_data(self, offset: int) -> int:
        cut = self.head.size
        if offset < cut and (found := self.head.next_data(offset)) < cut:
            return found
        return cut + self.tail.next_data(max(offset, cut) - cut)


class Store(Protocol):
    """What formats, views and the tree know of where bytes live."""

    can_list: bool  # False where directories cannot be listed (HTTP): they list as empty
    piece_size: int  # bytes read at a time when a value is decoded as it is read
    reads_at_once: int  # reads a listing keeps in flight: 1 where a read waits on nothing but itself

    def reads(self) -> Executor | None:
        """The threads every listing's reads run in (one set per store, sized once), or None where a read
        is run by the thread that wants it."""

    def open(self, path: str) -> StoredFile:
        """The current version of a regular file; FileNotFoundError if there is none."""

    def open_reading(self, path: str, start: int, stop: int) -> tuple[StoredFile, bytes]:
        """open() and the bytes [start, stop) of that version (fewer where it ends sooner), at the cost of the
        read alone where the store can: a remote one learns the version from the read's answer."""

    def open_tail(self, path: str, n: int) -> tuple[StoredFile, bytes]:
        """open() and the last n bytes of that version (all of it where it is shorter), at the cost of the
        read alone where the store can: what a zarr shard's index at its end needs before its size is known."""

    def read(self, file: StoredFile, start: int, stop: int) -> bytes: ...

    def next_data(self, file: StoredFile, offset: int) -> int: ...

    def list(self, path: str) -> Iterator[tuple[str, bool]]:
        """(name, is_dir) of a directory's files and directories, streamed; nothing if it is absent."""

    def kind(self, path: str) -> str | None:
        """'file', 'dir', or None for anything else (absent, a link, a device)."""

    def owner(self, path: str) -> Owner:
        """Who may read the node that stands for path: a file or directory as the source has it, an
        absent one as its nearest directory. Narrowed by every directory on the way."""

    def where(self, path: str) -> str:
        """path as a user would name it, for messages."""

    def forget(self) -> None:
        """Close what is open and forget what was learned, so that the source is read afresh."""

    def descriptors(self) -> list[int]:
        """File descriptors the store needs kept open across a daemon's detaching."""

    def sizes(self) -> Iterator[int]:
        """The size of every file the source stores, streamed (for `df`); nothing where it cannot be listed."""


class LocalStore:
    """Byte ranges from files under one root directory, read with `os.pread` on descriptors kept in an
    LRU (functools', thread-safe and frameless). An evicted file closes by refcounting once no reader
    still holds it, so eviction never races a concurrent `pread`."""

    can_list = True
    piece_size = 1 << 20
    reads_at_once = 1  # a pread is over before a thread could be handed it

    def __init__(self, root: str | Path, max_open: int = 256, context: Context | None = None) -> None:
        """context: the mount's, where its reads are counted."""
        self.root = Path(root).absolute()
        self.context = context or Context()
        self._root = os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        weakref.finalize(self, os.close, self._root)
        st = os.fstat(self._root)
        self._root_owner = Owner.of(st)
        # The directories above the root count too: the mount must not open what they close.
        self._above = tuple(Owner.of(os.stat(p)) for p in reversed(self.root.parents))
        # The caches call back weakly, so that a store nobody holds is freed (its files closed) at once.
        self._file = functools.lru_cache(maxsize=max_open)(_weakly(self._open))
        self._dirs = functools.lru_cache(maxsize=4096)(_weakly(self._directories))

    # -- resolving beneath the root -----------------------------------------------------------------------------------

    def _parts(self, path: str) -> list[str]:
        parts = path.split("/") if path else []
        if any(p in ("", ".", "..") for p in parts):
            raise FileNotFoundError(errno.ENOENT, "not a path beneath the source", self.where(path))
        return parts

    def _opendir(self, parts: list[str], flags: int = os.O_PATH) -> int:
        """A descriptor of the directory parts lead to, every component opened with O_NOFOLLOW relative to
        the one before. A link, or anything but a directory, on the way is as good as absent."""
        fd = os.dup(self._root)
        steps = parts if parts or flags == os.O_PATH else ["."]
        try:
            for i, part in enumerate(steps):
                opened = os.open(part, (flags if i == len(steps) - 1 else os.O_PATH) | _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = opened
        except OSError as e:
            os.close(fd)
            raise _absent(e, self.where("/".join(parts))) from None
        return fd

    def _directories(self, path: str) -> tuple[Owner, ...]:
        """Owners of every directory from / down to path (cached: directories are few)."""
        if not path:
            return (*self._above, self._root_owner)
        parent, _, _ = path.rpartition("/")
        fd = self._opendir(self._parts(path))
        try:
            return (*self._dirs(parent), Owner.of(os.fstat(fd)))
        finally:
            os.close(fd)

    def _open(self, path: str) -> tuple[io.FileIO, tuple, Owner]:
        """Only regular files are data. Opening is non-blocking, so a FIFO where a shard should be cannot
        hang a FUSE thread."""
        parts = self._parts(path)
        if not parts:
            raise FileNotFoundError(errno.ENOENT, "not a file", self.where(path))
        parent = self._opendir(parts[:-1])
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
        except OSError as e:
            raise _absent(e, self.where(path)) from None
        finally:
            os.close(parent)
        file = io.FileIO(fd, "r")  # closes fd however this ends
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileNotFoundError(errno.ENOENT, "not a regular file", self.where(path))
        owner = Owner.of(st).beneath(self._dirs("/".join(parts[:-1])))
        return file, (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns), owner

    def _lstat(self, path: str) -> os.stat_result | None:
        parts = self._parts(path)
        if not parts:
            return os.fstat(self._root)
        try:
            parent = self._opendir(parts[:-1])
        except FileNotFoundError:
            return None
        try:
            return os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            return None
        finally:
            os.close(parent)

    # -- the Store protocol -------------------------------------------------------------------------------------------

    def reads(self) -> None:
        return None

    def open(self, path: str) -> StoredFile:
        _, version, owner = self._file(path)
        return StoredFile(path, version[2], version, owner, self)

    def open_reading(self, path: str, start: int, stop: int) -> tuple[StoredFile, bytes]:
        file = self.open(path)
        return file, file.read(start, min(stop, file.size))

    def open_tail(self, path: str, n: int) -> tuple[StoredFile, bytes]:
        file = self.open(path)
        return file, file.read(max(file.size - n, 0), file.size)

    def read(self, file: StoredFile, start: int, stop: int) -> bytes:
        f, version, _ = self._file(file.path)
        if version != file.version:
            raise StoreChanged(self.where(file.path), "replaced since its index was read")
        data = os.pread(f.fileno(), stop - start, start)
        self.context.metrics.store_reads.inc()
        self.context.metrics.store_bytes.inc(len(data))
        if len(data) != stop - start:
            raise StoreChanged(self.where(file.path), f"{len(data)} bytes at {start}, not {stop - start}: truncated")
        return data

    def next_data(self, file: StoredFile, offset: int) -> int:
        f, version, _ = self._file(file.path)
        if version != file.version:
            raise StoreChanged(self.where(file.path), "replaced since it was opened")
        try:
            return os.lseek(f.fileno(), offset, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:  # no data at or after offset: the rest is a hole
                return file.size
            raise

    def list(self, path: str) -> Iterator[tuple[str, bool]]:
        try:
            fd = self._opendir(self._parts(path), os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            entries = os.scandir(fd)  # on a descriptor of its own: ours is closed at once
        finally:
            os.close(fd)
        with entries:
            for e in entries:
                if e.is_dir(follow_symlinks=False):
                    yield e.name, True
                elif e.is_file(follow_symlinks=False):
                    yield e.name, False

    def kind(self, path: str) -> str | None:
        st = self._lstat(path)
        if st is None:
            return None
        return "dir" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else None

    def owner(self, path: str) -> Owner:
        kind = self.kind(path)
        if kind == "file":
            return self.open(path).owner
        parts = self._parts(path)
        chain = self._nearest_directory(parts if kind == "dir" else parts[:-1])
        return chain[-1].beneath(chain[:-1])

    def _nearest_directory(self, parts: list[str]) -> tuple[Owner, ...]:
        for n in range(len(parts), 0, -1):
            with contextlib.suppress(FileNotFoundError):
                return self._dirs("/".join(parts[:n]))
        return self._dirs("")

    def where(self, path: str) -> str:
        return str(self.root / path) if path else str(self.root)

    def forget(self) -> None:
        self._file.cache_clear()
        self._dirs.cache_clear()

    def sizes(self) -> Iterator[int]:
        """Regular files' sizes, walked from the root's descriptor with no link followed."""
        for _, _, files, at in os.fwalk(".", dir_fd=self._root):
            for name in files:
                with contextlib.suppress(OSError):  # gone meanwhile
                    st = os.stat(name, dir_fd=at, follow_symlinks=False)
                    if stat.S_ISREG(st.st_mode):
                        yield st.st_size

    def descriptors(self) -> list[int]:
        return [self._root]


def _weakly(method: Callable[..., T]) -> Callable[..., T]:
    """method, called through a weak reference to its object: no reference cycle through a cache of it."""
    ref = weakref.WeakMethod(method)
    return lambda *args: ref()(*args)  # type: ignore[misc]


_DIR_FLAGS = os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _absent(e: OSError, path: str) -> OSError:
    """A link (ELOOP), a non-directory on the way (ENOTDIR) or nothing (ENOENT) all mean: not in the
    source. Anything else (EACCES, EIO) is a real error and stays one."""
    if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
        return FileNotFoundError(errno.ENOENT, "not in the source", path)
    return OSError(e.errno, e.strerror, path)
