#!/usr/bin/env python3
"""Daemon CPU per cold file, exactly, for shardfs from one or more code trees (an A/B of a change).

scripts/bench.py reads CPU time in 10 ms ticks; this reads each daemon thread's nanoseconds
(`/proc/PID/task/*/schedstat`) around one reader (os.open, os.read, os.close) of random chunks through a
fresh mount, the trees taking turns, with bench.py's idle-priority spinners keeping the cores awake.
A tree is a directory holding a `shardfs` package (e.g. `git archive REV shardfs | tar -x -C DIR`);
the daemon imports it through PYTHONPATH. A SOURCE that does not exist is written first: bench.py's
precomputed volume of 20,000 gzip chunks.

    .venv/bin/python scripts/cold_cpu.py SOURCE TREE [TREE ...] [--files 15000] [--runs 3] [--no-spinners]
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
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench import spinners, write_dataset


def daemon_seconds(pid: int) -> float:
    """CPU time of the daemon's threads, in seconds, from the scheduler's nanosecond counts."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            total += int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[0])
    return total / 1e9


def one_run(source: Path, tree: Path, names: list[str], point: Path) -> tuple[float, float]:
    """(files/s, daemon CPU µs a file) for one reader of names through a fresh mount of tree's shardfs."""
    env = dict(os.environ, PYTHONPATH=str(tree))  # and run from tree: `-m` puts the working directory first
    subprocess.run([sys.executable, "-m", "shardfs", "mount", str(source), str(point)], check=True, env=env, cwd=tree)
    try:
        found = subprocess.run(["pgrep", "-f", f"shardfs mount {source} {point}$"], capture_output=True, text=True)
        pid = int(found.stdout.split()[0])
        cpu, start = daemon_seconds(pid), time.perf_counter()
        for name in names:
            fd = os.open(point / name, os.O_RDONLY)
            while os.read(fd, 1 << 20):
                pass
            os.close(fd)
        elapsed, cpu = time.perf_counter() - start, daemon_seconds(pid) - cpu
    finally:
        subprocess.run(["fusermount3", "-u", str(point)], check=True)
    return len(names) / elapsed, cpu / len(names) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source", type=Path, help="a sharded dataset (a scale's chunk files are read)")
    ap.add_argument("trees", type=Path, nargs="+", help="directories each holding a shardfs package")
    ap.add_argument("--files", type=int, default=15000, help="random chunks read per run")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-spinners", action="store_true", help="let idle vCPUs halt (to see what they cost)")
    args = ap.parse_args()
    source = args.source.resolve()
    if not source.exists():
        write_dataset(source, 20000)
    with spinners(not args.no_spinners), tempfile.TemporaryDirectory(prefix="shardfs-cpu-") as scratch:
        point = Path(scratch)
        subprocess.run([sys.executable, "-m", "shardfs", "mount", str(source), str(point)], check=True)
        try:
            names = [str(p.relative_to(point)) for p in point.rglob("*") if p.is_file() and p.name != "info"]
        finally:
            subprocess.run(["fusermount3", "-u", str(point)], check=True)
        results: dict[Path, list[tuple[float, float]]] = {tree: [] for tree in args.trees}
        for run in range(args.runs):
            sample = random.Random(run).sample(names, min(args.files, len(names)))
            for tree in args.trees if run % 2 == 0 else args.trees[::-1]:
                results[tree].append(one_run(source, tree.resolve(), sample, point))
    spinning = "off" if args.no_spinners else "on"
    print(f"one reader, {min(args.files, len(names))} random chunks a run, median of {args.runs}, spinners {spinning}")
    for tree, runs in results.items():
        rate, cpu = statistics.median(r for r, _ in runs), statistics.median(c for _, c in runs)
        print(f"{tree!s:40s} {rate:8.0f} files/s  daemon CPU {cpu:6.1f} µs a cold file")


if __name__ == "__main__":
    main()
