"""What a hostile local user runs against `shardfs stats`: it takes every name it can where a daemon's stats
socket could be, and answers whoever connects with made-up figures. Run through tests.support.as_user."""

from __future__ import annotations

import os
import select
import socket
import sys

FAKE = b"shardfs_served_bytes_total 999999.0\n"


def main(names: list[str]) -> int:
    """Bind each of names ('@name' abstract, else a path); print how many were taken; answer for ever."""
    servers = []
    for name in names:
        try:
            if not name.startswith("@"):
                os.makedirs(os.path.dirname(name), exist_ok=True)
            server = socket.socket(socket.AF_UNIX)
            server.bind(b"\0" + name[1:].encode() if name.startswith("@") else name)
        except OSError:
            continue
        server.listen()
        servers.append(server)
    print(len(servers), flush=True)
    while True:
        for server in select.select(servers, [], [])[0]:
            with server.accept()[0] as conn:
                conn.sendall(FAKE)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
