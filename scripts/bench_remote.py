#!/usr/bin/env python3
"""shardfs on a remote source (issues 12 and 21): a loopback HTTP server with injected latency per request.

Three datasets written by real writers, served by tests/support/http_server.py's RangeServer in a process of its
own, which counts every request, so that requests are counted where they arrive.

Cold (issue 21), on a precomputed volume sharded as production volumes are: hashed keys
(murmurhash3_x86_128), preshift_bits 0, minishard_bits 6, shard_bits 6 (4,096 minishards), --cold-chunks
chunks of 16^3 uint8, gzip, written by tensorstore, and the same chunks in shards made by cloud-volume's
synthesize_shard_files as igneous writes production volumes (minishard indexes side by side, where
tensorstore puts each beside its chunks). For each layout, each of --cold-repeats rounds, the two in turns:
- a fresh mount, 16 readers (processes doing Python's `open().read()`) of --cold-sample chunks never read,
  files/s and requests per chunk counted at the server; against tensorstore in-process with a fresh
  context, 16 reads in flight, the same chunks from the same server (target: shardfs >= 1.5x tensorstore);
- a fresh mount, one process reading --copy-files files of the scale one after another in listing order (as
  `cp -r`, rsync or a loop over os.listdir), the directory listed first; against tensorstore given the same
  chunks in one batch from a fresh context (target: shardfs >= 1.0x);
- a fresh mount, a viewer's pattern: 2-D windows of 8x8 chunks of one plane panned by 2 chunks, each
  window's files read by 16 threads; against tensorstore's precomputed driver reading each window as one box
  from a fresh context (target: shardfs >= 3x); and the 16 readers' bytes fetched a byte served (<= 8);
- a fresh mount, the scale directory listed (os.listdir, every name), in seconds (target: <= 10 s at
  20 ms), then every name stat'ed by one thread.

Warm (issue 12), on bench.py's two datasets: a sharded precomputed volume (tensorstore, cloud-volume's
sharding chooser, gzip in the shards) and a sharded zarr v3 array (zarr-python 3). For each, on one mount
by URL:
- warm: a disjoint set of chunks is read first, so that every shard and minishard index is cached;
- 16 readers, then 1 reader (processes doing open+read+close, as scripts/bench.py's): random chunks
  never read before, files/s and GETs per chunk counted at the server (targets: 1.00 GET a chunk, 16
  readers >= 8x one);
- tensorstore in-process, 16 reads in flight, the same chunks as chunk-aligned regions after warming
  its own index cache the same way; cloud-volume (precomputed only) with 16 threads over one CloudVolume;
- cold first chunk: a fresh mount (or a fresh CloudVolume / tensorstore open) and one chunk, in round
  trips of the injected latency and in requests counted at the server;
- the daemon's peak RSS (VmHWM) after 16 readers read every chunk through a fresh mount.

The server's own capacity (requests/s with no latency and with the latency, under the concurrency the
figures use) is measured first and printed beside the highest request rate any figure needed. As in
scripts/bench.py, idle-priority busy loops keep the cores awake throughout (unless --no-spinners). The
figures are medians; the ratios are of medians from this one run, printed together at the end.

    .venv/bin/python scripts/bench_remote.py [--chunks 16384] [--sample 2000] [--repeats 3] [--latency 0.02]
        [--cold-chunks 20000] [--cold-sample 2000] [--cold-repeats 3] [--copy-files 2000] [--windows 24]
        [--only cold|precomputed|zarr]
        [--no-spinners]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import exited, peak_rss, read_files, spinners, write_dataset, write_zarr  # noqa: E402  (scripts/ is on the path)

SHARDFS = [sys.executable, "-m", "shardfs"]
IN_FLIGHT = 16  # readers through the mount, reads in flight in-process
FUSECTL = Path("/sys/fs/fuse/connections")


# -- the server, in a process of its own ---------------------------------------------------------------------------


def serve(root: Path, latency: float) -> None:
    """RangeServer over root. Prints its URL, then answers each line on stdin with the requests counted so
    far (by method), the most answered at once, and its own CPU seconds, as one JSON line."""
    from tests.support.http_server import RangeServer

    server = RangeServer(root, latency, suffix_ranges=True)  # tensorstore reads zarr shard indexes so
    busy = {"now": 0, "most": 0}
    lock = threading.Lock()
    plain = server.server.RequestHandlerClass

    class Counted(plain):  # type: ignore[misc, valid-type]
        """The same handler, counting requests in progress: how many the server answers at once."""

        def _answer(self, body: bool) -> None:
            with lock:
                busy["now"] += 1
                busy["most"] = max(busy["most"], busy["now"])
            try:
                super()._answer(body)
            finally:
                with lock:
                    busy["now"] -= 1

    server.server.RequestHandlerClass = Counted
    with server.running():
        print(server.url, flush=True)
        for line in sys.stdin:
            with server.lock:
                counts: dict[str, int] = {}
                for (method, _), n in server.requests.items():
                    counts[method] = counts.get(method, 0) + n
            with lock:
                most, busy["most"] = busy["most"], busy["now"]
            cpu = sum(os.times()[:2])
            print(json.dumps({**counts, "most_at_once": most, "cpu": cpu, "said": line.strip()}), flush=True)


class Server:
    """A RangeServer process and its counts."""

    def __init__(self, root: Path, latency: float) -> None:
        command = [sys.executable, __file__, "--serve", str(root), str(latency)]
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout and self.proc.stdin
        self.url = self.proc.stdout.readline().strip()
        self.latency = latency

    def stats(self) -> dict[str, Any]:
        """Requests so far by method ('GET', 'HEAD'), the most in progress at once since the last call,
        and the server's CPU seconds."""
        assert self.proc.stdout and self.proc.stdin
        self.proc.stdin.write("stats\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    @contextmanager
    def counting(self) -> Iterator[dict[str, Any]]:
        """Requests, the most at once and server CPU seconds during the block, and the block's seconds."""
        out: dict[str, Any] = {}
        before, t = self.stats(), time.perf_counter()
        yield out
        seconds, after = time.perf_counter() - t, self.stats()
        out.update({k: after.get(k, 0) - before.get(k, 0) for k in ("GET", "HEAD", "cpu")})
        out.update(most_at_once=after["most_at_once"], seconds=seconds)

    def close(self) -> None:
        assert self.proc.stdin
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def capacity(url: str, key: str, concurrency: int, seconds: float = 3.0) -> float:
    """Requests/s the server answers to `concurrency` clients in a loop, each a 512-byte range GET through
    obstore (which drops the GIL: this process is not the limit)."""
    import obstore
    from obstore.store import HTTPStore

    store = HTTPStore(url, client_options={"allow_http": True})
    stop = time.monotonic() + seconds
    done = [0] * concurrency

    def client(i: int) -> None:
        while time.monotonic() < stop:
            obstore.get(store, key, options={"range": (i * 512, i * 512 + 512)}).bytes()
            done[i] += 1

    obstore.get(store, key, options={"range": (0, 1)}).bytes()  # connect once before timing
    t = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(client, range(concurrency)))
    return sum(done) / (time.perf_counter() - t)


# -- mounts, readers, diagnostics ----------------------------------------------------------------------------------


class Mount:
    """shardfs mounted on a URL (or a local directory), unmounted by close()."""

    def __init__(self, source: str, where: Path, *options: str) -> None:
        where.mkdir(parents=True, exist_ok=True)
        subprocess.run([*SHARDFS, "mount", *options, source, str(where)], check=True)
        self.path = where
        self.connection = FUSECTL / str(os.minor(os.stat(where).st_dev))  # fusectl names it by device

    def daemon_pid(self) -> int:
        out = subprocess.run(["pgrep", "-f", f"shardfs mount .* {self.path}$"], capture_output=True, text=True)
        return int(out.stdout.split()[0])

    def peak_rss(self) -> int:
        return peak_rss(self.daemon_pid())

    def close(self) -> None:
        pid = self.daemon_pid()
        subprocess.run(["fusermount3", "-u", str(self.path)], check=True)
        exited(pid)  # so that the next mount here is not refused while this daemon still ends


@contextmanager
def mounted(source: str, where: Path, *options: str) -> Iterator[Mount]:
    m = Mount(source, where, *options)
    try:
        yield m
    finally:
        m.close()


@contextmanager
def sampling(read: Callable[[], int], every: float = 0.002) -> Iterator[dict[str, float]]:
    """Samples read() in a thread while the block runs: its mean and maximum."""
    seen: list[int] = []
    done = threading.Event()

    def loop() -> None:
        while not done.is_set():
            seen.append(read())
            time.sleep(every)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    out: dict[str, float] = {}
    try:
        yield out
    finally:
        done.set()
        thread.join()
        out.update(mean=statistics.fmean(seen) if seen else 0.0, max=max(seen, default=0))


def fusectl_waiting(m: Mount) -> Callable[[], int]:
    """Requests the kernel has sent to this mount's daemon and not yet had answered."""
    path = m.connection / "waiting"
    return lambda: int(path.read_text()) if path.exists() else -1  # fusectl may not be mounted


def chunk_names(source: Path, scratch: Path) -> list[str]:
    """Every chunk file of the dataset, by relative path, listed through a local mount of its source."""
    names = []
    with mounted(str(source), scratch / "mnt-list") as m:
        for top, _, files in os.walk(m.path):
            for f in files:
                if f not in ("info", "zarr.json", "provenance"):
                    names.append(os.path.relpath(os.path.join(top, f), m.path))
    return sorted(names)


# -- in-process peers ----------------------------------------------------------------------------------------------


def region(kind: str, name: str) -> tuple[slice, ...]:
    """The chunk-aligned region a chunk file holds: precomputed 'x0-x1_y0-y1_z0-z1', zarr 'c/i/j/k'."""
    if kind == "precomputed":
        bounds = [tuple(map(int, b.split("-"))) for b in name.rsplit("/", 1)[-1].split("_")]
        return tuple(slice(a, b) for a, b in bounds)
    grid = [int(p) for p in name.split("/")[1:]]
    return tuple(slice(g * c, (g + 1) * c) for g, c in zip(grid, (8, 8, 10), strict=True))


def tensorstore_open(kind: str, url: str) -> Any:
    """A tensorstore over HTTP with a fresh context: an empty cache pool big enough for every index, and
    cached data trusted once opened (as shardfs trusts an immutable source), so no index is revalidated."""
    import tensorstore as ts

    driver = "neuroglancer_precomputed" if kind == "precomputed" else "zarr3"
    spec = {"driver": driver, "kvstore": f"{url}/", "recheck_cached_data": "open", "recheck_cached_metadata": "open"}
    context = ts.Context({"cache_pool": {"total_bytes_limit": 256 << 20}})
    return ts.open(spec, context=context, read=True).result()


def tensorstore_read(store: Any, kind: str, names: list[str]) -> float:
    """Chunks/s reading names as regions, IN_FLIGHT reads outstanding at any time."""
    slots = threading.Semaphore(IN_FLIGHT)
    futures = []
    t = time.perf_counter()
    for name in names:
        slots.acquire()
        future = store[region(kind, name)].read()
        future.add_done_callback(lambda _: slots.release())
        futures.append(future)
    for future in futures:
        future.result()
    return len(names) / (time.perf_counter() - t)


def cloudvolume_open(url: str) -> Any:
    from cloudvolume import CloudVolume

    return CloudVolume(f"precomputed://{url}", mip=0, progress=False, cache=False, fill_missing=False)


def cloudvolume_read(cv: Any, names: list[str]) -> float:
    """Chunks/s reading names as cutouts from IN_FLIGHT threads sharing one CloudVolume (its own parallel=
    splits one large cutout across processes, which one-chunk cutouts do not have)."""
    t = time.perf_counter()
    with ThreadPoolExecutor(IN_FLIGHT) as pool:
        list(pool.map(lambda n: cv[region("precomputed", n)], names))
    return len(names) / (time.perf_counter() - t)


# -- cold: a fresh mount of a volume sharded as production volumes are --------------------------------------------


def write_hashed(root: Path, chunks: int) -> str:
    """A precomputed volume of about `chunks` chunks of 16^3 uint8 (a grid of side x side x 32), sharded
    with hashed keys as production volumes are (4,096 minishards in 64 shards), gzip, written by
    tensorstore in one write (so that every shard is written once). Returns the scale's key."""
    import numpy as np
    import tensorstore as ts

    side = max(1, round((chunks / 32) ** 0.5))
    size = [16 * side, 16 * side, 16 * 32]
    sharding = {
        "@type": "neuroglancer_uint64_sharded_v1", "hash": "murmurhash3_x86_128", "preshift_bits": 0,
        "minishard_bits": 6, "shard_bits": 6, "minishard_index_encoding": "gzip", "data_encoding": "gzip",
    }  # fmt: skip
    store = ts.open(
        {
            "driver": "neuroglancer_precomputed",
            "kvstore": f"file://{root}",
            "multiscale_metadata": {"type": "image", "data_type": "uint8", "num_channels": 1},
            "scale_metadata": {
                "size": size, "chunk_size": [16, 16, 16], "resolution": [8, 8, 8], "encoding": "raw",
                "sharding": sharding,
            },
            "create": True,
        }
    ).result()  # fmt: skip
    store[...] = np.random.default_rng(0).integers(0, 32, store.shape, dtype=np.uint8)  # compressible
    print(f"cold volume: {side * side * 32} chunks of 16^3, sharding {json.dumps(sharding)}")
    return json.loads((root / "info").read_text())["scales"][0]["key"]


def write_igneous(written: Path, root: Path, scale: str) -> None:
    """The same chunks and sharding spec, in shards made by cloud-volume's synthesize_shard_files, as igneous
    writes production volumes: each shard's minishard indexes side by side after its data, where tensorstore
    interleaves each with its minishard's chunks."""
    import numpy as np
    import tensorstore as ts
    from cloudvolume.datasource.precomputed.sharding import ShardingSpecification, synthesize_shard_files

    from tests.support.peers import compressed_morton_code

    info = json.loads((written / "info").read_text())
    spec = info["scales"][0]
    voxels = ts.open({"driver": "neuroglancer_precomputed", "kvstore": f"file://{written}"}).result().read().result()
    grid = tuple(-(-s // c) for s, c in zip(spec["size"], spec["chunk_sizes"][0], strict=True))
    values = {
        compressed_morton_code(pos, grid): voxels[tuple(slice(p * 16, p * 16 + 16) for p in pos)].tobytes(order="F")
        for pos in np.ndindex(*grid)
    }  # raw chunks: x fastest, channels last
    (root / scale).mkdir(parents=True)
    for name, shard in synthesize_shard_files(ShardingSpecification.from_dict(spec["sharding"]), values).items():
        (root / scale / name).write_bytes(shard)
    (root / "info").write_text(json.dumps(info))


SHARDFS_COLD, TENSORSTORE_COLD = "shardfs, 16 readers", "tensorstore, 16 in flight"
SHARDFS_VIEW, TENSORSTORE_VIEW = "shardfs, 16 readers a window", "tensorstore, a box a window"
WINDOW, PAN = 8, 2  # a viewer's window of 8 x 8 chunks, panned by 2 chunks at a time
SHARDFS_COPY, TENSORSTORE_COPY = "shardfs, one process in listing order", "tensorstore, one batch"
COLD_LAYOUTS = {  # the cold volume's two shard layouts, served side by side
    "cold": "shards written by tensorstore (each minishard index beside its chunks)",
    "cold-igneous": "the same chunks in shards made by cloud-volume, as igneous writes them (minishard indexes "
    "side by side)",
}


def cold(work: Path, source: Path, url: str, scale: str, server: Server, args: argparse.Namespace) -> dict:
    """Fresh mounts against fresh tensorstore contexts, in turns, on samples never read; then listings."""
    names = [n for n in chunk_names(source, work) if n.startswith(f"{scale}/")]
    options = ["-o", args.options] if args.options else []
    rng = random.Random(1)
    runs: dict[str, list[tuple[float, float, float]]] = {SHARDFS_COLD: [], TENSORSTORE_COLD: []}
    print(f"{len(names)} chunks; {args.cold_repeats} rounds of {args.cold_sample} never read, each from nothing")
    for i in range(args.cold_repeats):
        sample = rng.sample(names, min(args.cold_sample, len(names)))
        for who in list(runs) if i % 2 == 0 else list(runs)[::-1]:  # in turns, so order biases cancel
            runs[who].append(cold_round(who, work, url, sample, server, options))
    out: dict[str, Any] = {
        who: {"files_per_s": round(statistics.median(r for r, _, _ in v)),
              "requests_per_chunk": round(statistics.median(n for _, n, _ in v), 2)}
        for who, v in runs.items()
    }  # fmt: skip
    out[SHARDFS_COLD]["bytes_per_byte_served"] = round(statistics.median(b for _, _, b in runs[SHARDFS_COLD]), 2)
    rate = {who: statistics.median(r for r, _, _ in v) for who, v in runs.items()}
    out["shardfs_vs_tensorstore"] = round(rate[SHARDFS_COLD] / rate[TENSORSTORE_COLD], 2)
    out["copy"] = copies(work, url, scale, sorted(n.split("/", 1)[1] for n in names), server, options, args)
    out["viewer"] = viewer(work, url, scale, server, options, args)
    out["listing"] = listings(work, url, scale, len(names), server, options, args.cold_repeats)
    return out


def copies(
    work: Path, url: str, scale: str, listed: list[str], server: Server, options: list[str], args: argparse.Namespace
) -> dict:  # fmt: skip
    """One process reading the scale's files one after another in listing order, as `cp -r`, rsync or a loop
    over os.listdir do, from a fresh mount (the directory listed first, as they do), against tensorstore given
    the same chunks in one batch, from a fresh context: --copy-files files a round, in turns."""
    names = listed[: args.copy_files]
    runs: dict[str, list[tuple[float, float]]] = {SHARDFS_COPY: [], TENSORSTORE_COPY: []}
    for i in range(args.cold_repeats):
        for who in list(runs) if i % 2 == 0 else list(runs)[::-1]:
            if who == SHARDFS_COPY:
                with mounted(url, work / "mnt-copy", *options) as m, server.counting() as c:
                    os.listdir(m.path / scale)
                    t = time.perf_counter()
                    for name in names:
                        with open(m.path / scale / name, "rb") as f:
                            f.read()
                    rate = len(names) / (time.perf_counter() - t)
            else:
                store = tensorstore_open("precomputed", url)
                with server.counting() as c:
                    t = time.perf_counter()
                    for future in [store[region("precomputed", name)].read() for name in names]:
                        future.result()
                    rate = len(names) / (time.perf_counter() - t)
            requests = (c["GET"] + c["HEAD"]) / len(names)
            runs[who].append((rate, requests))
            print(f"{who}: {rate:6.0f} files/s, {requests:.2f} requests/file", flush=True)
    out: dict[str, Any] = {
        who: {"files_per_s": round(statistics.median(r for r, _ in v)),
              "requests_per_file": round(statistics.median(n for _, n in v), 2)}
        for who, v in runs.items()
    }  # fmt: skip
    out["shardfs_vs_tensorstore"] = round(out[SHARDFS_COPY]["files_per_s"] / out[TENSORSTORE_COPY]["files_per_s"], 2)
    return out


def pans(side: int, count: int) -> list[tuple[int, int]]:
    """Window origins (x, y), in chunks, as a viewer pans: PAN chunks along x to the edge, PAN down, back."""
    across = list(range(0, side - WINDOW + 1, PAN))
    out: list[tuple[int, int]] = []
    for row, y in enumerate(range(0, side - WINDOW + 1, PAN)):
        out += [(x, y) for x in (across if row % 2 == 0 else across[::-1])]
    return out[:count]


def chunk_name(x: int, y: int, z: int) -> str:
    return f"{16 * x}-{16 * x + 16}_{16 * y}-{16 * y + 16}_{16 * z}-{16 * z + 16}"


def viewer(work: Path, url: str, scale: str, server: Server, options: list[str], args: argparse.Namespace) -> dict:
    """A viewer's pattern on a fresh mount: 2-D windows of 8 x 8 chunks of one z plane, panned by 2 chunks
    (--windows of them), each window's 64 files read by 16 threads at once through the kernel (a window at
    a time, as a viewer asks for what it shows), against tensorstore's precomputed driver reading each window
    as one box from a fresh context; requests counted a chunk new to the window. A plane of its own a round."""
    info = json.loads(urllib.request.urlopen(f"{url}/info").read())
    side = info["scales"][0]["size"][0] // 16
    runs: dict[str, list[tuple[float, float]]] = {SHARDFS_VIEW: [], TENSORSTORE_VIEW: []}
    for i in range(args.cold_repeats):
        windows = pans(side, args.windows)
        boxes = [[(x + a, y + b, i) for a in range(WINDOW) for b in range(WINDOW)] for x, y in windows]
        new = len({chunk for box in boxes for chunk in box})
        for who in list(runs) if i % 2 == 0 else list(runs)[::-1]:
            if who == SHARDFS_VIEW:
                with (
                    mounted(url, work / "mnt-view", *options) as m,
                    ThreadPoolExecutor(IN_FLIGHT) as pool,
                    server.counting() as c,
                ):
                    read = lambda chunk: (m.path / scale / chunk_name(*chunk)).read_bytes()  # noqa: E731
                    t = time.perf_counter()
                    for box in boxes:
                        list(pool.map(read, box))
                    rate = len(boxes) / (time.perf_counter() - t)
            else:
                store = tensorstore_open("precomputed", url)
                with server.counting() as c:
                    t = time.perf_counter()
                    for x, y in windows:
                        store[
                            16 * x : 16 * (x + WINDOW), 16 * y : 16 * (y + WINDOW), 16 * i : 16 * i + 16
                        ].read().result()
                    rate = len(boxes) / (time.perf_counter() - t)
            requests = (c["GET"] + c["HEAD"]) / new
            runs[who].append((rate, requests))
            print(f"{who}: {rate:6.1f} windows/s, {requests:.2f} requests a new chunk", flush=True)
    out: dict[str, Any] = {
        who: {"windows_per_s": round(statistics.median(r for r, _ in v), 1),
              "requests_per_chunk": round(statistics.median(n for _, n in v), 2)}
        for who, v in runs.items()
    }  # fmt: skip
    out["shardfs_vs_tensorstore"] = round(
        out[SHARDFS_VIEW]["windows_per_s"] / out[TENSORSTORE_VIEW]["windows_per_s"], 2
    )
    return out


def fetched_per_served(point: Path) -> float:
    """The mount's bytes read from the source over bytes served to readers (`shardfs stats --prometheus`)."""
    text = subprocess.run([*SHARDFS, "stats", str(point), "--prometheus"], capture_output=True, text=True).stdout
    found = dict(line.split() for line in text.splitlines() if line.startswith("shardfs_") and " " in line)
    return float(found["shardfs_store_read_bytes_total"]) / max(float(found["shardfs_served_bytes_total"]), 1)


def cold_round(
    who: str, work: Path, url: str, sample: list[str], server: Server, options: list[str]
) -> tuple[float, float, float]:
    """(files/s, requests a chunk, bytes fetched a byte served (shardfs; 0 for tensorstore)) reading sample
    from nothing: a fresh mount, or a fresh tensorstore."""
    seen, per_byte = "", 0.0
    if who == SHARDFS_COLD:
        with mounted(url, work / "mnt-cold", *options) as m:
            with server.counting() as c, sampling(fusectl_waiting(m)) as waiting:
                rate = read_files(m.path, sample, IN_FLIGHT, work, "open()")
            per_byte = fetched_per_served(m.path)
        seen = f"; {per_byte:.2f} bytes fetched a byte served"
        if waiting["max"] >= 0:  # fusectl is mounted
            seen += f"; fusectl waiting: mean {waiting['mean']:.1f}, max {waiting['max']:.0f}"
    else:
        store = tensorstore_open("precomputed", url)  # a fresh context: nothing cached
        with server.counting() as c:
            rate = tensorstore_read(store, "precomputed", sample)
    requests = (c["GET"] + c["HEAD"]) / len(sample)
    print(
        f"{who}: {rate:6.0f} files/s, {requests:.2f} requests/chunk ({c['HEAD'] / len(sample):.2f} HEAD); "
        f"server: at most {c['most_at_once']} at once{seen}",
        flush=True,
    )
    return rate, requests, per_byte


def listings(work: Path, url: str, scale: str, expected: int, server: Server, options: list[str], repeats: int) -> dict:
    """Seconds to list the scale directory on a fresh mount (every name, as `ls` does), and then to stat
    every name from one thread (as `ls -l` does), medians of repeats; requests counted at the server."""
    listed, stated, requests = [], [], []
    for _ in range(repeats):
        with mounted(url, work / "mnt-list-cold", *options) as m:
            with server.counting() as c:
                names = os.listdir(m.path / scale)
            assert len(names) == expected, f"listed {len(names)} names, expected {expected}"
            t = time.perf_counter()
            for name in names:
                os.stat(m.path / scale / name)
            stated.append(time.perf_counter() - t)
        listed.append(c["seconds"])
        requests.append(c["GET"] + c["HEAD"])
        print(
            f"listing {expected} names, fresh mount: {listed[-1]:.2f}s, {requests[-1]} requests (at most "
            f"{c['most_at_once']} at once); then stat of every name: {stated[-1]:.2f}s",
            flush=True,
        )
    return {
        "seconds": round(statistics.median(listed), 2),
        "requests": statistics.median(requests),
        "stat_every_name_seconds": round(statistics.median(stated), 2),
    }


# -- the benchmark -------------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chunks", type=int, default=16384, help="chunks in the precomputed volume (>= 16k)")
    ap.add_argument("--sample", type=int, default=2000, help="random chunks, never read before, per pass")
    ap.add_argument("--repeats", type=int, default=3, help="passes of 16 readers (each on a new sample)")
    ap.add_argument("--latency", type=float, default=0.02, help="seconds the server waits before each answer")
    ap.add_argument("--warm", type=int, default=1000, help="chunks read first, so that every index is cached")
    ap.add_argument("-o", dest="options", help="FUSE options for every shardfs mount, e.g. max_idle_threads=64")
    ap.add_argument("--cold-chunks", type=int, default=20000, help="chunks in the hashed volume of the cold phase")
    ap.add_argument("--cold-sample", type=int, default=2000, help="chunks read per cold round")
    ap.add_argument("--cold-repeats", type=int, default=3, help="cold rounds (and listings), each from nothing")
    ap.add_argument("--copy-files", type=int, default=2000, help="files read in listing order per copy round")
    ap.add_argument("--windows", type=int, default=24, help="viewer windows panned across per round")
    ap.add_argument("--only", choices=("cold", "precomputed", "zarr"), help="one phase only")
    ap.add_argument("--no-spinners", action="store_true", help="let idle vCPUs halt (to see what they cost)")
    ap.add_argument("--serve", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(Path(args.serve[0]), float(args.serve[1]))
        return
    with spinners(not args.no_spinners), tempfile.TemporaryDirectory(prefix="shardfs-rbench-") as scratch:
        try:
            run(Path(scratch), args)
        finally:  # a mount left by a failed run would keep the directory from being removed
            for m in Path(scratch).glob("mnt-*"):
                subprocess.run(["fusermount3", "-uz", str(m)], capture_output=True)


def run(work: Path, args: argparse.Namespace) -> None:
    data = work / "data"
    data.mkdir()
    t = time.monotonic()
    wanted = [args.only] if args.only else ["cold", "precomputed", "zarr"]
    if "cold" in wanted:
        scale = write_hashed(data / "cold", args.cold_chunks)
        write_igneous(data / "cold", data / "cold-igneous", scale)
    if "precomputed" in wanted:
        write_dataset(data / "precomputed", args.chunks)
    if "zarr" in wanted:
        write_zarr(data / "zarr")
    os.sync()
    print(f"wrote {', '.join(wanted)} in {time.monotonic() - t:.1f}s")

    server = Server(data, args.latency)
    try:
        summary = {"server": server_capacity(data, server, wanted[0])}
        for kind in wanted:
            print(f"\n== {kind}", flush=True)
            if kind == "cold":
                for layout in COLD_LAYOUTS:
                    print(f"-- {layout}: {COLD_LAYOUTS[layout]}", flush=True)
                    summary[layout] = cold(work, data / layout, f"{server.url}/{layout}", scale, server, args)
            else:
                summary[kind] = measure(work, data / kind, f"{server.url}/{kind}", kind, server, args)
    finally:
        server.close()
    rates = [r["most_requests_per_s"] for k, r in summary.items() if k in ("precomputed", "zarr")]
    if rates:
        print(f"\nthe most requests/s any warm pass asked of the server: {max(rates):.0f}")
    print(f"server capacity: {summary['server']}")
    conclude(summary, args.latency)
    print(json.dumps({"spinners": not args.no_spinners, "latency_s": args.latency, **summary}))


def conclude(summary: dict[str, Any], latency: float) -> None:
    """The figures issue 21 sets targets for, side by side, from this run."""
    print(f"\n== this run's figures ({latency * 1e3:.0f} ms a request)")
    for layout in [k for k in COLD_LAYOUTS if k in summary]:
        c, ours, theirs = summary[layout], summary[layout][SHARDFS_COLD], summary[layout][TENSORSTORE_COLD]
        print(
            f"{layout}, fresh mount: shardfs 16 readers {ours['files_per_s']} files/s ({ours['requests_per_chunk']} "
            f"requests/chunk), tensorstore 16 in flight {theirs['files_per_s']} ({theirs['requests_per_chunk']}): "
            f"{c['shardfs_vs_tensorstore']:.2f}x (target >= 1.5x)"
        )
        copy, ours, theirs = c["copy"], c["copy"][SHARDFS_COPY], c["copy"][TENSORSTORE_COPY]
        print(
            f"{layout}, copy in listing order, fresh mount: shardfs one process {ours['files_per_s']} files/s "
            f"({ours['requests_per_file']} requests/file), tensorstore one batch {theirs['files_per_s']} "
            f"({theirs['requests_per_file']}): {copy['shardfs_vs_tensorstore']:.2f}x (target >= 1.0x)"
        )
        view, ours, theirs = c["viewer"], c["viewer"][SHARDFS_VIEW], c["viewer"][TENSORSTORE_VIEW]
        print(
            f"{layout}, viewer windows (8x8 chunks panned by 2), fresh mount: shardfs 16 readers a window "
            f"{ours['windows_per_s']} windows/s ({ours['requests_per_chunk']} requests a new chunk), tensorstore "
            f"a box a window {theirs['windows_per_s']} ({theirs['requests_per_chunk']}): "
            f"{view['shardfs_vs_tensorstore']:.2f}x (target >= 3x)"
        )
        print(
            f"{layout}, random cold chunks: shardfs fetched {c[SHARDFS_COLD]['bytes_per_byte_served']} bytes a byte "
            "served (target <= 8)"
        )
        print(
            f"{layout}, listing the scale directory, fresh mount: {c['listing']['seconds']:.1f}s (target <= 10 s); "
            f"then stat of every name {c['listing']['stat_every_name_seconds']:.1f}s"
        )
    for kind in ("precomputed", "zarr"):
        if kind in summary:
            w = summary[kind]
            print(
                f"warm {kind}: {w['gets_per_chunk_warm']:.2f} GETs a chunk (target 1.00), 16 readers vs 1 "
                f"{w['speedup_16_vs_1']:.1f}x (target >= 8x), vs tensorstore {w['shardfs_vs_tensorstore']:.2f}x"
            )


def server_capacity(data: Path, server: Server, kind: str) -> dict[str, float]:
    """Requests/s the server process answers, with no latency and with the benchmark's."""
    shard = next(p for p in (data / kind).rglob("*.shard"))
    key = str(shard.relative_to(data))
    out = {}
    idle = Server(data, 0.0)
    try:
        for concurrency in (16, 64):
            out[f"latency 0, {concurrency} clients"] = round(capacity(idle.url, key, concurrency))
    finally:
        idle.close()
    out[f"latency {server.latency * 1e3:.0f} ms, 64 clients"] = round(capacity(server.url, key, 64))
    print(
        f"server capacity, requests/s: {out} (64 clients at {server.latency * 1e3:.0f} ms: at most "
        f"{64 / server.latency:.0f})"
    )
    return out


def measure(work: Path, source: Path, url: str, kind: str, server: Server, args: argparse.Namespace) -> dict:
    names = chunk_names(source, work)
    rtt = server.latency
    order = random.Random(0).sample(names, len(names))
    warm, rest = order[: args.warm], order[args.warm :]
    samples = [rest[i * args.sample : (i + 1) * args.sample] for i in range(args.repeats + 1)]
    assert len(samples[-1]) == args.sample, f"{len(names)} chunks are too few for {args.repeats + 1} samples"
    print(f"{len(names)} chunks; warm with {args.warm}, then samples of {args.sample} never read before")
    out: dict[str, Any] = {"chunks": len(names)}
    most_rate = 0.0

    # shardfs: 16 readers (repeats), then 1 reader; GETs counted at the server for each pass.
    rates: dict[str, list[float]] = {"shardfs, 16 readers": [], "shardfs, 1 reader": []}
    gets_per_chunk = []
    options = ["-o", args.options] if args.options else []
    with mounted(url, work / "mnt-remote", *options) as m:
        read_files(m.path, warm, IN_FLIGHT, work)
        for i, sample in enumerate(samples):
            readers = IN_FLIGHT if i < args.repeats else 1
            with server.counting() as c, sampling(fusectl_waiting(m)) as waiting:
                rate = read_files(m.path, sample, readers, work)
            rates[f"shardfs, {readers} reader{'s' if readers > 1 else ''}"].append(rate)
            gets_per_chunk.append(c["GET"] / len(sample))
            most_rate = max(most_rate, (c["GET"] + c["HEAD"]) / c["seconds"])
            print(
                f"shardfs, {readers:>2} reader(s): {rate:6.0f} chunks/s, {c['GET'] / len(sample):.2f} GETs and "
                f"{c['HEAD'] / len(sample):.2f} HEADs per chunk; server: at most {c['most_at_once']} requests at "
                f"once, {c['cpu'] / c['seconds']:.0%} of a core; fusectl waiting: mean {waiting['mean']:.1f}, "
                f"max {waiting['max']:.0f}",
                flush=True,
            )

    # tensorstore in-process: the same samples as the 16-reader passes, after warming on the same chunks.
    store = tensorstore_open(kind, url)
    tensorstore_read(store, kind, warm)
    rates["tensorstore, 16 in flight"] = []
    for sample in samples[: args.repeats]:
        with server.counting() as c:
            rates["tensorstore, 16 in flight"].append(tensorstore_read(store, kind, sample))
        most_rate = max(most_rate, (c["GET"] + c["HEAD"]) / c["seconds"])
        print(
            f"tensorstore, 16 in flight: {rates['tensorstore, 16 in flight'][-1]:6.0f} chunks/s, "
            f"{c['GET'] / len(sample):.2f} GETs per chunk",
            flush=True,
        )
    del store
    if kind == "precomputed":
        cv = cloudvolume_open(url)
        cloudvolume_read(cv, warm)
        rates["cloud-volume, 16 threads"] = []
        for sample in samples[: args.repeats]:
            with server.counting() as c:
                rates["cloud-volume, 16 threads"].append(cloudvolume_read(cv, sample))
            most_rate = max(most_rate, (c["GET"] + c["HEAD"]) / c["seconds"])
            print(
                f"cloud-volume, 16 threads: {rates['cloud-volume, 16 threads'][-1]:6.0f} chunks/s, "
                f"{c['GET'] / len(sample):.2f} GETs per chunk",
                flush=True,
            )

    med = {k: statistics.median(v) for k, v in rates.items()}
    out["chunks_per_s"] = {k: round(v) for k, v in med.items()}
    out["gets_per_chunk_warm"] = round(statistics.median(gets_per_chunk), 3)
    out["speedup_16_vs_1"] = round(med["shardfs, 16 readers"] / med["shardfs, 1 reader"], 2)
    out["shardfs_vs_tensorstore"] = round(med["shardfs, 16 readers"] / med["tensorstore, 16 in flight"], 2)
    out["most_requests_per_s"] = round(most_rate)
    out["cold_first_chunk"] = cold_first_chunk(work, url, kind, samples[0][:3], server, options)
    out["peak_rss_mib"] = full_scan(work, url, names, options)
    print(f"\n{kind}: chunks/s, median of {args.repeats} (1 reader: one pass): {out['chunks_per_s']}")
    print(
        f"GETs per chunk once warm: {out['gets_per_chunk_warm']:.2f}; 16 readers vs 1: "
        f"{out['speedup_16_vs_1']:.1f}x; shardfs (16 readers) vs tensorstore (16 in flight): "
        f"{out['shardfs_vs_tensorstore']:.2f}x"
    )
    print(f"cold first chunk, in round trips of {rtt * 1e3:.0f} ms (and requests): {out['cold_first_chunk']}")
    print(f"daemon peak RSS over a full scan: {out['peak_rss_mib']} MiB (budget 64 MiB + 150 MiB = 214 MiB)")
    return out


def cold_first_chunk(
    work: Path, url: str, kind: str, names: list[str], server: Server, options: list[str]
) -> dict[str, str]:
    """Time to the bytes of one chunk from nothing, in round trips of the injected latency, median over
    names (each from a fresh start); opening (info, zarr.json) is done before the clock starts."""
    runs: dict[str, list[tuple[float, int]]] = {"shardfs": [], "tensorstore": [], "cloud-volume": []}
    for name in names:
        with mounted(url, work / "mnt-cold", *options) as m:
            with server.counting() as c:
                (m.path / name).read_bytes()
            runs["shardfs"].append((c["seconds"], c["GET"] + c["HEAD"]))
        store = tensorstore_open(kind, url)
        with server.counting() as c:
            store[region(kind, name)].read().result()
        runs["tensorstore"].append((c["seconds"], c["GET"] + c["HEAD"]))
        if kind == "precomputed":
            cv = cloudvolume_open(url)
            with server.counting() as c:
                cv[region(kind, name)]
            runs["cloud-volume"].append((c["seconds"], c["GET"] + c["HEAD"]))
    return {
        who: f"{statistics.median(s for s, _ in r) / server.latency:.1f} ({statistics.median(n for _, n in r):.0f})"
        for who, r in runs.items()
        if r
    }


def full_scan(work: Path, url: str, names: list[str], options: list[str]) -> int:
    """The daemon's peak RSS in MiB after 16 readers read every chunk through a fresh mount."""
    with mounted(url, work / "mnt-scan", *options) as m:
        t = time.monotonic()
        read_files(m.path, names, IN_FLIGHT, work)
        peak = m.peak_rss()
        print(f"full scan of {len(names)} chunks, 16 readers: {time.monotonic() - t:.1f}s", flush=True)
    return round(peak / 2**20)


if __name__ == "__main__":
    main()
