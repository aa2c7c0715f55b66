"""The keeper: a small process that holds mounts' /dev/fuse descriptors while their daemons come and go.

A FUSE connection lives while any process holds a descriptor of its /dev/fuse open file. A daemon hands its
descriptors to a keeper once it has mounted; the next daemon for the same mount takes them back instead of
mounting, so a crash, a restart or an upgrade of the daemon never ends the mount (readers wait; nothing is
lost: see shardfs/fuse/record.py and README "Restarts and upgrades"). systemd's file-descriptor store does
the same under a unit (service/fdstore.py); a Kubernetes node plugin can speak this protocol in the keeper's
place.

The protocol (version 1):
- A Unix socket of type SOCK_SEQPACKET, at a path in a directory only its owner can write (the default is
  `keeper.sock` in the runtime directory, service/rundir.py). The keeper serves only peers whose uid
  (SO_PEERCRED) is its own or root's: a /dev/fuse descriptor answers for the filesystem, to every user.
- Every message is one packet: a line of UTF-8 text (no newline), at most MAX_MESSAGE bytes, a verb and,
  after one space, its argument; descriptors travel with the packet as SCM_RIGHTS. A connection carries
  any number of requests; each is answered by exactly one packet, in order.
- The name of a mount is the real path of its mountpoint (any text without a newline).

    KEEP <name>  with 1 to MAX_FDS descriptors: /dev/fuse first, then what else the mount needs (shardfs
                 sends its record, a memfd, second). Held under name, replacing what was held there.
                 Answer: `OK`.
    TAKE <name>  Answer: `FDS` with the descriptors held under name, in the order kept (the keeper keeps
                 its own copies until DROP), or `NONE`.
    DROP <name>  The mount is ending: what is held under name is closed. Answer: `OK` (also if nothing was).
    LIST         Answer: `NAMES` then, after a space each, the names held, percent-encoded (a space is %20).

  Anything else is answered `ERR <why>`. Descriptors whose connection has ended (unmounted, aborted: the
  kernel reports POLLERR on them) are dropped by the keeper itself, as systemd's store does.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import socket
import struct
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

from shardfs.errors import ServiceError
from shardfs.service import rundir
from shardfs.service.rundir import own_dir, runtime_dir

log = logging.getLogger("shardfs")

MAX_MESSAGE = 4096
MAX_FDS = 8
UCRED = struct.Struct("3i")  # pid, uid, gid, as SO_PEERCRED gives them
STARTED_WITHIN = 10.0  # seconds a keeper started by a daemon has to answer


def default_path() -> Path:
    """keeper.sock in this user's runtime directory (made, closed to others, if missing)."""
    uid = os.getuid()
    return own_dir(runtime_dir(uid), 0o755 if uid == 0 else 0o700) / "keeper.sock"


# The client side: a daemon's (or a node plugin's) three requests.
def _ask(path: Path, request: str, fds: list[int] | None = None) -> tuple[str, list[int]]:
    """Send one request, return the answer's text and the descriptors that came with it."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC) as conn:
        conn.settimeout(STARTED_WITHIN)
        try:
            conn.connect(str(path))
            socket.send_fds(conn, [request.encode()], fds or [])
            data, received, flags, _ = socket.recv_fds(conn, MAX_MESSAGE, MAX_FDS, socket.MSG_CMSG_CLOEXEC)
        except OSError as e:
            raise ServiceError(f"{path}: the keeper did not answer ({e.strerror or e})") from None
    if flags & socket.MSG_CTRUNC:
        _close(received)
        raise ServiceError(f"{path}: the keeper sent more descriptors than {MAX_FDS}")
    answer = data.decode(errors="replace")
    if not answer:  # a peer it does not serve is hung up on
        _close(received)
        raise ServiceError(f"{path}: the keeper hung up without answering (it serves only its own user and root)")
    if answer.startswith("ERR "):
        _close(received)
        raise ServiceError(f"{path}: the keeper refused {request.split()[0]}: {answer[4:]}")
    return answer, received


def keep(path: Path, name: str, fds: list[int]) -> None:
    """Have the keeper at path hold fds (/dev/fuse first) for the mount called name."""
    answer, extra = _ask(path, f"KEEP {name}", fds)
    _close(extra)
    if answer != "OK":
        raise ServiceError(f"{path}: unexpected answer to KEEP: {answer[:80]}")


def take(path: Path, name: str) -> list[int]:
    """The descriptors the keeper holds for name (close-on-exec), or [] if it holds none."""
    answer, fds = _ask(path, f"TAKE {name}")
    if answer == "FDS" and fds:
        return fds
    _close(fds)
    return []


def drop(path: Path, name: str) -> None:
    """Have the keeper close what it holds for name."""
    _ask(path, f"DROP {name}")


def names(path: Path) -> list[str]:
    """The names of the mounts the keeper at path holds."""
    answer, fds = _ask(path, "LIST")
    _close(fds)
    return [urllib.parse.unquote(word) for word in answer.split()[1:]]


def answers(path: Path) -> bool:
    """Whether a keeper listens at path."""
    return rundir.answers(path, socket.SOCK_SEQPACKET)


def started(path: Path) -> None:
    """A keeper at path: the one there, or one started now, detached from the caller (its own session, stdio
    on /dev/null), that outlives every daemon. ServiceError if none answers within STARTED_WITHIN."""
    if answers(path):
        return
    subprocess.Popen(
        [sys.executable, "-m", "shardfs.service.keeper", str(path)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + STARTED_WITHIN
    while not answers(path):
        if time.monotonic() > deadline:
            raise ServiceError(f"{path}: a keeper was started but does not answer")
        time.sleep(0.02)


def _close(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


# The keeper itself.
class Keeper:
    """Serves the protocol on a socket bound at path, in one thread with poll(2): every request is a few
    system calls, and nothing it does waits on anything but its peers' packets."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.held: dict[str, list[int]] = {}
        self._uid = os.getuid()
        if answers(path):
            raise ServiceError(f"{path}: another keeper already answers there")
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # left by a keeper that was killed
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        self._server.bind(str(path))
        os.chmod(path, 0o666)  # the directory and the peer's uid decide who may speak
        self._server.listen(16)

    def serve(self) -> None:
        """Serve until the process ends."""
        poller = select.poll()
        poller.register(self._server, select.POLLIN)
        clients: dict[int, socket.socket] = {}
        while True:
            watched = {fds[0]: name for name, fds in self.held.items()}
            for fd in watched:
                poller.register(fd, 0)  # POLLERR and POLLHUP are reported whatever is asked
            for fd, events in poller.poll():
                if fd == self._server.fileno():
                    conn, _ = self._server.accept()
                    if self._trusted(conn):
                        clients[conn.fileno()] = conn
                        poller.register(conn, select.POLLIN)
                    else:
                        conn.close()
                elif fd in clients:
                    if not self._answer(clients[fd]):
                        poller.unregister(fd)
                        clients.pop(fd).close()
                elif fd in watched and events & (select.POLLERR | select.POLLHUP):
                    log.info("%s: its connection ended; dropped", watched[fd], extra={"event": "keeper_drop"})
                    _close(self.held.pop(watched[fd], []))
            for fd in watched:
                with contextlib.suppress(KeyError, ValueError):
                    poller.unregister(fd)

    def _trusted(self, conn: socket.socket) -> bool:
        _, uid, _ = UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, UCRED.size))
        return uid in (0, self._uid)

    def _answer(self, conn: socket.socket) -> bool:
        """Answer one request on conn; False once the peer has gone."""
        try:
            data, fds, flags, _ = socket.recv_fds(conn, MAX_MESSAGE, MAX_FDS, socket.MSG_CMSG_CLOEXEC)
        except OSError:
            return False
        if not data and not fds:
            return False
        verb, _, name = data.decode(errors="replace").partition(" ")
        answer, sent = self._handle(verb, name, fds, bool(flags & socket.MSG_CTRUNC))
        try:
            socket.send_fds(conn, [answer.encode()], sent)
        except OSError as e:
            return e.errno not in (errno.EPIPE, errno.ECONNRESET)
        return True

    def _handle(self, verb: str, name: str, fds: list[int], truncated: bool) -> tuple[str, list[int]]:
        if verb == "KEEP" and name and fds and not truncated and "\n" not in name:
            _close(self.held.pop(name, []))
            self.held[name] = fds
            return "OK", []
        _close(fds)  # only KEEP brings descriptors
        if verb == "KEEP":
            return f"ERR KEEP takes a name and 1 to {MAX_FDS} descriptors", []
        if verb == "TAKE":
            found = self.held.get(name)
            return ("FDS", found) if found else ("NONE", [])
        if verb == "DROP":
            _close(self.held.pop(name, []))
            return "OK", []
        if verb == "LIST":
            return " ".join(["NAMES", *(urllib.parse.quote(n, safe="/") for n in self.held)]), []
        return f"ERR unknown request {verb[:40]!r}", []


def main(argv: list[str]) -> int:
    """`python -m shardfs.service.keeper [SOCKET]`: run a keeper until killed."""
    logging.basicConfig(level=logging.INFO, format="shardfs keeper: %(message)s")
    try:
        Keeper(Path(argv[0]) if argv else default_path()).serve()
    except (ServiceError, OSError) as e:
        print(f"shardfs keeper: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
