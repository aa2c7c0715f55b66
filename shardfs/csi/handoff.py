"""The privileged plugin hands the volume's configuration to the daemon that serves it: one message on a
SOCK_SEQPACKET socket pair inherited by the daemon, so that the configuration (with the publish secret) never
passes through argv, the environment or a file. (The mounted /dev/fuse descriptor comes from the plugin's
keeper, shardfs/service/keeper.py.) The daemon of a fresh connection first sends KEEP with the descriptor and
the record its session keeps of the connection (fuse/record.py), which the plugin keeps for a next daemon;
then it answers once: READY when the kernel's INIT is answered (or the connection taken up), or why it could
not serve."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Callable
from typing import Any

READY = "ready"
KEEP = "keep"  # with [/dev/fuse, record]: what the next daemon takes up
REFUSED = "refused: "  # the source could not be opened: the volume's fault, said in the daemon's words
FAILED = "failed: "  # anything else
MOST = 1 << 20  # bytes of one message: a configuration is a few KB (a GCS service-account key is ~2 KB)


def pair() -> tuple[socket.socket, socket.socket]:
    """(the plugin's end, the daemon's end, inheritable for its exec)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    theirs.set_inheritable(True)
    return ours, theirs


def hand(sock: socket.socket, config: dict[str, Any]) -> None:
    sock.send(json.dumps(config).encode())


def take(sock: socket.socket) -> dict[str, Any]:
    """The configuration; ValueError if the message is not one."""
    return json.loads(sock.recv(MOST))


def answer(sock: socket.socket, text: str) -> None:
    """Tell the plugin, if it still listens (it gives up waiting after a while)."""
    with contextlib.suppress(OSError):
        sock.send(text.encode()[:MOST])


def keep(sock: socket.socket, fds: list[int]) -> None:
    """The daemon's part of a fresh connection: its /dev/fuse and the record its session writes, sent back
    for the plugin to keep for the next daemon."""
    socket.send_fds(sock, [KEEP.encode()], fds)


def answer_of(sock: socket.socket, timeout: float, kept: Callable[[list[int]], None]) -> str:
    """The daemon's answer; '' if it ended without one. Descriptors sent to be kept before it are given to
    kept (which closes them). TimeoutError after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        try:
            data, fds, _, _ = socket.recv_fds(sock, MOST, 2)
        except (ConnectionResetError, BrokenPipeError):  # the daemon ended without a word
            return ""
        text = data.decode(errors="replace")
        if text == KEEP and len(fds) == 2:
            kept(fds)
            continue
        for fd in fds:
            os.close(fd)
        return text
