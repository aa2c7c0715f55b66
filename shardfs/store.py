"""Where bytes live. Every read is a byte range, so a chunk never costs a whole shard."""

from __future__ import annotations

import functools
import io
import os
from collections.abc import Iterator
from pathlib import Path


class LocalStore:
    """Byte ranges from files under one root directory, read with `os.pread`.

    Open shard files are kept in a small LRU (functools', which is thread-safe and costs no Python
    frames). An evicted file closes by refcounting once no reader still holds it, so eviction never
    races a concurrent `pread`.
    """

    def __init__(self, root: str | Path, max_open: int = 256) -> None:
        self.root = Path(root)
        self._file = functools.lru_cache(maxsize=max_open)(self._open)

    def _open(self, path: str) -> tuple[io.FileIO, int]:
        f = io.FileIO(self.root / path, "r")
        return f, os.fstat(f.fileno()).st_size

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
