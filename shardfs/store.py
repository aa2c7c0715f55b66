"""Where bytes live. Every read is a byte range, so a chunk never costs a whole shard."""

from __future__ import annotations

import io
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from cachetools import LRUCache


class LocalStore:
    """Byte ranges from files under one root directory, read with `os.pread`.

    Shard files are reopened on every read otherwise; a small LRU of open files keeps the hot ones.
    An evicted file is closed by refcounting once no reader still holds it, so eviction never
    races a concurrent `pread`.
    """

    def __init__(self, root: str | Path, max_open: int = 256) -> None:
        self.root = Path(root)
        self._open: LRUCache[str, tuple[io.FileIO, int]] = LRUCache(maxsize=max_open)
        self._lock = threading.Lock()

    def _file(self, path: str) -> tuple[io.FileIO, int]:
        with self._lock:
            hit = self._open.get(path)
        if hit is None:
            f = io.FileIO(self.root / path, "r")
            hit = (f, os.fstat(f.fileno()).st_size)
            with self._lock:
                self._open[path] = hit
        return hit

    def size(self, path: str) -> int:
        """Size of a file; FileNotFoundError when it is absent."""
        return self._file(path)[1]

    def read(self, path: str, start: int, stop: int) -> bytes:
        """Bytes [start, stop) of a file; shorter only if the file is shorter."""
        f, _ = self._file(path)
        return os.pread(f.fileno(), stop - start, start) if stop > start else b""

    def stat(self, path: str) -> os.stat_result:
        return os.stat(self.root / path)

    def scandir(self, path: str) -> Iterator[os.DirEntry[str]]:
        """Entries of a directory, streamed; nothing if it does not exist."""
        try:
            with os.scandir(self.root / path) as entries:
                yield from entries
        except (FileNotFoundError, NotADirectoryError):
            return

    def forget(self) -> None:
        """Close cached files, for when the source was rewritten in place."""
        with self._lock:
            self._open.clear()
