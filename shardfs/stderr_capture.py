"""What libfuse writes to stderr while a mount is attempted. libfuse says why a mount failed (an unknown
option, a busy mountpoint) only there, and returns a bare status: the user should see the reason on the
terminal, not a number."""

from __future__ import annotations

import os
import sys
import threading


class StderrCapture:
    """From start() to release(), file descriptor 2 goes to a file in memory; release() returns the text."""

    def __init__(self) -> None:
        self._saved: int | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        sys.stderr.flush()
        self._file = os.memfd_create("shardfs-stderr", os.MFD_CLOEXEC)
        self._saved = os.dup(2)
        os.dup2(self._file, 2)

    def release(self) -> str:
        """Restore stderr; what was written meanwhile, the first time (it is called from two threads)."""
        with self._lock:
            if self._saved is None:
                return ""
            sys.stderr.flush()
            os.dup2(self._saved, 2)
            os.close(self._saved)
            self._saved = None
            with open(self._file, "rb") as file:  # closes it
                file.seek(0)
                return file.read().decode(errors="replace")
