#!/usr/bin/env python3
"""The daemon's peak memory against `--cache-size`, after listing and reading every chunk of large directories.

Each case is a volume of 125,000 to 512,000 small chunks written once by a real writer (tensorstore) into
--data (kept for later runs): precomputed volumes in gzip and raw, sharded with the identity hash and with
murmurhash3, and a zarr v3 array sharded by tensorstore (gzip inner chunks, 2,500 chunk directories). For
each cache size, a detached daemon (`shardfs mount`, as users run it) serves the case; its chunks are
listed with their attributes (os.scandir and stat: what `ls -l` asks), then every chunk is read once, and
the daemon's resident memory is taken from /proc (VmRSS after each step, VmHWM: the peak over its life),
and what its cache counts as held at the end (`shardfs stats`). The last columns are the peak minus what
the cache held (the daemon's own memory) and the peak minus --cache-size: what the README promises stays
within 40 MiB.

    .venv/bin/python scripts/bench_memory.py [--data DIR] [--cache-sizes 64M 256M] [--cases CASE ...]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import tensorstore as ts

SHARDFS = [sys.executable, "-m", "shardfs"]
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.support.daemons import cache_held  # noqa: E402
from tests.support.peers import write_tensorstore_scale  # noqa: E402  (the tests' writer: the same volumes)

MARGIN_MIB = 40  # what the README promises beyond --cache-size


def sharding(hash_: str, data_encoding: str, preshift_bits: int) -> dict:
    return {
        "@type": "neuroglancer_uint64_sharded_v1", "hash": hash_, "preshift_bits": preshift_bits,
        "minishard_bits": 6, "shard_bits": 3, "minishard_index_encoding": "gzip", "data_encoding": data_encoding,
    }  # fmt: skip


def write_zarr(root: Path) -> None:
    """A zarr v3 uint8 array 400³ in shards of 80³, inner chunks of 8³ gzipped, written by tensorstore."""
    array = ts.open(
        {
            "driver": "zarr3",
            "kvstore": {"driver": "file", "path": str(root)},
            "metadata": {
                "shape": [400] * 3,
                "data_type": "uint8",
                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [80] * 3}},
                "codecs": [
                    {
                        "name": "sharding_indexed",
                        "configuration": {
                            "chunk_shape": [8] * 3,
                            "codecs": [{"name": "bytes"}, {"name": "gzip", "configuration": {"level": 5}}],
                        },
                    }
                ],
            },
            "create": True,
        }
    ).result()
    array.write(np.random.default_rng(0).integers(0, 16, size=(400,) * 3, dtype=np.uint8)).result()


def precomputed(side: int, chunk: int, hash_: str, data_encoding: str) -> Callable[[Path], None]:
    """A writer of a precomputed case: side³ voxels in chunk³ chunks (identity: 2^9 chunks a minishard)."""
    spec = sharding(hash_, data_encoding, 9 if hash_ == "identity" else 0)
    return lambda root: write_tensorstore_scale(root, side, chunk, spec)


# name -> (what is listed and read below the mount, writer)
CASES: dict[str, tuple[str, Callable[[Path], None]]] = {
    "precomputed gzip identity": ("s0", precomputed(400, 8, "identity", "gzip")),  # 125,000 chunks
    "precomputed raw identity": ("s0", precomputed(400, 8, "identity", "raw")),
    "precomputed gzip murmur 4³": ("s0", precomputed(320, 4, "murmurhash3_x86_128", "gzip")),  # 512,000 chunks
    "precomputed raw murmur 4³": ("s0", precomputed(320, 4, "murmurhash3_x86_128", "raw")),
    "zarr v3 gzip (tensorstore)": ("c", write_zarr),  # 125,000 chunks in 2,500 directories
}


def dataset(data: Path, name: str) -> Path:
    """The case's volume, written on first use."""
    root = data / name.replace(" ", "-").replace("³", "")
    if not (root / ".done").exists():
        start = time.monotonic()
        CASES[name][1](root)
        (root / ".done").touch()
        print(f"# wrote {name} in {time.monotonic() - start:.0f} s: {root}", flush=True)
    return root


def status_mib(pid: int) -> dict[str, int]:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return {key: int(fields[key].split()[0]) >> 10 for key in ("VmRSS", "VmHWM")}


def daemon_of(point: Path) -> int:
    """The pid of the daemon serving point (it names the mountpoint on its command line)."""
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if proc.name.isdigit() and str(point).encode() in (proc / "cmdline").read_bytes().split(b"\0"):
                return int(proc.name)
    raise SystemExit(f"no daemon serves {point}")


@contextlib.contextmanager
def mounted(source: Path, cache_size: str) -> Iterator[tuple[Path, int]]:
    with tempfile.TemporaryDirectory(prefix="shardfs-mem-") as where:
        point = Path(where) / "m"
        point.mkdir()
        log = Path(where) / "log"
        subprocess.run([*SHARDFS, "mount", source, point, "--cache-size", cache_size, "--log-file", log], check=True)
        try:
            yield point, daemon_of(point)
        finally:
            subprocess.run([*SHARDFS, "unmount", point], check=True)


def files(directory: Path) -> Iterator[os.DirEntry]:
    """Every file below directory, each stat'ed as the listing gives it (what `ls -lR` does)."""
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                yield from files(Path(entry.path))
            else:
                entry.stat(follow_symlinks=False)
                yield entry


def run(source: Path, below: str, cache_size: str) -> tuple[int, dict[str, int], dict[str, int], dict[str, int], int]:
    """(files, memory after mount, after listing, after reading, what the cache holds then), in MiB."""
    with mounted(source, cache_size) as (point, pid):
        idle = status_mib(pid)
        paths = [entry.path for entry in files(point / below)]
        listed = status_mib(pid)
        for path in paths:
            with open(path, "rb") as f:
                f.read()
        return len(paths), idle, listed, status_mib(pid), cache_held(point) >> 20


def mib(size: str) -> int:
    return int(size[:-1]) << {"M": 0, "G": 10}[size[-1]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "shardfs-bench-memory")
    parser.add_argument("--cache-sizes", nargs="+", default=["64M", "256M"])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    args = parser.parse_args()
    os.chdir(ROOT)  # `python -m shardfs` is this tree's
    sources = {name: dataset(args.data, name) for name in args.cases}
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"# {when}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, shardfs from {ROOT}")
    print(f"{'case':28} {'files':>8} {'cache':>6} {'mount':>6} {'ls -l':>6} {'read':>6} {'peak':>6} {'held':>6}"
          f" {'peak-held':>9} {'peak-cache':>10}")  # fmt: skip
    worst = -(1 << 30)
    for name in args.cases:
        for size in args.cache_sizes:
            count, idle, listed, read, held = run(sources[name], CASES[name][0], size)
            over = read["VmHWM"] - mib(size)
            worst = max(worst, over)
            cells = f"{idle['VmRSS']:6} {listed['VmRSS']:6} {read['VmRSS']:6} {read['VmHWM']:6} {held:6}"
            print(f"{name:28} {count:8} {size:>6} {cells} {read['VmHWM'] - held:9} {over:+10}", flush=True)
    print(f"# MiB (RSS after each step; peak: VmHWM; held: the cache's count at the end)."
          f" Worst peak beyond --cache-size: {worst:+} MiB"
          f" ({'within' if worst <= MARGIN_MIB else 'OVER'} the {MARGIN_MIB} MiB the README promises)")  # fmt: skip


if __name__ == "__main__":
    main()
