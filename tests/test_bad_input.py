"""Corrupt input gives EIO for that file alone, with a log line naming shard and key; bad metadata refuses the mount."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tensorstore as ts

from tests import peers
from tests.conftest import assert_eio, shardfs

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


def write(root: Path, data: np.ndarray, sharding: dict | None) -> None:
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


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sharded volume; tensorstore writes the same data unsharded beside it, at `twin`."""
    where = tmp_path_factory.mktemp("bad")
    data = np.random.default_rng(0).integers(0, 255, (64, 64, 16, 1), dtype=np.uint8)
    write(where / "vol", data, SHARDING)
    write(where / "twin", data, None)
    return where / "vol"


def twin_chunk(pristine: Path, name: str) -> bytes:
    return (pristine.parent / "twin" / "1_1_1" / name).read_bytes()


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


@pytest.fixture
def corrupted(pristine: Path, tmp_path: Path):
    def make(damage: Callable[[Path], None]) -> Path:
        root = tmp_path / "vol"
        shutil.copytree(pristine, root)
        damage(root / "1_1_1")
        return root

    return make


def assert_healthy(mnt: Path, pristine: Path, names: list[str]) -> None:
    """Each chunk reads as tensorstore's unsharded twin holds it, byte for byte."""
    for name in names:
        assert (mnt / "1_1_1" / name).read_bytes() == twin_chunk(pristine, name), name


def assert_rest_healthy(mnt: Path, pristine: Path, pristine_chunks: dict, bad_shard: str) -> None:
    for shard, chunks in pristine_chunks.items():
        if shard != bad_shard:
            assert_healthy(mnt, pristine, [name for name, *_ in chunks])
    assert json.loads((mnt / "info").read_text())["scales"][0].get("sharding") is None


def test_truncated_shard(pristine, corrupted, mount) -> None:
    chunks = chunks_by_shard(pristine)
    root = corrupted(lambda d: (d / "0.shard").write_bytes((d / "0.shard").read_bytes()[:40]))
    m = mount(root)
    name, key, *_ = chunks["0.shard"][0]
    assert_eio(m.path / "1_1_1" / name)
    assert "1_1_1/0.shard" in m.log_text() and f"key {key}" in m.log_text()
    assert_rest_healthy(m.path, pristine, chunks, "0.shard")
    listed = sorted(os.listdir(m.path / "1_1_1"))
    assert listed == sorted(name for s, c in chunks.items() if s != "0.shard" for name, *_ in c)


def test_bad_gzip(pristine, corrupted, mount) -> None:
    chunks = chunks_by_shard(pristine)
    name, key, start, _ = chunks["1.shard"][0]

    def damage(d: Path) -> None:
        with open(d / "1.shard", "r+b") as f:
            f.seek(start + 12)
            f.write(b"\xff" * 16)

    m = mount(corrupted(damage))
    assert_eio(m.path / "1_1_1" / name)
    assert "1_1_1/1.shard" in m.log_text() and f"key {key}" in m.log_text()
    assert_healthy(m.path, pristine, [other for other, *_ in chunks["1.shard"][1:]])
    assert_rest_healthy(m.path, pristine, chunks, "1.shard")


def test_minishard_offsets_past_end_of_file(pristine, corrupted, mount) -> None:
    chunks = chunks_by_shard(pristine)

    def damage(d: Path) -> None:
        with open(d / "2.shard", "r+b") as f:
            f.write(struct.pack("<QQ", 0, 1 << 40))  # minishard 0's index now ends a terabyte in

    m = mount(corrupted(damage))
    in_minishard_0 = [c for c in chunks["2.shard"] if c[1] & 1 == 0]
    in_minishard_1 = [c for c in chunks["2.shard"] if c[1] & 1 == 1]
    assert in_minishard_0 and in_minishard_1
    for name, key, *_ in in_minishard_0:
        assert_eio(m.path / "1_1_1" / name)
        assert f"key {key}" in m.log_text()
    assert_healthy(m.path, pristine, [name for name, *_ in in_minishard_1])
    assert_rest_healthy(m.path, pristine, chunks, "2.shard")


def test_huge_size_field(pristine, corrupted, mount) -> None:
    chunks = chunks_by_shard(pristine)
    name, key, *_ = chunks["3.shard"][0]

    def damage(d: Path) -> None:
        data = bytearray((d / "3.shard").read_bytes())
        ms = key & 1
        start, stop = struct.unpack_from("<QQ", data, 16 * ms)
        table = np.frombuffer(data, "<u8", (stop - start) // 8, 32 + start).reshape(3, -1).copy()
        table[2, np.flatnonzero(np.cumsum(table[0]) == key)[0]] = 1 << 62  # a size of 4 EiB
        data[32 + start : 32 + stop] = table.tobytes()
        (d / "3.shard").write_bytes(bytes(data))

    m = mount(corrupted(damage))
    assert_eio(m.path / "1_1_1" / name)
    assert "1_1_1/3.shard" in m.log_text() and f"key {key}" in m.log_text()
    assert_rest_healthy(m.path, pristine, chunks, "3.shard")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda info: "{not json", r"info: not valid JSON"),
        (lambda info: {**info, "scales": "many"}, r"info: field 'scales' must be a non-empty list"),
        (
            lambda info: {**info, "scales": [{**info["scales"][0], "size": [64, "x", 16]}]},
            r"info: field 'scales\[0\]\.size' must be a list of 3 positive integers",
        ),
        (
            lambda info: {**info, "scales": [{**info["scales"][0], "sharding": {**SHARDING, "hash": "sha1"}}]},
            r"info: field 'scales\[0\]\.sharding': 'hash' must be",
        ),
        (lambda info: {**info, "@type": "something_else"}, r"info: field '@type' is 'something_else'"),
    ],
)
def test_bad_info_refuses_the_mount(pristine, tmp_path, edit, message) -> None:
    root = tmp_path / "vol"
    shutil.copytree(pristine, root)
    edited = edit(json.loads((root / "info").read_text()))
    (root / "info").write_text(edited if isinstance(edited, str) else json.dumps(edited))
    (tmp_path / "mnt").mkdir()
    result = shardfs("mount", root, tmp_path / "mnt", check=False)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(root / "info") in lines[0], result.stderr
    assert re.search(message, lines[0]), lines[0]
    assert not os.path.ismount(tmp_path / "mnt")


def test_missing_shard_means_absent_chunks(pristine, corrupted, mount) -> None:
    chunks = chunks_by_shard(pristine)
    m = mount(corrupted(lambda d: (d / "1.shard").unlink()))
    for name, *_ in chunks["1.shard"]:
        assert not (m.path / "1_1_1" / name).exists()
    assert_rest_healthy(m.path, pristine, chunks, "1.shard")
