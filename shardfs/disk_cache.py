"""`--cache-dir`: byte ranges of remote objects kept on local disk across mounts, bounded in bytes.

An entry is named by a hash of the object's URL, its version (ETag) and the range, so a replaced object
is never answered from the disk: its new version has other names, and the old ones age out. Entries are
written to a temporary name and renamed, so a reader never sees half of one, even across processes.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import threading
from pathlib import Path

from shardfs import metrics

EVICT_TO = 0.9  # of the budget, after an eviction: so the next few writes do not evict again


class DiskCache:
    """Ranges as files in one directory, at most budget bytes of them; least recently used go first. The
    count of bytes held is kept in memory and made exact again by every eviction's scan."""

    def __init__(self, directory: Path, budget: int) -> None:
        self.directory = directory
        self.budget = budget
        directory.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._bytes = sum(e.stat().st_size for e in os.scandir(directory) if e.is_file())

    def _path(self, url: str, version: tuple, start: int, stop: int) -> Path:
        name = hashlib.sha256(repr((url, version, start, stop)).encode()).hexdigest()
        return self.directory / name

    def get(self, url: str, version: tuple, start: int, stop: int) -> bytes | None:
        path = self._path(url, version, start, stop)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            metrics.DISK_CACHE.labels("miss").inc()
            return None
        if len(data) != stop - start:  # damaged (a full disk, a hand edit): not to be trusted
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        with contextlib.suppress(OSError):  # evicted meanwhile: the bytes read are still good
            os.utime(path)  # recently used: evicted last
        metrics.DISK_CACHE.labels("hit").inc()
        return data

    def put(self, url: str, version: tuple, start: int, stop: int, data: bytes) -> None:
        if len(data) > self.budget:
            return
        fd, temporary = tempfile.mkstemp(dir=self.directory, prefix=".part-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(temporary, self._path(url, version, start, stop))
        except OSError:  # a full or read-only disk costs the cache, never the read
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            return
        with self._lock:
            self._bytes += len(data)
            if self._bytes > self.budget:
                self._evict()

    def _evict(self) -> None:
        """Least recently used first, until EVICT_TO of the budget is held."""
        entries = []
        for e in os.scandir(self.directory):
            with contextlib.suppress(OSError):
                if e.is_file() and not e.name.startswith(".part-"):
                    st = e.stat()
                    entries.append((st.st_mtime_ns, st.st_size, e.path))
        held = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if held <= self.budget * EVICT_TO:
                break
            with contextlib.suppress(OSError):
                os.unlink(path)
                held -= size
        self._bytes = held
