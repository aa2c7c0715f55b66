#!/usr/bin/env python3
"""The gap a daemon replaced under a live mount leaves, and the requests lost (there must be none).

A mount with `-o keeper` (service/keeper.py) is read by reader processes, each going through chunk files
of its own that the kernel has never cached (so every read is a request to the daemon), checking every
byte against the source read without FUSE (shardfs.tree). Every `--every` seconds the daemon is replaced:
killed (SIGKILL) or handed over (SIGUSR2, the graceful path), and the same `shardfs mount` started again,
as Restart=on-failure or an operator would. Reported per replacement: the gap, from the kill to the
first read answered once the killed daemon is gone (so by the next one: a resent request or a new one), and
its parts; at the end, the reads lost (an error, wrong bytes, or no answer at all).

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
# A reader: reads each file of its list, printing `start_ns done_ns sha1|errno` for each, then `end`.
READER = """
import hashlib, sys, time
for line in open(sys.argv[1]):
    start = time.monotonic_ns()
    try:
        with open(line.strip(), "rb", buffering=0) as f:
            answer = hashlib.sha1(f.read()).hexdigest()
    except OSError as e:
        answer = f"errno{e.errno}"
    print(start, time.monotonic_ns(), answer, flush=True)
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
        keeper = Path(scratch) / "keeper.sock"
        command = [*SHARDFS, "mount", str(args.source), str(point), "-o", f"keeper={keeper}"]
        subprocess.run(command, check=True)
        keeper_pid = None
        readers = []
        try:
            keeper_pid = _peer(keeper)
            for i in range(args.readers):
                files = Path(scratch) / f"list{i}"
                files.write_text("\n".join(str(point / n) for n in names[i :: args.readers]))
                readers.append(
                    subprocess.Popen([sys.executable, "-c", READER, str(files)], stdout=subprocess.PIPE, text=True)
                )
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
            outputs = [reader.communicate(timeout=600)[0].splitlines() for reader in readers]
        finally:
            with contextlib.suppress(subprocess.CalledProcessError):
                subprocess.run([*SHARDFS, "unmount", str(point)], check=True)
            if keeper_pid is not None:
                os.kill(keeper_pid, signal.SIGKILL)
            for reader in readers:
                reader.kill()
    unfinished = sum(1 for out in outputs if out[-1:] != ["end"])
    done, wrong = [], 0
    for i, out in enumerate(outputs):  # a reader prints its list's files in order
        for line, name in zip([x for x in out if x != "end"], names[i :: args.readers], strict=False):
            start, end, answer = line.split()
            done.append((int(start), int(end)))
            node = tree.lookup(name)
            wrong += answer != hashlib.sha1(node.read(0, node.size())).hexdigest()
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
