#!/usr/bin/env python3
"""Daemon CPU per file, exactly, cold and warm, for shardfs from one or more code trees (an A/B of a change).

scripts/bench.py reads CPU time in 10 ms ticks; this reads each daemon thread's nanoseconds
(`/proc/PID/task/*/schedstat`) around readers (processes, as bench.py's; one unless --readers) of random
chunks through a fresh mount (cold), then around the same readers of the same chunks again (warm: what
the kernel does not keep, such as the IOCTL of Python's open()), the trees taking turns, with bench.py's
idle-priority spinners keeping the cores awake. The readers open with os.open, or with Python's open()
(--open). A tree is a directory holding a `shardfs` package (e.g. `git archive REV shardfs | tar -x -C
DIR`, or a `git worktree`), optionally followed by what else it imports, PYTHONPATH-style
(`/work/wt/old:/work/old-deps` for a tree that needs mfusepy); the daemon runs from the tree with those on
PYTHONPATH. A SOURCE that does not exist is written first: bench.py's precomputed volume of 20,000 gzip
chunks. On a loaded machine the CPU figure is the steadier: other work slows the readers' wall clock more
than the daemon's work per file.

    .venv/bin/python scripts/cold_cpu.py SOURCE TREE[:EXTRA] [TREE[:EXTRA] ...] [--files 15000] [--runs 3]
        [--open] [--readers 1] [--no-spinners]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench import exited, read_files, spinners, write_dataset


def daemon_seconds(pid: int) -> float:
    """CPU time of the daemon's threads, in seconds, from the scheduler's nanosecond counts."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            total += int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[0])
    return total / 1e9


def one_run(
    source: Path, tree: str, names: list[str], point: Path, how: str, readers: int
) -> dict[str, tuple[float, float]]:
    """{'cold': (files/s, daemon CPU µs a file), 'warm': ...}: readers of names through a fresh mount of
    tree's shardfs, then again on the same mount; how: a key of bench.READS."""
    env = {k: v for k, v in os.environ.items() if k != "SHARDFS_FUSE"}  # an old tree's opt-in session: off
    env["PYTHONPATH"] = tree  # and run from tree: `-m` puts the working directory first
    command = [sys.executable, "-m", "shardfs", "mount", str(source), str(point)]
    subprocess.run(command, check=True, env=env, cwd=tree.split(os.pathsep)[0])
    out = {}
    found = subprocess.run(["pgrep", "-f", f"shardfs mount {source} {point}$"], capture_output=True, text=True)
    pid = int(found.stdout.split()[0])
    try:
        with tempfile.TemporaryDirectory(prefix="shardfs-cpu-lists-") as lists:
            for phase in ("cold", "warm"):
                cpu = daemon_seconds(pid)
                rate = read_files(point, names, readers, Path(lists), how)
                out[phase] = (rate, (daemon_seconds(pid) - cpu) / len(names) * 1e6)
    finally:
        subprocess.run(["fusermount3", "-u", str(point)], check=True)
        exited(pid)  # the next tree mounts here: not while this daemon still ends
    return out


def chunk_names(source: Path, point: Path) -> list[str]:
    """Every chunk file's path, through a mount of this tree's shardfs at point."""
    subprocess.run([sys.executable, "-m", "shardfs", "mount", str(source), str(point)], check=True)
    found = subprocess.run(["pgrep", "-f", f"shardfs mount {source} {point}$"], capture_output=True, text=True)
    try:
        return [str(p.relative_to(point)) for p in point.rglob("*") if p.is_file() and p.name != "info"]
    finally:
        subprocess.run(["fusermount3", "-u", str(point)], check=True)
        exited(int(found.stdout.split()[0]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source", type=Path, help="a sharded dataset (a scale's chunk files are read)")
    ap.add_argument("trees", nargs="+", help="directories each holding a shardfs package [:what else it imports]")
    ap.add_argument("--files", type=int, default=15000, help="random chunks read per run")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--open", action="store_true", help="read with Python's open() instead of os.open")
    ap.add_argument("--readers", type=int, default=1, help="reader processes sharing the files")
    ap.add_argument("--no-spinners", action="store_true", help="let idle vCPUs halt (to see what they cost)")
    args = ap.parse_args()
    source = args.source.resolve()
    if not source.exists():
        write_dataset(source, 20000)
    with spinners(not args.no_spinners), tempfile.TemporaryDirectory(prefix="shardfs-cpu-") as scratch:
        point = Path(scratch)
        names = chunk_names(source, point)
        trees = [os.pathsep.join(str(Path(p).resolve()) for p in tree.split(os.pathsep)) for tree in args.trees]
        how = "open()" if args.open else "os.open"
        results: dict[str, list[dict[str, tuple[float, float]]]] = {tree: [] for tree in trees}
        for run in range(args.runs):
            sample = random.Random(run).sample(names, min(args.files, len(names)))
            for tree in trees if run % 2 == 0 else trees[::-1]:
                results[tree].append(one_run(source, tree, sample, point, how, args.readers))
    spinning = "off" if args.no_spinners else "on"
    files = min(args.files, len(names))
    print(f"{args.readers} reader(s) ({how}), {files} random chunks a run, median of {args.runs}, spinners {spinning}")
    for tree, runs in results.items():
        for phase in ("cold", "warm"):
            rate, cpu = (statistics.median(r[phase][i] for r in runs) for i in (0, 1))
            print(f"{tree:50s} {phase} {rate:8.0f} files/s  daemon CPU {cpu:6.1f} µs a file")


if __name__ == "__main__":
    main()
