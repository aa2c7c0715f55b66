"""The privileged plugin hands volumes to the unprivileged daemon that serves them: messages on a SOCK_SEQPACKET
socket pair inherited by the daemon, so that a volume's configuration (with the publish secret) never passes
through argv, the environment or a file. One daemon may serve several volumes (as mountpoint-s3's Mountpoint
Pods do): each message names its volume's target path.

The plugin sends SERVE for a volume, with its mounted /dev/fuse descriptor, or with the descriptor and the record
of a connection a daemon before served (fuse/record.py), which the daemon takes up. The daemon of a fresh
connection first sends KEEP with the descriptor and the record its session keeps, which the plugin keeps for a
next daemon; then it answers once for that volume with an Outcome (service/outcome.py): READY when the kernel's
INIT is answered (or the connection taken up), or why it could not serve."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardfs.service.outcome import Outcome

log = logging.getLogger("shardfs.csi")

SERVE = "serve"  # {target, spec, secrets}, with [/dev/fuse] or [/dev/fuse, record]
KEEP = "keep"  # {target}, with [/dev/fuse, record]: what the next daemon takes up
ANSWER = "answer"  # {target, outcome}: service/outcome.py's, READY or why not
MOST = 1 << 20  # bytes of one message: a configuration is a few KB (a GCS service-account key is ~2 KB)


@dataclass
class Message:
    kind: str
    target: str
    fields: dict[str, Any] = field(default_factory=dict)
    fds: list[int] = field(default_factory=list)


def pair() -> tuple[socket.socket, socket.socket]:
    """(the plugin's end, the daemon's end, inheritable for its exec)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    theirs.set_inheritable(True)
    return ours, theirs


def send(sock: socket.socket, kind: str, target: str, fds: Sequence[int] = (), **fields: Any) -> None:
    """One message; OSError if the other end is gone."""
    socket.send_fds(sock, [json.dumps({"kind": kind, "target": target, **fields}).encode()], list(fds))


def answer(sock: socket.socket, target: str, outcome: Outcome) -> None:
    """The daemon's answer for target, if the plugin still listens (it gives up waiting after a while; a Slurm
    Prolog's has ended)."""
    with contextlib.suppress(OSError):
        send(sock, ANSWER, target, outcome=Outcome(outcome.said, outcome.why[: MOST // 2]).to_json())


def messages(sock: socket.socket, sender: str) -> Iterator[Message]:
    """The messages sender sends, their descriptors ours to close, until it closes its end (or it is gone). One
    that is not a message is logged, its descriptors closed, and skipped."""
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, MOST, 2)
        except OSError:
            return
        if not data:
            return
        try:
            message = json.loads(data)
            yield Message(str(message.pop("kind")), str(message.pop("target")), message, fds)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            for fd in fds:
                os.close(fd)
            log.error("%s sent not a hand-off message: %s", sender, e, extra={"event": "handoff"})
