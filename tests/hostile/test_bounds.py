"""A read returns the bytes the dataset holds, or an error, and no request runs or grows without bound:
shards that change under the mount, metadata whose numbers claim far more than is stored, nesting that
points back at itself, bombs, unreadable shards, malformed children and hostile names. Each case goes
through the kernel; `ls` and `find` run as subprocesses with a timeout, so a hang fails instead of
stalling the suite."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import threading
import zlib
from pathlib import Path

import numpy as np
import pytest
import zarr
from google_crc32c import value as crc32c

from shardfs.formats.plan import METADATA_LIMIT
from tests.support import peers
from tests.support.cli import SHARDFS, shardfs
from tests.support.daemons import daemon_of, peak_and_now_kib, wait_until
from tests.support.http_server import RangeServer
from tests.support.peers import kv_dataset
from tests.support.reading import assert_eio

pytestmark = [pytest.mark.kernel, pytest.mark.root, pytest.mark.loopback]


# Even keys in 0.shard, odd keys in 1.shard.
TWO_SHARDS = peers.sharding_spec(preshift_bits=0, hash="identity", minishard_bits=0, shard_bits=1)
HANG = 60  # seconds after which a listing counts as hung


def values(seed: int, n: int = 200) -> dict[int, bytes]:
    rng = np.random.default_rng(seed)
    return {k: rng.bytes(int(rng.integers(50, 400))) for k in range(n)}


def read(path: Path) -> bytes | int:
    """The file's bytes, or the errno its read fails with."""
    try:
        return path.read_bytes()
    except OSError as e:
        return e.errno


def listing(*command: str | Path) -> list[str]:
    done = subprocess.run(list(map(str, command)), capture_output=True, text=True, timeout=HANG)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


# --- item 6: a shard that changes under the mount ----------------------------------------------------


def test_a_shard_truncated_under_the_mount_is_eio_never_short(tmp_path, mount) -> None:
    kv = tmp_path / "kv"
    expected = peers.write_tensorstore_kv(kv, values(0), sharding=TWO_SHARDS)
    m = mount(kv)
    assert read(m.path / "0") == expected[0]  # the shard's index is now cached
    opened = (m.path / "2").open("rb")  # looked up and opened, not yet read
    shard = kv / "0.shard"
    os.truncate(shard, shard.stat().st_size // 2)
    outcomes = {k: read(m.path / str(k)) for k in range(4, 200, 2)}
    try:
        late = opened.read()
    except OSError as e:
        late = e.errno
    opened.close()
    assert late in (expected[2], errno.EIO)
    assert all(v in (expected[k], errno.EIO) for k, v in outcomes.items()), outcomes
    assert errno.EIO in outcomes.values(), "the chunks in the cut half are EIO"
    assert "truncated" in m.log_text() or "changed under the mount" in m.log_text()
    assert all(read(m.path / str(k)) == expected[k] for k in range(1, 200, 2))  # the other shard is untouched


def test_a_shard_replaced_by_rename_serves_one_version_then_the_new_after_sighup(tmp_path, mount) -> None:
    """512 shards of raw values (a wrong offset reads as wrong bytes, not bad gzip), more than the daemon
    keeps open: after every shard is replaced by rename, a shard whose file was closed is opened anew while
    its old index may still be cached. Each read is then one version's bytes or EIO, never the new file
    read through the old index; after SIGHUP, the new version."""
    spec = peers.sharding_spec(preshift_bits=0, hash="identity", minishard_bits=0, shard_bits=9, data_encoding="raw")
    kv, new = tmp_path / "kv", tmp_path / "new"
    old_values, new_values = values(1, 2048), values(2, 2048)
    peers.write_tensorstore_kv(kv, old_values, sharding=spec)
    peers.write_tensorstore_kv(new, new_values, sharding=spec)
    m = mount(kv)
    assert all(read(m.path / str(k)) == old_values[k] for k in range(512))  # every index cached, one key a shard
    for shard in new.glob("*.shard"):
        shard.rename(kv / shard.name)
    before = {k: read(m.path / str(k)) for k in range(512, 640)}  # the files of shards 128-511 stay open
    assert all(v in (old_values[k], new_values[k], errno.EIO) for k, v in before.items()), "bytes of no version"
    os.kill(daemon_of(m.path).pid, signal.SIGHUP)
    wait_until(lambda: "caches_dropped" in m.log_text())
    # Never looked up before the signal; first those whose shards' old files are the longest open (384-511).
    order = sorted(range(1024, 2048), key=lambda k: k % 512 < 384)
    after = {k: read(m.path / str(k)) for k in order}
    assert after == {k: new_values[k] for k in range(1024, 2048)}


# --- item 7: work and memory bounded by bytes that exist --------------------------------------------


def test_minishard_bits_36_over_a_sparse_terabyte_lists_promptly(tmp_path, mount) -> None:
    """A shard index of 2^36 entries (1 TiB) that is all hole but one entry: listing reads only the data."""
    root = tmp_path / "kv"
    root.mkdir()
    spec = dict(peers.sharding_spec(preshift_bits=0, hash="identity", minishard_bits=36, shard_bits=0),
                minishard_index_encoding="raw", data_encoding="raw")  # fmt: skip
    (root / "info").write_text(json.dumps({"sharding": spec}))
    index_size, key, value = 16 << 36, 5, b"five"
    rows = struct.pack("<3Q", key, 0, len(value))  # key delta, offset after the shard index, size
    with (root / "0.shard").open("wb") as f:
        f.seek(16 * key)
        f.write(struct.pack("<QQ", len(value), len(value) + len(rows)))
        f.seek(index_size)
        f.write(value + rows)
    m = mount(root)
    assert listing("ls", m.path) == ["5", "info"]
    assert read(m.path / "5") == value
    assert shardfs("check", root, check=False).returncode == 0


def nested_zarr(root: Path, depth: int, fanout: int) -> None:
    """A 1-d zarr v3 array sharded `depth` levels deep, every index entry of every level pointing at the
    same inner blob: a few hundred bytes a level that claim fanout^depth chunks."""
    codecs: list = [{"name": "bytes"}]
    blob = b"\x07"
    for _ in range(depth):
        codecs = [{"name": "sharding_indexed", "configuration": {"chunk_shape": [fanout ** (_)], "codecs": codecs}}]
        index = struct.pack(f"<{2 * fanout}Q", *[0, len(blob)] * fanout)
        blob = blob + index + struct.pack("<I", crc32c(index))
    meta = {
        "zarr_format": 3, "node_type": "array", "shape": [fanout**depth], "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [fanout**depth]}},
        "chunk_key_encoding": {"name": "default"}, "fill_value": 0, "codecs": codecs,
    }  # fmt: skip
    (root / "c").mkdir(parents=True)
    (root / "zarr.json").write_text(json.dumps(meta))
    (root / "c" / "0").write_bytes(blob)


def test_nested_shards_pointing_at_one_blob_are_bounded(tmp_path, mount) -> None:
    """Eight levels of 16 entries all aliasing one blob claim 16^8 chunks in 2 KB: listing refuses the shard
    (inner shards must not share bytes) instead of walking forever; a lookup still costs one path down."""
    root = tmp_path / "alias.zarr"
    nested_zarr(root, depth=8, fanout=16)
    assert (root / "c" / "0").stat().st_size < 4096
    m = mount(root)
    assert listing("find", m.path) == [str(m.path), str(m.path / "zarr.json")]
    assert "inner shards overlap" in m.log_text()
    cat = subprocess.run(["cat", m.path / "c" / "12345"], capture_output=True, text=True, timeout=HANG)
    assert "No such file" in cat.stderr  # a corrupt shard holds nothing, to lookups as to listings


def test_nesting_deeper_than_the_cap_is_served_as_stored(tmp_path, mount) -> None:
    """Nine levels pass the JSON bounds but not the nesting cap; fifty are refused as JSON: either way the
    array is shown as stored and the mount says why, and the rest of the hierarchy is served."""
    root = tmp_path / "h.zarr"
    zarr.open_group(root, mode="w").create_array("fine", shape=(4,), chunks=(2,), shards=(4,), dtype="u1")[...] = 5
    nested_zarr(root / "nine", depth=9, fanout=2)
    nested_zarr(root / "fifty", depth=50, fanout=2)
    m = mount(root)
    for name in ("nine", "fifty"):
        assert sorted(os.listdir(m.path / name)) == ["c", "zarr.json"]
        assert read(m.path / name / "c" / "0") == (root / name / "c" / "0").read_bytes()
    assert read(m.path / "fine" / "c" / "1") == read(m.path / "fine" / "c" / "0")
    info = shardfs("info", root).stdout
    assert "nested more than 8 levels" in info and "nested more than 64 levels" in info


def gzip_bomb(claimed: int) -> bytes:
    """gzip of `claimed` zero bytes, made piecewise: a few hundred KB per 300 MB."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(1 << 20)
    return b"".join([*(packer.compress(zeros) for _ in range(claimed >> 20)), packer.flush()])


def test_memory_stays_within_the_budget_and_one_file(tmp_path, mount) -> None:
    """Bombs and files near the cap, read by eight threads at once: every bomb is EIO, every file right, and
    the daemon grows by at most the cache budget, the one large file being made (large files are made one
    at a time, their stored bytes read as they are decoded), and a fixed overhead (the session threads'
    stacks before a value counts as large, and the interpreter's own)."""
    rng = np.random.default_rng(3)
    large = {k: rng.bytes(20 << 20) for k in (10, 11, 12)}
    data = {k: gzip_bomb(300 << 20) for k in range(1, 7)}
    data.update({k: _gzip(v) for k, v in large.items()})
    data[20] = _gzip(b"small")
    m = mount(kv_dataset(tmp_path / "kv", data, encoding="gzip"), "--cache-size", "16M", "--max-file-size", "32M")
    assert read(m.path / "20") == b"small"
    pid = daemon_of(m.path).pid
    _, idle = peak_and_now_kib(pid)
    wrong: list = []

    def reader(keys: list[int]) -> None:
        for k in keys:
            got = read(m.path / str(k))
            if got != large.get(k, errno.EIO):
                wrong.append((k, got if isinstance(got, int) else len(got)))

    keys = [*range(1, 7), *large]
    threads = [threading.Thread(target=reader, args=(keys[i:] + keys[:i],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong
    assert "over --max-file-size 32.0 MiB" in m.log_text()
    peak, _ = peak_and_now_kib(pid)
    bound = (16 + 32 + 10 * 2 + 24) << 10
    assert peak - idle < bound, f"daemon grew by {(peak - idle) >> 10} MiB from {idle >> 10} MiB"


def test_the_file_over_budget_is_let_go_before_the_next_is_made(tmp_path, mount) -> None:
    """Files larger than the budget, read one after another: each is kept in the one slot over budget until
    the next large one is made, not while it is made, so the daemon grows by one such file, never two."""
    pattern = np.random.default_rng(5).bytes(1 << 16)
    large = {k: bytes([k]) + pattern * 640 for k in (1, 2, 3)}  # 40 MiB each, a few hundred KiB gzipped
    m = mount(kv_dataset(tmp_path / "kv", {k: _gzip(v) for k, v in large.items()}, encoding="gzip"),
              "--cache-size", "1M", "--max-file-size", "64M")  # fmt: skip
    pid = daemon_of(m.path).pid
    _, idle = peak_and_now_kib(pid)
    for k, value in large.items():
        assert (m.path / str(k)).read_bytes() == value
    peak, _ = peak_and_now_kib(pid)
    assert peak - idle < (40 + 24) << 10, f"daemon grew by {(peak - idle) >> 10} MiB from {idle >> 10} MiB"


def _gzip(value: bytes) -> bytes:
    packer = zlib.compressobj(1, zlib.DEFLATED, 31)
    return packer.compress(value) + packer.flush()


def test_a_huge_chunk_size_and_a_small_bomb_stay_within_the_cap(tmp_path, mount) -> None:
    """`chunk_sizes` 2048³ would allow a chunk of 8 GiB: one file's cap bounds it instead, with EIO and a
    log line naming the limit."""
    root = tmp_path / "vol"
    spec = dict(peers.sharding_spec(preshift_bits=0, hash="identity", minishard_bits=0, shard_bits=0),
                minishard_index_encoding="raw", data_encoding="gzip")  # fmt: skip
    scale = {"key": "s0", "size": [2048] * 3, "chunk_sizes": [[2048] * 3], "resolution": [1, 1, 1],
             "voxel_offset": [0, 0, 0], "encoding": "raw", "sharding": spec}  # fmt: skip
    kv_dataset(root / "s0", {0: gzip_bomb(1 << 30)}, encoding="gzip")
    (root / "info").write_text(
        json.dumps({"type": "image", "data_type": "uint8", "num_channels": 1, "scales": [scale]})
    )
    m = mount(root, "--max-file-size", "32M")
    pid = daemon_of(m.path).pid
    _, idle = peak_and_now_kib(pid)
    assert_eio(m.path / "s0" / "0-2048_0-2048_0-2048")
    assert "over --max-file-size 32.0 MiB" in m.log_text()
    peak, _ = peak_and_now_kib(pid)
    assert peak - idle < (64 + 32 + 32) << 10


def test_a_file_past_max_file_size_is_eio_naming_the_limit(tmp_path, mount) -> None:
    value = np.random.default_rng(4).bytes(3 << 20)
    root = kv_dataset(tmp_path / "kv", {1: _gzip(value), 2: _gzip(b"two")}, encoding="gzip")
    m = mount(root, "--max-file-size", "2M")
    assert_eio(m.path / "1")
    assert "over --max-file-size 2.0 MiB" in m.log_text() and "key 1" in m.log_text()
    assert read(m.path / "2") == b"two"
    assert read(mount(root).path / "1") == value  # the default cap is larger


def test_a_chunk_over_max_file_size_is_named_so_not_corrupt(tmp_path, mount) -> None:
    """tensorstore's gzip chunks of 128 KiB, mounted with `--max-file-size 64K`: EIO with a log line naming the
    limit and the option, counted by `shardfs stats` under its own figure, not as corrupt data (and `shardfs cat`
    says the same); the default cap serves the same chunk."""
    root, twin = tmp_path / "vol", tmp_path / "twin"
    peers.write_tensorstore_volume(root, size=(64, 64, 64), chunk=(64, 64, 32), voxel_offset=(0, 0, 0),
                                   extra_unsharded_scale=False, unsharded_twin=twin)  # fmt: skip
    scale = next(p.name for p in twin.iterdir() if p.is_dir())
    name = sorted(p.name for p in (twin / scale).iterdir())[0]
    m = mount(root, "--max-file-size", "64K")
    assert read(m.path / scale / name) == errno.EIO
    line = next(ln for ln in m.log_text().splitlines() if "level=error" in ln)
    assert "event=too_large" in line and f"path=/{scale}/{name}" in line, line
    assert "KiB, over --max-file-size 64.0 KiB; mount with a larger --max-file-size" in line
    assert "corrupt" not in m.log_text()
    stats = shardfs("stats", m.path).stdout
    eio = re.search(r"\(EIO (\d+)\); corrupt data: 0; over --max-file-size: (\d+)", stats)
    assert eio and eio[1] == eio[2] != "0", stats  # every EIO is one too large, none counted as corrupt
    cat = shardfs("cat", root, f"{scale}/{name}", "--max-file-size", "64K", check=False)  # the CLI says the same
    assert cat.returncode == 1 and "over --max-file-size 64.0 KiB" in cat.stderr and "corrupt" not in cat.stderr
    assert read(mount(root).path / scale / name) == (twin / scale / name).read_bytes()


def one_shard_spec(**overrides: object) -> dict:
    """One shard, one minishard, the identity hash: every key's place is plain to see."""
    return dict(peers.sharding_spec(preshift_bits=0, hash="identity", minishard_bits=0, shard_bits=0,
                                    minishard_index_encoding="raw", data_encoding="raw"), **overrides)  # fmt: skip


def test_a_volume_chunk_decodes_to_at_most_twice_its_raw_size(tmp_path, mount) -> None:
    """A 16³ uint8 chunk is 4096 bytes raw: its gzip may decode to 2 * 4096 + 64 KiB, one byte more is EIO
    naming that limit, far below `--max-file-size`. Keys are the compressed Morton codes of the grid (2, 1, 1)."""
    root = tmp_path / "vol"
    limit = 2 * 16**3 + 65536
    good = np.random.default_rng(6).bytes(16**3)
    kv_dataset(root / "s0", {0: _gzip(bytes(limit + 1)), 1: _gzip(good)}, encoding="gzip")
    spec = one_shard_spec(data_encoding="gzip")
    scale = {"key": "s0", "size": [32, 16, 16], "chunk_sizes": [[16, 16, 16]], "resolution": [1, 1, 1],
             "voxel_offset": [0, 0, 0], "encoding": "raw", "sharding": spec}  # fmt: skip
    (root / "info").write_text(
        json.dumps({"type": "image", "data_type": "uint8", "num_channels": 1, "scales": [scale]})
    )
    m = mount(root)
    assert peers.compressed_morton_code((1, 0, 0), (2, 1, 1)) == 1
    assert_eio(m.path / "s0" / "0-16_0-16_0-16")
    assert f"{limit}-byte limit" in m.log_text() and "key 0" in m.log_text()
    assert read(m.path / "s0" / "16-32_0-16_0-16") == good


def test_a_minishard_index_decodes_to_at_most_16_mib(tmp_path, mount) -> None:
    """A gzip minishard index of 18 MB of zeros (key 0, size 0, 750 000 times) is refused: EIO for its keys,
    while the other shard, its index written here by the spec, serves its key."""
    root = tmp_path / "kv"
    root.mkdir()
    spec = peers.sharding_spec(preshift_bits=0, hash="identity", minishard_bits=0, shard_bits=1,
                               minishard_index_encoding="gzip", data_encoding="raw")  # fmt: skip
    (root / "info").write_text(json.dumps({"sharding": spec}))
    bomb = _gzip(bytes(24 * 750_000))
    (root / "0.shard").write_bytes(struct.pack("<QQ", 0, len(bomb)) + bomb)
    table = _gzip(struct.pack("<3Q", 1, 0, 3))  # key 1 (delta from 0), at 0 after the previous chunk, 3 bytes
    (root / "1.shard").write_bytes(struct.pack("<QQ", 3, 3 + len(table)) + b"one" + table)
    m = mount(root)
    assert_eio(m.path / "0")
    assert f"{16 << 20}-byte limit" in m.log_text()
    assert read(m.path / "1") == b"one"


def mesh_manifest(fragment_bytes: int) -> bytes:
    """A one-LOD, one-fragment multi-resolution manifest by the spec's layout: chunk_shape, grid_origin,
    num_lods, lod_scales, vertex_offsets, num_fragments_per_lod, fragment_positions, fragment_offsets."""
    return struct.pack("<3f3fIf3fI3II", 64, 64, 32, 0, 0, 0, 1, 1.0, 0, 0, 0, 1, 0, 0, 0, fragment_bytes)


def test_mesh_fragments_never_reach_into_the_shard_index(tmp_path, mount) -> None:
    """Mesh 1 is the first value after the 16-byte shard index and claims 8 bytes of fragments before it:
    they would be the index's, so it is EIO. Mesh 2 claims the 64 bytes stored before it (mesh 1's manifest):
    those are served."""
    root = kv_dataset(tmp_path / "mesh", {1: mesh_manifest(8), 2: mesh_manifest(64)})
    info = {"@type": "neuroglancer_multilod_draco", "vertex_quantization_bits": 10,
            "transform": peers.MESH_TRANSFORM, "lod_scale_multiplier": 1.0, "sharding": one_shard_spec()}  # fmt: skip
    (root / "info").write_text(json.dumps(info))
    m = mount(root)
    assert_eio(m.path / "1")
    assert "overrun" in m.log_text() and "key 1" in m.log_text()
    assert read(m.path / "1.index") == mesh_manifest(8)
    assert read(m.path / "2") == mesh_manifest(8) and read(m.path / "2.index") == mesh_manifest(64)


# --- item 8: one bad shard never hides the others ------------------------------------------------------


@pytest.fixture
def capless_mount(tmp_path):
    """Mount as root without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH (as on NFS with root_squash): a shard
    of mode 000 is then EACCES to the daemon, as an unreadable disk file would be."""
    made = []

    def make(source: Path) -> Path:
        point = tmp_path / f"m{len(made)}"
        point.mkdir()
        drop = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]
        subprocess.run(
            [*drop, *SHARDFS, "mount", source, point, "--log-file", tmp_path / "log"], check=True, timeout=60
        )
        made.append(point)
        return point

    yield make
    for point in made:
        shardfs("unmount", point, check=False)


def test_an_unreadable_shard_is_skipped_by_listings(tmp_path, capless_mount) -> None:
    kv = tmp_path / "kv"
    expected = peers.write_tensorstore_kv(kv, values(5), sharding=TWO_SHARDS)
    (kv / "0.shard").chmod(0)
    m = capless_mount(kv)
    assert sorted(listing("ls", m), key=lambda n: (n == "info", int(n) if n.isdigit() else 0)) == [
        *map(str, range(1, 200, 2)), "info"]  # fmt: skip
    assert read(m / "1") == expected[1]
    assert read(m / "2") == errno.EACCES
    log = (tmp_path / "log").read_text()
    assert "listing skips a shard" in log and "0.shard" in log

    arr = tmp_path / "a.zarr"
    zarr.create_array(arr, shape=(8, 8), chunks=(2, 2), shards=(4, 4), dtype="u1")[...] = 3
    (arr / "c" / "0" / "1").chmod(0)
    m = capless_mount(arr)
    found = {os.path.relpath(p, m) for p in listing("find", m, "-type", "f")}
    assert found == {"zarr.json"} | {f"c/{i}/{j}" for i in range(4) for j in range(4) if not (i < 2 and j >= 2)}


# --- item 9: a malformed child never refuses the mount ---------------------------------------------------


@pytest.mark.parametrize("child", ["[" * 100_000 + "]" * 100_000, "{not json", '"x"' + " " * 10])
def test_a_malformed_child_is_served_as_stored(tmp_path, mount, child) -> None:
    root = tmp_path / "h.zarr"
    group = zarr.open_group(root, mode="w")
    group.create_array("good", shape=(8,), chunks=(2,), shards=(4,), dtype="u1")[...] = np.arange(8, dtype="u1")
    (root / "bad").mkdir()
    (root / "bad" / "zarr.json").write_text(child)
    m = mount(root)
    assert read(m.path / "bad" / "zarr.json") == child.encode()
    assert np.array_equal(zarr.open_array(m.path / "good", mode="r")[...], np.arange(8))
    assert (m.path / "good" / "c" / "3").exists()  # unsharded: inner chunk 3


@pytest.fixture(scope="module")
def segmentation(tmp_path_factory) -> tuple[Path, Path, dict[str, bytes], dict[int, bytes]]:
    """A sharded volume (tensorstore, with its unsharded twin) with sharded multi-resolution meshes and
    skeletons (cloud-volume) named by its root info."""
    root = tmp_path_factory.mktemp("seg")
    source, twin = root / "src", root / "twin"
    peers.write_tensorstore_volume(source, data_encoding="raw", unsharded_twin=twin, extra_unsharded_scale=False)
    volume_info = json.loads((source / "info").read_text())
    meshes = peers.write_cloudvolume_multires_meshes(source)
    skeletons = peers.write_cloudvolume_skeletons(source)
    (source / "info").write_text(json.dumps({**volume_info, "mesh": "mesh", "skeletons": "skeletons"}))
    return source, twin, meshes, skeletons


BROKEN_INFO = {  # how a sub-directory's info is broken: its bytes, and the reason the log gives
    "bad json": (b"{not json", "not valid JSON"),
    "too deep": (b"[" * 100_000 + b"]" * 100_000, "nested more than"),
    "too large": (b'{"@type": "neuroglancer_skeletons", "x": "', f"more than the {METADATA_LIMIT}-byte limit"),
    "wrong type": (b'{"@type": "neuroglancer_skeletons", "sharding": 5}', "field 'sharding' must be an object"),
}


@pytest.mark.parametrize("served", ["local", "http"])
@pytest.mark.parametrize("broken", BROKEN_INFO)
@pytest.mark.parametrize("sub", ["mesh", "skeletons"])
def test_a_broken_mesh_or_skeletons_info_is_served_as_stored(tmp_path, segmentation, sub, broken, served) -> None:
    """The dataset mounts; the broken directory passes through as stored; the other one and the volume
    read right; one warning in the daemon's log names the file and the reason (for a local source, planned
    before the daemon detaches, the mount command's stderr too)."""
    source, twin, meshes, skeletons = segmentation
    root, point, log = tmp_path / "src", tmp_path / "m", tmp_path / "log"
    shutil.copytree(source, root)
    point.mkdir()
    info, reason = BROKEN_INFO[broken]
    (root / sub / "info").write_bytes(info)
    if broken == "too large":
        os.truncate(root / sub / "info", METADATA_LIMIT + 1)
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(RangeServer(root).running()).url if served == "http" else root
        done = shardfs("mount", url, point, "--log-file", log)
        stack.callback(shardfs, "unmount", point)
        with (point / sub / "info").open("rb") as f:
            assert f.read(1 << 20) == (root / sub / "info").read_bytes()[: 1 << 20]  # passes through
        assert (point / sub / "info").stat().st_size == (root / sub / "info").stat().st_size
        for shard in (root / sub).glob("*.shard"):
            assert (point / sub / shard.name).read_bytes() == shard.read_bytes()
        other = {f"skeletons/{k}": v for k, v in skeletons.items()} if sub == "mesh" else {
            f"mesh/{k}": v for k, v in meshes.items()}  # fmt: skip
        assert all((point / name).read_bytes() == value for name, value in other.items())
        chunk = next((twin / "4_4_40").iterdir())
        assert (point / "4_4_40" / chunk.name).read_bytes() == chunk.read_bytes()
        said = [line for line in log.read_text().splitlines() if "served as it is stored" in line]
        assert len(said) == 1 and "level=warning" in said[0], said
        assert f"{sub}/info" in said[0] and reason in said[0], said
        if served == "local":  # planned before the daemon detached: the terminal was told too
            assert f"{sub}/info" in done.stderr and reason in done.stderr, done.stderr


def test_a_root_nested_too_deep_refuses_in_one_line(tmp_path) -> None:
    root = tmp_path / "deep.zarr"
    root.mkdir()
    (root / "zarr.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp_path / "m").mkdir()
    done = shardfs("mount", root, tmp_path / "m", check=False)
    assert done.returncode == 2 and "nested more than" in done.stderr and "zarr.json" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


# --- item 5: names that do not parse are absent, not bugs -----------------------------------------------

HOSTILE = ["18446744073709551616", "99999999999999999999999999999999", "-1", "01", "1" * 250, "+1", "1e3",
           "0x10", " 1", "1 ", "٣"]  # fmt: skip


def test_names_that_do_not_parse_are_enoent_without_a_bug_line(tmp_path, mount) -> None:
    vol, kv, arr = tmp_path / "vol", tmp_path / "kv", tmp_path / "a.zarr"
    peers.write_tensorstore_volume(vol, extra_unsharded_scale=False)
    peers.write_tensorstore_kv(kv, {1: b"one"}, sharding=TWO_SHARDS)
    zarr.create_array(arr, shape=(8, 8), chunks=(2, 2), shards=(4, 4), dtype="u1")[...] = 1
    names = {
        vol: [f"4_4_40/{n}" for n in (*HOSTILE, "0-16_0-16_0-99999999999999999999999", "-5-11_3-19_7-15_1")],
        kv: HOSTILE,
        arr: [f"c/{n}" for n in HOSTILE] + [f"c/0/{n}" for n in HOSTILE] + ["c/99999999999999999999999/0"],
    }
    for source, paths in names.items():
        m = mount(source)
        for path in paths:
            assert read(m.path / path) == errno.ENOENT, path
        assert "event=bug" not in m.log_text() and "Traceback" not in m.log_text(), m.log_text()[-2000:]
