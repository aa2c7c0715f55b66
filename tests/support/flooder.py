"""What a hostile local user runs against a daemon's stats socket: connect, read the answer, close, as fast
as it can for a while; prints how many answers it got. Run through tests.support.as_user."""

from __future__ import annotations

import socket
import sys
import time


def main(args: list[str]) -> int:
    path, seconds = args[0], float(args[1])
    answers = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(seconds)
            try:
                conn.connect(path)
                answers += bool(conn.recv(1 << 16))
            except OSError:
                continue
    print(answers, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
