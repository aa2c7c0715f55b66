"""Publishing a volume at a pod's target path, and taking it down, as the CSI node plugin does it.

Publish: the plugin (root) opens /dev/fuse and mounts it at the target with `fd=` (the mount(2) shardfs
makes as root), gives the descriptor to its keeper (shardfs/service/keeper.py) under the target's path,
hands it with the volume to a daemon that made itself an unprivileged user (see daemon.py), and answers
kubelet once the daemon has answered the kernel's INIT. Volumes with the same publish secret (none, mostly)
share one daemon, as mountpoint-s3's Mountpoint Pods do: a process and its Python interpreter, not one a
volume. The daemon sends back each connection's record (fuse/record.py), kept beside its descriptor: a daemon
that ends while its volumes are published is replaced by one that takes every connection up (Node._watch).

Unpublish never touches a path inside the mount (its daemon may hang, and so would the caller): the mount
is found in /proc/self/mountinfo by the target's path as given, detached (a lazy unmount, which never
waits), its FUSE connection aborted if anything still holds it after a moment (a reader stuck on a hung
daemon would hold it for ever), and the target removed; the daemon's session for it ends with the connection,
and the daemon itself once it serves no other volume.

Every daemon is this process's child, and in Kubernetes this process is its container's first one, so the
daemons end with the plugin: a shardfs mount at a target that this plugin did not make is a dead one from
its last life, and publishing there clears it first.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import functools
import logging
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from shardfs.csi import NOBODY, handoff
from shardfs.csi.volume import kernel_mount
from shardfs.errors import ServiceError
from shardfs.fuse.mount import FuseMountError, connection_of, mount, unmount
from shardfs.service import keeper, mountinfo
from shardfs.service.outcome import READY, Outcome, Said
from shardfs.service.spec import MountSpec

log = logging.getLogger("shardfs.csi")

FUSECTL = Path("/sys/fs/fuse/connections")
READY_TIMEOUT = 100.0  # seconds a daemon may take to open its source and answer INIT: within kubelet's 2 minutes
GONE_WAIT = 2.0  # seconds a detached mount's connection may take to end by itself before it is aborted
END_WAIT = 5.0  # seconds a daemon may take to exit once asked, before it is killed
RESTARTS, RESTART_WINDOW = 3, 60.0  # daemons replaced within that many seconds before a volume is let die
CODES = {Said.MISSING: "NOT_FOUND", Said.REFUSED: "FAILED_PRECONDITION"}  # a daemon's refusal as kubelet is told it
DAEMON_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "TMPDIR": "/tmp"}


class NodeError(Exception):
    """A refusal kubelet is told: code is a gRPC status name (INVALID_ARGUMENT, ...), the message says why."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class Daemon:
    """A daemon process as the plugin sees it: the volumes it serves (by target), and the answers it owes. A
    thread reads what it says: records of connections to keep (kept is given the target and the record, and
    closes it) and answers, handed to the publish waiting for each. A daemon is trusted with nothing beyond its
    own volumes: a record is taken only for a target it serves, and its /dev/fuse descriptor never (the plugin
    keeps the one it mounted), so that a compromised daemon cannot put its own connection under another
    volume's name for that volume's next daemon to serve."""

    def __init__(
        self, process: subprocess.Popen[bytes], sock: socket.socket, secrets: dict[str, str],
        kept: Callable[[str, int], None], uid: int = NOBODY,
    ) -> None:  # fmt: skip
        self.process, self.sock, self.secrets, self.uid = process, sock, secrets, uid
        self.targets: set[str] = set()
        self.restarts: list[float] = []  # when daemons before this one were replaced lately (monotonic)
        self.unanswering = False  # it let a publish wait READY_TIMEOUT (stopped, wedged): no volume goes to it again
        self._kept = kept
        self._owed: dict[str, queue.Queue[Outcome | None]] = {}
        self._closed = False
        self._lock = threading.Lock()
        threading.Thread(target=self._listen, name="shardfs-csi-daemon-link", daemon=True).start()

    @property
    def alive(self) -> bool:
        return self.process.poll() is None and not self._closed

    def serve(self, target: str, spec: MountSpec, fds: list[int]) -> Outcome | None:
        """Hand the volume's spec and its descriptors (the mounted /dev/fuse, and a kept connection's record) to
        the daemon, with the secret it was started for beside the spec; its answer: READY, or why not (None if it
        ended without one)."""
        owed: queue.Queue[Outcome | None] = queue.Queue(1)
        with self._lock:
            if self._closed:
                return None
            self._owed[target] = owed
        try:
            handoff.send(self.sock, handoff.SERVE, target, fds, spec=spec.to_json(), secrets=self.secrets)
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
            if message.kind == handoff.KEEP and len(message.fds) == 2 and message.target in self.targets:
                os.close(message.fds[0])
                self._kept(message.target, message.fds[1])
                continue
            for fd in message.fds:
                os.close(fd)
            if message.kind == handoff.KEEP:
                log.warning("%s: a daemon (pid %d) that does not serve it asked to keep a connection under its name;"
                            " refused", message.target, self.process.pid, extra={"event": "refused"})  # fmt: skip
            with self._lock:
                owed = self._owed.get(message.target)
            if owed is not None and message.kind == handoff.ANSWER:
                owed.put(Outcome.from_json(message.fields.get("outcome")))
        with self._lock:  # it ended: every answer still owed is none
            self._closed = True
            for owed in self._owed.values():
                owed.put(None)
        self.sock.close()


@dataclass
class Published:
    volume_id: str
    spec: MountSpec
    secrets: dict[str, str]
    daemon: Daemon  # the one serving now: replaced when it ends (see Node._watch)


class Node:
    """The volumes published on this node, by target path."""

    def __init__(
        self, run_dir: Path, uids: range = range(NOBODY, NOBODY + 1), gid: int = NOBODY, home: str = "/nonexistent",
        machine: bool = False, log: int | None = None,
    ) -> None:  # fmt: skip
        """Daemons run as a uid of uids (one each, or the one they share: see free_uid) and gid, with HOME=home
        (where the AWS and gcloud tools keep a user's credentials). machine:
        whether a volume with no credentials of its own is read with the node's cloud identity (its EC2 instance
        role, its GCE service account): the admin's choice, off by default, or any pod could read any bucket the
        node can. log: where daemons write their log (a Slurm job's file); the plugin's stderr if None."""
        self.uids, self.gid, self.machine, self.log = uids, gid, machine, log
        self.env = {**DAEMON_ENV, "HOME": home}
        self.published: dict[str, Published] = {}
        self.daemons: list[Daemon] = []
        self._sharing = threading.Lock()  # daemons chosen, started and let go one at a time
        self._busy: set[str] = set()
        self._lock = threading.Lock()
        self._run_dir = run_dir
        self._own_fusectl: Path | None = None

    @functools.cached_property
    def keeper(self) -> Path:
        """The socket of this process's keeper (shardfs/service/keeper.py), started when first needed: it holds
        every published volume's /dev/fuse descriptor and its record, which a next daemon is handed when the
        one serving it ends."""
        self._run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self._run_dir, 0o700)
        path = self._run_dir / f"keeper.{os.getpid()}.sock"
        holder = keeper.Keeper(path)
        threading.Thread(target=holder.serve, name="shardfs-csi-keeper", daemon=True).start()
        return path

    @functools.cached_property
    def fusectl(self) -> Path:
        """Where the FUSE connections are: /sys/fs/fuse/connections, or where that is not mounted (as in most
        containers) a fusectl mount of this process's own, made when first needed."""
        found = mountinfo.exactly_at(str(FUSECTL))
        if found is not None and found.fstype == "fusectl":
            return FUSECTL
        own = self._run_dir / f"fusectl.{os.getpid()}"
        own.mkdir(parents=True, exist_ok=True)
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        if libc.mount(b"fusectl", os.fsencode(own), b"fusectl", 0, None) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"cannot mount fusectl at {own}: {os.strerror(code)}")
        self._own_fusectl = own
        return own

    def close(self) -> None:
        """The keeper's socket and the private fusectl mount, if made, are taken down; the daemons stay with
        their mounts (and the keeper's copies of their descriptors go with this process)."""
        if "keeper" in self.__dict__:
            self.keeper.unlink(missing_ok=True)
        if self._own_fusectl is not None:
            with contextlib.suppress(OSError):
                unmount(self._own_fusectl, lazy=True)
                self._own_fusectl.rmdir()

    @contextlib.contextmanager
    def _only(self, target: str) -> Iterator[None]:
        """One operation at a time on a target; another one meanwhile is ABORTED, as CSI has it (kubelet retries)."""
        with self._lock:
            if target in self._busy:
                raise NodeError("ABORTED", f"{target}: an operation on it is in progress")
            self._busy.add(target)
        try:
            yield
        finally:
            with self._lock:
                self._busy.discard(target)

    def publish(
        self, volume_id: str, target: str, spec: MountSpec, secrets: Mapping[str, str] | None = None
    ) -> None:  # fmt: skip
        """Mount spec at target, served by a daemon of secrets' (the volume's publish secret; none by default)."""
        target, secrets = _real(target), dict(secrets or {})
        with self._only(target):
            mounted = mountinfo.exactly_at(target)
            known = self.published.get(target)
            if mounted is not None and known is not None and known.daemon.alive:
                if known.volume_id != volume_id or known.spec != spec:  # a rotated secret: the same mount
                    raise NodeError("ALREADY_EXISTS", f"{target}: volume {known.volume_id} is published here otherwise")
                return  # published twice: the same mount
            if mounted is not None and mounted.fstype != mountinfo.SHARDFS_TYPE:
                raise NodeError("FAILED_PRECONDITION", f"{target}: a {mounted.fstype} mount is there, not shardfs")
            self._take_down(target)  # a dead daemon's mount, if any
            try:
                Path(target).mkdir(mode=0o750, exist_ok=True)
            except OSError as e:
                raise NodeError("INVALID_ARGUMENT", f"{target}: cannot be made ({e.strerror})") from None
            self._publish(Published(volume_id, spec, secrets, self._daemon_for(target, secrets)), target)
            log.info("published %s at %s", volume_id, target, extra={"event": "published"})

    def _publish(self, published: Published, target: str) -> None:
        """published's spec mounted at target for its daemon's uid, and served by it."""
        volume_id, daemon = published.volume_id, published.daemon
        try:
            fd = mount(Path(target), kernel_mount(published.spec, (daemon.uid, self.gid)))
        except (FuseMountError, OSError) as e:
            self._let_go(daemon, target)
            raise NodeError("INTERNAL", str(e)) from None
        try:
            connection = connection_of(fd) or _connection(target)
            keeper.keep(self.keeper, target, [fd])
            answer = daemon.serve(target, published.spec, [fd])
        except ServiceError as e:
            self._end(target, connection)
            self._let_go(daemon, target)
            raise NodeError("INTERNAL", str(e)) from None
        finally:
            os.close(fd)  # the keeper's copy is the one a next daemon takes
        if answer == READY:
            self.published[target] = published
            return
        self._end(target, connection)
        self._let_go(daemon, target)
        with contextlib.suppress(OSError):
            os.rmdir(target)
        if answer is None:
            raise NodeError("INTERNAL", f"volume {volume_id}: its daemon exited ({daemon.process.wait()})")
        raise NodeError(CODES.get(answer.said, "INTERNAL"), f"volume {volume_id}: {answer.why}")

    def _daemon_for(self, target: str, secrets: dict[str, str]) -> Daemon:
        """The daemon to serve target: one serving volumes with the same publish secret, or a new one, with a uid
        of its own. target is counted as its from here, so that it is not let go meanwhile."""
        with self._sharing:
            shared = (d for d in self.daemons if d.alive and not d.unanswering and d.secrets == secrets)
            daemon = next(shared, None)
            if daemon is None:
                try:
                    daemon = self._start_daemon(secrets, self._free_uid())
                except OSError as e:
                    raise NodeError("INTERNAL", f"{target}: no daemon could be started ({e})") from None
            daemon.targets.add(target)
        return daemon

    def _free_uid(self) -> int:
        """A uid no live daemon has (with _sharing held): each daemon its own, so that none can signal, renice or
        `prlimit` another (they would share a uid otherwise). A range of one uid is shared by all."""
        if len(self.uids) == 1:
            return self.uids[0]
        taken = {d.uid for d in self.daemons}
        uid = next((u for u in self.uids if u not in taken), None)
        if uid is None:
            raise NodeError("RESOURCE_EXHAUSTED", f"every uid of --daemon-user {self.uids.start}-"
                            f"{self.uids.stop - 1} has a daemon")  # fmt: skip
        return uid

    def _kept(self, target: str, record: int) -> None:
        """The record of a daemon's fresh connection, kept beside the /dev/fuse descriptor this plugin mounted at
        target: what a next daemon takes up."""
        held: list[int] = []
        try:
            held = keeper.take(self.keeper, target)
            if not held:
                raise ServiceError("its connection is no longer held")
            keeper.keep(self.keeper, target, [held[0], record])
        except ServiceError as e:
            log.error("%s: not kept for a next daemon: %s", target, e, extra={"event": "handover"})
        finally:
            for fd in [*held, record]:
                os.close(fd)

    def _start_daemon(self, secrets: dict[str, str], uid: int, watched: bool = True) -> Daemon:
        """A daemon in a session of its own (a signal to the plugin's group is not for it), logging to the
        node's log, or the plugin's stderr; watched (see _watch) unless it replaces one, whose watch goes on."""
        ours, theirs = handoff.pair()
        with theirs:
            process = subprocess.Popen(
                [sys.executable, "-I", "-m", "shardfs.csi.daemon", str(uid), str(self.gid), str(theirs.fileno()),
                 "machine" if self.machine else "own"],
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=self.log or sys.stderr.fileno(),
                stderr=self.log, cwd="/", env=self.env, start_new_session=True,
            )  # fmt: skip
        daemon = Daemon(process, ours, dict(secrets), self._kept, uid)
        self.daemons.append(daemon)
        if watched:
            threading.Thread(target=self._watch, args=(daemon,), name="shardfs-csi-reaper", daemon=True).start()
        return daemon

    def _let_go(self, daemon: Daemon, target: str) -> None:
        """target is no longer daemon's: a daemon that serves nothing more is ended."""
        with self._sharing:
            daemon.targets.discard(target)
            idle = not daemon.targets
            if idle and daemon in self.daemons:
                self.daemons.remove(daemon)
        if idle:
            _stop(daemon.process)

    def _watch(self, daemon: Daemon | None) -> None:
        """A daemon that ends while its volumes are published (it crashed, or was killed) is replaced: the next
        one takes each connection and its record from the keeper and serves it without mounting or INIT, and
        the kernel resends what the one before read and never answered (Linux 6.9+), so readers see no error.
        Where that cannot be (no record kept yet, daemons that keep failing), the keeper's copy is dropped:
        readers get ENOTCONN rather than wait for ever on a connection nobody serves. The watch goes on with
        the replacement, once it has every volume (it may end before it answers: it is replaced in turn)."""
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
                    with self._only(target):
                        published = self.published.get(target)
                        if published is None or published.daemon is not daemon:
                            continue  # unpublished, or published again: not this watch's to replace
                        after = self._replaced(target, published, code, restarts, after)
                        if published.daemon is daemon:
                            log.error("%s: its daemon ended (%s) while published; the mount is dead until published"
                                      " again", target, code, extra={"event": "daemon_ended"})  # fmt: skip
                            with contextlib.suppress(ServiceError):
                                keeper.drop(self.keeper, target)
                except NodeError:  # another call on target is in progress: it takes the mount up or down
                    continue
            if after is not None and not after.targets:  # it took up nothing
                self._let_go(after, "")
                after = None
            daemon = after

    def _replaced(
        self, target: str, published: Published, code: int, restarts: list[float], after: Daemon | None
    ) -> Daemon | None:
        """The daemon that takes target up in place of the one that ended (after, if one was started already
        for its other volumes), which published.daemon is then; None if there is none."""
        try:
            held = keeper.take(self.keeper, target)
        except ServiceError:
            held = []
        try:
            if len(held) != 2 or len(restarts) >= RESTARTS:
                return after
            log.warning("%s: its daemon ended (%s); a new one takes the connection up", target, code,
                        extra={"event": "daemon_replaced"})  # fmt: skip
            try:
                with self._sharing:
                    if after is None:
                        # its predecessor's uid: the user the connection was mounted for
                        after = self._start_daemon(published.secrets, published.daemon.uid, watched=False)
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

    def unpublish(self, volume_id: str, target: str) -> None:
        target = _real(target)
        with self._only(target):
            mounted = mountinfo.exactly_at(target)
            if mounted is not None and mounted.fstype != mountinfo.SHARDFS_TYPE:
                raise NodeError("FAILED_PRECONDITION", f"{target}: a {mounted.fstype} mount is there, not shardfs")
            self._take_down(target)
            try:
                os.rmdir(target)
            except FileNotFoundError:
                pass
            except OSError as e:
                raise NodeError("INTERNAL", f"{target}: cannot be removed ({e.strerror})") from None
            log.info("unpublished %s from %s", volume_id, target, extra={"event": "unpublished"})

    def _take_down(self, target: str) -> None:
        """Every shardfs mount at target (one over another, if a retry stacked them), and its daemon's part."""
        known = self.published.pop(target, None)
        for _ in range(16):  # the most stacked mounts taken down; more is a loop that must not spin for ever
            mounted = mountinfo.exactly_at(target)
            if mounted is None or mounted.fstype != mountinfo.SHARDFS_TYPE:
                break
            self._end(target, _device_connection(mounted.device))
        if known is not None:
            self._let_go(known.daemon, target)

    def _end(self, target: str, connection: int | None) -> None:
        """Detach the mount at target, abort its connection if still held: never waits long. Its daemon's session
        ends with the connection."""
        held = self._connection_dir(target, connection)
        try:
            try:
                unmount(Path(target), lazy=True)
            except OSError as e:
                if e.errno != errno.EINVAL:  # EINVAL: nothing mounted there any more
                    raise NodeError("INTERNAL", f"{target}: cannot be unmounted ({e.strerror})") from None
            if "keeper" in self.__dict__:  # else none was started (an Epilog's process): nothing is held
                with contextlib.suppress(ServiceError):
                    keeper.drop(self.keeper, target)
            if held is None:
                return
            deadline = time.monotonic() + GONE_WAIT
            while _exists("abort", held) and time.monotonic() < deadline:
                time.sleep(0.05)
            try:
                abort = os.open("abort", os.O_WRONLY, dir_fd=held)
            except FileNotFoundError:  # gone by itself meanwhile
                return
            with open(abort, "w") as f:
                f.write("1")
            log.warning("%s: connection %d aborted (still held after it was unmounted)", target, connection,
                        extra={"event": "aborted"})  # fmt: skip
        finally:
            if held is not None:
                os.close(held)

    def _connection_dir(self, target: str, connection: int | None) -> int | None:
        """The connection's fusectl directory, opened while its mount is still at target. The kernel gives an
        ended connection's number to the next mount made anywhere, so a later look by number could find (and
        abort) another one; through this descriptor, the directory is gone once its connection is."""
        if connection is None:
            return None
        try:
            held = os.open(self.fusectl / str(connection), os.O_PATH | os.O_DIRECTORY)
        except FileNotFoundError:
            return None
        if _connection(target) != connection:  # it ended before the directory was opened: not ours
            os.close(held)
            return None
        return held


def _exists(name: str, directory: int) -> bool:
    try:
        os.stat(name, dir_fd=directory)
    except FileNotFoundError:
        return False
    return True


def _stop(daemon: subprocess.Popen[bytes]) -> None:
    daemon.terminate()
    try:
        daemon.wait(END_WAIT)
    except subprocess.TimeoutExpired:
        daemon.kill()  # a stopped or hung daemon: SIGKILL reaches it anyway
        daemon.wait()


def _real(target: str) -> str:
    """target with its parent's links resolved, as mountinfo shows mountpoints; the target itself, which may be
    a mount whose daemon hangs, is not looked at."""
    parent, name = os.path.split(os.path.normpath(target))
    return os.path.join(os.path.realpath(parent), name)


def _connection(target: str) -> int | None:
    mounted = mountinfo.exactly_at(target)
    return None if mounted is None else _device_connection(mounted.device)


def _device_connection(device: str) -> int | None:
    """A FUSE mount's connection number: the minor of its device, `0:N`."""
    major, _, minor = device.partition(":")
    return int(minor) if major == "0" and minor.isdigit() else None
