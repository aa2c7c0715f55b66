"""`shardfs check`: every shard index read, chunks counted exactly, each corrupt shard named, exit 1 for any.

Datasets come from the peers' writers (tensorstore, cloud-volume, zarr-python 3); corruption is done as in
test_bad_input and test_zarr, whose fixtures are reused, and always through the CLI in a subprocess."""

from __future__ import annotations

import fcntl
import json
import math
import os
import pty
import struct
import subprocess
import termios
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.codecs import BytesCodec, GzipCodec, ShardingCodec

from tests.support import peers
from tests.support.cli import SHARDFS, shardfs
from tests.support.datasets import chunks_by_shard, innermost, rewrite_index
from tests.support.peers import kv_dataset


def run_check(root: Path) -> tuple[int, list[str], str]:
    done = shardfs("check", root, check=False)
    return done.returncode, done.stdout.splitlines(), done.stderr


def line_of(lines: list[str], directory: str) -> str:
    return next(line for line in lines if line.startswith(f"{directory}/: "))


# ---------------------------------------------------------------------------------------------------------------------
# Sound datasets: exact counts, exit 0, nothing on stderr when it is not a terminal


def test_sound_precomputed(pristine) -> None:
    assert sum(len(c) for c in chunks_by_shard(pristine).values()) == 16  # 64x64x16 voxels in 16^3 chunks
    code, lines, err = run_check(pristine)
    assert code == 0, lines
    assert lines == [
        "1_1_1/: volume scale: 4 shard files, 16 chunks, 0 corrupt",
        "OK: 1 sharded directory, 4 shard files, 16 chunks, 0 corrupt",
    ]
    assert err == ""  # no progress bar: stderr is not a terminal


PEER_DATASETS: dict[str, tuple[Callable[[Path], Any], Callable[[Any], dict[str, tuple[int | None, int]]]]] = {
    # name: (writer, what it returned -> {directory: (shard files, chunks)})
    "volume, gzip minishard indexes": (peers.write_tensorstore_volume, lambda _: {"4_4_40": (4, 5 * 4 * 5)}),
    "annotations": (
        peers.write_tensorstore_annotations,
        lambda written: {
            part: (None, sum(1 for path in written if path.startswith(f"{part}/")))
            for part in ("by_id", "segments", "spatial0")
        },
    ),
    "skeletons": (peers.write_cloudvolume_skeletons, lambda written: {"skeletons": (2, len(written))}),
    "meshes": (peers.write_cloudvolume_multires_meshes, lambda written: {"mesh": (2, len(written) // 2)}),
}


@pytest.mark.parametrize("name", PEER_DATASETS)
def test_sound_peer_datasets(tmp_path, name) -> None:
    write, expect = PEER_DATASETS[name]
    expected = expect(write(tmp_path / "src"))
    code, lines, _ = run_check(tmp_path / "src")
    assert code == 0, lines
    for directory, (shards, chunks) in expected.items():
        line = line_of(lines, directory)
        assert line.endswith(f", {chunks} chunks, 0 corrupt"), line
        if shards is not None:
            assert f": {shards} shard files," in line, line
    assert lines[-1].startswith("OK: ") and f"{sum(c for _, c in expected.values())} chunks" in lines[-1]


def written_chunks(array: zarr.Array) -> int:
    """Inner chunks holding data: test_zarr's writer fills the first two thirds of each dimension."""
    written = [max(1, s * 2 // 3) for s in array.shape]
    return math.prod(-(-w // c) for w, c in zip(written, innermost(array), strict=True))


def test_sound_zarr(zarr_source) -> None:
    root, contents = zarr_source
    code, lines, err = run_check(root)
    assert code == 0, lines
    sharded = [name for name in contents if name != "plain_unsharded"]  # not sharded: nothing to check
    expected = {name: written_chunks(zarr.open_array(root / name, mode="r")) for name in sharded}
    assert expected["gzip"] == 45 and expected["nested"] == 36 and expected["raw"] == 16  # as test_listing_is_exact
    for name, chunks in expected.items():
        assert line_of(lines, name).endswith(f", {chunks} chunks, 0 corrupt"), name
    assert not any(line.startswith("plain_unsharded") for line in lines)
    assert lines[-1] == f"OK: 10 sharded directories, 40 shard files, {sum(expected.values())} chunks, 0 corrupt"
    assert err == ""


# ---------------------------------------------------------------------------------------------------------------------
# Corrupt precomputed shards: named, with what is wrong; the other shards still counted


def edit_shard_index(shard: str, minishard: int, edit: Callable[[int, int], tuple[int, int]]) -> Callable[[Path], None]:
    def damage(d: Path) -> None:
        with open(d / shard, "r+b") as f:
            f.seek(16 * minishard)
            start, stop = struct.unpack("<QQ", f.read(16))
            f.seek(16 * minishard)
            f.write(struct.pack("<QQ", *edit(start, stop)))

    return damage


def edit_minishard_index(shard: str, minishard: int, edit: Callable[[np.ndarray], None]) -> Callable[[Path], None]:
    """Edit the decoded (raw) rows of one minishard index in place: keys, offsets, sizes."""

    def damage(d: Path) -> None:
        data = bytearray((d / shard).read_bytes())
        start, stop = struct.unpack_from("<QQ", data, 16 * minishard)
        table = np.frombuffer(data, "<u8", (stop - start) // 8, 32 + start).reshape(3, -1).copy()
        edit(table)
        data[32 + start : 32 + stop] = table.tobytes()
        (d / shard).write_bytes(bytes(data))

    return damage


def bump(table: np.ndarray, row: int, by: int) -> None:
    table[row, 0] += np.uint64(by)


CORRUPTIONS = {
    # name: (damage to 1_1_1/, shard named, minishard lost (None: the whole shard), what the line says)
    "truncated minishard index": (
        edit_shard_index("2.shard", 0, lambda start, stop: (start, stop - 1)),
        "2.shard", 0, "minishard 0 index: minishard index is 47 bytes, not a multiple of 24",
    ),
    "minishard index past the end": (
        edit_shard_index("2.shard", 0, lambda start, stop: (0, 1 << 40)),
        "2.shard", 0, "minishard 0 index range [32, 1099511627808) lies outside the file",
    ),
    "truncated shard index": (
        lambda d: (d / "0.shard").write_bytes((d / "0.shard").read_bytes()[:20]),
        "0.shard", None, "file is 20 bytes, shorter than its 32-byte shard index",
    ),
    "keys in the wrong minishard": (
        edit_minishard_index("1.shard", 1, lambda t: bump(t, 0, 1)),  # every key of minishard 1 now even
        "1.shard", 1, "is in minishard 1, but its hash puts it in minishard 0 of shard 2",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", CORRUPTIONS)
def test_corrupt_precomputed_shard(pristine, corrupted, case) -> None:
    damage, shard, minishard, message = CORRUPTIONS[case]
    lost = [c for c in chunks_by_shard(pristine)[shard] if minishard is None or c[1] & 1 == minishard]
    assert lost
    code, lines, err = run_check(corrupted(damage))
    assert code == 1, lines
    assert lines[0] == f"1_1_1/: volume scale: 4 shard files, {16 - len(lost)} chunks, 1 corrupt"
    assert lines[1].startswith(f"  1_1_1/{shard}: ") and message in lines[1], lines[1]
    assert lines[-1] == f"CORRUPT: 1 sharded directory, 4 shard files, {16 - len(lost)} chunks, 1 corrupt"
    assert len(lines) == 3 and err == ""


def test_chunk_past_end_of_file(pristine, corrupted) -> None:
    _, key, *_ = chunks_by_shard(pristine)["3.shard"][0]
    # Each chunk starts where the one before it ends, so the chunks after it in its minishard move out too.
    lost = [k for _, k, *_ in chunks_by_shard(pristine)["3.shard"] if k & 1 == key & 1 and k >= key]

    def huge(table: np.ndarray) -> None:
        table[2, np.flatnonzero(np.cumsum(table[0]) == key)[0]] = 1 << 62  # a size of 4 EiB, as test_bad_input does

    code, lines, _ = run_check(corrupted(edit_minishard_index("3.shard", key & 1, huge)))
    assert code == 1
    assert lines[0] == f"1_1_1/: volume scale: 4 shard files, {16 - len(lost)} chunks, 1 corrupt"
    assert lines[1].startswith(f"  1_1_1/3.shard: chunk {key} data range [") and "lies outside the file" in lines[1]


def test_bad_gzip_minishard_index_and_two_corrupt_shards(tmp_path) -> None:
    """tensorstore's gzip minishard indexes: garbage in one must not decode; two shards, two lines."""
    peers.write_tensorstore_volume(tmp_path / "src")
    shards = sorted((tmp_path / "src" / "4_4_40").glob("*.shard"))
    for path in shards[:2]:
        data = bytearray(path.read_bytes())
        start, stop = next((a, b) for a, b in np.frombuffer(data, "<u8", 8).reshape(4, 2).tolist() if a != b)
        data[64 + start + 10 : 64 + stop] = bytes(stop - start - 10)  # past the gzip header: the stream is zeros
        path.write_bytes(bytes(data))
    code, lines, _ = run_check(tmp_path / "src")
    assert code == 1
    bad = [line for line in lines if line.startswith("  ")]
    assert [line.split(":")[0].strip() for line in bad] == [f"4_4_40/{p.name}" for p in shards[:2]]
    assert all("gzip" in line for line in bad), bad
    assert line_of(lines, "4_4_40").endswith(", 2 corrupt") and lines[-1].startswith("CORRUPT: ")


# ---------------------------------------------------------------------------------------------------------------------
# Corrupt zarr shards, and arrays shardfs serves as stored


def test_zarr_index_byte_flipped(zarr_source, damaged) -> None:
    def edit(root: Path) -> None:
        data = bytearray((root / "raw/c/1/0").read_bytes())
        data[-5] ^= 0x01  # the last byte of the index table, under its crc32c
        (root / "raw/c/1/0").write_bytes(bytes(data))

    code, lines, _ = run_check(damaged(edit))
    assert code == 1
    assert line_of(lines, "raw") == "raw/: zarr v3 sharded array: 4 shard files, 12 chunks, 1 corrupt"  # 16 less 2x2
    assert "  raw/c/1/0: level 0 index: shard index checksum (crc32c) does not match" in lines
    assert line_of(lines, "gzip").endswith(", 45 chunks, 0 corrupt")  # other arrays untouched
    assert sum(line.startswith("  ") for line in lines) == 1
    assert lines[-1].startswith("CORRUPT: 10 sharded directories, 40 shard files, ")
    assert lines[-1].endswith(", 1 corrupt")


def test_zarr_entry_past_end_of_file(zarr_source, damaged) -> None:
    """A sound index (crc32c matches) pointing outside the file: listing shows the chunk, check reports it."""
    root = damaged(lambda r: rewrite_index(r / "raw/c/0/0", lambda t: t.__setitem__((1, 0), 1 << 40), cps=2 * 2))
    code, lines, _ = run_check(root)
    assert code == 1
    assert "  raw/c/0/0: chunk at [0, 6]: index entry [1099511627776, +30) lies outside the shard" in lines
    assert "1" in shardfs("ls", root, "raw/c/0").stdout.split()  # the mount still lists it (its read is EIO)


def test_refused_arrays_are_listed_not_checked(zarr_source, damaged) -> None:
    def edit(root: Path) -> None:
        meta = json.loads((root / "zstd" / "zarr.json").read_text())
        meta["codecs"] = ["sharding_indexed"]  # no configuration: shardfs cannot present it, so serves it as stored
        (root / "zstd" / "zarr.json").write_text(json.dumps(meta))
        (root / "blosc" / "zarr.json").write_text("{not json")

    code, lines, _ = run_check(damaged(edit))
    assert code == 0  # served as stored, not corrupt
    refused = [line for line in lines if line.startswith("not checked: ")]
    assert len(refused) == 2 and any("blosc/zarr.json: not valid JSON" in line for line in refused), refused
    assert not any(line.startswith(("zstd/", "blosc/")) for line in lines)
    assert lines[-1].startswith("OK: 8 sharded directories, 32 shard files, ")
    assert lines[-1].endswith(", 0 corrupt, 2 not checked (served as stored)")


def test_a_precomputed_directory_served_as_stored_is_listed_not_checked(tmp_path) -> None:
    """As a zarr array shardfs cannot present: a mesh directory whose info cannot be read is served as stored,
    counted as not checked, and the rest of the dataset checked."""
    peers.write_cloudvolume_multires_meshes(tmp_path / "src")
    (tmp_path / "src" / "mesh" / "info").write_text("{not json")
    code, lines, _ = run_check(tmp_path / "src")
    assert code == 0  # served as stored, not corrupt
    refused = [line for line in lines if line.startswith("not checked: ")]
    assert len(refused) == 1 and "mesh/info" in refused[0], lines
    assert not any(line.startswith("mesh/") for line in lines)
    assert lines[-1].endswith(", 0 corrupt, 1 not checked (served as stored)")


# ---------------------------------------------------------------------------------------------------------------------
# The progress bar: on a terminal only, and never in the report


def test_progress_bar_on_a_terminal_only(pristine) -> None:
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a new pty is 0 columns wide
    try:
        done = subprocess.run(
            [*SHARDFS, "check", pristine], stdout=subprocess.PIPE, stderr=follower, text=True, timeout=60, check=False
        )
        os.close(follower)
        bar = b""
        while True:
            try:
                piece = os.read(leader, 4096)
            except OSError:  # EIO: the terminal's other end is closed and drained
                break
            if not piece:
                break
            bar += piece
    finally:
        os.close(leader)
    assert done.returncode == 0
    assert "1_1_1: 100%" in bar.decode() and "4/4" in bar.decode(), bar
    assert done.stdout == shardfs("check", pristine).stdout  # the report is the same with or without the bar


def test_special_file_where_a_shard_should_be(tmp_path) -> None:
    """A FIFO named like a shard is not part of the dataset, as the mount sees it (its keys are absent): never
    opened, so the check is prompt, and not counted."""
    root = kv_dataset(tmp_path / "kv", {1: b"x"})
    (root / "0.shard").unlink()
    os.mkfifo(root / "0.shard")
    code, lines, _ = run_check(root)
    assert code == 0
    assert lines == [
        "./: sharded key-value directory: 0 shard files, 0 chunks, 0 corrupt",
        "OK: 1 sharded directory, 0 shard files, 0 chunks, 0 corrupt",
    ]


def test_check_deep_decodes_every_chunk(tmp_path) -> None:
    """An index can be sound while a chunk's data is not: plain `check` passes, `--deep` names the chunk."""
    root = tmp_path / "img.zarr"
    array = zarr.create_array(
        root, shape=(40, 40), chunks=(20, 20), dtype="uint16", fill_value=0,
        serializer=ShardingCodec(chunk_shape=(10, 10), codecs=[BytesCodec(), GzipCodec()]), compressors=None,
    )  # fmt: skip
    array[...] = np.arange(1600, dtype=np.uint16).reshape(40, 40)
    shard = root / "c" / "1" / "0"
    data = bytearray(shard.read_bytes())
    offset, nbytes = np.frombuffer(data, "<u8", 2, len(data) - 4 - 4 * 16)  # the first inner chunk's entry
    data[int(offset) + int(nbytes) // 2] ^= 0xFF  # inside its deflate stream: gzip's own crc32 catches it
    shard.write_bytes(bytes(data))
    shallow = shardfs("check", root, check=False)
    assert shallow.returncode == 0, shallow.stdout
    deep = shardfs("check", "--deep", root, check=False)
    assert deep.returncode == 1, deep.stdout
    assert "  ./chunk [2, 0]: does not decode:" in deep.stdout, deep.stdout
    assert deep.stdout.splitlines()[-1].endswith("0 corrupt, 1 chunk(s) that do not decode")


def test_check_says_each_warning_once(tmp_path) -> None:
    root = tmp_path / "typo.zarr"
    zarr.create_array(root, shape=(4,), chunks=(2,), dtype="uint8")
    meta = (root / "zarr.json").read_text().replace('"bytes"', '"bytez"')
    (root / "zarr.json").write_text(meta)
    done = shardfs("check", root, check=False)
    assert done.stdout.count("unknown codec(s) ['bytez']") == 1, done.stdout  # in the report, which says it
    assert "bytez" not in done.stderr, done.stderr
