"""The kernel's FUSE protocol, as `linux/fuse.h` (7.40) defines it: opcodes, flags and the structs a
read-only filesystem reads and writes, with the resending of unanswered requests that 7.40 brought. Native
byte order; every struct is padded to 8 bytes as the kernel's are. 7.39 and 7.40 changed no size this reads
or writes (init_out's max_stack_depth and open_out's backing_id took padding, and mean something only with
FUSE_PASSTHROUGH, never granted); FUSE_STATX, new in 7.39, is answered ENOSYS, and the kernel then asks
GETATTR."""

from __future__ import annotations

import enum
import struct

KERNEL_MAJOR = 7
OUR_MINOR = 40  # the header this was written against; a kernel offering less is answered with its own
RESEND_MINOR = 40  # from this minor on, a kernel offering FUSE_HAS_RESEND takes FUSE_NOTIFY_RESEND
MIN_MINOR = 12  # below this, entry_out and attr_out had other sizes (FUSE_COMPAT_*_SIZE): refused
ROOT_ID = 1
UNKNOWN_INO = 0xFFFFFFFF  # what a directory entry's d_ino is before its name is looked up (as libfuse)
COMPAT_22_INIT_OUT_SIZE = 24  # what a kernel before 7.23 takes as init_out


class Op(enum.IntEnum):
    LOOKUP = 1
    FORGET = 2
    GETATTR = 3
    SETATTR = 4
    READLINK = 5
    SYMLINK = 6
    MKNOD = 8
    MKDIR = 9
    UNLINK = 10
    RMDIR = 11
    RENAME = 12
    LINK = 13
    OPEN = 14
    READ = 15
    WRITE = 16
    STATFS = 17
    RELEASE = 18
    FSYNC = 20
    SETXATTR = 21
    GETXATTR = 22
    LISTXATTR = 23
    REMOVEXATTR = 24
    FLUSH = 25
    INIT = 26
    OPENDIR = 27
    READDIR = 28
    RELEASEDIR = 29
    FSYNCDIR = 30
    GETLK = 31
    SETLK = 32
    SETLKW = 33
    ACCESS = 34
    CREATE = 35
    INTERRUPT = 36
    BMAP = 37
    DESTROY = 38
    IOCTL = 39
    POLL = 40
    NOTIFY_REPLY = 41
    BATCH_FORGET = 42
    FALLOCATE = 43
    READDIRPLUS = 44
    RENAME2 = 45
    LSEEK = 46
    COPY_FILE_RANGE = 47
    SETUPMAPPING = 48
    REMOVEMAPPING = 49
    SYNCFS = 50
    TMPFILE = 51
    STATX = 52  # 7.39


class InitFlag(enum.IntFlag):
    """fuse_init_in/out flags (the low 32 bits; we ask for nothing in flags2)."""

    ASYNC_READ = 1 << 0
    POSIX_LOCKS = 1 << 1
    FILE_OPS = 1 << 2
    ATOMIC_O_TRUNC = 1 << 3
    EXPORT_SUPPORT = 1 << 4
    BIG_WRITES = 1 << 5
    DONT_MASK = 1 << 6
    SPLICE_WRITE = 1 << 7
    SPLICE_MOVE = 1 << 8
    SPLICE_READ = 1 << 9
    FLOCK_LOCKS = 1 << 10
    HAS_IOCTL_DIR = 1 << 11
    AUTO_INVAL_DATA = 1 << 12
    DO_READDIRPLUS = 1 << 13
    READDIRPLUS_AUTO = 1 << 14
    ASYNC_DIO = 1 << 15
    WRITEBACK_CACHE = 1 << 16
    NO_OPEN_SUPPORT = 1 << 17
    PARALLEL_DIROPS = 1 << 18
    HANDLE_KILLPRIV = 1 << 19
    POSIX_ACL = 1 << 20
    ABORT_ERROR = 1 << 21
    MAX_PAGES = 1 << 22
    CACHE_SYMLINKS = 1 << 23
    NO_OPENDIR_SUPPORT = 1 << 24
    EXPLICIT_INVAL_DATA = 1 << 25
    MAP_ALIGNMENT = 1 << 26
    SUBMOUNTS = 1 << 27
    HANDLE_KILLPRIV_V2 = 1 << 28
    SETXATTR_EXT = 1 << 29
    INIT_EXT = 1 << 30
    INIT_RESERVED = 1 << 31


class InitFlag2(enum.IntFlag):
    """fuse_init_in's flags2 (bits 32 and up of the flags, sent when INIT_EXT is set): the ones read here."""

    HAS_RESEND = 1 << (39 - 32)  # 7.40 (Linux 6.9): the kernel takes NOTIFY_RESEND


class Notify(enum.IntEnum):
    """What a message with unique 0 tells the kernel (fuse_notify_code), sent as the out header's error."""

    RESEND = 7  # put every request read and not answered back in the queue, their unique | UNIQUE_RESEND


UNIQUE_RESEND = 1 << 63  # set in a resent request's unique; its answer echoes the unique as read
FOPEN_KEEP_CACHE = 1 << 1
FOPEN_CACHE_DIR = 1 << 3

# struct fuse_in_header: len, opcode, unique, nodeid, uid, gid, pid, total_extlen, padding
IN_HEADER = struct.Struct("=IIQQIIIHH")
# struct fuse_out_header: len, error (negative errno), unique
OUT_HEADER = struct.Struct("=IiQ")
# struct fuse_init_in up to flags (16 bytes: what every kernel sends); flags2 follows from 7.36
INIT_IN = struct.Struct("=IIII")
INIT_IN_FLAGS2 = struct.Struct("=I")
# struct fuse_init_out: major, minor, max_readahead, flags, max_background, congestion_threshold,
# max_write, time_gran, max_pages, map_alignment, flags2, unused[7]
INIT_OUT = struct.Struct("=IIIIHHIIHHI28x")
# struct fuse_attr: ino, size, blocks, atime, mtime, ctime, atimensec, mtimensec, ctimensec, mode, nlink,
# uid, gid, rdev, blksize, flags
ATTR = struct.Struct("=QQQQQQIIIIIIIIII")
# struct fuse_entry_out: nodeid, generation, entry_valid, attr_valid, entry_valid_nsec, attr_valid_nsec
ENTRY_OUT = struct.Struct("=QQQQII")
# struct fuse_attr_out: attr_valid, attr_valid_nsec, dummy
ATTR_OUT = struct.Struct("=QII")
# struct fuse_open_out: fh, open_flags, padding
OPEN_OUT = struct.Struct("=QII")
# struct fuse_read_in: fh, offset, size, read_flags, lock_owner, flags, padding
READ_IN = struct.Struct("=QQIIQII")
# struct fuse_release_in: fh, flags, release_flags, lock_owner
RELEASE_IN = struct.Struct("=QIIQ")
# struct fuse_forget_in: nlookup
FORGET_IN = struct.Struct("=Q")
# struct fuse_batch_forget_in: count, dummy; then count of struct fuse_forget_one: nodeid, nlookup
BATCH_FORGET_IN = struct.Struct("=II")
FORGET_ONE = struct.Struct("=QQ")
# struct fuse_interrupt_in: unique
INTERRUPT_IN = struct.Struct("=Q")
# struct fuse_dirent: ino, off, namelen, type; then the name, padded to 8 bytes
DIRENT = struct.Struct("=QQII")
# struct fuse_kstatfs: blocks, bfree, bavail, files, ffree, bsize, namelen, frsize, padding, spare[6]
STATFS_OUT = struct.Struct("=QQQQQIIII24x")

READ_ONLY_REFUSED = frozenset(
    {
        Op.SETATTR, Op.SYMLINK, Op.MKNOD, Op.MKDIR, Op.UNLINK, Op.RMDIR, Op.RENAME, Op.LINK, Op.WRITE,
        Op.SETXATTR, Op.REMOVEXATTR, Op.CREATE, Op.FALLOCATE, Op.RENAME2, Op.COPY_FILE_RANGE, Op.TMPFILE,
    }
)  # fmt: skip
"""Requests that would change the filesystem: EROFS, whatever they name."""


def dirent(ino: int, offset: int, name: bytes, file_type: int) -> bytes:
    """One fuse_dirent: file_type is the d_type (DT_DIR, DT_REG), i.e. st_mode >> 12."""
    entry = DIRENT.pack(ino, offset, len(name), file_type) + name
    return entry + b"\0" * (-len(entry) % 8)
