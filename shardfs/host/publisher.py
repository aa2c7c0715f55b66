"""Publishing a mount at a target path, and taking it down, for whichever deployment asks: the CSI node plugin
(shardfs/csi/) for a pod's volume, a Slurm Prolog (shardfs/slurm.py) for a job's dataset.

Publish: the host (root) opens /dev/fuse and mounts it at the target with `fd=` (the mount(2) shardfs makes as
root), keeps the descriptor (held.py) under the target's path, hands it with the spec to a daemon that made
itself an unprivileged user (daemon.py, chosen and watched by supervisor.py), and returns once the daemon has
answered the kernel's INIT. The daemon sends back each connection's record (fuse/record.py), kept beside its
descriptor for a next daemon.

Unpublish never touches a path inside the mount (its daemon may hang, and so would the caller): the mount is found
in /proc/self/mountinfo by the target's path as given, detached (a lazy unmount, which never waits), its FUSE
connection aborted if anything still holds it after a moment (fuse/connections.py: a reader stuck on a hung daemon
would hold it for ever), and the target removed; the daemon's session for it ends with the connection, and the
daemon itself once it serves no other mount.

Every daemon is this process's child, so the daemons end with the host (in Kubernetes, the plugin's container): a
shardfs mount at a target this host did not make is a dead one from its last life, and publishing there clears it.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import threading
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path

from shardfs.fuse import connections
from shardfs.fuse.mount import FuseMountError, connection_of, mount, unmount
from shardfs.fuse.serve import settings_of
from shardfs.host.errors import Busy, PublishError
from shardfs.host.held import Held
from shardfs.host.supervisor import Daemon, Published, Supervisor, Users
from shardfs.service import mountinfo
from shardfs.service.outcome import READY, Said
from shardfs.service.spec import MountSpec

log = logging.getLogger("shardfs.host")

GONE_WAIT = 2.0  # seconds a detached mount's connection may take to end by itself before it is aborted
CODES = {Said.MISSING: "NOT_FOUND", Said.REFUSED: "FAILED_PRECONDITION"}  # a daemon's refusal as the caller is told


class Publisher:
    """The mounts published by this host, by target path, one operation on a target at a time."""

    def __init__(self, run_dir: Path, users: Users | None = None) -> None:
        """run_dir: the host's own directory (a fusectl mount, where /sys/fs/fuse/connections has none). users: who
        the daemons run as (supervisor.Users)."""
        self.published: dict[str, Published] = {}
        self.held = Held()
        self.supervisor = Supervisor(users or Users(), self)
        self._busy: set[str] = set()
        self._lock = threading.Lock()
        self._run_dir = run_dir
        self._own_fusectl: Path | None = None

    @property
    def daemons(self) -> list[Daemon]:
        return self.supervisor.daemons

    @functools.cached_property
    def fusectl(self) -> Path:
        """Where the FUSE connections are: /sys/fs/fuse/connections, or where that is not mounted (as in most
        containers) a fusectl mount of this process's own, made when first needed."""
        found = mountinfo.exactly_at(str(connections.FUSECTL))
        if found is not None and found.fstype == "fusectl":
            return connections.FUSECTL
        self._run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # root's alone
        own = self._run_dir / f"fusectl.{os.getpid()}"
        connections.mount_fusectl(own)
        self._own_fusectl = own
        return own

    def close(self) -> None:
        """The private fusectl mount, if made, is taken down; the daemons stay with their mounts (and what this
        host keeps of their connections goes with this process)."""
        if self._own_fusectl is not None:
            with contextlib.suppress(OSError):
                unmount(self._own_fusectl, lazy=True)
                self._own_fusectl.rmdir()

    @contextlib.contextmanager
    def only(self, target: str) -> Iterator[None]:
        """One operation at a time on a target; another one meanwhile is Busy (CSI: ABORTED; kubelet retries)."""
        with self._lock:
            if target in self._busy:
                raise Busy(target)
            self._busy.add(target)
        try:
            yield
        finally:
            with self._lock:
                self._busy.discard(target)

    def published_at(self, target: str) -> Published | None:
        return self.published.get(target)

    def publish(self, name: str, target: str, spec: MountSpec, secrets: Mapping[str, str] | None = None) -> None:
        """Mount spec at target as name (a CSI volume id, a job's dataset), served by a daemon of secrets' (the
        publish secret; none by default). Published twice alike, it is the same mount (a rotated secret too)."""
        target, secrets = _real(target), dict(secrets or {})
        with self.only(target):
            mounted = mountinfo.exactly_at(target)
            known = self.published.get(target)
            if mounted is not None and known is not None and known.daemon is not None and known.daemon.alive:
                if known.name != name or known.spec != spec:
                    raise PublishError("ALREADY_EXISTS", f"{target}: volume {known.name} is published here otherwise")
                return
            if mounted is not None and mounted.fstype != mountinfo.SHARDFS_TYPE:
                raise PublishError("FAILED_PRECONDITION", f"{target}: a {mounted.fstype} mount is there, not shardfs")
            self._take_down(target)  # a dead daemon's mount, if any
            try:
                Path(target).mkdir(mode=0o750, exist_ok=True)
            except OSError as e:
                raise PublishError("INVALID_ARGUMENT", f"{target}: cannot be made ({e.strerror})") from None
            daemon = self.supervisor.daemon_for(target, secrets)  # first: the mount is made for its uid
            self._publish(Published(name, spec, secrets, daemon), target, daemon)
            log.info("published %s at %s", name, target, extra={"event": "published"})

    def _publish(self, published: Published, target: str, daemon: Daemon) -> None:
        """published's spec mounted at target for daemon's uid, and served by it."""
        try:
            asked = settings_of(published.spec.options, Path(target)).mount  # checked as the spec was made
            fd = mount(Path(target), replace(asked, owner=(daemon.uid, self.supervisor.users.gid)))
        except (FuseMountError, OSError) as e:
            self.supervisor.let_go(daemon, target)
            raise PublishError("INTERNAL", str(e)) from None
        connection = connection_of(fd) or _connection(target)
        try:
            self.held.keep(target, [fd])
            answer = daemon.serve(target, published.spec, [fd])
        except OSError as e:  # no descriptor left to keep a copy with
            self._end(target, connection)
            self.supervisor.let_go(daemon, target)
            raise PublishError("INTERNAL", f"{target}: {e}") from None
        finally:
            os.close(fd)  # the copy held is the one a next daemon takes
        if answer == READY:
            self.published[target] = published
            return
        self._end(target, connection)
        self.supervisor.let_go(daemon, target)
        with contextlib.suppress(OSError):
            os.rmdir(target)
        if answer is None:
            raise PublishError("INTERNAL", f"volume {published.name}: its daemon exited ({daemon.process.wait()})")
        raise PublishError(CODES.get(answer.said, "INTERNAL"), f"volume {published.name}: {answer.why}")

    def unpublish(self, name: str, target: str) -> None:
        target = _real(target)
        with self.only(target):
            mounted = mountinfo.exactly_at(target)
            if mounted is not None and mounted.fstype != mountinfo.SHARDFS_TYPE:
                raise PublishError("FAILED_PRECONDITION", f"{target}: a {mounted.fstype} mount is there, not shardfs")
            self._take_down(target)
            try:
                os.rmdir(target)
            except FileNotFoundError:
                pass
            except OSError as e:
                raise PublishError("INTERNAL", f"{target}: cannot be removed ({e.strerror})") from None
            log.info("unpublished %s from %s", name, target, extra={"event": "unpublished"})

    def _take_down(self, target: str) -> None:
        """Every shardfs mount at target (one over another, if a retry stacked them), and its daemon's part."""
        known = self.published.pop(target, None)
        for _ in range(16):  # the most stacked mounts taken down; more is a loop that must not spin for ever
            mounted = mountinfo.exactly_at(target)
            if mounted is None or mounted.fstype != mountinfo.SHARDFS_TYPE:
                break
            self._end(target, connections.device_connection(mounted.device))
        if known is not None and known.daemon is not None:
            self.supervisor.let_go(known.daemon, target)

    def _end(self, target: str, connection: int | None) -> None:
        """Detach the mount at target, abort its connection if still held: never waits long. Its daemon's session
        ends with the connection."""
        held = connections.opened(self.fusectl, connection, lambda: _connection(target))
        try:
            try:
                unmount(Path(target), lazy=True)
            except OSError as e:
                if e.errno != errno.EINVAL:  # EINVAL: nothing mounted there any more
                    raise PublishError("INTERNAL", f"{target}: cannot be unmounted ({e.strerror})") from None
            self.held.drop(target)
        except BaseException:
            if held is not None:
                os.close(held)
            raise
        if held is not None and connections.abort_if_held(held, GONE_WAIT):
            log.warning("%s: connection %d aborted (still held after it was unmounted)", target, connection,
                        extra={"event": "aborted"})  # fmt: skip


def _real(target: str) -> str:
    """target with its parent's links resolved, as mountinfo shows mountpoints; the target itself, which may be
    a mount whose daemon hangs, is not looked at."""
    parent, name = os.path.split(os.path.normpath(target))
    return os.path.join(os.path.realpath(parent), name)


def _connection(target: str) -> int | None:
    mounted = mountinfo.exactly_at(target)
    return None if mounted is None else connections.device_connection(mounted.device)
