"""What a hostile local user runs against a mount's directories: open a directory N times, read one 4 KiB
batch of entries from each (one getdents64, as small as an attacker likes: glibc's readdir asks for as much
as st_blksize, 1 MiB, and would take a whole directory of thousands at once), and hold every handle until
stdin closes. Prints `held N failed M` once all are open (M: opens or reads that failed). Run through
tests.support.as_user."""

from __future__ import annotations

import ctypes
import os
import platform
import resource
import sys

GETDENTS64 = {"x86_64": 217, "aarch64": 61}[platform.machine()]
_libc = ctypes.CDLL(None, use_errno=True)


def getdents(fd: int, size: int = 4096) -> int:
    """Bytes of entries one getdents64 call read; OSError if it failed."""
    buffer = ctypes.create_string_buffer(size)
    got = _libc.syscall(GETDENTS64, fd, buffer, size)
    if got < 0:
        raise OSError(ctypes.get_errno(), "getdents64")
    return got


def main(args: list[str]) -> int:
    path, count = args[0], int(args[1])
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # its own limit, not the daemon's
    held, failed = [], 0
    for _ in range(count):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            failed += 1
            continue
        held.append(fd)
        try:
            getdents(fd)
        except OSError:
            failed += 1
    print(f"held {len(held)} failed {failed}", flush=True)
    sys.stdin.read()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
