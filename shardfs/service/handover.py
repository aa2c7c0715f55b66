"""Where a mount's connection waits while its daemon is replaced: systemd's file-descriptor store, or a keeper.

Under systemd (a unit with `FileDescriptorStoreMax=`, see systemd/shardfs@.service) the daemon pushes the
/dev/fuse descriptor and its record into the unit's store (sd_notify `FDSTORE=1` with `FDNAME=`); systemd
holds them while the unit restarts and passes them to the next ExecStart as LISTEN_FDS/LISTEN_FDNAMES.
Elsewhere `-o keeper[=SOCKET]` hands them to a keeper process (service/keeper.py, started if none answers).
Either way the next `shardfs mount` of the same mountpoint finds the connection and takes it up without
mounting: nothing touches the mountpoint first, since no daemon would answer for it yet. It does so only if
the connection is still mounted there: a mount detached while files were open on it (a stop, `shardfs
unmount --lazy`) keeps its connection alive, and taking that up would serve nothing anyone can reach.

A stop lets go of what was kept; under systemd, the SIGTERM of a restart hands the mount over instead
(`SystemdStore.restarting`): a restart is as invisible to readers as a crash.
"""

from __future__ import annotations

import array
import contextlib
import json
import logging
import os
import select
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardfs.errors import ServiceError
from shardfs.fuse.mount import FuseMountError, connection_of, unmount
from shardfs.fuse.record import Carrier, Connection, RecordError
from shardfs.service import keeper, mountinfo

log = logging.getLogger("shardfs")

BUSCTL = ("busctl", "--json=short", "--timeout=2")  # systemd's own D-Bus client, there wherever systemd is
SYSTEMD = "org.freedesktop.systemd1"
FUSE_NAME = "shardfs-fuse"  # FDNAME of the /dev/fuse descriptor in systemd's store
RECORD_NAME = "shardfs-record"  # FDNAME of its record
LISTEN_FDS_START = 3  # sd_listen_fds(3): passed descriptors begin here
MAX_LINKS = 40  # links followed in a mountpoint's name, as the kernel's own path walk allows
HANDED_OVER = 75  # the daemon's exit status once it has handed its mount over (RestartForceExitStatus= in the unit)


def mount_name(mountpoint: Path) -> Path:
    """The mountpoint's real path, found without looking at the mount itself (its parent resolved, then its name
    if that is a link, by readlink(2), which never asks the mount's daemon): a kept connection's mount answers
    nothing until its next daemon serves it. Whatever path names a mount, its daemons find it by one name."""
    path = Path(os.path.abspath(mountpoint))
    for _ in range(MAX_LINKS):
        path = Path(os.path.realpath(path.parent)) / path.name
        try:
            path = Path(os.path.normpath(path.parent / os.readlink(path)))
        except OSError:  # EINVAL: not a link (a directory, a mount), or nothing there
            return path
    return path


def served(source: str, view: str, mountpoint: Path) -> str:
    """What a connection serves, as its record is stamped with it (fuse/record.py): a daemon asked for anything
    else does not take the connection up."""
    return json.dumps({"source": source, "view": view, "mountpoint": str(mount_name(mountpoint))}, sort_keys=True)


def _stamp(connection: Connection, serves: str) -> None:
    """Stamp what the connection serves, with its mount's device (`0:N`, as mountinfo lists it): on the kernels
    that do not name a descriptor's connection (before 6.18), how the next daemon knows where it is mounted."""
    stamp = json.loads(serves)
    found = mountinfo.topmost(Path(stamp["mountpoint"]))
    stamp["device"] = _device(connection.fd) or (found.device if found is not None else None)
    connection.record.stamp(json.dumps(stamp, sort_keys=True))


def _device(fd: int) -> str | None:
    """The device of the mount a /dev/fuse descriptor serves, where the kernel names its connection."""
    connection = connection_of(fd)
    return None if connection is None else f"0:{connection}"


@dataclass(frozen=True)
class SystemdStore:
    """The unit's file-descriptor store, reached over $NOTIFY_SOCKET. serves: see served()."""

    address: str
    serves: str

    def keep(self, connection: Connection) -> None:
        """Store a new connection's descriptors, once whatever an earlier one left under their names (a record
        whose connection ended, say) is removed: the next start must find one of each."""
        _stamp(connection, self.serves)
        self.forget()
        for name, fd in ((FUSE_NAME, connection.fd), (RECORD_NAME, connection.record.fd)):
            self._notify(f"FDSTORE=1\nFDNAME={name}", [fd])

    def forget(self) -> None:
        for name in (FUSE_NAME, RECORD_NAME):
            self._notify(f"FDSTOREREMOVE=1\nFDNAME={name}", [])

    def _notify(self, text: str, fds: list[int]) -> None:
        address = "\0" + self.address[1:] if self.address.startswith("@") else self.address  # abstract namespace
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as conn:
            try:
                # socket.send_fds would drop the address (CPython 3.11 passes neither flags nor address on)
                rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
                conn.sendmsg([text.encode()], rights, 0, address)
            except OSError as e:
                raise ServiceError(f"systemd's notify socket refused the mount's descriptors ({e.strerror})") from e

    def descriptors(self) -> list[int]:
        return []  # a new socket each time

    def restarting(self) -> bool:
        """Whether systemd is restarting this unit (`systemctl restart`, `try-restart`, a package upgrade's):
        its job is then of type `restart`, where a stop's is `stop` and a kill or a crash has none. Asked over
        D-Bus (busctl) when SIGTERM comes; if systemd cannot say, a stop is assumed, as before restarts were
        told apart."""
        try:
            (unit,) = _bus(
                "call", "/org/freedesktop/systemd1", f"{SYSTEMD}.Manager", "GetUnitByPID", "u", str(os.getpid())
            )
            job_id, job = _bus("get-property", unit, f"{SYSTEMD}.Unit", "Job")
            return bool(job_id) and _bus("get-property", job, f"{SYSTEMD}.Job", "JobType") == "restart"
        except (OSError, subprocess.SubprocessError, ValueError, TypeError, KeyError) as e:
            log.warning("could not ask systemd whether this stop is a restart (%s): it ends the mount", e,
                        extra={"event": "handover"})  # fmt: skip
            return False


def _bus(verb: str, path: str, *args: str) -> Any:
    """What systemd answers over D-Bus, from JSON: busctl's `data`."""
    env = {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}  # else its failure is told to systemd
    command = [*BUSCTL, verb, SYSTEMD, path, *args]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=5, check=True)
    return json.loads(done.stdout)["data"]


def _listened() -> dict[str, int]:
    """Descriptors systemd passed this process (sd_listen_fds_with_names), by name; none if they were meant
    for another process (LISTEN_PID). The variables are removed, so that nothing started later takes them."""
    if os.environ.get("LISTEN_PID") != str(os.getpid()):
        return {}
    count = int(os.environ.get("LISTEN_FDS", "0") or 0)
    names = os.environ.get("LISTEN_FDNAMES", "").split(":")
    for variable in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(variable, None)
    return {names[i] if i < len(names) else "unknown": LISTEN_FDS_START + i for i in range(count)}


@dataclass(frozen=True)
class KeeperCarrier:
    """A keeper, holding the connection under the mountpoint's real path. The link stays open for the daemon's
    life: while it does, no other daemon is handed the connection (see service/keeper.py). serves: see served()."""

    link: keeper.Link
    name: str
    serves: str

    def keep(self, connection: Connection) -> None:
        _stamp(connection, self.serves)
        self.link.keep(self.name, connection.fds)

    def forget(self) -> None:
        self.link.ask(f"DROP {self.name}")

    def restarting(self) -> bool:
        return False  # a keeper's daemon is replaced by a hand-over (SIGUSR2) or a crash; SIGTERM stops it

    def descriptors(self) -> list[int]:
        return [self.link.sock.fileno()]


def choose(
    mountpoint: Path, wanted: str | bool | None, foreground: bool, serves: str
) -> tuple[Carrier | None, Connection | None]:  # fmt: skip
    """Where this mount's connection is to be kept, and the connection kept there by a daemon before (None:
    mount afresh). Under systemd (foreground, $NOTIFY_SOCKET) the unit's store; with `-o keeper[=SOCKET]`
    (wanted: the socket, or True for the default one) a keeper; otherwise nowhere: the mount ends with its
    daemon. serves: what this daemon is asked to serve (served()); a connection kept for something else is
    ended, not taken up."""
    listened = _listened()
    notify = os.environ.get("NOTIFY_SOCKET", "")
    carrier: SystemdStore | KeeperCarrier
    if foreground and notify and os.environ.get("FDSTORE") != "0":  # $FDSTORE: the unit's maximum (systemd 254+)
        carrier = SystemdStore(notify, serves)
        fds = [listened[FUSE_NAME], listened[RECORD_NAME]] if {FUSE_NAME, RECORD_NAME} <= set(listened) else []
        return carrier, _taken_up(fds, "systemd's file-descriptor store", carrier)
    if wanted is None:
        return None, None
    path = keeper.default_path() if wanted is True else Path(str(wanted)).absolute()
    keeper.started(path)
    link = keeper.Link(path)
    carrier = KeeperCarrier(link, str(mount_name(mountpoint)), serves)
    return carrier, _taken_up(link.take(carrier.name), f"the keeper at {path}", carrier)


def _taken_up(fds: list[int], where: str, carrier: SystemdStore | KeeperCarrier) -> Connection | None:
    """The connection fds are, as carrier held them, if this daemon may take it up: one that has ended, serves
    something else or is no longer mounted here is let go, and None said (mount afresh)."""
    if not fds:
        return None
    try:
        connection = Connection.of(fds)
        connection.record.terms()  # reads, or says why not
        if _ended(connection.fd):
            raise RecordError("its mount has ended")
        stamped = json.loads(connection.record.serves() or "null")  # None: stamped by no version before this one
        if stamped is not None and {k: v for k, v in stamped.items() if k != "device"} != json.loads(carrier.serves):
            _end_other(connection, carrier)
            for fd in fds:
                os.close(fd)
            return None
        if not _mounted_here(connection, stamped, carrier):
            for fd in fds:
                os.close(fd)
            return None
    except (RecordError, OSError) as e:
        log.error("%s held descriptors that are not a kept connection (%s): mounting afresh", where, e,
                  extra={"event": "handover"})  # fmt: skip
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        return None
    log.info("taking up the connection kept by %s", where, extra={"event": "handover"})
    return connection


def _mounted_here(
    connection: Connection, stamped: dict[str, str | None] | None, carrier: SystemdStore | KeeperCarrier
) -> bool:  # fmt: skip
    """Whether the kept connection is the mount at its mountpoint. One detached (a stop or `shardfs unmount`
    with files open: the kernel keeps the connection until they close) must not be served, or the unit would be
    active with nothing mounted: it is let go where it is kept, and the mount made afresh. Where neither the
    kernel nor the record names its device (a record from before devices were stamped), it is taken up."""
    device = _device(connection.fd) or (stamped or {}).get("device")
    if device is None:
        return True
    asked = json.loads(carrier.serves)["mountpoint"]
    found = mountinfo.topmost(Path(asked))
    if found is not None and found.device == device:
        return True
    log.warning("the connection kept (device %s) is no longer mounted at %s: it is let go and the mount made"
                " afresh", device, asked, extra={"event": "handover"})  # fmt: skip
    with contextlib.suppress(ServiceError, OSError):
        carrier.forget()
    return False


def _end_other(connection: Connection, carrier: SystemdStore | KeeperCarrier) -> None:
    """A kept connection that serves something else than this daemon is asked for (a unit's SOURCE or view
    changed, another mount's descriptors passed): names the kernel cached there would read other bytes. It is
    let go where it is kept, and its mount detached if it is this mountpoint's (the kernel then ends the
    connection, and its callers get an error); another mountpoint's is left to its own daemon."""
    try:
        was = json.loads(connection.record.serves() or "{}")
    except ValueError:
        was = {}
    asked = json.loads(carrier.serves)
    log.warning("the connection kept serves %s (view %s) at %s, not %s (view %s) at %s: it is let go and the mount"
                " made afresh", was.get("source"), was.get("view"), was.get("mountpoint"), asked["source"],
                asked["view"], asked["mountpoint"], extra={"event": "handover"})  # fmt: skip
    with contextlib.suppress(ServiceError):
        carrier.forget()
    if was.get("mountpoint") == asked["mountpoint"]:
        with contextlib.suppress(OSError, FuseMountError):
            unmount(Path(asked["mountpoint"]), lazy=True)


def _ended(fd: int) -> bool:
    """Whether a /dev/fuse descriptor's connection has ended (unmounted, aborted): the kernel says POLLERR."""
    poller = select.poll()
    poller.register(fd, 0)
    return any(events & select.POLLERR for _, events in poller.poll(0))
