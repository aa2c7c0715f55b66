"""The privileged plugin hands the volume's configuration to the daemon that serves it: one message on a
SOCK_SEQPACKET socket pair inherited by the daemon, so that the configuration (with the publish secret) never
passes through argv, the environment or a file. (The mounted /dev/fuse descriptor comes from the plugin's
keeper, shardfs/service/keeper.py.) The daemon answers once, in one message: READY when the kernel's INIT is
answered, or why it could not serve."""

from __future__ import annotations

import contextlib
import json
import socket
from typing import Any

READY = "ready"
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


def answer_of(sock: socket.socket, timeout: float) -> str:
    """The daemon's one answer; '' if it ended without one. TimeoutError after timeout seconds."""
    sock.settimeout(timeout)
    return sock.recv(MOST).decode(errors="replace")
