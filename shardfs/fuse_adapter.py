"""The thin layer between libfuse and the tree: tree answers become FUSE replies, exceptions become errno.

It knows nothing of formats. Open directories keep a cursor, so a listing streams in pieces without
being held whole; files are found by path through the tree's node cache.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import itertools
import logging
import stat
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import mfusepy

from shardfs import metrics
from shardfs.codecs import start_request
from shardfs.errors import CorruptChunk
from shardfs.fuse.adapter import DirCursor
from shardfs.tree import Dir, Node, Owner, Tree

log = logging.getLogger("shardfs")
F = TypeVar("F", bound=Callable[..., Any])

BLOCK_SIZE = 1 << 20  # st_blksize: tools such as cp size their reads by it
FUSE_CAP_NO_OPEN_SUPPORT = 1 << 17  # libfuse's fuse_common.h
REQUEST_FILES = 4  # a request may decode as much as this many of the largest files (nested shards, a view)
READDIR = metrics.OPS.labels("readdir")
OPENED = metrics.OPS.labels("open")


_pinned: set[int] = set()


def pin_thread_state() -> None:
    """ctypes makes a Python thread state for every callback from a libfuse thread and destroys it after,
    frame stack and all. One extra reference, taken once per thread, keeps it for the thread's life."""
    ident = threading.get_ident()
    if ident not in _pinned:
        ctypes.pythonapi.PyGILState_Ensure()
        _pinned.add(ident)


def errors_to_errno(op: F) -> F:
    """Absent → ENOENT; corrupt data → EIO with a log line naming shard and key; a bug → EIO, logged.
    Every call is timed, and every error but ENOENT counted, for `--metrics` and `shardfs stats`."""
    timer = metrics.OPS.labels(op.__name__)

    @functools.wraps(op)
    def wrapper(*args: Any) -> Any:
        pin_thread_state()
        start_request(args[0].request_limit)
        start = time.perf_counter()
        try:
            return op(*args)
        except mfusepy.FuseOSError as e:
            _count(e.errno)
            raise
        except CorruptChunk as e:
            metrics.DECODE_ERRORS.inc()
            log.error("%s", e, extra={**e.log_fields("eio"), "path": args[1]})
            raise _error(errno.EIO) from None
        except (FileNotFoundError, NotADirectoryError):
            raise mfusepy.FuseOSError(errno.ENOENT) from None
        except OSError as e:
            log.error("%s: %s", op.__name__, e, extra={"event": "os_error", "path": args[1]})
            raise _error(e.errno or errno.EIO) from None
        except Exception:
            log.exception("%s failed", op.__name__, extra={"event": "bug", "path": args[1]})
            raise _error(errno.EIO) from None
        finally:
            timer.observe(time.perf_counter() - start)

    return wrapper  # type: ignore[return-value]


def _count(code: int) -> None:
    if code != errno.ENOENT:
        metrics.ERRORS.labels(errno.errorcode.get(code, str(code))).inc()


def _error(code: int) -> mfusepy.FuseOSError:
    _count(code)
    return mfusepy.FuseOSError(code)


class ShardFS(mfusepy.Operations):
    """Read-only operations over a Tree. Only the methods defined here are registered with libfuse."""

    use_ns = True

    def __init__(self, tree: Tree, mtime_ns: int, on_ready: Callable[[], None] | None = None) -> None:
        self.tree = tree
        self.on_ready = on_ready
        self.no_open = False  # until the kernel says it can do without OPEN (init_with_config)
        self.request_limit = REQUEST_FILES * tree.cache.max_value  # decoded bytes one request may make
        self._dirs: dict[int, DirCursor] = {}
        self._handles = itertools.count(1)
        self._times = {"st_mtime": mtime_ns, "st_ctime": mtime_ns, "st_atime": mtime_ns, "st_blksize": BLOCK_SIZE}
        self._attrs = functools.lru_cache(maxsize=1024)(self._attributes)

    def _attributes(self, kind: int, owner: Owner) -> dict[str, int]:
        """Attributes of a node owned by owner (few distinct ones: cached). Files get read bits only;
        directories read and search."""
        mode = owner.mode if kind == stat.S_IFDIR else owner.mode & 0o444
        nlink = 2 if kind == stat.S_IFDIR else 1
        return {"st_mode": kind | mode, "st_nlink": nlink, "st_uid": owner.uid, "st_gid": owner.gid, **self._times}

    def init_with_config(self, conn: Any, config: Any) -> None:
        """The mount is live. Whether the kernel takes ENOSYS for OPEN as "no open needed" (FUSE no_open,
        protocol 7.23 on): one without it would fail the open instead."""
        self.no_open = bool(conn is not None and conn.capable & FUSE_CAP_NO_OPEN_SUPPORT)
        log.info("kernel sends OPEN: %s", "no (no_open)" if self.no_open else "yes", extra={"event": "no_open"})
        if self.on_ready is not None:
            self.on_ready()

    def _lookup(self, path: str) -> Node:
        return self.tree.lookup(path[1:])

    @errors_to_errno
    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        node = self._lookup(path)
        if isinstance(node, Dir):
            return self._attrs(stat.S_IFDIR, node.owner)
        size = node.size()
        return {**self._attrs(stat.S_IFREG, node.owner), "st_size": size, "st_blocks": (size + 511) // 512}

    def open(self, path: str, flags: int) -> int:
        """ENOSYS tells the kernel it need not ask (FUSE no_open): it then sends neither OPEN nor RELEASE
        again and keeps a file's pages across opens, so a warm read never leaves the kernel. Permissions
        are checked by the kernel itself (`default_permissions`); writes are refused by the `ro` mount."""
        OPENED.observe(0)  # counted, so that `shardfs stats` shows whether the kernel still asks
        if self.no_open:
            raise mfusepy.FuseOSError(errno.ENOSYS)
        return 0

    @errors_to_errno
    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        node = self._lookup(path)
        if isinstance(node, Dir):
            raise mfusepy.FuseOSError(errno.EISDIR)
        data = node.read(offset, size)
        metrics.SERVED.inc(len(data))
        return data

    @errors_to_errno
    def opendir(self, path: str) -> int:
        if not isinstance(self._lookup(path), Dir):
            raise mfusepy.FuseOSError(errno.ENOTDIR)
        fh = next(self._handles)
        self._dirs[fh] = DirCursor(lambda: self.tree.listdir(path[1:]))
        return fh

    def readdir_with_offset(self, path: str, offset: int, fh: int) -> Iterator[tuple[str, int, int]]:
        """Entries are made while libfuse consumes them, so errors are mapped here, not by the decorator."""
        cursor = self._dirs[fh]
        start_request(self.request_limit)
        start = time.perf_counter()
        try:
            yield from cursor.entries(offset)
        except Exception as e:
            log.error("listing failed: %s", e, extra={"event": "eio", "path": path})
            cursor.restart()
            raise _error(errno.EIO) from None
        finally:
            READDIR.observe(time.perf_counter() - start)

    @errors_to_errno
    def releasedir(self, path: str, fh: int) -> int:
        self._dirs.pop(fh, None)
        return 0

    @errors_to_errno
    def statfs(self, path: str) -> dict[str, int]:
        return {"f_bsize": BLOCK_SIZE, "f_frsize": BLOCK_SIZE, "f_namemax": 255}

    # Read-only: every change is refused. The mount is also `ro`, so the kernel refuses most before us.
    def _read_only(self, *args: Any) -> int:
        raise mfusepy.FuseOSError(errno.EROFS)

    create = write = truncate = unlink = rmdir = mkdir = rename = symlink = link = _read_only
    chmod = chown = utimens = mknod = setxattr = removexattr = _read_only
