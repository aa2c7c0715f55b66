"""The keeper: a small process that holds mounts' /dev/fuse descriptors while their daemons come and go.

A FUSE connection lives while any process holds a descriptor of its /dev/fuse open file. A daemon hands its
descriptors to a keeper once it has mounted; the next daemon for the same mount takes them back instead of
mounting, so a crash, a restart or an upgrade of the daemon never ends the mount (readers wait; nothing is
lost: see shardfs/fuse/record.py and README "Restarts and upgrades"). systemd's file-descriptor store does
the same under a unit (service/handover.py); a Kubernetes node plugin can speak this protocol in the keeper's
place.

The protocol (version 2):
- A Unix socket of type SOCK_SEQPACKET, mode 0600, at a path in a directory only its owner (or root) can
  write (the default is `keeper.sock` in the runtime directory, service/rundir.py). The keeper serves only
  peers whose uid (SO_PEERCRED) is its own or root's: a /dev/fuse descriptor answers for the filesystem, to
  every user. A client checks the same of the keeper: its directory, and the listener's uid.
- Every message is one packet: a line of UTF-8 text (no newline), at most MAX_MESSAGE bytes, a verb and,
  after one space, its argument; descriptors travel with the packet as SCM_RIGHTS. A connection carries
  any number of requests; each is answered by exactly one packet, in order.
- The name of a mount is the real path of its mountpoint (any text without a newline).

    KEEP <name>  with 1 to MAX_FDS descriptors: /dev/fuse first, then what else the mount needs (shardfs
                 sends its record, a memfd, second). Held under name, replacing what was held there.
                 Answer: `OK`.
    TAKE <name>  Answer: `FDS` with the descriptors held under name, in the order kept (the keeper keeps
                 its own copies until DROP), or `NONE`.
                 A KEEP or TAKE makes its connection the mount's holder until the connection ends: a daemon
                 keeps it open while it serves, so the kernel ends it with the daemon. Meanwhile another
                 connection's KEEP or TAKE of that name is answered `BUSY <pid of the holder>`: two daemons
                 never serve one connection.
    DROP <name>  The mount is ending: what is held under name is closed. Answer: `OK` (also if nothing was).
    LIST         Answer: `NAMES` then, after a space each, the names held, percent-encoded (a space is %20).

  Anything else is answered `ERR <why>`. Descriptors whose connection has ended (unmounted, aborted: the
  kernel reports POLLERR on them) are dropped by the keeper itself, as systemd's store does.

A keeper lives while it holds a mount, a link is open to it, or a client connecting at its socket reaches it.
One that holds nothing, with no link, and whose socket file is gone (removed, as logind removes /run/user/UID
at logout) or is another's, can never be asked anything again: it exits at its second check in a row
(ORPHAN_CHECK apart) that finds it so.
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
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from shardfs.errors import ServiceError
from shardfs.service import rundir
from shardfs.service.rundir import own_dir, runtime_dir

log = logging.getLogger("shardfs")

MAX_MESSAGE = 4096
MAX_FDS = 8
UCRED = struct.Struct("3i")  # pid, uid, gid, as SO_PEERCRED gives them
STARTED_WITHIN = 10.0  # seconds a keeper started by a daemon has to answer
HANDOVER_GRACE = 3.0  # seconds a TAKE waits for the daemon holding the mount to let go (exiting after SIGUSR2)
BACKLOG = 64
ORPHAN_CHECK = 5.0  # seconds between an idle keeper's checks that it can still be reached (see the top)
T = TypeVar("T")


def default_path() -> Path:
    """keeper.sock in this user's runtime directory (made, closed to others, if missing)."""
    uid = os.getuid()
    return own_dir(runtime_dir(uid), 0o755 if uid == 0 else 0o700) / "keeper.sock"


class Busy(ServiceError):
    """Another daemon's link holds the mount: it is served."""


# The client side: a daemon's (or a node plugin's) requests.
class Link:
    """A connection to the keeper at path, checked before anything is sent: the socket's directory closed to
    others (nobody else can put a socket of theirs at that name) and the listener this user or root (a keeper
    of another user's would be handed this user's /dev/fuse, or hand back a connection of its own). A daemon
    keeps its link open while it serves: the keeper then answers another daemon's TAKE of that mount BUSY."""

    def __init__(self, path: Path) -> None:
        self.path = path
        if not closed_dir(path.parent):
            raise ServiceError(f"{path}: its directory is open to other users; put the keeper's socket in one only"
                               " its owner (or root) can write")  # fmt: skip
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            _connect(self.sock, path)
            _, uid, _ = _peer(self.sock)
        except OSError as e:
            self.sock.close()
            raise ServiceError(f"{path}: the keeper did not answer ({e.strerror or e})") from None
        if uid not in (0, os.getuid()):
            self.sock.close()
            raise ServiceError(f"{path}: listened to by uid {uid}, not by a keeper of this user or root")
        self.sock.settimeout(STARTED_WITHIN)

    def close(self) -> None:
        self.sock.close()

    def ask(self, request: str, fds: list[int] | None = None) -> tuple[str, list[int]]:
        """Send one request, return the answer's text and the descriptors that came with it."""
        try:
            socket.send_fds(self.sock, [request.encode()], fds or [])
            data, received, flags, _ = socket.recv_fds(self.sock, MAX_MESSAGE, MAX_FDS, socket.MSG_CMSG_CLOEXEC)
        except OSError as e:
            raise ServiceError(f"{self.path}: the keeper did not answer ({e.strerror or e})") from None
        if flags & socket.MSG_CTRUNC:
            _close(received)
            raise ServiceError(f"{self.path}: the keeper sent more descriptors than {MAX_FDS}")
        answer = data.decode(errors="replace")
        if not answer:  # a peer it does not serve is hung up on
            _close(received)
            raise ServiceError(f"{self.path}: the keeper hung up without answering (it serves only its own user and"
                               " root)")  # fmt: skip
        if answer.startswith("ERR "):
            _close(received)
            raise ServiceError(f"{self.path}: the keeper refused {request.split()[0]}: {answer[4:]}")
        return answer, received

    def keep(self, name: str, fds: list[int]) -> None:
        """Have the keeper hold fds (/dev/fuse first) for the mount called name."""
        answer, extra = self.ask(f"KEEP {name}", fds)
        _close(extra)
        if answer != "OK":
            raise ServiceError(f"{self.path}: unexpected answer to KEEP: {answer[:80]}")

    def take(self, name: str) -> list[int]:
        """The descriptors the keeper holds for name (close-on-exec), or [] if it holds none. A mount another link
        holds is waited for HANDOVER_GRACE (a daemon that handed it over may still be exiting), then refused."""
        deadline = time.monotonic() + HANDOVER_GRACE
        while True:
            answer, fds = self.ask(f"TAKE {name}")
            if answer == "FDS" and fds:
                return fds
            _close(fds)
            if not answer.startswith("BUSY"):
                return []
            if time.monotonic() > deadline:
                raise Busy(f"{name}: a live daemon (pid {answer[5:]}) serves this mount; it is not taken over"
                           " (`shardfs unmount` it first)")  # fmt: skip
            time.sleep(0.05)


def _connect(sock: socket.socket, path: Path) -> None:
    """connect(2), waiting up to STARTED_WITHIN while the keeper's backlog is full (EAGAIN at once otherwise)."""
    deadline = time.monotonic() + STARTED_WITHIN
    while True:
        try:
            sock.connect(str(path))
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _once(path: Path, do: Callable[[Link], T]) -> T:
    link = Link(path)
    try:
        return do(link)
    finally:
        link.close()


def keep(path: Path, name: str, fds: list[int]) -> None:
    """Have the keeper at path hold fds (/dev/fuse first) for the mount called name."""
    _once(path, lambda link: link.keep(name, fds))


def take(path: Path, name: str) -> list[int]:
    """The descriptors the keeper at path holds for name (see Link.take)."""
    return _once(path, lambda link: link.take(name))


def drop(path: Path, name: str) -> None:
    """Have the keeper close what it holds for name."""
    _once(path, lambda link: link.ask(f"DROP {name}"))


def names(path: Path) -> list[str]:
    """The names of the mounts the keeper at path holds."""
    answer, fds = _once(path, lambda link: link.ask("LIST"))
    _close(fds)
    return [urllib.parse.unquote(word) for word in answer.split()[1:]]


def closed_dir(path: Path) -> bool:
    """path is a real directory of this user or root that no one else can write to."""
    return any(rundir.trusted_dir(path, uid) for uid in {0, os.getuid()})


def answers(path: Path) -> bool:
    """Whether a keeper listens at path."""
    return rundir.answers(path, socket.SOCK_SEQPACKET)


def started(path: Path) -> None:
    """A keeper at path: the one there, or one started now, detached from the caller (its own session, stdio
    on /dev/null), that outlives every daemon. ServiceError if none answers within STARTED_WITHIN, or if the
    socket's directory is open to others."""
    if not closed_dir(path.parent):
        raise ServiceError(f"{path}: its directory is open to other users; put the keeper's socket in one only"
                           " its owner (or root) can write")  # fmt: skip
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
        self.holders: dict[str, socket.socket] = {}  # the link of the daemon serving each mount, while it is open
        self._uid = os.getuid()
        if answers(path):
            raise ServiceError(f"{path}: another keeper already answers there")
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # left by a keeper that was killed
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        self._server.bind(str(path))
        os.chmod(path, 0o600)  # only its owner (and root) may connect: nobody else can fill its backlog
        self._server.listen(BACKLOG)

    def serve(self) -> None:
        """Serve until the keeper holds nothing and cannot be reached (see the top): then return."""
        poller = select.poll()
        poller.register(self._server, select.POLLIN)
        clients: dict[int, socket.socket] = {}
        orphaned = False  # at the last check
        while True:
            watched = {fds[0]: name for name, fds in self.held.items()}
            for fd in watched:
                poller.register(fd, 0)  # POLLERR and POLLHUP are reported whatever is asked
            ready = poller.poll(ORPHAN_CHECK * 1000)
            if not ready:  # nothing for ORPHAN_CHECK: time to look whether it is orphaned
                was, orphaned = orphaned, not self.held and not clients and not self._reached()
                if was and orphaned:
                    log.info("%s: its socket is gone or another's, and it holds nothing: exiting", self.path,
                             extra={"event": "keeper_exit"})  # fmt: skip
                    return
            for fd, events in ready:
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
                        self._let_go(clients.pop(fd))
                elif fd in watched and events & (select.POLLERR | select.POLLHUP):
                    log.info("%s: its connection ended; dropped", watched[fd], extra={"event": "keeper_drop"})
                    _close(self.held.pop(watched[fd], []))
            for fd in watched:
                with contextlib.suppress(KeyError, ValueError):
                    poller.unregister(fd)

    def _reached(self) -> bool:
        """Whether a client connecting at the socket's path reaches this keeper. A backlog full there is taken
        for a yes: staying is the safe side."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK) as probe:
            try:
                probe.connect(str(self.path))
            except BlockingIOError:
                return True
            except OSError:
                return False
            return _peer(probe)[0] == os.getpid()

    def _let_go(self, conn: socket.socket) -> None:
        """A link has ended (its daemon exited, or was killed): what it held is free for the next daemon."""
        for name in [name for name, holder in self.holders.items() if holder is conn]:
            del self.holders[name]
        conn.close()

    def _trusted(self, conn: socket.socket) -> bool:
        return _peer(conn)[1] in (0, self._uid)

    def _answer(self, conn: socket.socket) -> bool:
        """Answer one request on conn; False once the peer has gone."""
        try:
            data, fds, flags, _ = socket.recv_fds(conn, MAX_MESSAGE, MAX_FDS, socket.MSG_CMSG_CLOEXEC)
        except OSError:
            return False
        if not data and not fds:
            return False
        verb, _, name = data.decode(errors="replace").partition(" ")
        answer, sent = self._handle(conn, verb, name, fds, bool(flags & socket.MSG_CTRUNC))
        try:
            socket.send_fds(conn, [answer.encode()], sent)
        except OSError as e:
            return e.errno not in (errno.EPIPE, errno.ECONNRESET)
        return True

    def _handle(
        self, conn: socket.socket, verb: str, name: str, fds: list[int], truncated: bool
    ) -> tuple[str, list[int]]:  # fmt: skip
        holder = self.holders.get(name)
        if verb in ("KEEP", "TAKE") and holder is not None and holder is not conn:
            _close(fds)
            return f"BUSY {_peer(holder)[0]}", []
        if verb == "KEEP" and name and fds and not truncated and "\n" not in name:
            _close(self.held.pop(name, []))
            self.held[name] = fds
            self.holders[name] = conn
            return "OK", []
        _close(fds)  # only KEEP brings descriptors
        if verb == "KEEP":
            return f"ERR KEEP takes a name and 1 to {MAX_FDS} descriptors", []
        if verb == "TAKE":
            found = self.held.get(name)
            if not found:
                return "NONE", []
            self.holders[name] = conn
            return "FDS", found
        if verb == "DROP":
            _close(self.held.pop(name, []))
            self.holders.pop(name, None)
            return "OK", []
        if verb == "LIST":
            return " ".join(["NAMES", *(urllib.parse.quote(n, safe="/") for n in self.held)]), []
        return f"ERR unknown request {verb[:40]!r}", []


def _peer(conn: socket.socket) -> tuple[int, int, int]:
    """The pid, uid and gid of the process at the other end of conn."""
    return UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, UCRED.size))


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
