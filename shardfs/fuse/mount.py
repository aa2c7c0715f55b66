"""Mounting a FUSE filesystem without libfuse: as root, mount(2) with an open /dev/fuse; as anyone else,
fusermount3 mounts and hands the device back over a socket (SCM_RIGHTS), as libfuse has it do. With
`auto_unmount` fusermount3 is used by root too, as libfuse did: it stays, and unmounts once the daemon is
gone (its end of the socket closed), however the daemon ended.

The mount shows as type `fuse.shardfs` with the source name given, as it did under libfuse."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import re
import socket
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_SYNCHRONOUS = 16
MS_DIRSYNC = 128
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_RELATIME = 1 << 21
MS_STRICTATIME = 1 << 24
MNT_DETACH = 2
# The mount flags `-o` may set or clear, as mount(8) and libfuse spell them: name → (flag, set or clear).
# Every shardfs mount is nosuid,nodev: it shows no device and no set-user-ID bit, so `suid` and `dev` (which
# mount.fuse3 adds to every root fstab mount) are accepted and change nothing (see serve.IGNORED).
VFS_FLAGS = {
    "nosuid": (MS_NOSUID, True), "nodev": (MS_NODEV, True), "noexec": (MS_NOEXEC, True), "exec": (MS_NOEXEC, False),
    "sync": (MS_SYNCHRONOUS, True), "async": (MS_SYNCHRONOUS, False), "dirsync": (MS_DIRSYNC, True),
    "noatime": (MS_NOATIME, True),
    "atime": (MS_NOATIME, False), "nodiratime": (MS_NODIRATIME, True), "diratime": (MS_NODIRATIME, False),
    "relatime": (MS_RELATIME, True), "norelatime": (MS_RELATIME, False), "strictatime": (MS_STRICTATIME, True),
}  # fmt: skip
FUSE_DEVICE = os.makedev(10, 229)  # /dev/fuse: the misc device's fixed number

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


class FuseMountError(Exception):
    """The mount could not be made; the message says why in one sentence."""


@dataclass(frozen=True)
class MountOptions:
    fsname: str
    subtype: str = "shardfs"
    read_only: bool = True
    allow_other: bool = False
    default_permissions: bool = True
    vfs: tuple[str, ...] = ()  # names in VFS_FLAGS, in the order given
    auto_unmount: bool = False
    kernel: tuple[str, ...] = ()  # `name=value` options for the kernel as given: max_read=, SELinux contexts
    # (uid, gid) the kernel lets in without allow_other (user_id=, group_id=): root mounting for the user whose
    # daemon serves it (a CSI plugin, a Slurm prolog); None: the caller.
    owner: tuple[int, int] | None = None


@dataclass(frozen=True)
class Handed:
    """A /dev/fuse descriptor a privileged parent mounted and handed over (a CSI plugin, a container runtime):
    served as it is, and never unmounted here (the mount is its parent's to end). Made only by handed(), so that
    it is an open /dev/fuse; shown as `/dev/fd/N`, as it was given."""

    fd: int

    def __str__(self) -> str:
        return f"/dev/fd/{self.fd}"


Target = Path | Handed  # where a mount is served: a directory to mount at, or a descriptor mounted already


def target_of(mountpoint: Path) -> Target:
    """The one reading of a MOUNTPOINT as given: `/dev/fd/N` is a handed descriptor (FuseMountError if it is not
    an open /dev/fuse), any other path a directory."""
    found = re.fullmatch(r"/dev/fd/(\d+)", str(mountpoint))
    return mountpoint if found is None else handed(int(found.group(1)))


def handed(fd: int) -> Handed:
    """fd as a handed target, checked to be an open /dev/fuse, and kept from the processes this one starts."""
    try:
        st = os.fstat(fd)
    except OSError as e:
        raise FuseMountError(f"{Handed(fd)}: not an open descriptor ({e.strerror})") from None
    if not stat.S_ISCHR(st.st_mode) or st.st_rdev != FUSE_DEVICE:
        raise FuseMountError(f"{Handed(fd)}: not a /dev/fuse descriptor")
    os.set_inheritable(fd, False)
    return Handed(fd)


def mount(target: Target, options: MountOptions) -> int:
    """Mount a FUSE filesystem at target; the /dev/fuse fd to serve it on (close-on-exec). A handed descriptor is
    served as it is."""
    if isinstance(target, Handed):
        return target.fd
    if os.geteuid() == 0 and not options.auto_unmount:
        return _mount_as_root(target, options)
    return _mount_with_fusermount(target, options)


def connection_of(fd: int) -> int | None:
    """The FUSE connection a /dev/fuse descriptor serves: the minor device number of its mount, as
    /proc/self/mountinfo shows it (`0:N`). None where the kernel does not say: fdinfo names it since 2025
    (6.18 does; the 6.1 and 6.8 of Debian 12 and Ubuntu 24.04 do not)."""
    try:
        text = Path(f"/proc/self/fdinfo/{fd}").read_text()
    except OSError:
        return None
    found = re.search(r"^fuse_connection:\s*(\d+)$", text, re.MULTILINE)
    return None if found is None else int(found.group(1))


def unmount(mountpoint: Path, lazy: bool = False) -> None:
    """Unmount: umount2(2) as root, `fusermount3 -u` otherwise. OSError / FuseMountError if refused."""
    if os.geteuid() == 0:
        if _libc.umount2(os.fsencode(mountpoint), MNT_DETACH if lazy else 0) != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code), str(mountpoint))
        return
    done = subprocess.run(
        ["fusermount3", "-u", *(["-z"] if lazy else []), "--", str(mountpoint)], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise FuseMountError(done.stderr.strip() or f"{mountpoint}: fusermount3 -u failed")


def is_busy(e: OSError | FuseMountError) -> bool:
    """Whether an unmount was refused because a process still uses the mount: umount2's EBUSY, or fusermount3's
    "Device or resource busy", which it says only in words."""
    return getattr(e, "errno", None) == errno.EBUSY or "busy" in str(e)


def _mount_as_root(mountpoint: Path, options: MountOptions) -> int:
    fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    try:
        root_mode = stat.S_IFMT(os.stat(mountpoint).st_mode)
        uid, gid = options.owner or (os.getuid(), os.getgid())
        data = [f"fd={fd}", f"rootmode={root_mode:o}", f"user_id={uid}", f"group_id={gid}"]
        data += [name for name, on in _flags(options) if on] + list(options.kernel)
        flags = MS_NOSUID | MS_NODEV | (MS_RDONLY if options.read_only else 0)
        for name in options.vfs:
            flag, on = VFS_FLAGS[name]
            flags = flags | flag if on else flags & ~flag
        kind = f"fuse.{options.subtype}".encode()
        if _libc.mount(options.fsname.encode(), os.fsencode(mountpoint), kind, flags, ",".join(data).encode()):
            code = ctypes.get_errno()
            raise FuseMountError(f"{mountpoint}: mount failed: {os.strerror(code)}")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _flags(options: MountOptions) -> list[tuple[str, bool]]:
    return [("allow_other", options.allow_other), ("default_permissions", options.default_permissions)]


# fusermount3 processes left watching for auto_unmount, with our end of their socket: kept open for the
# daemon's life, closed by the kernel when it ends however it ends, which is what fusermount3 waits for.
_watchers: list[tuple[socket.socket, subprocess.Popen[bytes]]] = []


def _escaped(value: str) -> str:
    """value as fusermount3 reads `fsname=` and `subtype=` (its only options that take escapes): a backslash
    takes the next character as it is, so a comma stays in the value and a trailing backslash cannot swallow
    the comma after it (`fsname=/data\\,subtype=shardfs` would be one fsname, the type plain `fuse`)."""
    return value.replace("\\", "\\\\").replace(",", "\\,")


def _mount_with_fusermount(mountpoint: Path, options: MountOptions) -> int:
    """fusermount3 is setuid root: it checks the user may mount there, mounts, and sends the fd back. It
    exits then, or with auto_unmount stays until our end of the socket closes."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    text = [f"fsname={_escaped(options.fsname)}", f"subtype={_escaped(options.subtype)}", "nosuid", "nodev"]
    text += options.vfs
    text += ["ro"] if options.read_only else []
    text += [name for name, on in _flags(options) if on] + list(options.kernel)
    text += ["auto_unmount"] if options.auto_unmount else []
    with theirs:
        tool = subprocess.Popen(
            ["fusermount3", "-o", ",".join(text), "--", str(mountpoint)],
            env={**os.environ, "_FUSE_COMMFD": str(theirs.fileno())},
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
    assert tool.stderr is not None
    with tool.stderr:
        _, fds, _, _ = socket.recv_fds(ours, 1, 1)  # nothing (end of file) if fusermount3 failed
        if not fds:
            ours.close()
            why = tool.stderr.read().decode(errors="replace").strip()
            tool.wait()
            raise FuseMountError(why or f"{mountpoint}: fusermount3 sent no /dev/fuse descriptor")
    os.set_inheritable(fds[0], False)
    if options.auto_unmount:
        _watchers.append((ours, tool))
    else:
        ours.close()
        tool.wait()
    return fds[0]
