"""Mounting and unmounting: FUSE options, detaching, readiness, stale mounts, logging.

`mount` returns only once the kernel has the mount live: the detached daemon reports back through a
pipe once its session has answered the kernel's INIT, which comes after the mount is made. The daemon
closes the stdin, stdout and stderr it inherited, so `out=$(shardfs mount ...)` never waits on it.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import re
import select
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from cysystemd.daemon import Notification

from shardfs.cache import return_freed_memory
from shardfs.context import Context
from shardfs.errors import ServiceError, SourceError
from shardfs.fs import serve as fs_serve
from shardfs.fuse import mount as fuse_mount
from shardfs.fuse import serve as fuse_serve
from shardfs.fuse.mount import FuseMountError, Handed, Target, connection_of
from shardfs.fuse.record import Carrier, Connection
from shardfs.fuse.serve import Control, Settings, settings_of
from shardfs.logs import log_to, open_log, replay_early
from shardfs.service import handover, holders, keeper, lifecycle, mountinfo, stats_socket
from shardfs.service.outcome import READY, Outcome, Said
from shardfs.service.rundir import own_dir
from shardfs.service.spec import MountSpec
from shardfs.source import Source
from shardfs.stores.disk_cache import DiskCache
from shardfs.tree import Tree

log = logging.getLogger("shardfs")

ONE_DAY = 86400
REMOTE_THREADS = 64  # session threads (`max_threads`) for remote sources: readers wait on the network, not the CPU
STOPPED_WITHIN = 5.0  # seconds the caller waits for the daemon's outcome after passing Ctrl-C on to it


class MountError(Exception):
    """The mount could not be made; the message says why in one sentence."""


class UsageError(MountError):
    """What was asked cannot work (a missing mountpoint, one inside the source); exit 2, as for bad options."""


def fuse_options(fsname: str, extra: dict[str, str | bool], remote: bool = False) -> dict[str, str | bool]:
    """Defaults for immutable data: the kernel caches pages across opens, and attributes, names and
    absences for a day. A remote source gets enough threads for many readers' requests to overlap.
    User `-o` options override them."""
    options: dict[str, str | bool] = {
        "ro": True,
        "default_permissions": True,
        "kernel_cache": True,
        "attr_timeout": str(ONE_DAY),
        "entry_timeout": str(ONE_DAY),
        "negative_timeout": str(ONE_DAY),
        "fsname": re.sub(r"[,\s]", "_", fsname),
        "subtype": "shardfs",
    }
    if remote:
        options["max_threads"] = str(REMOTE_THREADS)
    options.update(extra)
    return options


def parse_options(groups: Sequence[str]) -> dict[str, str | bool]:
    """`-o a,b=c` (repeatable) to {'a': True, 'b': 'c'}: the one reading of `-o` text, for `shardfs mount`,
    a CSI volume's mountOptions and a Slurm job's datasets alike."""
    options: dict[str, str | bool] = {}
    for group in groups:
        for item in filter(None, group.split(",")):
            key, eq, value = item.partition("=")
            options[key] = value if eq else True
    return options


def settings(options: dict[str, str | bool], mountpoint: Target) -> Settings:
    """What the options ask of the mount and its session, read once; MountError naming the one that cannot work."""
    try:
        return settings_of(options, mountpoint)
    except FuseMountError as e:
        raise MountError(str(e)) from None


@dataclass
class Mount:
    """One mount this process serves: its tree and where, its settings (its `-o` options, read once) and a
    context of its own (its figures, its requests under way; its cache and turn of large values are its tree's), so
    that one process can serve several, each counted apart (the CSI daemon). control stops it from elsewhere."""

    tree: Tree
    mountpoint: Target
    settings: Settings
    context: Context = field(default_factory=Context)
    name: str = ""  # the source, as `shardfs stats` and the mount's log line say it
    view: str = "native"
    mtime_ns: int = field(default_factory=time.time_ns)
    control: Control = field(default_factory=Control)


def is_stale(mountpoint: Path) -> bool:
    """A mount left by a killed daemon answers ENOTCONN. statfs always reaches the daemon, where stat
    may be answered from the kernel's attribute cache."""
    try:
        os.statvfs(mountpoint)
    except OSError as e:
        return e.errno == errno.ENOTCONN
    return False


def waits_for_daemon(mountpoint: Path, patience: float = 1.0) -> bool:
    """Whether a shardfs mount at mountpoint waits for a daemon (systemd or a keeper holds its connection, and
    no daemon serves it yet): its statfs neither answers nor fails (a dead mount's fails at once, ENOTCONN)
    within patience. The thread asking is left behind: the kernel ends its wait when this process exits."""
    found = mountinfo.topmost(mountpoint)
    if found is None or found.fstype != mountinfo.SHARDFS_TYPE:
        return False
    answered = threading.Event()

    def ask() -> None:
        with contextlib.suppress(OSError):
            os.statvfs(mountpoint)
        answered.set()

    threading.Thread(target=ask, daemon=True).start()
    return not answered.wait(patience)


def prepare_mountpoint(mountpoint: Target, source: Path | None, allow_non_empty: bool) -> None:
    """Clear a dead mount; refuse a mountpoint that cannot work. One inside a local source (or holding it)
    would deadlock: the daemon would read the source through its own mount. A handed descriptor is not looked
    at (it was checked to be /dev/fuse where it was named): its parent made the mount, which answers nothing
    (not even statfs) until the daemon serves it. A non-empty one that holds a dataset is asked about rather than
    offered --allow-non-empty: SOURCE and MOUNTPOINT were likely swapped, and mounting over it would hide the
    dataset."""
    if isinstance(mountpoint, Handed):
        return
    if waits_for_daemon(mountpoint):
        raise MountError(
            f"{mountpoint}: a mount here waits for its next daemon (its connection is kept): start it as the one"
            " before was started (the same -o keeper, or its systemd unit), or `shardfs unmount` it"
        )
    if is_stale(mountpoint):
        log.warning("clearing the stale mount at %s", mountpoint, extra={"event": "stale_mount"})
        try:
            fuse_mount.unmount(mountpoint, lazy=True)
        except (OSError, FuseMountError) as e:
            why = _unmount_failure(e)
            raise MountError(f"{mountpoint}: a dead mount is there and could not be cleared ({why})") from None
        if is_stale(mountpoint):
            raise MountError(f"{mountpoint}: a dead mount is there and could not be cleared")
    if not mountpoint.exists():
        raise UsageError(f"{mountpoint}: mountpoint does not exist")
    if not mountpoint.is_dir():
        raise UsageError(f"{mountpoint}: mountpoint is not a directory")
    if os.path.ismount(mountpoint):
        raise MountError(already_mounted(mountpoint))
    where = Path(os.path.realpath(mountpoint))
    if source is not None and (where.is_relative_to(source.resolve()) or source.resolve().is_relative_to(where)):
        source = source.resolve()
        how = "is" if where == source else "is inside" if where.is_relative_to(source) else "holds"
        raise UsageError(f"{mountpoint}: mountpoint {how} the source {source}; mount it elsewhere")
    with os.scandir(mountpoint) as entries:
        if allow_non_empty or not any(entries):
            return
    if held := next((name for name in ("zarr.json", "info") if (mountpoint / name).is_file()), None):
        raise UsageError(
            f"{mountpoint}: mountpoint is a dataset (it holds {held}), not an empty directory: were SOURCE and"
            " MOUNTPOINT swapped? (`shardfs mount SOURCE MOUNTPOINT`)"
        )
    raise UsageError(f"{mountpoint}: mountpoint is not empty; pass --allow-non-empty to mount over it")


def already_mounted(mountpoint: Path) -> str:
    """What is mounted at mountpoint, in one line saying what to do: the same whether a mount or a keeper's
    daemon found it first."""
    found = mountinfo.topmost(mountpoint)
    if found is None or found.fstype != mountinfo.SHARDFS_TYPE:
        what = f"a {found.fstype} mount of {found.source}" if found is not None else "a mount"
        return f"{mountpoint}: {what} is already here; mount elsewhere"
    try:
        pid = f" (daemon pid {stats_socket.ask(mountpoint)[0]})"
    except ServiceError:
        pid = ""
    return f"{mountpoint}: shardfs already serves {found.source} here{pid}; `shardfs unmount {mountpoint}` first"


def unmount(mountpoint: Path, any_type: bool = False, lazy: bool = False) -> None:
    """Unmount the shardfs mount at mountpoint; anything else mounted there is refused unless any_type, so
    that root's `shardfs unmount` with a mistyped path cannot take down a disk or another FUSE daemon. A busy
    mount is refused naming what holds it, unless lazy: then it is detached at once and goes when they let go."""
    # The mount table first: a mount whose daemon is being replaced answers no statfs or stat until it is.
    found = mountinfo.topmost(mountpoint)
    if found is None:
        if not os.path.lexists(mountpoint):
            raise UsageError(f"{mountpoint}: does not exist")
        raise MountError(f"{mountpoint}: not mounted")
    if not any_type and found is not None and found.fstype != mountinfo.SHARDFS_TYPE:
        raise MountError(f"{mountpoint}: a {found.fstype} mount, not shardfs; pass --any-type to unmount it anyway")
    try:
        fuse_mount.unmount(mountpoint, lazy)
    except (OSError, FuseMountError) as e:
        if fuse_mount.is_busy(e):
            raise MountError(
                f"{mountpoint}: {holders.said(mountpoint)}; close them, or pass --lazy to detach it now"
            ) from None
        raise MountError(f"{mountpoint}: unmount failed: {_unmount_failure(e)}") from None


def _unmount_failure(e: OSError | FuseMountError) -> str:
    """Why an unmount failed, in words: umount2's errno, or fusermount3's own line."""
    return (e.strerror or str(e)) if isinstance(e, OSError) else str(e)


def shown_mountpoint(mountpoint: Target) -> Path | None:
    """The directory the mount is at: mountpoint, or for a handed descriptor (mounted by a parent, as CSI drivers
    do) the directory the kernel shows that descriptor's connection mounted at, so that the stats socket
    and the default log are named after it and `shardfs stats DIR` finds the daemon. None where the kernel
    does not say (see mount.connection_of) or the mount is not visible here."""
    if isinstance(mountpoint, Path):
        return mountpoint
    connection = connection_of(mountpoint.fd)
    found = mountinfo.at_device(f"0:{connection}") if connection is not None else None
    return None if found is None else Path(found)


def default_log_file(mountpoint: Path) -> Path:
    """<temp dir>/shardfs-<uid>/<mountpoint>.log, in a directory only its owner can use, so that on a
    shared /tmp nobody else can plant a link where the daemon will write."""
    try:
        directory = own_dir(Path(tempfile.gettempdir()) / f"shardfs-{os.getuid()}", 0o700)
    except PermissionError as e:
        raise MountError(f"{e}; pass --log-file") from None
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", str(mountpoint).strip("/")) or "root"
    return directory / f"{slug}.log"


def stats_name(mountpoint: Target, taken_up: Connection | None) -> Path | None:
    """The path `shardfs stats` asks for this mount by: the mountpoint; for a handed descriptor the directory the
    kernel shows it at (see shown_mountpoint), whether this daemon mounts it or takes up a kept connection; a kept
    connection's mountpoint with its name as given (it answers nothing until this daemon serves it)."""
    if isinstance(mountpoint, Handed):
        return shown_mountpoint(mountpoint)
    return handover.mount_name(mountpoint) if taken_up is not None else mountpoint


def serve(
    mount: Mount,
    on_ready: Callable[[], None] | None = None,
    metrics_at: tuple[str, int] | None = None,
    carrier: Carrier | None = None,
    taken_up: Connection | None = None,
    signals: bool = True,
) -> bool:
    """Serve the mount until unmounted, stopped (its control; SIGTERM or SIGINT if signals: they unmount), or
    handed over to the next daemon (SIGUSR2; then True). carrier and taken_up: see service/handover.py. signals:
    whether this mount is the process's one, served from its main thread."""
    tree, mountpoint, figures_of = mount.tree, mount.mountpoint, mount.context.metrics
    where = stats_name(mountpoint, taken_up)
    figures_of.mount.info({"source": mount.name, "mountpoint": str(where or mountpoint), "view": mount.view})

    def ready(granted: str) -> None:
        figures_of.start_time.set_to_current_time()
        log.info("mounted %s at %s, view %s; %s", mount.name, where or mountpoint, mount.view, granted,
                 extra={"event": "mounted"})  # fmt: skip
        lifecycle.tell_systemd(Notification.READY)
        if on_ready is not None:
            on_ready()

    unhandled = lifecycle.handle_signals(tree)  # before the session's threads: they inherit the blocked signals
    return_freed_memory()
    figures = lifecycle.Paced(figures_of.text)
    try:
        if metrics_at is not None:
            lifecycle.serve_metrics(metrics_at, figures)
        if where is None:
            remove_stats_socket = _no_stats(mountpoint)
        else:
            remove_stats_socket = stats_socket.serve(where, figures, real=where != mountpoint or taken_up is not None)
    except ServiceError as e:
        unhandled()
        raise MountError(str(e)) from None
    figures_of.watch_cache(tree.cache)
    try:
        served = fs_serve.served(tree, mount.mtime_ns, mountpoint, mount.settings, figures_of)
        handed_over = fuse_serve.serve(served, ready, carrier, taken_up, mount.control, signals, holders.said)
    except FuseMountError as e:
        raise MountError(str(e)) from None
    finally:
        remove_stats_socket()
        unhandled()
    if handed_over:
        log.info("handed %s over to the next daemon", mountpoint, extra={"event": "handed_over"})
        return True
    if (waiting := mount.context.waiting.said()) is not None:  # left to end with the process, which does not wait
        log.warning("%s", waiting, extra={"event": "stopping"})
    if signals:
        lifecycle.tell_systemd(Notification.STOPPING)
    log.info("unmounted %s", mountpoint, extra={"event": "unmounted"})
    return False


def open_mount(
    spec: MountSpec, target: Target, context: Context, source: Source | None = None, disk: DiskCache | None = None
) -> Mount:  # fmt: skip
    """The one way a mount is opened from what it asks for, by `shardfs mount`'s daemon and the CSI daemon alike:
    its options read (MountError naming one that cannot work), then its source opened (SourceError) unless it was
    already (a local source, opened before the daemon detached so that a refusal comes first). disk: where a remote
    source's byte ranges are kept across mounts, if anywhere."""
    asked = settings(spec.options, target)
    source = source or spec.open_source(context, disk)
    mtime_ns = os.stat(source.local).st_mtime_ns if source.local is not None else time.time_ns()
    return Mount(source.tree, target, asked, context, spec.name, spec.reading.view, mtime_ns)


def mount(
    spec: MountSpec, target: Target, context: Context, source: Source | None = None, disk: DiskCache | None = None
) -> bool:  # fmt: skip
    """Mount; in the background unless spec.service.foreground. Returns once the mount is live; MountError
    otherwise. In the foreground, returns True once the mount has been handed over to the next daemon (SIGUSR2).

    source: the opened source, or None for a remote one: obstore's runtime does not survive a fork, so a remote
    source is opened by the daemon itself, which reports a refusal back as SourceError. A local source's directory
    is one the target must keep clear of. disk's descriptors are left open when the daemon detaches. context:
    the one the source was (or is to be) opened with. A connection kept for this target (by systemd or a
    keeper: service/handover.py) is taken up, not mounted again."""
    service, local = spec.service, None if source is None else source.local
    log_file, foreground = Path(service.log_file) if service.log_file else None, service.foreground
    if foreground:  # before anything is said: taking up a kept connection, clearing a stale mount
        log_to(log_file)
        replay_early()
    named = Path(str(target))  # what a kept connection is kept under: the target as given
    serves = handover.served(spec.name, spec.reading.view, named)
    try:
        carrier, taken_up = handover.choose(named, service.keeper, foreground, serves)
    except keeper.Busy:
        raise MountError(already_mounted(named)) from None
    if taken_up is None:
        prepare_mountpoint(target, local, service.allow_non_empty)
    metrics_at = service.metrics
    if foreground:
        lifecycle.block_signals()  # before a remote source is opened: obstore's threads start with it
        return serve(open_mount(spec, target, context, source, disk), None, metrics_at, carrier, taken_up)
    chosen = log_file is not None
    handed = [target.fd] if isinstance(target, Handed) else []
    log_file = log_file or default_log_file(shown_mountpoint(target) or Path(f"{target}-{os.getpid()}"))
    log_fd = open_log(log_file)  # here, so that a log file that cannot be ours alone is refused in words
    ready_r, ready_w = os.pipe()
    if daemon := os.fork():
        os.close(ready_w)
        os.close(log_fd)
        with os.fdopen(ready_r, "rb") as ready:
            try:
                outcome = Outcome.from_bytes(ready.read())
            except KeyboardInterrupt:
                raise KeyboardInterrupt(_stopped(daemon, ready)) from None
        if outcome is None:
            raise MountError(f"{target}: the daemon exited before mounting; see {log_file}")
        if outcome.said in (Said.REFUSED, Said.MISSING):
            raise SourceError(outcome.why)
        if outcome.said != Said.READY:
            raise MountError(outcome.why)
        return False
    # The daemon: a session of its own, stdio off the caller's terminal and pipes, logs to the file.
    os.close(ready_r)
    os.setsid()
    lifecycle.block_signals()  # before a remote source is opened: obstore's threads start with it
    descriptors = [] if disk is None else disk.descriptors()
    if source is not None:
        source.tree.store.forget()  # its files would be closed under it next
        descriptors += source.tree.store.descriptors()
    # Nothing the caller left open keeps its pipes or files alive; the pipe, the log, the source's root,
    # --cache-dir's directory and the connection's descriptors stay.
    connection_fds = ([] if taken_up is None else taken_up.fds) + ([] if carrier is None else carrier.descriptors())
    keep = sorted({2, ready_w, log_fd, *descriptors, *handed, *connection_fds})
    for low, high in itertools.pairwise([*keep, os.sysconf("SC_OPEN_MAX")]):
        os.closerange(low + 1, high)
    _detach_stdio(log_fd)
    log_to(None)  # stderr is the log file now
    replay_early()  # what planning the source told the terminal, in the log too

    def tell(outcome: Outcome) -> None:
        with contextlib.suppress(OSError):
            os.write(ready_w, outcome.to_bytes())

    def ready() -> None:
        tell(READY)
        os.close(ready_w)

    try:
        try:
            opened = open_mount(spec, target, context, source, disk)  # here: a refusal is in its log too
        except SourceError as e:
            log.error("mount refused: %s", e, extra={"event": "mount_failed"})
            tell(Outcome.of(e))
            os._exit(2)
        status = handover.HANDED_OVER if serve(opened, ready, metrics_at, carrier, taken_up) else 0
    except KeyboardInterrupt:  # the caller's Ctrl-C, passed on before the mount was ready (see _stopped)
        said = context.waiting.said() or ""
        if said:
            log.warning("%s", said, extra={"event": "stopping"})
        tell(Outcome(Said.STOPPED, said))
        status = 130  # as the caller exits, and `mount -f`
    except BaseException as e:  # the parent waits on the pipe: tell it why, then exit
        known = isinstance(e, MountError)  # says why in its message; anything else is a bug: a traceback
        log.error("mount failed: %s", e, exc_info=not known, extra={"event": "mount_failed"})
        why = str(e) if known else f"{target}: mount failed ({e or type(e).__name__}); see {log_file}"
        tell(Outcome(Said.FAILED, why))
        os._exit(1)
    if not chosen and os.fstat(2).st_size == 0:  # nothing was said: the default log is not kept, one a mount
        with contextlib.suppress(OSError):
            log_file.unlink()
    os._exit(status)


def _stopped(daemon: int, ready: BinaryIO) -> str:
    """Ctrl-C while the daemon was getting ready: it runs in a session of its own, so the terminal's SIGINT
    reached only this process. Passed on, it stops the daemon (a mount never made, or ended), which says what it
    left waiting, as `mount -f` does: those words, for this process to say on the terminal that pressed Ctrl-C,
    or "" if none came within STOPPED_WITHIN."""
    os.kill(daemon, signal.SIGINT)
    if not select.select([ready], [], [], STOPPED_WITHIN)[0]:
        return ""
    outcome = Outcome.from_bytes(ready.read())
    return outcome.why if outcome is not None and outcome.said == Said.STOPPED else ""


def _no_stats(target: Target) -> Callable[[], None]:
    """No stats socket: its name is the target's, which the kernel did not tell."""
    log.warning(
        "%s: the directory this descriptor is mounted at is not visible here: `shardfs stats` cannot reach"
        " this daemon", target, extra={"event": "no_stats"},
    )  # fmt: skip
    return lambda: None


def _detach_stdio(log_fd: int) -> None:
    """stdin and stdout to /dev/null, stderr to the log file (see logs.open_log)."""
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.dup2(log_fd, 2)  # whatever a library prints lands in the log too
    os.close(null)
    os.close(log_fd)
