#!/usr/bin/env python3
"""Listings must not starve reads (issue 27): the latency of cold reads by one user while other users list
and seek a large directory of the same root `allow_other` mount.

A precomputed scale of 131,072 one-voxel chunks in one directory (tensorstore, as tests/mount/test_fuse_session.py
writes it). One reader (root) reads --reads chunk files never read before, one at a time, timing each
`open`/`read`/`close`; meanwhile, in turn:
- nothing;
- --users seekers (the unprivileged user --user, else root): each opens the directory and, over and over,
  seeks to a random far entry (`seekdir`) and reads a batch of entries (`readdir`), as `telldir`/`seekdir`
  users and NFS re-exports do;
- --users `ls -f` loops: each lists the whole directory, over and over.
The directory is listed once, and --reads other chunks read, before the timed rounds (the listing a seek
resumes in is then made, and the shard indexes read). Prints the median and the slowest read of each round,
and how many seeks or listings the others did meanwhile.

    .venv/bin/python scripts/bench_listing.py [--reads 200] [--users 8] [--user shardfs-test] [--grid 64 64 32]

Runs as root (mounts with mount(2)); run it on a quiet machine, and read the ratios to the first round.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import pwd
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SHARDFS = [sys.executable, "-m", "shardfs"]


def stopped() -> list[bool]:
    """A flag SIGTERM sets: the others work until the reads are done, then say how much they did."""
    flag = [False]
    signal.signal(signal.SIGTERM, lambda *_: flag.__setitem__(0, True))
    return flag


def seeker(directory: str) -> int:
    """Seek to a random far entry and read a batch from there, until SIGTERM; the number of seeks."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.opendir.restype = libc.readdir.restype = ctypes.c_void_p
    libc.readdir.argtypes = libc.telldir.argtypes = libc.closedir.argtypes = [ctypes.c_void_p]
    libc.seekdir.argtypes = [ctypes.c_void_p, ctypes.c_long]
    entries = len(os.listdir(directory)) + 2  # a directory offset is an entry's number, "." and ".." first
    handle = libc.opendir(directory.encode())
    rng, seeks, stop = random.Random(os.getpid()), 0, stopped()
    while not stop[0]:
        libc.seekdir(handle, rng.randrange(entries // 2, entries))
        for _ in range(100):
            if not libc.readdir(handle):
                break
        seeks += 1
    libc.closedir(handle)
    return seeks


def lister(directory: str) -> int:
    """`ls -f` of the directory, over and over, until SIGTERM; the number of listings."""
    listings, stop = 0, stopped()
    while not stop[0]:
        subprocess.run(["ls", "-f", directory], stdout=subprocess.DEVNULL, check=True)
        listings += 1
    return listings


def others(kind: str, directory: Path, users: int, user: str | None) -> list[subprocess.Popen]:
    """users processes running seeker or lister (as user, if given)."""
    drop = []
    if user:
        entry = pwd.getpwnam(user)
        drop = ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--clear-groups", "--"]
    command = [*drop, sys.executable, __file__, f"--{kind}", str(directory)]
    return [subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd="/") for _ in range(users)]


def cold_reads(directory: Path, names: list[str]) -> list[float]:
    """Seconds each open/read/close of a file never read before took."""
    took = []
    for name in names:
        start = time.perf_counter()
        with open(directory / name, "rb") as f:
            f.read()
        took.append(time.perf_counter() - start)
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, default=200)
    parser.add_argument("--users", type=int, default=8)
    parser.add_argument("--user", default="shardfs-test", help="the others' user ('' for root)")
    parser.add_argument("--grid", type=int, nargs=3, default=[64, 64, 32])
    parser.add_argument("--seeker", metavar="DIR", help=argparse.SUPPRESS)
    parser.add_argument("--lister", metavar="DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.seeker or args.lister:
        print(seeker(args.seeker) if args.seeker else lister(args.lister))
        return
    if args.user and subprocess.run(["id", "-u", args.user], capture_output=True).returncode:
        useradd = ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", args.user]
        subprocess.run(useradd, check=True)

    from tests.support import peers

    with tempfile.TemporaryDirectory(prefix="shardfs-bench-listing-", dir="/tmp") as tmp:
        root = Path(tmp)
        root.chmod(0o755)
        source, point = root / "src", root / "m"
        point.mkdir()
        print(f"writing {args.grid[0] * args.grid[1] * args.grid[2]:,} chunks ...", flush=True)
        names = peers.write_tensorstore_chunk_grid(source, tuple(args.grid))
        subprocess.run([*SHARDFS, "mount", source, point, "-o", "allow_other", "--log-file", root / "log"], check=True)
        try:
            directory = point / "s0"
            start = time.perf_counter()
            listed = len(os.listdir(directory))
            print(f"first listing: {listed:,} names in {time.perf_counter() - start:.2f} s", flush=True)
            unread = random.Random(27).sample(names, 4 * args.reads)
            cold_reads(directory, unread[3 * args.reads :])  # the shard and minishard indexes read once
            rounds = [("alone", None), (f"{args.users} seekers", "seeker"), (f"{args.users} ls -f loops", "lister")]
            for i, (label, kind) in enumerate(rounds):
                batch = unread[i * args.reads : (i + 1) * args.reads]
                busy = others(kind, directory, args.users, args.user) if kind else []
                time.sleep(2 if busy else 0)  # the others under way
                took = cold_reads(directory, batch)
                for p in busy:
                    p.terminate()
                done = sum(int(p.communicate()[0] or 0) for p in busy)
                work = f"  ({done} {'seeks' if kind == 'seeker' else 'listings'} meanwhile)" if busy else ""
                print(f"{label:>16}: cold read median {statistics.median(took) * 1e3:8.2f} ms, slowest "
                      f"{max(took) * 1e3:8.2f} ms, total {sum(took):6.2f} s{work}", flush=True)  # fmt: skip
        finally:
            subprocess.run([*SHARDFS, "unmount", point], check=False)


if __name__ == "__main__":
    main()
