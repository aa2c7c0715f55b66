#!/usr/bin/env python3
"""shardfs against the limits of FUSE, against plain files and against another code tree, as ratios from one run.

Two datasets, a sharded precomputed volume written by tensorstore and a sharded zarr v3 array written
by zarr-python 3, the latter also as `--view n5` (zero-copy); four ways to serve the same chunk files,
each read the same ways, in an order that alternates between repeats:
- a C no-op: `noop_ll.c` beside this script, built here against libfuse3's low-level API, serving the
  same names and sizes as zeros with shardfs's mount options and FUSE `no_open`: the limit of FUSE;
- a Python no-op: shardfs's own bridge, options and FUSE session over an in-memory tree of the same
  names and sizes (also `no_open`): what shardfs would be if finding a chunk cost nothing;
- shardfs, mounted on the sharded dataset;
- the same chunks as plain files on disk (copied out of the mount with cp -r).
With --old TREE (a checkout of another revision, e.g. `git worktree add /work/wt/old 6293c7a`, the last
with libfuse's loop through mfusepy) its shardfs daemon and its Python no-op (its own scripts/bench.py
--serve-noop) are served beside them in the same run, with TREE and --old-path (what else it imports,
e.g. a `pip install --target` of mfusepy) on PYTHONPATH: an A/B of the two code trees.
Every FUSE server runs in a session of its own, as the detached daemon does, and must log that the
kernel sends no OPEN.

Readers are processes doing open+read+close of random chunks, 1 and 4 at once, in two ways: os.open and
os.read, and Python's open().read(), which also sends an IOCTL per file (its isatty check) that the
kernel never caches, so a warm open() still reaches the server. Cold is a fresh mount for every pass
(empty kernel and shardfs caches; the shard files themselves are in the page cache, as are the plain
files). Warm is a second pass over the same files on the same mount. Each figure is the median of
--repeats runs, and each ratio a ratio of those medians; the serving process's CPU time (user + system,
all threads, in 10 ms ticks: scripts/cold_cpu.py counts nanoseconds) is reported per file read. Peak
RSS is the daemon's VmHWM after reading every chunk.

Idle-priority busy loops, one per CPU, run throughout (unless --no-spinners): on a virtual machine an
idle vCPU halts and waking it costs more than a FUSE round trip, so without them the figures measure
the hypervisor's wake-ups. They take only CPU time nobody else wants (SCHED_IDLE, in a session whose
autogroup is at nice 19).

A last case transcodes: a little-endian uint16 zarr array as N5 blocks (decoded, byte-swapped, raw),
in MB/s against decoding the same stored chunks in-process, in one thread, with the same library; through
the mount with one reader and with four (the session's threads then decode in parallel: zstd drops the GIL).

    .venv/bin/python scripts/bench.py [--chunks 20000] [--sample 4000] [--repeats 5] [--cases CASE ...]
        [--old TREE --old-path PATH] [--no-spinners]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

SHARDFS = [sys.executable, "-m", "shardfs"]
ROOT = Path(__file__).resolve().parents[1]
NOOP_C = Path(__file__).with_name("noop_ll.c")
KINDS = ("c-noop", "noop", "shardfs", "plain")  # the table's columns; the order alternates between repeats
OLD_KINDS = ("noop old", "shardfs old")  # the same two from the other code tree (--old), in the same run
# What each server logs once the kernel's INIT is answered, and under FUSE no_open: shardfs (so its Python
# no-op) in its mount line, noop_ll.c and the mfusepy-era daemon in a line of their own.
READY = ("event=mounted", "kernel sends OPEN")
NO_OPEN = (", no_open,", "kernel sends OPEN: no")
READER = """
import os, sys, time
paths = open(sys.argv[1]).read().split("\\n")
sys.stdin.readline()  # wait for go, so interpreter start-up is not timed
start = time.time()
for p in paths:
{read}
print(start, time.time(), flush=True)
"""
# How a reader opens and reads a file (the tables' rows). Python's open() sends, besides the OPEN, the
# IOCTL of its isatty() check (answered ENOTTY), which the kernel never caches, and an fstat for its buffer.
READS = {
    "os.open": "    fd = os.open(p, os.O_RDONLY)\n    while os.read(fd, 1 << 20):\n        pass\n    os.close(fd)",
    "open()": '    with open(p, "rb") as f:\n        f.read()',
}


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
    """Serve the names and sizes in listing (one 'relpath size' per line) with the real bridge, logging
    to stderr as the daemon logs to its file (the bench checks its no_open line)."""
    from shardfs.cache import ByteCache
    from shardfs.files import BytesFile, Dir
    from shardfs.logs import log_to
    from shardfs.request import Request
    from shardfs.service.daemon import Mount, fuse_options, serve, settings
    from shardfs.stores.protocol import Owner
    from shardfs.tree import Located

    owner = Owner(os.getuid(), os.getgid(), 0o555)
    zeros = bytes(1 << 20)
    files, dirs = {}, {"": set()}
    for line in listing.read_text().splitlines():
        path, size = line.rsplit(" ", 1)
        files[path] = BytesFile(zeros[: int(size)], owner)
        parent = ""
        for part in path.split("/")[:-1]:
            dirs.setdefault(parent, set()).add(part)
            parent = f"{parent}/{part}".lstrip("/")
        dirs.setdefault(parent, set()).add(path.rsplit("/", 1)[-1])
    directory = Dir(owner)
    paths = sorted(files)
    numbers = {path: i for i, path in enumerate(paths)}

    class NoopTree:
        cache = ByteCache(0)  # reported by the metrics like shardfs', never used

        def drop_caches(self) -> None:
            """Nothing is cached (SIGHUP)."""

        def listdir(self, path: str) -> Iterator[tuple[str, bool]]:
            return ((name, f"{path}/{name}".lstrip("/") in dirs) for name in sorted(dirs[path]))

        # Files are numbered as shardfs numbers chunks (their node ids are their numbers, and a read goes
        # from the number to the file), so that the bridge keeps no table of them here either.
        numbers = 1

        def numbering(self, numbered: list[str], journal: object) -> None:
            """One directory, numbered 0 on every mount: nothing to restore."""

        # df: nothing stored; one read at a time, as from a disk (no read-ahead)
        store = type("NoStore", (), {"sizes": staticmethod(lambda: iter(())), "reads_at_once": 1})()

        def locate(self, path: str) -> Located:
            return Located(path, None)

        def child(self, parent: Located, name: str) -> Located | tuple[int, int]:
            path = f"{parent.path}/{name}" if parent.path else name
            number = numbers.get(path)
            return Located(path, None) if number is None else (0, number)

        def path_of(self, directory: int, number: int) -> str | None:
            return paths[number] if directory == 0 and number < len(paths) else None

        def node(self, place: Located | tuple[int, int], request: Request) -> object:
            """request is not asked: nothing here decodes or waits."""
            if isinstance(place, Located):
                if place.path in dirs:
                    return directory
                raise FileNotFoundError(place.path)
            path = self.path_of(*place)
            if path is None:
                raise FileNotFoundError(place)
            return files[path]

    log_to(None)
    logging.getLogger().setLevel(logging.INFO)
    tree = NoopTree()
    serve(Mount(tree, mountpoint, settings(fuse_options("noop", {}), mountpoint), mtime_ns=0))  # type: ignore[arg-type]


def build_c_noop(work: Path) -> Path:
    """noop_ll.c compiled against the installed libfuse3, the library shardfs runs on."""
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "fuse3"], check=True, capture_output=True, text=True)
    program = work / "noop_ll"
    subprocess.run(["gcc", "-O2", "-Wall", "-o", str(program), str(NOOP_C), *flags.stdout.split()], check=True)
    return program


def c_noop_options() -> str:
    """shardfs's mount options, less those of libfuse's high-level API, which noop_ll.c does itself
    (day-long timeouts; no_open keeps pages across opens as kernel_cache does)."""
    from shardfs.service.daemon import fuse_options

    high_level = ("kernel_cache", "attr_timeout", "entry_timeout", "negative_timeout")
    options = fuse_options("noop", {}).items()
    return ",".join(k if v is True else f"{k}={v}" for k, v in options if k not in high_level)


@contextlib.contextmanager
def spinners(enabled: bool = True) -> Iterator[None]:
    """One busy loop per CPU at idle priority, in a session of its own whose autogroup is at nice 19:
    they keep the vCPUs from halting (a wake-up costs more than a FUSE round trip) and yield to any
    other work. Killed, as a process group, when the block ends."""
    if not enabled:
        yield
        return
    loops = len(os.sched_getaffinity(0))
    spin = 'chrt -i 0 sh -c "while :; do :; done" &'
    script = f"echo 19 > /proc/self/autogroup; for _ in $(seq {loops}); do {spin} done; wait"
    proc = subprocess.Popen(["sh", "-c", script], start_new_session=True)
    try:
        yield
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@dataclasses.dataclass(frozen=True)
class Code:
    """A code tree shardfs runs from, and what else it imports (mfusepy, for a tree from before shardfs's
    own session). Its daemon and its Python no-op (its own scripts/bench.py's) run from the tree with it
    first on PYTHONPATH, so that `-m shardfs` finds it before any installed shardfs."""

    tree: Path
    extra: tuple[str, ...] = ()

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "SHARDFS_FUSE"}  # the old tree's opt-in session: off
        env["PYTHONPATH"] = os.pathsep.join([str(self.tree), *self.extra])
        return env


THIS = Code(ROOT)


class Mounted:
    """A mount of one of the kinds (plain files need none) and the pid of the process serving it. The C
    no-op needs its program (`build_c_noop`); the kinds named '... old' run from the code tree given."""

    def __init__(
        self, kind: str, source: Path, listing: Path, where: Path, view: str = "native",
        program: Path | None = None, code: Code = THIS,
    ) -> None:  # fmt: skip
        self.kind, self.path, self.proc, self.pid = kind, where, None, None
        if kind == "plain":
            self.path = source
            return
        where.mkdir(parents=True, exist_ok=True)
        log = where.with_name(f"{where.name}.log")
        log.unlink(missing_ok=True)
        if kind.startswith("shardfs"):
            mount = [*SHARDFS, "mount", str(source), str(where), "--view", view, "--log-file", str(log)]
            subprocess.run([*mount, "--log-level", "info"], check=True, env=code.env(), cwd=code.tree)
            found = subprocess.run(["pgrep", "-f", f"shardfs mount .* {where} --view"], capture_output=True, text=True)
            self.pid = int(found.stdout.split()[0])
        else:
            # A session of its own, as the detached shardfs daemon has: with the kernel's autogroup
            # scheduling, a server sharing the readers' session gets their CPU share (warm reads 1.4x faster).
            if kind == "c-noop":
                assert program is not None, "the C no-op needs its program"
                command = [str(program), str(listing), str(where), "-f", "-o", c_noop_options()]
            else:
                command = [sys.executable, str(code.tree / "scripts" / "bench.py"), "--serve-noop", str(listing)]
                command.append(str(where))
            with log.open("w") as stderr:
                self.proc = subprocess.Popen(
                    command, start_new_session=True, stderr=stderr, env=code.env(), cwd=code.tree
                )
            self.pid = self.proc.pid
        # Logged once the kernel's INIT is answered, so the mount is live by then.
        deadline = time.monotonic() + 30
        while not any(said in log.read_text() for said in READY):
            alive = self.proc is None or self.proc.poll() is None
            assert alive and time.monotonic() < deadline, f"{kind} mount failed; see {log}"
            time.sleep(0.02)
        text = log.read_text()
        assert any(said in text for said in NO_OPEN), f"{kind}: the kernel still sends OPEN; figures would not compare"

    def cpu_seconds(self) -> float:
        """User and system CPU time of the serving process, all its threads (those exited too)."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def daemon_peak_rss(self) -> int:
        return peak_rss(self.pid)

    def close(self) -> None:
        if self.kind != "plain":
            subprocess.run(["fusermount3", "-u", str(self.path)], check=True)
        if self.proc:
            self.proc.wait(timeout=30)
        elif self.pid:
            exited(self.pid)


def exited(pid: int, timeout: float = 30) -> None:
    """Returns once a process (not our child: a detached daemon) has exited. An unmounted daemon still
    answers on its stats socket for a moment, and a mount at the same place meanwhile is refused."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return
        if state == "Z":  # exited; its parent has yet to reap it
            return
        assert time.monotonic() < deadline, f"process {pid} still runs {timeout:.0f}s after its unmount"
        time.sleep(0.01)


def peak_rss(pid: int) -> int:
    """A process's peak resident memory (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


def read_files(root: Path, names: list[str], readers: int, scratch: Path, how: str = "os.open") -> float:
    """Files per second for `readers` processes sharing the names, timed from first start to last end;
    how: a key of READS."""
    parts = [names[i::readers] for i in range(readers)]
    lists = []
    for i, part in enumerate(parts):
        lists.append(scratch / f"list{i}")
        lists[-1].write_text("\n".join(str(root / n) for n in part))
    program = READER.format(read=READS[how])
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", program, str(f)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
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
    ap.add_argument("--chunks", type=int, default=20000, help="chunks in the precomputed volume")
    ap.add_argument("--sample", type=int, default=4000, help="random chunks read per pass")
    ap.add_argument("--repeats", type=int, default=5, help="passes of each kind; figures are medians")
    ap.add_argument("--no-spinners", action="store_true", help="let idle vCPUs halt (to see what they cost)")
    ap.add_argument("--cases", nargs="+", choices=CASES, default=CASES, help="which cases to run (default: all)")
    ap.add_argument("--old", type=Path, help="another code tree (a checkout) whose daemon and no-op run beside")
    ap.add_argument("--old-path", default="", help="what else the other tree imports, as PYTHONPATH (mfusepy)")
    ap.add_argument("--serve-noop", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.old = Code(args.old.resolve(), tuple(filter(None, args.old_path.split(os.pathsep)))) if args.old else None
    if args.serve_noop:
        serve_noop(*args.serve_noop)
        return

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the spinners and mounts are cleaned up
    work = Path(tempfile.mkdtemp(prefix="shardfs-bench-"))
    try:
        with spinners(not args.no_spinners):
            run(work, args)
    finally:
        for m in work.glob("*/mnt-*"):  # each case's mounts are in a directory of its own
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


CASES = ("precomputed", "zarr", "zarr as N5, zero-copy", "zarr as N5, transcoded")


def run(work: Path, args: argparse.Namespace) -> None:
    summary: dict[str, object] = {"spinners": not args.no_spinners}
    if args.old:
        summary["old"] = f"{args.old.tree} (+ {os.pathsep.join(args.old.extra) or 'nothing'})"
    program = build_c_noop(work)
    cases = (
        ("precomputed", lambda root: write_dataset(root, args.chunks), "native"),
        ("zarr", write_zarr, "native"),
        ("zarr as N5, zero-copy", write_zarr, "n5"),  # uint8 under zstd: the N5 header, then the stored bytes
    )
    for label, write, view in cases:
        if label not in args.cases:
            continue
        source = work / label.replace(" ", "_")
        t = time.monotonic()
        write(source)
        os.sync()
        print(f"\n== {label}: wrote {source} in {time.monotonic() - t:.1f}s")
        summary[label] = measure(work / f"{source.name}-run", source, args, program, view)
    if "zarr as N5, transcoded" in args.cases:
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


def measure(work: Path, source: Path, args: argparse.Namespace, program: Path, view: str = "native") -> dict:
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
    kinds = (*KINDS, *OLD_KINDS) if args.old else KINDS
    rates: dict[Row, list[float]] = {}
    cpu: dict[Row, list[float]] = {}  # µs of the server's CPU per file
    for rep in range(args.repeats):
        for readers in (1, 4):
            for how in READS:
                for kind in kinds if rep % 2 == 0 else kinds[::-1]:  # alternate, so order biases cancel
                    source_of = plain if kind == "plain" else source
                    code = args.old if kind in OLD_KINDS else THIS
                    where = work / f"mnt-{kind.replace(' ', '-')}"
                    m = Mounted(kind, source_of, listing, where, view, program, code)
                    try:
                        for phase in ("cold", "warm"):  # a fresh mount for every cold pass
                            before = m.cpu_seconds() if m.pid else 0.0
                            rate = read_files(m.path, sample, readers, work, how)
                            rates.setdefault((kind, readers, how, phase), []).append(rate)
                            if m.pid:
                                used = (m.cpu_seconds() - before) / len(sample) * 1e6
                                cpu.setdefault((kind, readers, how, phase), []).append(used)
                    finally:
                        m.close()
        print(f"repeat {rep + 1}/{args.repeats} done", flush=True)
    return report(len(sample), args.repeats, kinds, rates, cpu, peak)


Row = tuple[str, int, str, str]  # kind, readers, how they open (a key of READS), cold or warm
RATIOS = {  # the tables' ratios: shardfs to each anchor, and this tree to the other (--old)
    "sfs/C": ("shardfs", "c-noop"),
    "sfs/py": ("shardfs", "noop"),
    "sfs/plain": ("shardfs", "plain"),
    "new/old": ("shardfs", "shardfs old"),
    "old/C": ("shardfs old", "c-noop"),
    "py new/old": ("noop", "noop old"),
}
NAMES = {"c-noop": "C no-op", "noop": "py no-op", "noop old": "py old", "shardfs old": "sfs old", "plain": "plain"}


def report(
    files: int, repeats: int, kinds: tuple[str, ...], rates: dict[Row, list[float]], cpu: dict[Row, list[float]],
    peak: int,
) -> dict:  # fmt: skip
    """The table of medians (files/s and the ratios of RATIOS between them), then the servers' CPU µs per
    file, and the same as a dict for the JSON summary."""
    med = {k: statistics.median(v) for k, v in rates.items()}
    cpu_med = {k: statistics.median(v) for k, v in cpu.items()}
    served = [k for k in kinds if k != "plain"]
    ratios = {name: pair for name, pair in RATIOS.items() if set(pair) <= set(kinds)}
    rows = [(readers, how, phase) for readers in (1, 4) for how in READS for phase in ("cold", "warm")]
    print(f"\nrandom open+read+close of {files} chunks, files/s (median of {repeats}) and ratios of the medians")
    print(f"{'readers':>7} {'opens':>7} {'pass':>5} " + " ".join(f"{NAMES.get(k, k):>8}" for k in kinds), end=" ")
    print(" ".join(f"{name:>10}" for name in ratios))
    summary: dict[str, dict] = {"files_per_s": {}, "ratios": {}, "cpu_us_per_file": {}}
    for readers, how, phase in rows:
        key = f"{readers}r_{how}_{phase}"
        figures = {k: med[(k, readers, how, phase)] for k in kinds}
        shares = {name: figures[a] / figures[b] for name, (a, b) in ratios.items()}
        print(f"{readers:>7} {how:>7} {phase:>5} " + " ".join(f"{figures[k]:>8.0f}" for k in kinds), end=" ")
        print(" ".join(f"{r:>9.2f}x" for r in shares.values()))
        summary["files_per_s"][key] = {k: round(v) for k, v in figures.items()}
        summary["ratios"][key] = {k: round(r, 2) for k, r in shares.items()}
        summary["cpu_us_per_file"][key] = {k: round(cpu_med[(k, readers, how, phase)]) for k in served}
    print("\nserving process's CPU µs per file (median; 10 ms ticks)")
    print(f"{'readers':>7} {'opens':>7} {'pass':>5} " + " ".join(f"{NAMES.get(k, k):>8}" for k in served))
    for readers, how, phase in rows:
        used = summary["cpu_us_per_file"][f"{readers}r_{how}_{phase}"]
        print(f"{readers:>7} {how:>7} {phase:>5} " + " ".join(f"{used[k]:>8}" for k in served))
    return {**summary, "peak_rss_mib": round(peak / 2**20)}


if __name__ == "__main__":
    main()
