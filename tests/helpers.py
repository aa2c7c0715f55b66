"""What several test modules use: finding and waiting on a daemon, reading through a mount, a fake kernel
over a socket pair, the small datasets' maths. Peer writers live in tests/peers.py, fixtures in conftest.py."""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import mmh3
import numpy as np
import psutil
import pytest
import tensorstore as ts
import zarr
from google_crc32c import value as crc32c
from zarr.codecs import ShardingCodec

from shardfs.fuse import wire
from shardfs.fuse.bridge import Bridge
from shardfs.fuse.session import Session, Timeouts
from shardfs.source import open_source
from tests import peers
from tests.http_server import RangeServer

REPO = Path(__file__).resolve().parent.parent

# --- daemons and waiting --------------------------------------------------------------------------------


def daemon_of(mountpoint: Path) -> psutil.Process:
    for proc in psutil.process_iter(["cmdline"]):
        if str(mountpoint) in (proc.info["cmdline"] or []) and "mount" in proc.info["cmdline"]:
            return proc
    raise AssertionError(f"no daemon serves {mountpoint}")


def wait_until(condition: Callable[[], bool], seconds: float = 60) -> None:
    """Wait for condition, polling; the ceiling is one only a hang reaches, never a speed target."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def peer_pid(path: Path, kind: int = socket.SOCK_SEQPACKET) -> int:
    """The pid of the process listening at a Unix socket (a keeper's, by default)."""
    with socket.socket(socket.AF_UNIX, kind) as conn:
        conn.connect(str(path))
        return struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]


def alive(pid: int) -> bool:
    """Whether pid still runs (not a zombie waiting for its parent)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


def wait_for(condition: Callable[[], bool], seconds: float = 60) -> bool:
    """Whether condition holds within seconds, polling: for tests that assert it with a message of their own."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def cache_held(point: Path) -> int:
    """Bytes the mount's cache counts as held, as `shardfs stats` reads them from the daemon."""
    text = subprocess.run(
        [sys.executable, "-m", "shardfs", "stats", "--prometheus", point], check=True, capture_output=True, text=True
    ).stdout
    return int(float(next(line.split()[-1] for line in text.splitlines() if line.startswith("shardfs_cache_bytes "))))


@contextlib.contextmanager
def machine_lock(path: Path, seconds: float = 600, shared: bool = False) -> Iterator[None]:
    """Held while a test changes path, which the whole machine shares: another suite (a second copy of the
    tree, run at once) or another worker waits for it. shared: held by tests that count on what path would
    change staying as it is, any number at once. The ceiling is one only a hang reaches."""
    with open(f"/run/lock/shardfs-tests-{str(path).strip('/').replace('/', '-')}", "w") as lock:
        deadline = time.monotonic() + seconds
        while True:
            try:
                fcntl.flock(lock, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                assert time.monotonic() < deadline, f"{path}: another suite held it for {seconds:.0f} s"
                time.sleep(0.2)
        yield


def one_line_error(done: subprocess.CompletedProcess[str], status: int, *words: str) -> None:
    """Exit status, a single line on stderr holding each of words, and no traceback."""
    assert done.returncode == status, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert all(word in done.stderr for word in words), done.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- reading through a mount and with the peers ---------------------------------------------------------


def chunk_names(twin: Path, scale: str) -> list[str]:
    """The chunk files the unsharded twin holds."""
    return sorted(p.name for p in (twin / scale).iterdir())


def read_errno(path: Path) -> int | None:
    try:
        path.read_bytes()
    except OSError as e:
        return e.errno
    return None


def peak_and_now_kib(pid: int) -> tuple[int, int]:
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(status["VmHWM"].split()[0]), int(status["VmRSS"].split()[0])


def denied(result) -> bool:
    return result.returncode != 0 and "Permission denied" in result.stderr


def files_under(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def read_ts(root: Path, scale_index: int = 0) -> np.ndarray:
    spec = {"driver": "neuroglancer_precomputed", "kvstore": f"file://{root}", "scale_index": scale_index}
    return ts.open(spec).result().read().result()


def ts_read(driver: str, path: Path) -> np.ndarray:
    return ts.open({"driver": driver, "kvstore": {"driver": "file", "path": str(path)}}).result().read().result()


def precomputed(source: Path) -> dict:
    return {"driver": "neuroglancer_precomputed", "kvstore": {"driver": "file", "path": str(source)}}


# --- remote sources -------------------------------------------------------------------------------------


def replace(shard: Path, twin_chunk: Path, grow: bool) -> None:
    """A new object under the same name, as a writer uploads one: the chunk's bytes inverted (its indexes
    unchanged, so an old index finds other bytes there), a new file (a new ETag), modified 10 s later (a new
    Last-Modified), one byte longer if grow, else of the same size."""
    data = bytearray(shard.read_bytes())
    chunk = twin_chunk.read_bytes()
    at = data.find(chunk)
    assert at >= 0 and data.find(chunk, at + 1) < 0
    data[at : at + len(chunk)] = bytes(b ^ 0xFF for b in chunk)
    when = int(shard.stat().st_mtime) + 10
    fresh = shard.with_name(shard.name + ".new")
    fresh.write_bytes(bytes(data) + (b"\0" if grow else b""))
    os.utime(fresh, (when, when))
    os.replace(fresh, shard)


DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def forget_pages(*files: Path) -> None:
    """The kernel's pages of files dropped, so that their next read reaches the daemon (the mount uses FUSE
    no_open: the kernel keeps pages). Theirs only: /proc/sys/vm/drop_caches would drop every other test's too."""
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def counted(server: RangeServer) -> Counter[str]:
    """Requests so far, by method."""
    after: Counter[str] = Counter()
    with server.lock:
        for (method, _), n in server.requests.items():
            after[method] += n
    return after


def home(spec: dict, key: int) -> tuple[int, int]:
    """(shard, minishard) of a key, by the spec's maths written out here, owing nothing to shardfs."""
    hashed = mmh3.hash64((key >> spec["preshift_bits"]).to_bytes(8, "little"), 0, False, False)[0]
    return (hashed >> spec["minishard_bits"]) & ((1 << spec["shard_bits"]) - 1), hashed & (
        (1 << spec["minishard_bits"]) - 1
    )


# --- mounts by an unprivileged user ---------------------------------------------------------------------

BIG = 100_000  # bytes of key 1 of conftest's `shared` dataset: many pages, many READs when each is capped

# /dev/fuse a node the user may open, and fuse.conf's user_allow_other, in this namespace alone.
PRIVATE_FUSE = (
    "mount -t tmpfs none /run && mkdir /run/fuse && mknod -m 666 /run/fuse/fuse c 10 229"
    " && mount --bind /run/fuse/fuse /dev/fuse && echo user_allow_other > /run/fuse/fuse.conf"
    ' && mount --bind /run/fuse/fuse.conf /etc/fuse.conf && exec "$@"'
)


def run_in_private_fuse(script: str, source: Path, where: Path, user: tuple[int, int], *args: str) -> dict:
    """The Python script, run in a mount namespace of its own (PRIVATE_FUSE) with the arguments source, a
    mountpoint `where/m` and a log `where/log` (both the user's), the user's uid and gid, then args; what it
    printed, as JSON. The script drops to the user itself."""
    point, log = where / "m", where / "log"
    point.mkdir()
    os.chown(point, *user)
    log.touch()
    os.chown(log, *user)
    private = ["unshare", "--mount", "--propagation", "private", "sh", "-c", PRIVATE_FUSE, "-"]
    command = [sys.executable, "-c", script, str(source), str(point), str(log), *map(str, user), *args]
    done = subprocess.run([*private, *command], capture_output=True, text=True, timeout=180, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def hold_directory(other_user: list[str], directory: Path, handles: int) -> subprocess.Popen[str]:
    """tests/dir_holder.py run as the other user: it opens the directory handles times, says so on stdout, and
    holds every handle until its stdin closes."""
    command = [*other_user, "tests.dir_holder", directory, str(handles)]
    return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


# --- zarr-python 2.18 (the 2022 sharding draft), in its own environment -----------------------------------

VENV = REPO / ".venv-zarr2" / "bin" / "python"
ENV = {**os.environ, "ZARR_V3_EXPERIMENTAL_API": "1", "ZARR_V3_SHARDING": "1", "PYTHONWARNINGS": "ignore"}


def run(script: str, *args: Path) -> str:
    """The script run by zarr-python 2.18's interpreter with args; its stdout."""
    if not VENV.exists():
        pytest.fail(f"{VENV} is missing: run scripts/setup, which makes the zarr-python 2.18 environment")
    done = subprocess.run(
        [VENV, "-c", textwrap.dedent(script), *map(str, args)], env=ENV, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


# --- zarr v3 shards -------------------------------------------------------------------------------------


def innermost(array: zarr.Array) -> tuple[int, ...]:
    codec = array.metadata.codecs[0]
    while isinstance(codec, ShardingCodec):
        shape = codec.chunk_shape
        codec = codec.codecs[0]
    return tuple(shape)


def rewrite_index(path: Path, edit: Callable[[np.ndarray], None], cps: int) -> None:
    """Edit a shard's index table and store a matching crc32c, so only the edit is wrong."""
    data = bytearray(path.read_bytes())
    at = len(data) - (16 * cps + 4)
    table = np.frombuffer(bytes(data[at : at + 16 * cps]), "<u8").reshape(-1, 2).copy()
    edit(table)
    data[at : at + 16 * cps] = table.tobytes()
    data[-4:] = struct.pack("<I", crc32c(bytes(data[at : at + 16 * cps])))
    path.write_bytes(bytes(data))


# --- a fake kernel over a socket pair ---------------------------------------------------------------------


@contextlib.contextmanager
def kernel_socket(volume_root: Path, timeouts: Timeouts | None = None) -> Iterator[tuple[socket.socket, Session]]:
    """A session whose "device" is one end of a packet socket pair: the test plays a kernel this machine
    does not run (older, newer), request by request, and reads what the kernel would be told."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    session = Session(theirs.fileno(), Bridge(open_source(volume_root, 1 << 20).tree, 0), 1, timeouts)
    runner = threading.Thread(target=session.run)
    runner.start()
    try:
        yield ours, session
    finally:
        ours.close()
        runner.join(60)
        theirs.close()
    assert not runner.is_alive()


def ask(kernel: socket.socket, opcode: int, body: bytes, unique: int = 1, nodeid: int = 0) -> tuple[int, bytes]:
    """Send one request; (errno, payload) of the reply."""
    kernel.send(wire.IN_HEADER.pack(wire.IN_HEADER.size + len(body), opcode, unique, nodeid, 0, 0, 0, 0, 0) + body)
    reply = kernel.recv(1 << 16)
    size, error, answered = wire.OUT_HEADER.unpack_from(reply)
    assert (size, answered) == (len(reply), unique)
    return -error, reply[wire.OUT_HEADER.size :]


def init(kernel: socket.socket, major: int, minor: int, flags: int, flags2: int = 0) -> tuple[int, bytes]:
    """INIT as a kernel of major.minor sends it: flags2 is read only where flags has INIT_EXT."""
    body = wire.INIT_IN.pack(major, minor, 1 << 17, flags) + wire.INIT_IN_FLAGS2.pack(flags2)
    return ask(kernel, wire.Op.INIT, body + bytes(64 - len(body)))


EVERYTHING = 0xFFFFFFFF  # INIT flags: every capability a kernel could offer


# --- the small gzip volume of conftest's `pristine`, and where each chunk lies in its shards ----------------

SHARDING = {
    "@type": "neuroglancer_uint64_sharded_v1",
    "preshift_bits": 0,
    "hash": "identity",  # keys spread predictably over 4 shards x 2 minishards
    "minishard_bits": 1,
    "shard_bits": 2,
    "minishard_index_encoding": "raw",
    "data_encoding": "gzip",
}


GRID = (4, 4, 1)  # chunks of 16 x 16 x 16 in a 64 x 64 x 16 volume


def write_small_volume(root: Path, data: np.ndarray, sharding: dict | None) -> None:
    scale = {"size": [64, 64, 16], "chunk_size": [16, 16, 16], "resolution": [1, 1, 1], "encoding": "raw"}
    store = ts.open(
        {
            "driver": "neuroglancer_precomputed",
            "kvstore": f"file://{root}",
            "multiscale_metadata": {"type": "image", "data_type": "uint8", "num_channels": 1},
            "scale_metadata": {**scale, "sharding": sharding} if sharding else scale,
            "create": True,
        }
    ).result()
    store[...] = data


def stored_range(shard: bytes, key: int) -> tuple[int, int]:
    """[start, stop) of key in a shard of two raw minishards, decoded as the spec describes: the shard index
    gives each minishard index's range after the 32-byte shard index; its rows are key deltas, start deltas
    (from the end of the previous chunk, the first from the end of the shard index) and sizes."""
    lo, hi = struct.unpack_from("<QQ", shard, 16 * (key & 1))
    deltas, gaps, sizes = np.frombuffer(shard, "<u8", (hi - lo) // 8, 32 + lo).reshape(3, -1).astype(np.int64)
    stops = 32 + np.cumsum(gaps + sizes)
    i = int(np.flatnonzero(np.cumsum(deltas) == key)[0])
    return int(stops[i] - sizes[i]), int(stops[i])


def chunks_by_shard(root: Path) -> dict[str, list[tuple[str, int, int, int]]]:
    """(name, key, start, stop) of every chunk, by shard file, from the pristine copy and the spec's maths alone:
    shard by peers.volume_chunk_shards, key the compressed Morton code, the byte range by `stored_range`."""
    shard_of = peers.volume_chunk_shards(root, "1_1_1")
    found: dict[str, list] = {}
    for pos in itertools.product(*map(range, GRID)):
        name = "_".join(f"{16 * p}-{16 * p + 16}" for p in pos)
        key = peers.compressed_morton_code(pos, GRID)
        start, stop = stored_range((root / "1_1_1" / shard_of[name]).read_bytes(), key)
        found.setdefault(shard_of[name], []).append((name, key, start, stop))
    assert sorted(found) == ["0.shard", "1.shard", "2.shard", "3.shard"]
    return found


# --- S3 (moto) ------------------------------------------------------------------------------------------

BUCKET = "data"


def upload(client: Any, local: Path, prefix: str) -> None:
    """Every file under local, as it is, to s3://BUCKET/prefix/…, readable by anyone (for --anonymous)."""
    for path in local.rglob("*"):
        if path.is_file():
            key = f"{prefix}/{path.relative_to(local)}"
            client.put_object(Bucket=BUCKET, Key=key, Body=path.read_bytes(), ACL="public-read")
