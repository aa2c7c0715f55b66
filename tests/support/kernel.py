"""A fake kernel over a socket pair: a session whose device is one end of a packet socket pair, and the
requests a kernel this machine does not run would send it."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

from shardfs.fs.bridge import Bridge
from shardfs.fuse import wire
from shardfs.fuse.session import Serving, Session, Timeouts
from shardfs.source import open_source


@contextlib.contextmanager
def kernel_socket(
    source: Path | str, timeouts: Timeouts | None = None, threads: int = 1
) -> Iterator[tuple[socket.socket, Session]]:
    """A session (of so many threads) whose "device" is one end of a packet socket pair: the test plays a kernel
    this machine does not run (older, newer), request by request, and reads what the kernel would be told."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    bridge = Bridge(open_source(source, 1 << 20).tree, 0)
    session = Session(theirs.fileno(), bridge, Serving(threads, timeouts or Timeouts()))
    runner = threading.Thread(target=session.run)
    runner.start()
    try:
        yield ours, session
    finally:
        ours.close()
        runner.join(60)
        theirs.close()
    assert not runner.is_alive()


def ask(kernel: socket.socket, opcode: int, body: bytes, unique: int = 1, nodeid: int = 0) -> tuple[int, bytes]:
    """Send one request; (errno, payload) of the reply."""
    send(kernel, opcode, body, unique, nodeid)
    answered, code, payload = answer(kernel)
    assert answered == unique
    return code, payload


def send(kernel: socket.socket, opcode: int, body: bytes, unique: int, nodeid: int = 0) -> None:
    """One request sent, its answer not waited for."""
    kernel.send(wire.IN_HEADER.pack(wire.IN_HEADER.size + len(body), opcode, unique, nodeid, 0, 0, 0, 0, 0) + body)


def answer(kernel: socket.socket) -> tuple[int, int, bytes]:
    """The next answer: (unique, errno, payload)."""
    reply = kernel.recv(1 << 16)
    size, error, unique = wire.OUT_HEADER.unpack_from(reply)
    assert size == len(reply)
    return unique, -error, reply[wire.OUT_HEADER.size :]


def init(kernel: socket.socket, major: int, minor: int, flags: int, flags2: int = 0) -> tuple[int, bytes]:
    """INIT as a kernel of major.minor sends it: flags2 is read only where flags has INIT_EXT."""
    body = wire.INIT_IN.pack(major, minor, 1 << 17, flags) + wire.INIT_IN_FLAGS2.pack(flags2)
    return ask(kernel, wire.Op.INIT, body + bytes(64 - len(body)))


EVERYTHING = 0xFFFFFFFF  # INIT flags: every capability a kernel could offer
