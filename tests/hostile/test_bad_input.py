"""Corrupt input gives EIO for that file alone, with a log line naming shard and key; bad metadata refuses the mount."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from tests.support.cli import shardfs
from tests.support.datasets import SHARDING, chunks_by_shard
from tests.support.reading import assert_eio

pytestmark = [pytest.mark.kernel]


def twin_chunk(pristine: Path, name: str) -> bytes:
    return (pristine.parent / "twin" / "1_1_1" / name).read_bytes()


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


@pytest.mark.parametrize("how", ["rewritten", "deleted"])
def test_a_source_deleted_or_rewritten_under_the_mount_is_eio_never_fill_values(tmp_path, mount, how) -> None:
    """zarr-python's open_group(mode='w') removes the directory and writes it again: a mount of the old one
    must not show the array as absent chunks (zarr-python would read zeros without an error). Reads that find
    nothing fail EIO, with one log line saying what happened and what to do; a remount serves the new data."""
    import zarr

    root = tmp_path / "brain.zarr"

    def write(value: int) -> np.ndarray:
        data = np.full((16, 16), value, dtype="uint16")
        group = zarr.open_group(root, mode="w", zarr_format=3)
        group.create_array("raw", shape=data.shape, dtype=data.dtype, chunks=(4, 4), shards=(8, 8))[...] = data
        return data

    first = write(7)
    m = mount(root)
    array = zarr.open_array(m.path / "raw", mode="r")
    assert np.array_equal(array[:8, :8], first[:8, :8])  # one shard read: the rest is cold
    if how == "rewritten":
        write(9)
    else:
        shutil.rmtree(root)
    with pytest.raises(OSError) as e:
        zarr.open_array(m.path / "raw", mode="r")[8:, 8:]
    assert e.value.errno == errno.EIO or "Input/output error" in str(e.value), e.value
    assert_eio(m.path / "raw" / "c" / "3" / "3")
    said = [line for line in m.log_text().splitlines() if "event=source_gone" in line]
    assert len(said) == 1 and "unmount and mount again" in said[0], m.log_text()
    if how == "rewritten":
        again = mount(root)
        assert np.array_equal(zarr.open_array(again.path / "raw", mode="r")[...], np.full((16, 16), 9, "uint16"))
