"""Where bytes live. Every read is a byte range, so a chunk never costs a whole shard."""

from __future__ import annotations

import errno
import functools
import io
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from shardfs import metrics


class LocalStore:
    """Byte ranges from files under one root directory, read with `os.pread`.

    Open shard files are kept in a small LRU (functools', which is thread-safe and costs no Python
    frames). An evicted file closes by refcounting once no reader still holds it, so eviction never
    races a concurrent `pread`.
    """

    def __init__(self, root: str | Path, max_open: int = 256) -> None:
        self.root = Path(root).resolve()
        self._file = functools.lru_cache(maxsize=max_open)(self._open)

    def _open(self, path: str) -> tuple[io.FileIO, int]:
        """Only regular files inside the root are data. Opening is non-blocking, so a FIFO where a shard
        should be cannot hang a FUSE thread; a link that leads out of the root is as good as absent."""
        full = self.root / path
        if not os.path.realpath(full).startswith(f"{self.root}/"):
            raise FileNotFoundError(errno.ENOENT, "outside the source", str(full))
        fd = os.open(full, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise FileNotFoundError(errno.ENOENT, "not a regular file", str(full))
        return io.FileIO(fd, "r"), st.st_size

    def size(self, path: str) -> int:
        """Size of a file; FileNotFoundError when it is absent."""
        return self._file(path)[1]

    def read(self, path: str, start: int, stop: int) -> bytes:
        """Bytes [start, stop) of a file; shorter only if the file is shorter."""
        f, _ = self._file(path)
        data = os.pread(f.fileno(), stop - start, start) if stop > start else b""
        metrics.STORE_READS.inc()
        metrics.STORE_BYTES.inc(len(data))
        return data

    def stat(self, path: str) -> os.stat_result:
        """The entry itself, not what a link points to: links are not part of the presented tree."""
        return os.lstat(self.root / path)

    def scandir(self, path: str) -> Iterator[os.DirEntry[str]]:
        """Entries of a directory, streamed; nothing if it does not exist."""
        try:
            with os.scandir(self.root / path) as entries:
                yield from entries
        except (FileNotFoundError, NotADirectoryError):
            return

    def forget(self) -> None:
        """Close the open files, before the daemon closes every inherited descriptor."""
        self._file.cache_clear()
