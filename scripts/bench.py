#!/usr/bin/env python3
"""shardfs against the ceiling of its stack and against plain files, as ratios from one run.

Two datasets, a sharded precomputed volume written by tensorstore and a sharded zarr v3 array written
by zarr-python 3, the latter also as `--view n5` (zero-copy); three ways to serve the same chunk files,
each read the same way (random open+read+close):
- shardfs, mounted on the sharded dataset;
- a no-op FUSE filesystem: the same adapter, options and libfuse loop over an in-memory tree of the
  same names and sizes, serving zeros, in a session of its own as the daemon is. It is what shardfs
  would be if finding a chunk cost nothing;
- the same chunks as plain files on disk (copied out of the mount with cp -r).

Cold is a fresh mount (empty kernel and shardfs caches; the shard files themselves are in the page
cache, as they are for the plain files). Warm is a second pass over the same files on the same mount.
Each figure is the median of --repeats runs. Peak RSS is the daemon's VmHWM after reading every chunk.

A last case transcodes: a little-endian uint16 zarr array as N5 blocks (decoded, byte-swapped, raw),
in MB/s against decoding the same stored chunks in-process, in one thread, with the same library; through
the mount with one reader and with four (libfuse's threads then decode in parallel: zstd drops the GIL).

    .venv/bin/python scripts/bench.py [--chunks 102400] [--sample 10000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

SHARDFS = [sys.executable, "-m", "shardfs"]
READER = """
import os, sys, time
paths = open(sys.argv[1]).read().split("\\n")
sys.stdin.readline()  # wait for go, so interpreter start-up is not timed
start = time.time()
for p in paths:
    fd = os.open(p, os.O_RDONLY)
    while os.read(fd, 1 << 20):
        pass
    os.close(fd)
print(start, time.time(), flush=True)
"""


def write_dataset(root: Path, chunks: int) -> None:
    """A uint8 volume of 8^3 chunks (512 bytes each), gzip in the shards, sharded with the parameters
    cloud-volume's own chooser (the one igneous uses) picks for 4 MiB shards."""
    import numpy as np
    import tensorstore as ts
    from cloudvolume.datasource.precomputed.sharding import compute_shard_params_for_image

    side = round((chunks / 25) ** 0.5)
    size, chunk = [8 * side, 8 * side, 8 * 25], [8, 8, 8]
    spec = compute_shard_params_for_image(size, chunk, "raw", "uint8", uncompressed_shard_bytesize=4 << 20)
    sharding = {k: v if isinstance(v, str) else int(v) for k, v in spec.to_dict().items()}
    store = ts.open(
        {
            "driver": "neuroglancer_precomputed",
            "kvstore": f"file://{root}",
            "multiscale_metadata": {"type": "image", "data_type": "uint8", "num_channels": 1},
            "scale_metadata": {
                "size": size,
                "chunk_size": chunk,
                "resolution": [4, 4, 40],
                "encoding": "raw",
                "sharding": sharding,
            },
            "create": True,
        }
    ).result()
    rng = np.random.default_rng(0)
    for z in range(0, store.shape[2], 40):
        slab = store[:, :, z : z + 40]
        slab[...] = rng.integers(0, 32, slab.shape, dtype=np.uint8)  # compressible, like real data
    print(f"sharding: {json.dumps(sharding)}")


def serve_noop(listing: Path, mountpoint: Path) -> None:
    """Serve the names and sizes in listing (one 'relpath size' per line) with the real adapter."""
    from shardfs.cache import ByteCache
    from shardfs.daemon import fuse_options, serve
    from shardfs.tree import DIR, BytesFile, Owner

    zeros = bytes(1 << 20)
    files, dirs = {}, {"": set()}
    for line in listing.read_text().splitlines():
        path, size = line.rsplit(" ", 1)
        files[path] = BytesFile(zeros[: int(size)])
        parent = ""
        for part in path.split("/")[:-1]:
            dirs.setdefault(parent, set()).add(part)
            parent = f"{parent}/{part}".lstrip("/")
        dirs.setdefault(parent, set()).add(path.rsplit("/", 1)[-1])

    class NoopTree:
        owner = Owner(os.getuid(), os.getgid(), 0o555)
        cache = ByteCache(0)  # reported by the metrics like shardfs', never used

        def drop_caches(self) -> None:
            """Nothing is cached (SIGHUP)."""

        def lookup(self, path: str) -> object:
            if path in dirs:
                return DIR
            try:
                return files[path]
            except KeyError:
                raise FileNotFoundError(path) from None

        def listdir(self, path: str) -> Iterator[tuple[str, bool]]:
            return ((name, f"{path}/{name}".lstrip("/") in dirs) for name in sorted(dirs[path]))

    serve(NoopTree(), 0, mountpoint, fuse_options("noop", {}))  # type: ignore[arg-type]


class Mounted:
    """A mount of one of the three kinds; plain files need no mount."""

    def __init__(self, kind: str, source: Path, listing: Path, where: Path, view: str = "native") -> None:
        self.kind, self.path, self.proc = kind, where, None
        if kind == "plain":
            self.path = source
            return
        where.mkdir(parents=True, exist_ok=True)
        if kind == "shardfs":
            subprocess.run([*SHARDFS, "mount", str(source), str(where), "--view", view], check=True)
        else:
            # A session of its own, as the detached shardfs daemon has: with the kernel's autogroup
            # scheduling, a server sharing the readers' session gets their CPU share (warm reads 1.4x faster).
            command = [sys.executable, __file__, "--serve-noop", str(listing), str(where)]
            self.proc = subprocess.Popen(command, start_new_session=True)
            deadline = time.monotonic() + 30
            while not os.path.ismount(where):
                assert time.monotonic() < deadline and self.proc.poll() is None, "no-op mount failed"
                time.sleep(0.02)

    def daemon_peak_rss(self) -> int:
        out = subprocess.run(["pgrep", "-f", f"shardfs mount .* {self.path} --view"], capture_output=True, text=True)
        pid = out.stdout.split()[0]
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmHWM")

    def close(self) -> None:
        if self.kind != "plain":
            subprocess.run(["fusermount3", "-u", str(self.path)], check=True)
        if self.proc:
            self.proc.wait(timeout=30)


def read_files(root: Path, names: list[str], readers: int, scratch: Path) -> float:
    """Files per second for `readers` processes sharing the names, timed from first start to last end."""
    parts = [names[i::readers] for i in range(readers)]
    lists = []
    for i, part in enumerate(parts):
        lists.append(scratch / f"list{i}")
        lists[-1].write_text("\n".join(str(root / n) for n in part))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", READER, str(f)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        for f in lists
    ]
    time.sleep(0.3)
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    spans = [tuple(map(float, p.communicate()[0].split())) for p in procs]
    return len(names) / (max(e for _, e in spans) - min(s for s, _ in spans))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chunks", type=int, default=102400, help="chunks in the volume (>= 100k for the RSS figure)")
    ap.add_argument("--sample", type=int, default=10000, help="random chunks read per pass")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--serve-noop", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_noop:
        serve_noop(*args.serve_noop)
        return

    work = Path(tempfile.mkdtemp(prefix="shardfs-bench-"))
    try:
        run(work, args)
    finally:
        for m in work.glob("mnt-*"):
            subprocess.run(["fusermount3", "-uz", str(m)], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


def write_zarr(root: Path) -> None:
    """A zarr v3 array written by zarr-python 3: 16,000 inner chunks of 8x8x10 uint8 (zstd, its default),
    in shards of 64x64x50 with the crc32c index, under the default c/i/j/k keys."""
    import numpy as np
    import zarr

    array = zarr.create_array(root, shape=(320, 320, 100), chunks=(8, 8, 10), shards=(64, 64, 50), dtype="uint8")
    array[...] = np.random.default_rng(0).integers(0, 32, array.shape, dtype=np.uint8)


def write_zarr_uint16(root: Path) -> None:
    """A little-endian uint16 zarr v3 array (zstd, zarr-python's default) in 64^3 chunks: N5 is big-endian,
    so `--view n5` decodes, byte-swaps and serves each block raw."""
    import numpy as np
    import zarr

    array = zarr.create_array(root, shape=(256, 512, 512), chunks=(64, 64, 64), shards=(128, 256, 256), dtype="<u2")
    array[...] = np.random.default_rng(0).integers(0, 4096, array.shape, dtype=np.uint16)


def run(work: Path, args: argparse.Namespace) -> None:
    summary = {}
    cases = (
        ("precomputed", lambda root: write_dataset(root, args.chunks), "native"),
        ("zarr", write_zarr, "native"),
        ("zarr as N5, zero-copy", write_zarr, "n5"),  # uint8 under zstd: the N5 header, then the stored bytes
    )
    for label, write, view in cases:
        source = work / label.replace(" ", "_")
        t = time.monotonic()
        write(source)
        os.sync()
        print(f"\n== {label}: wrote {source} in {time.monotonic() - t:.1f}s")
        summary[label] = measure(work / f"{source.name}-run", source, args, view)
    print("\n== transcoding: little-endian uint16 zarr (zstd) as N5 (big-endian, raw)")
    summary["zarr as N5, transcoded"] = transcoding(work / "transcode", args)
    print(json.dumps(summary))


def transcoding(work: Path, args: argparse.Namespace) -> dict:
    """MB/s of N5 blocks read through a cold mount, against decoding the same stored chunks in this
    process with the same library (numcodecs' zstd, numpy's byte swap) from plain files."""
    import numcodecs
    import numpy as np

    work.mkdir()
    source, native, plain = work / "source", work / "mnt-native", work / "plain"
    write_zarr_uint16(source)
    m = Mounted("shardfs", source, work / "unused", native)
    subprocess.run(["cp", "-r", str(m.path), str(plain)], check=True)  # the stored inner chunks, as files
    m.close()
    stored = sorted(p for p in plain.rglob("*") if p.is_file() and p.name != "zarr.json")
    blocks = ["/".join(reversed(p.relative_to(plain / "c").parts)) for p in stored]  # c/i/j/k is N5's k/j/i
    zstd = numcodecs.Zstd()
    rates: dict[str, list[float]] = {"in-process": [], "shardfs": [], "noop": [], "shardfs, 4 readers": []}
    listing = work / "listing"  # the no-op filesystem serves the same names and sizes: the stack's ceiling
    m = Mounted("shardfs", source, listing, work / "mnt-n5", view="n5")
    listing.write_text("\n".join(f"{b} {(m.path / b).stat().st_size}" for b in blocks))
    m.close()
    for _ in range(args.repeats):
        t, out = time.perf_counter(), 0
        for p in stored:
            out += len(np.frombuffer(zstd.decode(p.read_bytes()), "<u2").astype(">u2").tobytes())
        rates["in-process"].append(out / (time.perf_counter() - t) / 1e6)
        for kind, readers in (("shardfs", 1), ("noop", 1), ("shardfs", 4)):
            m = Mounted(kind, source, listing, work / f"mnt-{kind}", view="n5")
            try:
                rate = out * read_files(m.path, blocks, readers, work) / len(blocks) / 1e6
                rates[kind if readers == 1 else f"{kind}, {readers} readers"].append(rate)
            finally:
                m.close()
    med = {k: statistics.median(v) for k, v in rates.items()}
    ratio = med["shardfs"] / med["in-process"]
    size = stored[0].stat().st_size
    print(f"{len(blocks)} blocks of 64^3 uint16 (stored ~{size / 1e3:.0f} kB each), MB/s, median of {args.repeats}:")
    inproc, four = med["in-process"], med["shardfs, 4 readers"] / med["in-process"]
    print(
        f"in-process decode (one thread) {inproc:.0f}; shardfs --view n5, cold {med['shardfs']:.0f}"
        f" (4 readers: {med['shardfs, 4 readers']:.0f}); no-op FUSE serving the same sizes {med['noop']:.0f}"
    )
    noop = med["noop"] / inproc
    print(f"shardfs vs in-process: {ratio:.2f}x (4 readers: {four:.2f}x); no-op FUSE vs in-process: {noop:.2f}x")
    ratios = {"1_reader": round(ratio, 2), "4_readers": round(four, 2)}
    return {"mb_per_s": {k: round(v) for k, v in med.items()}, "shardfs_vs_in_process": ratios}


def measure(work: Path, source: Path, args: argparse.Namespace, view: str = "native") -> dict:
    work.mkdir()
    plain = work / "plain"

    # Full scan through a fresh mount: every chunk listed, stat'ed and read; then the daemon's peak RSS.
    m = Mounted("shardfs", source, work / "unused", work / "mnt-scan", view)
    t = time.monotonic()
    subprocess.run(["cp", "-r", str(m.path), str(plain)], check=True)
    scan = time.monotonic() - t
    peak = m.daemon_peak_rss()
    m.close()
    os.sync()  # the copy's writeback would otherwise compete with the first passes for the CPU
    sizes = {str(p.relative_to(plain)): p.stat().st_size for p in plain.rglob("*") if p.is_file()}
    chunks = sorted(n for n in sizes if not n.endswith(("info", "zarr.json", "attributes.json")))
    listing = work / "listing"
    listing.write_text("\n".join(f"{n} {s}" for n, s in sizes.items()))
    print(f"full scan (cp -r) of {len(chunks)} chunks: {scan:.1f}s, {len(chunks) / scan:.0f} files/s")
    print(f"daemon peak RSS over the full scan, default cache budget: {peak / 2**20:.0f} MiB")

    sample = random.Random(0).sample(chunks, min(args.sample, len(chunks)))
    results: dict[tuple[str, int, str], list[float]] = {}
    for rep in range(args.repeats):
        for readers in (1, 4):
            kinds = ("noop", "shardfs", "plain")
            for kind in kinds if rep % 2 == 0 else kinds[::-1]:  # alternate, so order biases cancel
                m = Mounted(kind, plain if kind == "plain" else source, listing, work / f"mnt-{kind}", view)
                try:
                    for phase in ("cold", "warm"):
                        rate = read_files(m.path, sample, readers, work)
                        results.setdefault((kind, readers, phase), []).append(rate)
                finally:
                    m.close()
        print(f"repeat {rep + 1}/{args.repeats} done", flush=True)

    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"\nrandom open+read+close of {len(sample)} chunks, files/s (median of {args.repeats})")
    print(f"{'readers':>7} {'pass':>5} {'no-op FUSE':>11} {'shardfs':>9} {'plain':>9} {'vs no-op':>9} {'vs plain':>9}")
    ratios = {}
    for readers in (1, 4):
        for phase in ("cold", "warm"):
            noop, ours, disk = (med[(k, readers, phase)] for k in ("noop", "shardfs", "plain"))
            ratios[f"{readers}r_{phase}"] = round(ours / noop, 2)
            rates = f"{noop:>11.0f} {ours:>9.0f} {disk:>9.0f}"
            print(f"{readers:>7} {phase:>5} {rates} {ours / noop:>8.2f}x {ours / disk:>8.2f}x")
    return {"shardfs_vs_noop": ratios, "peak_rss_mib": round(peak / 2**20)}


if __name__ == "__main__":
    main()
