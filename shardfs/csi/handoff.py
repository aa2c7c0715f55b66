"""The privileged plugin hands a mounted /dev/fuse descriptor and the volume's configuration to the unprivileged
daemon that serves it: one message on a SOCK_SEQPACKET socket pair, the JSON in its body and the descriptor
in its SCM_RIGHTS, so that neither the configuration (with the publish secret) nor the descriptor ever
passes through argv, the environment or a file. The daemon answers once, in one message: READY when the
kernel's INIT is answered, or why it could not serve."""

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


def hand(sock: socket.socket, fd: int, config: dict[str, Any]) -> None:
    socket.send_fds(sock, [json.dumps(config).encode()], [fd])


def take(sock: socket.socket) -> tuple[int, dict[str, Any]]:
    """The descriptor and the configuration; ValueError if the message is not one of each."""
    data, fds, _, _ = socket.recv_fds(sock, MOST, 1)
    if len(fds) != 1:
        for fd in fds:
            socket.close(fd)
        raise ValueError(f"expected one descriptor with the configuration, got {len(fds)}")
    return fds[0], json.loads(data)


def answer(sock: socket.socket, text: str) -> None:
    """Tell the plugin, if it still listens (it gives up waiting after a while)."""
    with contextlib.suppress(OSError):
        sock.send(text.encode()[:MOST])


def answer_of(sock: socket.socket, timeout: float) -> str:
    """The daemon's one answer; '' if it ended without one. TimeoutError after timeout seconds."""
    sock.settimeout(timeout)
    return sock.recv(MOST).decode(errors="replace")
