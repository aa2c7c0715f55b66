"""`python -m shardfs.host.daemon UID GID FD machine|own`: the unprivileged daemon serving a host's mounts (a
Kubernetes node's volumes, a Slurm job's datasets).

The host starts it as root for one thing only: to import from wherever Python lies (an image's /usr/local, a
pyenv under /root). Then, before it reads anything, it becomes UID:GID with no supplementary groups, no
capabilities, no_new_privs, and not dumpable, so that another process of the same user (another daemon) cannot
read its memory or environment, where the publish secret will be. It takes mounts from the socket FD (see
handoff.py), each a spec with its mounted /dev/fuse descriptor, and serves each as `shardfs mount SOURCE
/dev/fd/N -f` would (service/daemon.open_mount), from a thread of its own, with its own cache, decode budget,
figures and stats socket (a `Mount`), logging to the stderr it shares with the host. It ends once the host has
closed the socket and no mount is served any more, or on SIGTERM.

Mounts share a daemon only if they carry the same publish secret (none, mostly): the secret is set in the
process's environment, where the AWS and GCS credential chains read it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib
import logging
import os
import re
import signal
import socket
import sys
import threading
from dataclasses import replace
from pathlib import Path

from shardfs.context import Context
from shardfs.errors import SourceError
from shardfs.fuse.mount import FuseMountError, handed
from shardfs.fuse.record import Connection, RecordError
from shardfs.host import handoff
from shardfs.logs import log_to, log_to_terminal, own_thread, redact, thread_mount
from shardfs.service import lifecycle
from shardfs.service.daemon import Mount, MountError, open_mount, serve
from shardfs.service.outcome import READY, Outcome, Said

log = logging.getLogger("shardfs")

# What serving may import only later (credentials.aws, for an s3:// source), imported while the daemon is still
# root: where the interpreter lies under a directory its user cannot reach, an import after would fail.
IMPORTED_FIRST = ("boto3", "botocore.session", "botocore.exceptions", "obstore.auth.boto3")
LOG_MOST = 8 << 20  # bytes of a log file of its own (a Slurm job's) before it is begun again
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38


class _ToHost:
    """Where a fresh connection is kept for the next daemon (a fuse.record Carrier): the host, over the socket,
    which keeps it under the mount's target."""

    def __init__(self, sock: socket.socket, target: str) -> None:
        self.sock, self.target = sock, target

    def keep(self, connection: Connection) -> None:
        handoff.send(self.sock, handoff.Keep(self.target, connection.fds))

    # A hosted mount is served without signals: its host stops it (Control.stop), and lets go of what it keeps
    # when it unpublishes the mount. No SIGTERM reaches a mount: nothing here is ever asked.
    def forget(self) -> None:
        raise NotImplementedError("a hosted mount's connection is let go by its host")

    def restarting(self) -> bool:
        raise NotImplementedError("a hosted mount's daemon is never restarted by a signal")


def become(uid: int, gid: int) -> None:
    """This process as uid:gid, with no way back: no groups, no capabilities, no_new_privs, not dumpable."""
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)  # from root to another user: the kernel clears every capability set
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    for option in (PR_SET_NO_NEW_PRIVS, PR_SET_DUMPABLE):
        if libc.prctl(option, 1 if option == PR_SET_NO_NEW_PRIVS else 0, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), f"prctl({option})")
    held = re.findall(r"^Cap(?:Inh|Prm|Eff|Amb):\s*([0-9a-f]+)$", Path("/proc/self/status").read_text(), re.M)
    if os.getuid() == 0 or any(int(mask, 16) for mask in held):
        raise PermissionError(f"still privileged after becoming {uid}:{gid}")


class _Naming(logging.Filter):
    """A record of a mount's work starts with the mount's target: every daemon shares the host's stderr. The
    mount is the one the logging thread works for, fixed when the thread started (logs.own_thread): the thread
    that opens and serves it, and the threads that mount starts (its session's, listing workers, read-ahead),
    whoever's request they answer. INFO lines, the mount's milestones (mounted, unmounted), name its mountpoint in
    their own words, and are left as they are."""

    def filter(self, record: logging.LogRecord) -> bool:
        target = None if record.levelno == logging.INFO else thread_mount()
        if target is not None and getattr(record, "mount", None) != target:  # once, whichever handler asks
            record.mount = target  # each mount has its own log budgets (logs.RateLimit)
            record.msg = f"{target}: ".replace("%", "%%") + str(record.msg)  # the message is a %-format
        return True


class Daemon:
    """The mounts this process serves, by target: each a Mount served from a thread of its own."""

    def __init__(self, sock: socket.socket, machine: bool = False) -> None:
        """machine: whether the node's own cloud identity may sign its mounts' requests (see host/supervisor.py)."""
        self.sock, self.machine = sock, machine
        self.taken: set[str] = set()  # the targets given to this daemon and not yet ended
        self.mounts: dict[str, Mount] = {}  # of those, the ones served
        self.secrets: dict[str, str] | None = None  # the publish secret of the mounts served (all the same)
        self._lock = threading.Lock()
        self.idle = threading.Event()  # no mount served
        self.idle.set()

    def take(self, message: handoff.Message) -> None:
        """Serve the mount of a Serve message, in a thread of its own; anything else is refused."""
        target = message.target
        if not isinstance(message, handoff.Serve) or len(message.fds) not in (1, 2):
            for fd in message.fds:
                os.close(fd)
            what = type(message).__name__
            handoff.answer(self.sock, target, Outcome(Said.FAILED, f"not a mount to serve ({what})"))
            return
        with self._lock:
            self.idle.clear()
            self.taken.add(target)
        threading.Thread(target=self._serve, args=(message,), name=f"shardfs-mount-{target}", daemon=True).start()

    def _serve(self, message: handoff.Serve) -> None:
        target = message.target
        try:
            self._answered(message)
        except Exception as e:  # a bug: said to the host (a second answer is ignored), never a publish left waiting
            log.error("%s: %s", target, e, exc_info=True, extra={"event": "mount_failed"})
            handoff.answer(self.sock, target, Outcome(Said.FAILED, redact(str(e))))
        finally:
            with self._lock:
                self.taken.discard(target)
                self.mounts.pop(target, None)
                if not self.taken:
                    self.idle.set()

    def _answered(self, message: handoff.Serve) -> None:
        """Serve the message's target until its mount ends, having told the host READY, or why not."""
        target, fds, spec, secrets = message.target, message.fds, message.spec, message.secrets
        try:
            taken_up = Connection.of(fds) if len(fds) == 2 else None  # with its record: a daemon before served it
            mountpoint = handed(fds[0])
        except (OSError, ValueError, RecordError, FuseMountError) as e:
            for fd in fds:
                os.close(fd)
            handoff.answer(self.sock, target, Outcome(Said.FAILED, str(e)))
            return
        with self._lock:
            if self.secrets is None:
                self.secrets = secrets
                os.environ.update(secrets)  # this process's only: the credential chains read them here
            shared = self.secrets == secrets
            root = logging.getLogger()  # one log for the process: as verbose as its most verbose mount asks
            root.setLevel(min(root.level, logging.getLevelName(spec.service.log_level or "WARNING")))
        if not shared:
            for fd in fds:
                os.close(fd)
            handoff.answer(self.sock, target, Outcome(Said.FAILED, "another publish secret than this daemon's mounts'"))
            return
        access = replace(spec.reading.access, machine=self.machine)  # the node's call (its argv), not the mount's
        spec = replace(spec, reading=replace(spec.reading, access=access))
        try:
            mount = open_mount(spec, mountpoint, Context())
        except (SourceError, MountError) as e:
            for fd in fds:
                os.close(fd)
            outcome = Outcome.of(e)
            handoff.answer(self.sock, target, Outcome(outcome.said, redact(outcome.why)))
            return
        own_thread(target)  # this thread, and those its mount starts, name the mount on their lines
        with self._lock:
            self.mounts[target] = mount
        try:
            serve(
                mount, lambda: handoff.answer(self.sock, target, READY), None,
                _ToHost(self.sock, target), taken_up, signals=False,
            )  # fmt: skip
        except Exception as e:
            log.error("%s: %s", target, e, extra={"event": "mount_failed"})
            handoff.answer(self.sock, target, Outcome(Said.FAILED, redact(str(e))))

    def stop(self) -> None:
        """Stop serving every mount (SIGTERM): their mounts stay, the host's to end or to hand a next daemon."""
        with self._lock:
            mounts = list(self.mounts.values())
        for mount in mounts:
            mount.control.stop()


def main(argv: list[str]) -> int:
    uid, gid, fd = (int(a) for a in argv[:3])
    machine = argv[3:4] == ["machine"]
    sock = socket.socket(fileno=fd)
    try:
        for name in IMPORTED_FIRST:
            importlib.import_module(name)
        become(uid, gid)
    except (OSError, ImportError) as e:
        print(f"shardfs daemon: {e}", file=sys.stderr)
        return 1
    log_to_terminal("WARNING")
    log_to(None, most=LOG_MOST)
    lifecycle.block_signals()  # before obstore's runtime starts a thread
    daemon = Daemon(sock, machine)
    for handler in logging.getLogger().handlers:
        handler.filters.insert(0, _Naming())  # before the rate limit, which budgets by mount
    stopped = threading.Event()

    def stop(*_: object) -> None:
        stopped.set()
        daemon.stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)

    def listen() -> None:
        for message in handoff.messages(sock, "the host"):
            daemon.take(message)
        daemon.idle.wait()  # the host closed its end (a Slurm Prolog ends; a plugin restarts): serve on till then
        stopped.set()

    threading.Thread(target=listen, name="shardfs-handoff", daemon=True).start()
    while not stopped.wait(1.0):  # a timed wait: the signal handlers run between two
        pass
    logging.shutdown()
    os._exit(0)  # obstore's runtime threads are not waited for (see cli.run)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
