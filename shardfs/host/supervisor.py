"""The daemons of a host, pooled by publish secret and replaced when they end while they serve.

Mounts with the same publish secret (none, mostly) share one daemon, as mountpoint-s3's Mountpoint Pods do: a
process and its Python interpreter, not one a mount. Each daemon is started as a uid of its own (unless the host
has one only), so that none can signal, renice or re-limit another's. A daemon that ends while its mounts are
published (it crashed, or was killed) is replaced: the next one takes each connection and its record from what
the host holds (held.py) and serves it without mounting or INIT, and the kernel resends what the one before read
and never answered (Linux 6.9+), so readers see no error. The budget: RESTARTS replacements within RESTART_WINDOW
seconds; past it, or where no record was held yet, the held connection is dropped and readers get ENOTCONN rather
than wait for ever on a connection nobody serves.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol

from shardfs.host import handoff
from shardfs.host.errors import Busy, PublishError
from shardfs.host.held import Held
from shardfs.service.outcome import READY, Outcome, Said
from shardfs.service.spec import MountSpec

log = logging.getLogger("shardfs.host")

NOBODY = 65534
READY_TIMEOUT = 100.0  # seconds a daemon may take to open its source and answer INIT: within kubelet's 2 minutes
END_WAIT = 5.0  # seconds a daemon may take to exit once asked, before it is killed
RESTARTS, RESTART_WINDOW = 3, 60.0  # daemons replaced within that many seconds before a mount is let die
DAEMON_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "TMPDIR": "/tmp"}
DAEMON = "shardfs.host.daemon"  # the module daemons run: how a process is known to be one


class Daemon:
    """A daemon process as the host sees it: the mounts it serves (by target), and the answers it owes. A thread
    reads what it says: records of connections to hold (hold_record is given the target and the record, and
    closes it) and answers, handed to the publish waiting for each. A daemon is trusted with nothing beyond its
    own mounts: a record is taken only for a target it serves, and its /dev/fuse descriptor never (the host keeps
    the one it mounted), so that a compromised daemon cannot put its own connection under another mount's name
    for that mount's next daemon to serve."""

    def __init__(
        self, process: subprocess.Popen[bytes], sock: socket.socket, secrets: dict[str, str],
        hold_record: Callable[[str, int], None], uid: int = NOBODY,
    ) -> None:  # fmt: skip
        self.process, self.sock, self.secrets, self.uid = process, sock, secrets, uid
        self.targets: set[str] = set()
        self.restarts: list[float] = []  # when daemons before this one were replaced lately (monotonic)
        self.unanswering = False  # it let a publish wait READY_TIMEOUT (stopped, wedged): no mount goes to it again
        self._hold_record = hold_record
        self._owed: dict[str, queue.Queue[Outcome | None]] = {}
        self._closed = False
        self._lock = threading.Lock()
        threading.Thread(target=self._listen, name="shardfs-daemon-link", daemon=True).start()

    @property
    def alive(self) -> bool:
        return self.process.poll() is None and not self._closed

    def serve(self, target: str, spec: MountSpec, fds: list[int]) -> Outcome | None:
        """Hand the mount's spec and its descriptors (the mounted /dev/fuse, and a held connection's record) to
        the daemon, with the secret it was started for beside the spec; its answer: READY, or why not (None if it
        ended without one)."""
        owed: queue.Queue[Outcome | None] = queue.Queue(1)
        with self._lock:
            if self._closed:
                return None
            self._owed[target] = owed
        try:
            handoff.send(self.sock, handoff.Serve(target, spec, self.secrets, fds))
            return owed.get(timeout=READY_TIMEOUT)
        except OSError:
            return None
        except queue.Empty:
            self.unanswering = True
            return Outcome(Said.FAILED, f"its daemon did not answer in {READY_TIMEOUT:.0f} s")
        finally:
            with self._lock:
                self._owed.pop(target, None)

    def _listen(self) -> None:
        for message in handoff.messages(self.sock, "a daemon"):
            if isinstance(message, handoff.Keep) and len(message.fds) == 2 and message.target in self.targets:
                os.close(message.fds[0])
                self._hold_record(message.target, message.fds[1])
                continue
            for fd in message.fds:
                os.close(fd)
            if isinstance(message, handoff.Keep):
                log.warning("%s: a daemon (pid %d) that does not serve it asked to keep a connection under its name;"
                            " refused", message.target, self.process.pid, extra={"event": "refused"})  # fmt: skip
            with self._lock:
                owed = self._owed.get(message.target)
            if owed is not None and isinstance(message, handoff.Answer):
                owed.put(message.outcome)
        with self._lock:  # it ended: every answer still owed is none
            self._closed = True
            for owed in self._owed.values():
                owed.put(None)
        self.sock.close()


@dataclass
class Published:
    """A mount published at a target: what it asks for, the secret beside it, and the daemon serving it now
    (replaced when it ends)."""

    name: str  # as the caller knows it (a CSI volume id, a Slurm job's dataset name)
    spec: MountSpec
    secrets: dict[str, str] = field(default_factory=dict)
    daemon: Daemon | None = None


class Hosted(Protocol):
    """What the supervisor asks of the publisher whose daemons it keeps."""

    held: Held

    def only(self, target: str) -> AbstractContextManager[None]: ...

    def published_at(self, target: str) -> Published | None: ...


@dataclass(frozen=True)
class Users:
    """Who daemons run as: a uid of uids (one each, or the one they share) and gid, with HOME=home (where the AWS
    and gcloud tools keep a user's credentials). machine: whether a mount with no credentials of its own is read
    with the machine's cloud identity (its EC2 instance role, its GCE service account): the admin's choice, off by
    default, or any pod could read any bucket the node can. log: where daemons write their log (a Slurm job's
    file); the host's stderr if None."""

    uids: range = range(NOBODY, NOBODY + 1)
    gid: int = NOBODY
    home: str = "/nonexistent"
    machine: bool = False
    log: int | None = None


class Supervisor:
    """The host's daemons: started, shared, let go, and replaced when they end (see the top)."""

    def __init__(self, users: Users, hosted: Hosted, replaced: Callable[[str, Daemon], None] | None = None) -> None:
        """replaced: told each target whose daemon was replaced, and the new one (a Slurm job keeps its pid)."""
        self.users, self.hosted, self.replaced = users, hosted, replaced
        self.env = {**DAEMON_ENV, "HOME": users.home}
        self.daemons: list[Daemon] = []
        self.watches: list[threading.Thread] = []  # one a daemon started afresh: it ends when no replacement serves
        self._sharing = threading.Lock()  # daemons chosen, started and let go one at a time

    def daemon_for(self, target: str, secrets: dict[str, str]) -> Daemon:
        """The daemon to serve target: one serving mounts with the same publish secret, or a new one, with a uid
        of its own. target is counted as its from here, so that it is not let go meanwhile."""
        with self._sharing:
            shared = (d for d in self.daemons if d.alive and not d.unanswering and d.secrets == secrets)
            daemon = next(shared, None)
            if daemon is None:
                try:
                    daemon = self._start(secrets, self._free_uid())
                except OSError as e:
                    raise PublishError("INTERNAL", f"{target}: no daemon could be started ({e})") from None
            daemon.targets.add(target)
        return daemon

    def _free_uid(self) -> int:
        """A uid no live daemon has (with _sharing held): each daemon its own, so that none can signal, renice or
        `prlimit` another (they would share a uid otherwise). A range of one uid is shared by all."""
        uids = self.users.uids
        if len(uids) == 1:
            return uids[0]
        taken = {d.uid for d in self.daemons}
        uid = next((u for u in uids if u not in taken), None)
        if uid is None:
            raise PublishError("RESOURCE_EXHAUSTED", f"every uid of --daemon-user {uids.start}-{uids.stop - 1} has"
                               " a daemon")  # fmt: skip
        return uid

    def _hold_record(self, target: str, record: int) -> None:
        """Hold the record of a daemon's fresh connection beside the /dev/fuse descriptor the host mounted at
        target: what a next daemon takes up."""
        held = self.hosted.held.take(target)
        try:
            if held:
                self.hosted.held.keep(target, [held[0], record])
            else:
                log.error("%s: not kept for a next daemon: its connection is no longer held", target,
                          extra={"event": "handover"})  # fmt: skip
        finally:
            for fd in [*held, record]:
                os.close(fd)

    def _start(self, secrets: dict[str, str], uid: int, watched: bool = True) -> Daemon:
        """A daemon in a session of its own (a signal to the host's group is not for it), logging to the users'
        log, or the host's stderr; watched (see _watch) unless it replaces one, whose watch goes on."""
        ours, theirs = handoff.pair()
        users = self.users
        with theirs:
            process = subprocess.Popen(
                [sys.executable, "-I", "-m", DAEMON, str(uid), str(users.gid), str(theirs.fileno()),
                 "machine" if users.machine else "own"],
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=users.log or sys.stderr.fileno(),
                stderr=users.log, cwd="/", env=self.env, start_new_session=True,
            )  # fmt: skip
        daemon = Daemon(process, ours, dict(secrets), self._hold_record, uid)
        self.daemons.append(daemon)
        if watched:
            watch = threading.Thread(target=self._watch, args=(daemon,), name="shardfs-reaper", daemon=True)
            self.watches.append(watch)
            watch.start()
        return daemon

    def let_go(self, daemon: Daemon, target: str) -> None:
        """target is no longer daemon's: a daemon that serves nothing more is ended."""
        with self._sharing:
            daemon.targets.discard(target)
            idle = not daemon.targets
            if idle and daemon in self.daemons:
                self.daemons.remove(daemon)
        if idle:
            _stop(daemon.process)

    def _watch(self, daemon: Daemon | None) -> None:
        """Replace a daemon that ends while its mounts are published (see the top). The watch goes on with the
        replacement, once it has every mount (it may end before it answers: it is replaced in turn)."""
        while daemon is not None:
            code = daemon.process.wait()
            with self._sharing:
                if daemon in self.daemons:
                    self.daemons.remove(daemon)
                targets = sorted(daemon.targets)
            now = time.monotonic()
            restarts = [t for t in daemon.restarts if now - t < RESTART_WINDOW]
            after: Daemon | None = None
            for target in targets:
                try:
                    with self.hosted.only(target):
                        published = self.hosted.published_at(target)
                        if published is None or published.daemon is not daemon:
                            continue  # unpublished, or published again: not this watch's to replace
                        after = self._replaced(target, published, code, restarts, after)
                        if published.daemon is daemon:
                            log.error("%s: its daemon ended (%s) while published; the mount is dead until published"
                                      " again", target, code, extra={"event": "daemon_ended"})  # fmt: skip
                            self.hosted.held.drop(target)
                        elif self.replaced is not None and published.daemon is not None:
                            self.replaced(target, published.daemon)
                except Busy:  # another call on target is in progress: it takes the mount up or down
                    continue
            if after is not None and not after.targets:  # it took up nothing
                self.let_go(after, "")
                after = None
            daemon = after

    def _replaced(
        self, target: str, published: Published, code: int, restarts: list[float], after: Daemon | None
    ) -> Daemon | None:
        """The daemon that takes target up in place of the one that ended (after, if one was started already
        for its other mounts), which published.daemon is then; None if there is none."""
        held = self.hosted.held.take(target)
        try:
            if len(held) != 2 or len(restarts) >= RESTARTS or published.daemon is None:
                return after
            log.warning("%s: its daemon ended (%s); a new one takes the connection up", target, code,
                        extra={"event": "daemon_replaced"})  # fmt: skip
            try:
                with self._sharing:
                    if after is None:
                        # its predecessor's uid: the user the connection was mounted for
                        after = self._start(published.secrets, published.daemon.uid, watched=False)
                        after.restarts = [*restarts, time.monotonic()]
                    after.targets.add(target)
            except OSError as e:  # it could not even start
                log.error("%s: no new daemon: %s", target, e, extra={"event": "handover"})
                return after
            answer = after.serve(target, published.spec, held)
        finally:
            for fd in held:
                os.close(fd)
        if answer is not None and answer != READY:  # it said why it cannot serve: another would fare no better
            log.error("%s: the new daemon did not serve: %s", target, answer.why, extra={"event": "handover"})
            with self._sharing:
                after.targets.discard(target)
            return after
        published.daemon = after  # serving, or ended before it could say so (killed too): the watch goes on
        return after


def _stop(daemon: subprocess.Popen[bytes]) -> None:
    daemon.terminate()
    try:
        daemon.wait(END_WAIT)
    except subprocess.TimeoutExpired:
        daemon.kill()  # a stopped or hung daemon: SIGKILL reaches it anyway
        daemon.wait()
