#!/usr/bin/env python3
"""The gap a daemon replaced under a live mount leaves, and the requests lost (there must be none).

A mount with `-o keeper` (service/keeper.py) is read by reader processes, each going round chunk files of
its own until the last replacement has served a while, dropping each file's pages once read (so every read
is a request to the daemon); every byte is checked against the source read without FUSE (shardfs.tree).
Every `--every` seconds the daemon is replaced: killed (SIGKILL) or handed over (SIGUSR2, the graceful
path), and the same `shardfs mount` started again, as Restart=on-failure or an operator would. Reported per
replacement: the gap, from the kill to the first read answered once the killed daemon is gone (so by the
next one: a resent request or a new one), and its parts; at the end, the reads lost (an error, wrong bytes,
or no answer at all).

    .venv/bin/python scripts/restart_gap.py [SOURCE] [--replacements 5] [--how kill|hand-over] [--readers 4]

A SOURCE that does not exist is written first: bench.py's precomputed volume of 20,000 gzip chunks.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import exited, write_dataset

from shardfs.service import stats_socket
from shardfs.source import open_source

SHARDFS = [sys.executable, "-m", "shardfs"]
# A reader: reads the files of its list, round and round until the file sys.argv[2] exists (each read from the
# daemon: the kernel's pages of a file are dropped once read), printing
# `start_ns done_ns sha1|errno index` for each, then `end`.
READER = """
import hashlib, os, sys, time
files = open(sys.argv[1]).read().split("\\n")
i = 0
while not os.path.exists(sys.argv[2]):
    start = time.monotonic_ns()
    try:
        with open(files[i % len(files)], "rb", buffering=0) as f:
            answer = hashlib.sha1(f.read()).hexdigest()
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)  # the next pass reads from the daemon too
    except OSError as e:
        answer = f"errno{e.errno}"
    print(start, time.monotonic_ns(), answer, i % len(files), flush=True)
    i += 1
    time.sleep(0.002)
print("end", flush=True)
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", nargs="?", type=Path, default=Path("/tmp/shardfs-bench-restart/precomputed"))
    p.add_argument("--replacements", type=int, default=5)
    p.add_argument("--how", choices=["kill", "hand-over"], default="kill")
    p.add_argument("--readers", type=int, default=4)
    p.add_argument("--every", type=float, default=2.0, help="seconds of serving between two replacements")
    args = p.parse_args()
    if not args.source.exists():
        print(f"writing {args.source} ...", file=sys.stderr)
        write_dataset(args.source, 20_000)
    tree = open_source(args.source, 256 << 20).tree
    scale = next(name for name, is_dir in tree.listdir("") if is_dir)
    names = [f"{scale}/{name}" for name, is_dir in tree.listdir(scale) if not is_dir]
    with tempfile.TemporaryDirectory(prefix="shardfs-restart-") as scratch:
        point = Path(scratch) / "m"
        point.mkdir()
        keeper, stop = Path(scratch) / "keeper.sock", Path(scratch) / "stop"
        command = [*SHARDFS, "mount", str(args.source), str(point), "-o", f"keeper={keeper}"]
        subprocess.run(command, check=True)
        keeper_pid = None
        readers = []
        try:
            keeper_pid = _peer(keeper)
            for i in range(args.readers):
                files = Path(scratch) / f"list{i}"
                files.write_text("\n".join(str(point / n) for n in names[i :: args.readers]))
                # to a file: a pipe nobody reads until the end fills, and the reader would wait on it, not the mount
                with open(Path(scratch) / f"out{i}", "w") as out:
                    readers.append(subprocess.Popen([sys.executable, "-c", READER, str(files), str(stop)], stdout=out))
            replaced = []
            for _ in range(args.replacements):
                time.sleep(args.every)
                pid = stats_socket.ask(point)[0]
                killed = time.monotonic_ns()
                os.kill(pid, signal.SIGKILL if args.how == "kill" else signal.SIGUSR2)
                exited(pid)
                started = time.monotonic_ns()
                subprocess.run(command, check=True)
                replaced.append((killed, started, time.monotonic_ns()))
            time.sleep(args.every)  # the last one served a while too
            stop.touch()
            for reader in readers:
                reader.wait(timeout=600)
            outputs = [(Path(scratch) / f"out{i}").read_text().splitlines() for i in range(args.readers)]
        finally:
            with contextlib.suppress(subprocess.CalledProcessError):
                subprocess.run([*SHARDFS, "unmount", str(point)], check=True)
            if keeper_pid is not None:
                os.kill(keeper_pid, signal.SIGKILL)
            for reader in readers:
                reader.kill()
    unfinished = sum(1 for out in outputs if out[-1:] != ["end"])
    done, wrong = [], 0
    digests: dict[str, str] = {}
    for i, out in enumerate(outputs):
        mine = names[i :: args.readers]
        for line in out:
            if line == "end":
                continue
            start, end, answer, index = line.split()
            done.append((int(start), int(end)))
            name = mine[int(index)]
            if name not in digests:
                node = tree.lookup(name)
                digests[name] = hashlib.sha1(node.read(0, node.size())).hexdigest()
            wrong += answer != digests[name]
    gaps, starts, exits, answers = [], [], [], []
    for killed, started, up in replaced:
        first = min((d for _, d in done if d > started), default=None)  # the killed daemon is gone by then
        if first is not None:
            gaps.append((first - killed) / 1e6)
            answers.append((first - up) / 1e6)
        starts.append((up - started) / 1e6)
        exits.append((started - killed) / 1e6)
    print(f"replacements ({args.how}): {len(replaced)}; reads: {len(done)} by {args.readers} readers")
    print(f"gap, kill to the first request the next daemon answers: median {statistics.median(gaps):.0f} ms,"
          f" most {max(gaps):.0f} ms (each: {', '.join(f'{g:.0f}' for g in gaps)})")  # fmt: skip
    print(f"of which: the old daemon's exit {statistics.median(exits):.0f} ms, the next `shardfs mount` until it"
          f" returned {statistics.median(starts):.0f} ms, then to the first answer {statistics.median(answers):.0f} ms"
          " (medians)")  # fmt: skip
    for i, (gap, ended, start, answer) in enumerate(zip(gaps, exits, starts, answers, strict=False)):
        print(f"  {i + 1}: gap {gap:.0f} ms = exit {ended:.0f} + mount {start:.0f} + first answer {answer:.0f}")
    print(f"requests lost: {wrong} (wrong bytes or an error) + {unfinished} readers never answered")
    return 0 if wrong == unfinished == 0 else 1


def _peer(path: Path) -> int:
    import socket
    import struct

    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
        conn.connect(str(path))
        return struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]


if __name__ == "__main__":
    raise SystemExit(main())
