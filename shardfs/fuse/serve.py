"""A filesystem mounted and served by shardfs's own session, with libfuse's `-o` options.

Options become mount(2) data, kernel timeouts or session settings, with the meanings libfuse 3.14 gave them.
Its options that change nothing here are accepted (and named in the log at INFO, with why); one that cannot
work, or that nobody knows, refuses the mount in one line, as libfuse did. SIGTERM and SIGINT unmount
(lazily, as libfuse does; Ctrl-C first names the processes a mount in use is detached under). Given somewhere
to keep the connection (a `Carrier`), the descriptor and its
record are handed there once mounted, a connection kept there is taken up instead of mounting, and SIGUSR2
hands the mount over to the next daemon: this one ends, and the mount stays. So does the SIGTERM of a
restart, where the carrier can tell one (systemd's store); a stop's SIGTERM takes the connection back too.
A process serving several mounts (the CSI daemon) serves each from a thread of its own and stops them through
their `Control`, not signals.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import logging
import math
import os
import signal
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

from shardfs.fuse.filesystem import Filesystem
from shardfs.fuse.mount import VFS_FLAGS, FuseMountError, MountOptions, Target, is_busy, mount, unmount
from shardfs.fuse.record import Carrier, Connection, Record
from shardfs.fuse.session import Serving, Session, Timeouts
from shardfs.metrics import Metrics

log = logging.getLogger("shardfs")

# max_threads when not given, for a local source (a remote one gets daemon.REMOTE_THREADS): the daemon's
# Python runs one thread at a time, so past a few threads more only fight for the GIL (docs/performance.md,
# Threads), while four still let reads that wait on a slow local disk overlap.
DEFAULT_THREADS = 4
READ_AHEAD, MAX_READ_AHEAD = 64, 1024  # `-o read_ahead=N`: files of a directory fetched ahead (remote sources)
MAX_THREADS = 100_000  # libfuse's most
# Timeouts go to the kernel as 64-bit whole seconds (which it then caps at what it can count): a timeout is a
# number of seconds from 0 up to below 2^64, anything else (nan, inf, negative, 1e30) is refused before mount.
TIMEOUT_LIMIT = 2.0**64
# libfuse 3.14's options that change nothing here (each accepted, as it was), and why.
IGNORED = {
    "max_idle_threads": "every thread waits on the device; none idles",
    "clone_fd": "the threads take turns at one descriptor, each request read by one of them",
    "noforget": "no node id outlives the kernel's use of it unless the kernel asks for it again",
    "remember": "as noforget",
    "auto_cache": "the data does not change while mounted: pages are kept (kernel_cache)",
    "noauto_cache": "as auto_cache",
    "ac_attr_timeout": "as auto_cache",
    "no_rofd_flush": "FLUSH is answered ENOSYS once and never sent again",
    "user": "libfuse wrote it to /etc/mtab only",
    "suid": "the mount shows no set-user-ID bit: it stays nosuid (mount.fuse3 adds suid for root)",
    "dev": "the mount shows no device: it stays nodev (mount.fuse3 adds dev for root)",
}
# libfuse 3.14's options that cannot work here: the mount is refused with the reason.
REFUSED = {
    "blkdev": "shardfs serves no block device (fuseblk)",
    "blksize": "it is for block-device mounts (blkdev), which shardfs does not make",
    "modules": "libfuse's stacked modules (subdir, iconv) are not part of shardfs's own FUSE session",
}
CONTEXTS = ("context", "fscontext", "defcontext", "rootcontext")  # SELinux labels, handed to the kernel as given


@dataclass(frozen=True)
class Shown:
    """libfuse's `-o uid=N,gid=N,umask=M`: every node shown with that owner, group, or permission bits
    `0777 & ~M` in place of its source's (None: the source's)."""

    uid: int | None = None
    gid: int | None = None
    umask: int | None = None


@dataclass(frozen=True)
class Settings:
    mount: MountOptions
    timeouts: Timeouts
    threads: int
    kernel_cache: bool
    shown: Shown  # uid=, gid=, umask=
    owner: int | None  # allow_root: the one user besides root whose requests are served
    debug: bool
    ignored: tuple[str, ...] = ()  # libfuse's options given that change nothing here (IGNORED)
    read_ahead: int = READ_AHEAD  # the most files of a directory fetched ahead of a reader (0: none)

    def say_ignored(self) -> None:
        """Name each option given that changes nothing, with why: in the log of the daemon that serves them."""
        for name in self.ignored:
            log.info("-o %s changes nothing: %s", name, IGNORED[name], extra={"event": "option_ignored"})


# Every `-o` name settings_of reads, for the "did you mean" of an unknown one.
KNOWN = (
    "allow_root", "allow_other", "rw", "ro", "max_read", "fsname", "subtype", "default_permissions", "auto_unmount",
    "entry_timeout", "attr_timeout", "negative_timeout", "max_threads", "kernel_cache", "uid", "gid", "umask",
    "debug", "read_ahead", *CONTEXTS, *VFS_FLAGS, *IGNORED, *REFUSED,
)  # fmt: skip


def settings_of(options: dict[str, str | bool], mountpoint: Target) -> Settings:
    """What `-o` options (as daemon.fuse_options makes them) ask of the mount and the session, checked once;
    FuseMountError naming mountpoint and the option if one cannot work."""
    left = {k: v for k, v in options.items() if k not in IGNORED}

    def refuse(why: str) -> FuseMountError:
        return FuseMountError(f"{mountpoint}: mount failed: {why}")

    def flag(name: str) -> bool:
        return bool(left.pop(name, False))

    def seconds(name: str, default: float) -> float:
        value = left.pop(name, None)
        if value is None:
            return default
        try:
            found = float(str(value))
        except ValueError:
            found = math.nan
        if not 0 <= found < TIMEOUT_LIMIT:  # nan compares false
            raise refuse(f"invalid value {name}={value} (seconds, from 0 up to below 2^64)")
        return found

    def integer(name: str, top: int, base: int = 10) -> int | None:
        """uid=, gid=, max_read= (decimal), umask= (octal, as libfuse read it): from 0 up to top, or refused."""
        value = left.pop(name, None)
        if value is None:
            return None
        try:
            found = int(str(value), base)
        except ValueError:
            found = -1
        if not 0 <= found <= top:
            raise refuse(f"invalid value {name}={value}")
        return found

    if refused := [name for name in REFUSED if name in left]:
        raise refuse("; ".join(f"-o {name}: {REFUSED[name]}" for name in refused))
    allow_root = flag("allow_root")
    left.pop("rw", None)  # shardfs is read-only whatever is asked
    left.pop("ro", None)
    max_read = integer("max_read", 2**32 - 1)  # the kernel's cap on one READ request, in bytes
    kernel = tuple(f"{name}={left.pop(name)}" for name in CONTEXTS if name in left)
    mount_options = MountOptions(
        fsname=str(left.pop("fsname", "shardfs")),
        subtype=str(left.pop("subtype", "shardfs")),
        allow_other=flag("allow_other") or allow_root,  # the kernel lets everyone in; the session, two
        default_permissions=flag("default_permissions"),
        vfs=tuple(name for name in list(left) if name in VFS_FLAGS and left.pop(name)),
        auto_unmount=flag("auto_unmount"),
        kernel=kernel if max_read is None else (*kernel, f"max_read={max_read}"),
    )
    timeouts = Timeouts(seconds("entry_timeout", 1.0), seconds("attr_timeout", 1.0), seconds("negative_timeout", 0.0))
    threads = integer("max_threads", MAX_THREADS)
    kernel_cache = flag("kernel_cache")
    shown = Shown(integer("uid", 2**32 - 2), integer("gid", 2**32 - 2), integer("umask", 0o777, 8))
    debug = flag("debug")
    read_ahead = integer("read_ahead", MAX_READ_AHEAD)
    if left:
        names = ",".join(k if v is True else f"{k}={v}" for k, v in left.items())
        close = [found for name in left for found in difflib.get_close_matches(name, KNOWN, 1)]
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise refuse(f"unknown option(s): -o {names}{hint}")
    if threads == 0:
        raise refuse("invalid value max_threads=0")
    owner = os.getuid() if allow_root else None
    ignored = tuple(name for name in options if name in IGNORED)
    return Settings(
        mount_options, timeouts, threads or DEFAULT_THREADS, kernel_cache, shown, owner, debug, ignored,
        READ_AHEAD if read_ahead is None else read_ahead,
    )  # fmt: skip


class Control:
    """Ends a mount being served, or hands it over to the next daemon, from a signal handler or another thread.
    Asked before its session runs, it is done as soon as it does."""

    def __init__(self) -> None:
        self.handed_over = False
        self._session: Session | None = None
        self._take_away: Callable[..., None] = lambda say_users=False: None
        self._carrier: Carrier | None = None
        self._asked: Callable[[], None] | None = None

    def _bind(self, session: Session, take_away: Callable[..., None], carrier: Carrier | None) -> None:
        self._session, self._take_away, self._carrier = session, take_away, carrier
        if self._asked is not None:
            self._asked()

    def stop(self, say_users: bool = False) -> None:
        """Unmount (lazily: a mount made by a parent is its to end) and stop serving. say_users (Ctrl-C): a mount
        still in use is detached all the same, since Ctrl-C must end a daemon whose readers hang on a dead source,
        but not silently: the processes that now get ENOTCONN are named first, as `shardfs unmount` names them."""
        if self._session is None:
            self._asked = functools.partial(self.stop, say_users)
            return
        self._take_away(say_users)
        self._session.stop()

    def terminate(self) -> None:
        """SIGTERM: a stop, which also lets go of the connection where it is kept (so that nothing of the mount
        is left); but the stop half of a restart (the carrier says: `systemctl restart`) hands the mount over,
        so that the next daemon, started at once, takes it up and readers see a pause, not an error."""
        session, carrier = self._session, self._carrier
        if session is None:
            self._asked = self.terminate
            return
        if carrier is not None and carrier.restarting():
            if session.resend:
                self._leave("SIGTERM of a restart")
                return
            log.error(
                "SIGTERM of a restart: this kernel cannot resend requests (FUSE_HAS_RESEND, Linux 6.9), so the mount"
                " ends and the next daemon mounts afresh", extra={"event": "handover"},
            )  # fmt: skip
        self.stop()
        if carrier is not None:
            try:
                carrier.forget()
            except Exception as e:  # the mount is gone either way; what is kept ends once its holder lets go
                log.error(
                    "could not take the connection back from where it was kept: %s", e, extra={"event": "handover"}
                )

    def hand_over(self) -> None:
        """Leave the mount to the next daemon: what this one read and has not answered, the kernel resends to
        it. A kernel that cannot resend would leave those callers waiting for ever: refused."""
        session = self._session
        if session is None:
            self._asked = self.hand_over
            return
        if self._carrier is None:
            log.error("SIGUSR2: nothing keeps this mount's connection; not handed over", extra={"event": "handover"})
        elif not session.resend:
            log.error(
                "SIGUSR2: this kernel cannot resend requests (FUSE_HAS_RESEND, Linux 6.9): not handed over",
                extra={"event": "handover"},
            )  # fmt: skip
        else:
            self._leave("SIGUSR2")

    def _leave(self, why: str) -> None:
        """Stop serving and leave the mount, connection and all, to the next daemon."""
        assert self._session is not None
        log.warning("%s: handing the mount over to the next daemon", why, extra={"event": "handover"})
        self.handed_over = True
        self._session.stop()


@dataclass(frozen=True)
class Served:
    """What a session serves and where: a filesystem at a target, with the settings its options asked for,
    counted in metrics (the mount's own). The filesystem is made once the connection's record is known (a new
    one, or the one taken up), and closed when the mount ends (fs/serve.py makes it over a tree)."""

    filesystem: Callable[[Record | None], AbstractContextManager[Filesystem]]
    mountpoint: Target
    settings: Settings
    metrics: Metrics = field(default_factory=Metrics)


def serve(
    served: Served, on_ready: Callable[[str], None], carrier: Carrier | None = None, taken_up: Connection | None = None,
    control: Control | None = None, signals: bool = True, in_use: Callable[[Path], str] | None = None,
) -> bool:  # fmt: skip
    """Mount and serve until unmounted, SIGTERM or SIGINT; FuseMountError if the mount cannot be made.
    on_ready is told what the kernel granted, once the mount answers. The options were checked before
    mount(2) (settings_of); whatever fails after it (a thread that cannot start) takes the mount away before it
    is raised, so that no dead mount is left behind. carrier: where the connection is kept for the next daemon;
    taken_up: the connection a daemon before left there, served instead of mounting. control: how the mount is
    stopped from elsewhere; signals: whether SIGTERM and SIGINT stop it and SIGUSR2 hands it over (then this runs
    in the main thread). in_use: who uses the mount, in words (service/holders.py), for Ctrl-C to say.
    True if the mount was handed over, False if it ended."""
    mountpoint, settings, metrics = served.mountpoint, served.settings, served.metrics
    settings.say_ignored()
    record = None
    if taken_up is not None:
        fd, record = taken_up.fd, taken_up.record
    else:
        fd = mount(mountpoint, settings.mount)
        if carrier is not None:
            record = Record.new()
            try:
                carrier.keep(Connection(fd, record))
            except Exception as e:  # the mount still serves; it just ends with this daemon
                log.error("the mount is not restart-safe: %s", e, extra={"event": "handover"})
                carrier = None
    session: Session | None = None
    control = control or Control()

    def ready() -> None:
        assert session is not None
        on_ready(session.granted_text())

    def take_away(say_users: bool = False) -> None:
        """Unmount lazily; say_users: whole first, so that a mount in use is known (EBUSY) and its users named."""
        if not isinstance(mountpoint, Path):  # a handed descriptor's mount is its parent's to end
            return
        if say_users and in_use is not None:
            try:
                unmount(mountpoint)
                return
            except (OSError, FuseMountError) as e:
                if is_busy(e):
                    log.warning(
                        "Ctrl-C: %s is %s: detached anyway, and they now get ENOTCONN there (`shardfs unmount`"
                        " refuses while a mount is in use)", mountpoint, in_use(mountpoint),
                        extra={"event": "stopping"},
                    )  # fmt: skip
        with contextlib.suppress(OSError, FuseMountError):
            unmount(mountpoint, lazy=True)

    serving = Serving(settings.threads, settings.timeouts, settings.kernel_cache, settings.owner, settings.debug)
    with served.filesystem(record) as filesystem:
        try:
            session = Session(fd, filesystem, serving, ready, record, taken_up is not None, metrics)
            control._bind(session, take_away, carrier)
            handlers = {
                signal.SIGTERM: control.terminate,
                signal.SIGINT: functools.partial(control.stop, say_users=True),
                signal.SIGUSR2: control.hand_over,
            }
            previous = {}
            if signals:
                previous = {sig: signal.signal(sig, lambda *_, do=do: do()) for sig, do in handlers.items()}
            try:
                session.run()
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
        except BaseException:
            take_away()
            raise
        finally:  # one a thread still reads (the session not ended) stays open: its number must name no other file
            if session is None or session.ended:
                os.close(fd)
    return control.handed_over
