"""`python -m shardfs.slurm mount|unmount`: the root side of deploy/slurm's Prolog and Epilog (README, "Slurm").

They mount as the CSI node plugin publishes (shardfs/host/), with the job's user in the pod's place: root mounts
/dev/fuse at the job's directory for that user alone (user_id=, no allow_other), and a daemon that makes itself
the job's user, with the user's HOME (so the user's own cloud credentials), serves it. Neither the user nor the
daemon needs /dev/fuse or fusermount3. The mount is published by a host process of its own that stays for the job:
as a CSI plugin does, it keeps the connection and replaces a daemon that ends (killed, crashed) while the job runs,
readers seeing no error (host/supervisor.py). The daemon's pid and the host's are kept beside the mount for the
Epilog, which runs in another process: it ends the host first (so that nothing replaces what it takes down), then
detaches the mount, aborts its connection, and kills a daemon that still runs (one that hangs).

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
import time
from collections.abc import Callable
from pathlib import Path

from shardfs.csi import add_ceilings
from shardfs.csi.volume import BadVolume, Ceilings, volume_of
from shardfs.host.errors import PublishError
from shardfs.host.publisher import Publisher
from shardfs.host.supervisor import DAEMON, Daemon, Users
from shardfs.options import BY_ATTRIBUTE, NODES_POLICY, word_of
from shardfs.service import mountinfo
from shardfs.service.daemon import parse_options
from shardfs.service.outcome import READY, Outcome, Said
from shardfs.service.spec import MountSpec

HOST = "shardfs.slurm"  # the module a dataset's host process runs (forked from the Prolog's `mount`)
GONE_WITHIN = 5.0  # seconds a killed process may take to be gone before the Epilog goes on
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # as the Prolog takes them
OWN_SUFFIXES = (".error", ".log", ".pid")  # the Prolog's own files beside each dataset's directory
CEILING_CONF = "this node's ceiling (SHARDFS_CEILING_* in /etc/shardfs/slurm.conf)"


# The CSI code's refusals (csi.volume, host/: shared with the Kubernetes plugin) name what a PersistentVolume
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
    """Where the pid of the daemon serving NAME is kept (rewritten when the daemon is replaced)."""
    return job_dir / f".{name}.pid"


def _host_file(job_dir: Path, name: str) -> Path:
    """Where the pid of NAME's host process is kept."""
    return job_dir / f".{name}.host"


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
    try:
        ceilings = Ceilings(args.ceiling_cache_size, args.ceiling_max_file_size, args.ceiling_threads, CEILING_CONF)
        spec = volume_of(attributes, flags, {}, others=False, ceilings=ceilings)
    except BadVolume as e:
        return _refuse(str(e))
    log = _log_file(args.job_dir / f"{args.name}.log", args.uid, args.gid)
    users = Users(range(args.uid, args.uid + 1), args.gid, args.home, args.node_identity, log)
    ready_r, ready_w = os.pipe()
    if host := os.fork():
        os.close(ready_w)
        os.close(log)
        # Cut by the Prolog's timeout (SIGTERM): the host goes too, as the mount it was making is the Epilog's.
        signal.signal(signal.SIGTERM, lambda *_: (os.kill(host, signal.SIGKILL), os._exit(128 + signal.SIGTERM)))
        with os.fdopen(ready_r, "rb") as ready:
            outcome = Outcome.from_bytes(ready.read())
        if outcome != READY:
            return _refuse(outcome.why if outcome is not None else "its host process ended before mounting")
        return 0
    os.close(ready_r)
    os._exit(_host(args.job_dir, args.name, spec, users, ready_w))


def _host(job_dir: Path, name: str, spec: MountSpec, users: Users, ready: int) -> int:
    """The host process of one dataset: publish it, tell the Prolog's process the outcome on ready, then stay while
    its daemon (or the one that replaced it) serves, keeping the connection for a next one. It logs to the job's
    log: a session of its own, off the Prolog's stdio."""
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd, to in ((0, null), (1, null), (2, users.log)):
        os.dup2(to, fd)
    os.close(null)
    publisher = Publisher(job_dir / ".run", users)

    def served_by(_: str, daemon: Daemon) -> None:
        _pid_file(job_dir, name).write_text(str(daemon.process.pid))

    publisher.supervisor.replaced = served_by
    try:
        publisher.publish(name, str(job_dir / name), spec)
    except PublishError as e:
        os.write(ready, Outcome(Said.FAILED, str(e)).to_bytes())
        publisher.close()
        return 2
    [published] = publisher.published.values()
    assert published.daemon is not None
    served_by(name, published.daemon)
    _host_file(job_dir, name).write_text(str(os.getpid()))
    os.write(ready, READY.to_bytes())
    os.close(ready)
    for watch in publisher.supervisor.watches:
        watch.join()
    publisher.close()
    return 0


def _log_file(path: Path, uid: int, gid: int) -> int:
    """The daemon's log: a file in the job's directory that the job's user may read (and nobody else), where it
    stays until the Epilog removes the directory; the daemon keeps it under LOG_MOST bytes."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    os.fchown(fd, uid, gid)
    os.fchmod(fd, 0o600)
    return fd


def unmount(args: argparse.Namespace) -> int:
    for host_file in args.job_dir.glob(".*.host"):  # first: no host replaces the daemons ended here
        _end(host_file, 0, HOST)
    publisher = Publisher(args.job_dir / ".run")  # it starts no daemon
    failed = 0
    try:
        for point, _ in reversed(mountinfo.shardfs_mounts()):
            if point.startswith(f"{args.job_dir}/"):
                try:
                    publisher.unpublish(os.path.basename(point), point)
                except PublishError as e:
                    print(f"shardfs: {e}", file=sys.stderr)
                    failed = 1
    finally:
        publisher.close()
    for pid_file in args.job_dir.glob(".*.pid"):
        _end(pid_file, args.uid, DAEMON)
    with contextlib.suppress(OSError):
        (args.job_dir / ".run").rmdir()
    return failed


def _end(pid_file: Path, uid: int, module: str) -> None:
    """Kill the process the file names if it still runs (a host; a daemon stopped, or hung on something), and wait
    for it to be gone: only uid's running module, not a process that took its pid."""
    with contextlib.suppress(OSError, ValueError):
        pid = int(pid_file.read_text())
        status = Path(f"/proc/{pid}/status").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        uids = next(line.split()[1:] for line in status.splitlines() if line.startswith("Uid:"))
        if uids[0] == str(uid) and module.encode() in cmdline:
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + GONE_WITHIN
            while _running(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
    pid_file.unlink(missing_ok=True)


def _running(pid: int) -> bool:
    """Whether pid runs (a zombie, whose parent has not reaped it yet, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


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
