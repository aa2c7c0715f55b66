"""`python -m shardfs.slurm mount|unmount`: the root side of deploy/slurm's Prolog and Epilog (README, "Slurm").

They mount as the CSI node plugin publishes (shardfs/csi/node.py), with the job's user in the pod's place: root
mounts /dev/fuse at the job's directory for that user alone (user_id=, no allow_other), and a daemon that makes
itself the job's user, with the user's HOME (so the user's own cloud credentials), serves it. Neither the user
nor the daemon needs /dev/fuse or fusermount3. The daemon's pid is kept beside the mount for the Epilog, which
runs in another process: a daemon that hangs is killed once its mount is detached and its connection aborted.

    mount --uid U --gid G --home H [--node-identity] [--ceiling-* ...] JOB_DIR NAME SOURCE [-o OPTIONS]
    unmount --uid U JOB_DIR                                         (every shardfs mount under it; JOB_DIR removed)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from shardfs.csi import add_ceilings
from shardfs.csi.node import Node, NodeError
from shardfs.csi.volume import BadVolume, Ceilings, volume_of
from shardfs.options import BY_ATTRIBUTE, NODES_POLICY, word_of
from shardfs.service import mountinfo
from shardfs.service.daemon import parse_options

DAEMON = "shardfs.csi.daemon"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # as the Prolog takes them
OWN_SUFFIXES = (".error", ".log", ".pid")  # the Prolog's own files beside each dataset's directory
CEILING_CONF = "this node's ceiling (SHARDFS_CEILING_* in /etc/shardfs/slurm.conf)"


# The CSI code's refusals (csi.volume, csi.node: shared with the Kubernetes plugin) name what a PersistentVolume
# asks, and the daemon's hints `shardfs mount`'s flags (--endpoint); a job asked in its comment, as `cache_size=`.
def _flag(match: re.Match[str]) -> str:
    """--requester-pays → requester_pays, as a job writes it; any other flag as it is."""
    setting = word_of(match[1])
    return setting.said if setting is not None and setting.attribute is not None else match[0]


def _attribute(match: re.Match[str]) -> str:
    """cacheSize → cache_size, as a job writes it; any other word (source) as it is."""
    setting = BY_ATTRIBUTE.get(match[1])
    return match[1] if setting is None else setting.said


IN_JOBS_WORDS: tuple[tuple[str, str | Callable[[re.Match[str]], str]], ...] = (
    (r"^volume attribute (\w+)", _attribute),
    (r"^mountOptions:? ", ""),  # an option names itself
    (r"^volume [^:]+: ", ""),  # the dataset: the TaskProlog names it
    (r"--([a-z]+(?:-[a-z]+)*)\b", _flag),
    (r"put credentials in the publish secret", "a job's comment is shown to every user"),
    (r"the plugin's to set", "the node's to set"),
)


def _refuse(why: str) -> int:
    """Why a dataset is not mounted, in the job's words, for the Prolog to keep in NAME.error: the TaskProlog
    prints it as `shardfs: NAME not mounted: WHY`, so it carries no `shardfs:` of its own."""
    for pattern, words in IN_JOBS_WORDS:
        why = re.sub(pattern, words, why)
    print(why, file=sys.stderr)
    return 2


def _pid_file(job_dir: Path, name: str) -> Path:
    return job_dir / f".{name}.pid"


def mount(args: argparse.Namespace) -> int:
    attributes, flags = {"source": args.source}, []
    for key, value in parse_options(args.options).items():
        if key in NODES_POLICY:
            return _refuse(f"{key}: a job cannot set who may reach its mount (the node's policy)")
        setting = word_of(key)
        if setting is not None and setting.attribute is not None:
            attributes[setting.attribute] = "true" if value is True else value
        else:
            flags.append(key if value is True else f"{key}={value}")
    if not NAME.fullmatch(args.name) or args.name.endswith(OWN_SUFFIXES):
        return _refuse(f"dataset name {args.name!r}: letters, digits, '.', '_' or '-', starting with a letter or"
                       f" digit, not ending {', '.join(OWN_SUFFIXES)}")  # fmt: skip
    log = _log_file(args.job_dir / f"{args.name}.log", args.uid, args.gid)
    node = Node(args.job_dir / ".run", range(args.uid, args.uid + 1), args.gid, args.home, args.node_identity, log)
    point = args.job_dir / args.name
    try:
        ceilings = Ceilings(args.ceiling_cache_size, args.ceiling_max_file_size, args.ceiling_threads, CEILING_CONF)
        volume = volume_of(attributes, flags, {}, others=False, ceilings=ceilings)
        node.publish(args.name, str(point), volume)
    except (BadVolume, NodeError) as e:
        return _refuse(str(e))
    finally:
        node.close()
        os.close(log)
    [published] = node.published.values()
    _pid_file(args.job_dir, args.name).write_text(str(published.daemon.process.pid))
    return 0


def _log_file(path: Path, uid: int, gid: int) -> int:
    """The daemon's log: a file in the job's directory that the job's user may read (and nobody else), where it
    stays until the Epilog removes the directory; the daemon keeps it under LOG_MOST bytes."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    os.fchown(fd, uid, gid)
    os.fchmod(fd, 0o600)
    return fd


def unmount(args: argparse.Namespace) -> int:
    node = Node(args.job_dir / ".run")  # it starts no daemon
    failed = 0
    try:
        for point, _ in reversed(mountinfo.shardfs_mounts()):
            if point.startswith(f"{args.job_dir}/"):
                try:
                    node.unpublish(os.path.basename(point), point)
                except NodeError as e:
                    print(f"shardfs: {e}", file=sys.stderr)
                    failed = 1
    finally:
        node.close()
    for pid_file in args.job_dir.glob(".*.pid"):
        _end(pid_file, args.uid)
    for left in (args.job_dir / ".run").glob("keeper.*.sock"):  # of a Prolog's mount its timeout cut short
        left.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        (args.job_dir / ".run").rmdir()
    return failed


def _end(pid_file: Path, uid: int) -> None:
    """Kill the daemon the file names if it still runs (stopped, or hung on something): the mount is gone."""
    with contextlib.suppress(OSError, ValueError):
        pid = int(pid_file.read_text())
        status = Path(f"/proc/{pid}/status").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        uids = next(line.split()[1:] for line in status.splitlines() if line.startswith("Uid:"))
        if uids[0] == str(uid) and DAEMON.encode() in cmdline:  # that daemon, not a process that took its pid
            os.kill(pid, signal.SIGKILL)
    pid_file.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m shardfs.slurm", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("mount")
    m.add_argument("--uid", type=int, required=True)
    m.add_argument("--gid", type=int, required=True)
    m.add_argument("--home", default="/nonexistent")
    m.add_argument("--node-identity", action="store_true")  # the Prolog's SHARDFS_NODE_IDENTITY=1
    add_ceilings(m)  # the Prolog's SHARDFS_CEILING_*
    m.add_argument("job_dir", type=Path)
    m.add_argument("name")
    m.add_argument("source")
    m.add_argument("-o", dest="options", action="append", default=[])
    u = sub.add_parser("unmount")
    u.add_argument("--uid", type=int, required=True)
    u.add_argument("job_dir", type=Path)
    args = p.parse_args(argv)
    if args.uid == 0:
        p.error("--uid 0: jobs' datasets are served by their users, not root")
    args.job_dir = args.job_dir.resolve()  # root's own directory, not a mount: as mountinfo names what is in it
    return mount(args) if args.command == "mount" else unmount(args)


if __name__ == "__main__":
    sys.exit(main())
