"""Reading through a mount and with the peers: the errno a read or stat ends in, a tree's files, tensorstore's
reads, and the kernel's pages of a file dropped so that its next read reaches the daemon."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest
import tensorstore as ts


def assert_eio(path: Path) -> None:
    """Reading path fails with EIO: the answer for corrupt data, which must not be ENOENT or garbage."""
    with pytest.raises(OSError) as e:
        path.read_bytes()
    assert e.value.errno == errno.EIO


def errno_of(path: Path) -> int:
    """The errno of stat'ing path through the mount, or 0 if it is there."""
    try:
        os.stat(path)
    except OSError as e:
        return e.errno
    return 0


def read_errno(path: Path) -> int | None:
    try:
        path.read_bytes()
    except OSError as e:
        return e.errno
    return None


def denied(result) -> bool:
    return result.returncode != 0 and "Permission denied" in result.stderr


def chunk_names(twin: Path, scale: str) -> list[str]:
    """The chunk files the unsharded twin holds."""
    return sorted(p.name for p in (twin / scale).iterdir())


def files_under(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def read_ts(root: Path, scale_index: int = 0) -> np.ndarray:
    spec = {"driver": "neuroglancer_precomputed", "kvstore": f"file://{root}", "scale_index": scale_index}
    return ts.open(spec).result().read().result()


def ts_read(driver: str, path: Path) -> np.ndarray:
    return ts.open({"driver": driver, "kvstore": {"driver": "file", "path": str(path)}}).result().read().result()


def precomputed(source: Path) -> dict:
    return {"driver": "neuroglancer_precomputed", "kvstore": {"driver": "file", "path": str(source)}}


DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def forget_pages(*files: Path) -> None:
    """The kernel's pages of files dropped, so that their next read reaches the daemon (the mount uses FUSE
    no_open: the kernel keeps pages). Theirs only: /proc/sys/vm/drop_caches would drop every other test's too."""
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
