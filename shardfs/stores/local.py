"""Byte ranges from a local directory.

A mount is a service other users reach, so the local store resolves every path beneath its root one
component at a time, each opened relative to its parent's descriptor with `O_NOFOLLOW`: a link is never
followed, and swapping a directory for a link between a check and a use has no window to exploit. The
owner and mode a node is shown with are narrowed by every directory on the way to it, so the mount lets
read exactly what the source would, never more.

The root is held open: a source deleted or replaced under the mount (a writer that removes its directory and
writes it again) would otherwise look empty, every chunk absent, and readers such as zarr-python would read
an array of fill values without an error. So whatever is found absent is checked against the root first: once
the root is gone (no links left, or its path names another directory), absent is EIO, said once in the log.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import io
import logging
import os
import stat
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from shardfs.context import Context
from shardfs.request import OWN, Request
from shardfs.stores.protocol import ByteRange, Owner, StoreChanged, StoredFile

T = TypeVar("T")
log = logging.getLogger("shardfs")


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
        self._gone_said = False

    def _absent(self, e: OSError, path: str) -> OSError:
        """What a failed open beneath the root means (see _absent); ENOENT becomes EIO once the root is gone."""
        found = _absent(e, path)
        if isinstance(found, FileNotFoundError) and (gone := self._root_gone()) is not None:
            return gone
        return found

    def _root_gone(self) -> OSError | None:
        """EIO, said once, if the root held open was deleted or its path now names another directory."""
        held = os.fstat(self._root)
        try:
            now = os.stat(self.root)
            replaced = (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino)
        except OSError:
            replaced = True
        if held.st_nlink and not replaced:  # a directory has links while it is there (its name and ".")
            return None
        why = "deleted" if not held.st_nlink else "replaced by another directory"
        if not self._gone_said:
            self._gone_said = True
            log.error("%s: the source directory was %s since it was mounted: its files fail (EIO) rather than look"
                      " absent; unmount and mount again to serve what is there now", self.root, why,
                      extra={"event": "source_gone"})  # fmt: skip
        return OSError(errno.EIO, f"the source directory was {why} since it was mounted", str(self.root))

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
            raise self._absent(e, self.where("/".join(parts))) from None
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
            raise self._absent(e, self.where(path)) from None
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
            if (gone := self._root_gone()) is not None:
                raise gone from None
            return None
        finally:
            os.close(parent)

    # -- the Store protocol -------------------------------------------------------------------------------------------

    def reads(self) -> None:
        return None

    def open(self, path: str) -> StoredFile:
        _, version, owner = self._file(path)
        return StoredFile(path, version[2], version, owner, self)

    def open_reading(self, path: str, want: ByteRange, request: Request = OWN) -> tuple[StoredFile, bytes]:
        file = self.open(path)
        return file, file.read(*want.within(file.size))

    def read(self, file: StoredFile, start: int, stop: int, request: Request = OWN) -> bytes:
        """A disk's read waits on nothing an interrupt could end: request is not asked."""
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
        if (gone := self._root_gone()) is not None:  # a deleted root still lists, empty
            raise gone
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

    def type_of(self, path: str) -> str | None:
        st = self._lstat(path)
        if st is None:
            return None
        return "dir" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else None

    def is_file(self, path: str) -> bool:
        return self.type_of(path) == "file"

    def owner(self, path: str) -> Owner:
        found = self.type_of(path)
        if found == "file":
            return self.open(path).owner
        parts = self._parts(path)
        chain = self._nearest_directory(parts if found == "dir" else parts[:-1])
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
