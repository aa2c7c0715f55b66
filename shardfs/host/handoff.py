"""The host hands mounts to the unprivileged daemon that serves them: typed messages on a SOCK_SEQPACKET socket pair
inherited by the daemon, so that a mount's spec and its publish secret never pass through argv, the environment
or a file. One daemon may serve several mounts (as mountpoint-s3's Mountpoint Pods do): each message names its
mount's target path.

The host sends Serve for a mount, with its mounted /dev/fuse descriptor, or with the descriptor and the record of
a connection a daemon before served (fuse/record.py), which the daemon takes up. The daemon of a fresh connection
first sends Keep with the descriptor and the record its session keeps, which the host keeps for a next daemon;
then it answers once for that mount with an Answer: its Outcome (service/outcome.py), READY when the kernel's
INIT is answered (or the connection taken up), or why it could not serve."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from shardfs.service.outcome import Outcome
from shardfs.service.spec import MountSpec

log = logging.getLogger("shardfs.host")

MOST = 1 << 20  # bytes of one message: a spec is a few KB (a GCS service-account key beside it ~2 KB)


@dataclass
class Serve:
    """Serve spec at target, with the publish secret given beside it; fds: [/dev/fuse] or [/dev/fuse, record]."""

    target: str
    spec: MountSpec
    secrets: dict[str, str] = field(default_factory=dict)
    fds: list[int] = field(default_factory=list)


@dataclass
class Keep:
    """Keep a fresh connection for target's next daemon; fds: [/dev/fuse, record]."""

    target: str
    fds: list[int] = field(default_factory=list)


@dataclass
class Answer:
    """Whether the daemon serves target."""

    target: str
    outcome: Outcome
    fds: list[int] = field(default_factory=list)  # none: a daemon that sends some has them closed


Message = Serve | Keep | Answer


def pair() -> tuple[socket.socket, socket.socket]:
    """(the host's end, the daemon's end, inheritable for its exec)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    theirs.set_inheritable(True)
    return ours, theirs


def send(sock: socket.socket, message: Message) -> None:
    """One message; OSError if the other end is gone."""
    if isinstance(message, Serve):
        body: dict[str, Any] = {"kind": "serve", "spec": message.spec.to_json(), "secrets": message.secrets}
    elif isinstance(message, Keep):
        body = {"kind": "keep"}
    else:
        outcome = Outcome(message.outcome.said, message.outcome.why[: MOST // 2])
        body = {"kind": "answer", "outcome": outcome.to_json()}
    socket.send_fds(sock, [json.dumps({**body, "target": message.target}).encode()], list(message.fds))


def answer(sock: socket.socket, target: str, outcome: Outcome) -> None:
    """The daemon's answer for target, if the host still listens (it gives up waiting after a while; a Slurm
    Prolog's has ended)."""
    with contextlib.suppress(OSError):
        send(sock, Answer(target, outcome))


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
            yield _read(json.loads(data), fds)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            for fd in fds:
                os.close(fd)
            log.error("%s sent not a hand-off message: %s", sender, e, extra={"event": "handoff"})


def _read(body: dict[str, Any], fds: list[int]) -> Message:
    target, kind = str(body["target"]), body["kind"]
    if kind == "serve":
        secrets = {str(k): str(v) for k, v in dict(body["secrets"]).items()}
        return Serve(target, MountSpec.from_json(body["spec"]), secrets, fds)
    if kind == "keep":
        return Keep(target, fds)
    if kind == "answer":
        return Answer(target, Outcome.from_json(body["outcome"]), fds)
    raise ValueError(f"unknown kind {str(kind)[:40]!r}")
