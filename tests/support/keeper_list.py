"""`python -m tests.support.as_user UID GID tests.support.keeper_list SOCKET`: the names a keeper holds,
asked as its own user (its directory may be open to others: the check a daemon makes is not this probe's);
prints `names: [...]`."""

from __future__ import annotations

import socket
import urllib.parse

from shardfs.service import keeper


def main(args: list[str]) -> int:
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
        conn.connect(args[0])
        socket.send_fds(conn, [b"LIST"], [])
        answer = conn.recv(keeper.MAX_MESSAGE).decode()
    print(f"names: {[urllib.parse.unquote(word) for word in answer.split()[1:]]}")
    return 0
