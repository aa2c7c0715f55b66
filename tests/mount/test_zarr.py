"""Zarr v3 sharded arrays written by zarr-python 3 and tensorstore, mounted, and read back through the
kernel by the same peers as unsharded arrays; index maths on synthetic shards; corrupt input."""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import numcodecs
import numpy as np
import pytest
import tensorstore as ts
import zarr
import zarr.codecs.numcodecs
from google_crc32c import value as crc32c
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, GzipCodec, ShardingCodec, TransposeCodec, ZstdCodec

from shardfs.codecs import UNDO
from shardfs.errors import Unsupported
from shardfs.formats.zarr_codecs import unshard
from shardfs.shards.zarr import EMPTY, ChunkKeys, IndexLayout
from tests.support import peers
from tests.support.cli import shardfs
from tests.support.datasets import innermost, rewrite_index
from tests.support.reading import assert_eio

pytestmark = [pytest.mark.kernel]


# ---------------------------------------------------------------------------------------------------------------------
# Index maths


def index_bytes(rows: list[tuple[int, int]], checksum: bool = True, big: bool = False) -> bytes:
    table = np.array(rows, dtype=">u8" if big else "<u8").tobytes()
    return table + (struct.pack("<I", crc32c(table)) if checksum else b"")


def test_index_at_end_and_start() -> None:
    layout = IndexLayout((2, 2))
    assert layout.size == 4 * 16 + 4
    assert layout.where(1000) == (1000 - 68, 1000)
    assert IndexLayout((2, 2), at_start=True).where(1000) == (0, 68)
    with pytest.raises(ValueError, match="shorter than its 68-byte index"):
        layout.where(67)


def test_index_checksum_and_empty_entries() -> None:
    layout = IndexLayout((3,))
    raw = index_bytes([(0, 10), (EMPTY, EMPTY), (10, 5)])
    table = layout.decode(raw)
    assert [layout.entry(table, i) for i in range(3)] == [(0, 10), None, (10, 5)]
    assert layout.present(table)[1].tolist() == [[0], [2]]
    bad = bytearray(raw)
    bad[3] ^= 1
    with pytest.raises(ValueError, match="checksum"):
        layout.decode(bytes(bad))
    one = IndexLayout((1,), checksum=False)
    assert one.entry(one.decode(index_bytes([(EMPTY, 3)], checksum=False)), 0) == (
        EMPTY,
        3,
    )  # only both fields mark empty


def test_big_endian_index_and_c_order() -> None:
    layout = IndexLayout((2, 3), checksum=False, big_endian=True)
    table = layout.decode(index_bytes([(i, i + 1) for i in range(6)], checksum=False, big=True))
    assert layout.entry(table, 1 * 3 + 2) == (5, 6)  # C order: (1, 2) in a (2, 3) shard
    assert layout.present(table)[1].tolist() == [[i, j] for i in range(2) for j in range(3)]


def test_shard_codecs_are_bounded() -> None:
    """Whole-shard codecs are undone with a limit: a bomb is refused, not allocated."""
    zeros = bytes(8 << 20)
    for name, encode in [("zstd", numcodecs.Zstd().encode), ("blosc", numcodecs.Blosc().encode)]:
        assert UNDO[name](encode(b"hello"), 100) == b"hello"
        with pytest.raises(ValueError, match="limit"):
            UNDO[name](encode(zeros), 1 << 20)
    two_frames = numcodecs.Zstd().encode(b"hello ") + numcodecs.Zstd().encode(b"world")
    assert UNDO["zstd"](two_frames, 100) == b"hello world"
    corrupt = {"gzip": b"\x1f\x8b" + bytes(20), "zstd": b"\x28\xb5\x2f\xfd\xff\xff" + bytes(20), "blosc": bytes(20)}
    for name, data in corrupt.items():
        with pytest.raises(ValueError):
            UNDO[name](data, 100)
    data = b"payload"
    assert UNDO["crc32c"](data + struct.pack("<I", crc32c(data)), 100) == data
    with pytest.raises(ValueError, match="crc32c"):
        UNDO["crc32c"](data + b"\0\0\0\0", 100)


def sharding(inner: list[int], codecs: list, **config: object) -> dict:
    return {"name": "sharding_indexed", "configuration": {"chunk_shape": inner, "codecs": codecs, **config}}


def test_unshard_nested_levels_and_post_codecs() -> None:
    inner = [{"name": "bytes"}, {"name": "gzip"}]
    codecs = [sharding([8, 8], [sharding([4, 2], inner), {"name": "zstd"}], index_location="start"), {"name": "zstd"}]
    levels, innermost = unshard(codecs, (16, 16))
    assert [lv.inner for lv in levels] == [(8, 8), (4, 2)]
    assert [lv.post for lv in levels] == [("zstd",), ("zstd",)]
    assert levels[0].layout.at_start and not levels[1].layout.at_start
    assert levels[1].layout.chunks_per_shard == (2, 4)
    assert innermost == inner
    assert unshard([{"name": "bytes"}, {"name": "gzip"}], (4,)) is None


@pytest.mark.parametrize(
    ("codecs", "message"),
    [
        ([{"name": "transpose"}, sharding([2, 2], [{"name": "bytes"}])], "array→array"),
        ([sharding([3, 2], [{"name": "bytes"}])], "does not divide"),
        ([sharding([2, 2], [{"name": "bytes"}]), {"name": "lz4"}], "lz4"),
        ([sharding([2, 2], [{"name": "bytes"}], index_codecs=[{"name": "bytes"}, {"name": "zstd"}])], "index_codecs"),
    ],
)
def test_unshard_refuses_what_it_cannot_present(codecs: list, message: str) -> None:
    with pytest.raises(Unsupported, match=message):
        unshard(codecs, (4, 4))


def test_chunk_keys() -> None:
    default = ChunkKeys.from_json({"name": "default"}, 3)
    assert default.key((1, 2, 3)) == "c/1/2/3"
    assert default.parse("c/1/2/3") == ((1, 2, 3), True)
    assert default.parse("c/1") == ((1,), False)
    assert [default.parse(r) for r in ("c/1/2/03", "d/1/2/3", "c/1/2/3/4", "c/-1/2/3")] == [None] * 4
    dotted = ChunkKeys.from_json({"name": "default", "configuration": {"separator": "."}}, 2)
    assert dotted.key((4, 5)) == "c.4.5" and dotted.parse("c.4.5") == ((4, 5), True) and dotted.parse("c.4") is None
    v2 = ChunkKeys.from_json({"name": "v2"}, 2)
    assert v2.key((4, 5)) == "4.5" and v2.parse("4.5") == ((4, 5), True) and v2.owns("4.5") and not v2.owns("zarr.json")
    assert ChunkKeys.from_json({"name": "v2"}, 0).key(()) == "0"
    assert ChunkKeys.from_json(None, 0).key(()) == "c"


# ---------------------------------------------------------------------------------------------------------------------
# Real writers, real readers, through the kernel


def test_zarr_python_reads_the_mount_as_unsharded(zarr_source, mount) -> None:
    root, contents = zarr_source
    m = mount(root)
    group = zarr.open_group(m.path, mode="r")
    assert group.attrs["note"] == "kept"
    for name, expected in contents.items():
        array = group[name]
        assert array.shards is None, name
        source = zarr.open_array(root / name, mode="r")
        assert array.chunks == (source.chunks if name == "plain_unsharded" else innermost(source)), name
        assert np.array_equal(array[...], expected), name
        meta = json.loads((m.path / name / "zarr.json").read_text())
        assert "sharding_indexed" not in json.dumps(meta["codecs"]), name


def test_tensorstore_reads_the_mount_as_unsharded(zarr_source, mount) -> None:
    root, contents = zarr_source
    m = mount(root)
    for name, expected in contents.items():
        array = ts.open({"driver": "zarr3", "kvstore": f"file://{m.path / name}"}).result()
        assert np.array_equal(array.read().result(), expected), name


def test_inner_chunk_files_are_the_stored_bytes(zarr_source, mount, tmp_path) -> None:
    """The raw case against zarr-python's own unsharded array with the same inner chunks and codecs."""
    root, contents = zarr_source
    m = mount(root)
    twin = zarr.create_array(tmp_path / "twin", shape=(30, 30), dtype="uint8", chunks=(5, 6), compressors=None)
    twin[:20, :20] = contents["raw"][:20, :20]
    mounted = {str(p.relative_to(m.path / "raw")) for p in (m.path / "raw").rglob("*") if p.is_file()}
    written = {str(p.relative_to(tmp_path / "twin")) for p in (tmp_path / "twin").rglob("*") if p.is_file()}
    assert mounted - {"zarr.json"} == written - {"zarr.json"} and len(written) > 10
    for rel in written - {"zarr.json"}:
        assert (m.path / "raw" / rel).read_bytes() == (tmp_path / "twin" / rel).read_bytes(), rel


def test_listing_is_exact(zarr_source, mount) -> None:
    m = mount(zarr_source[0])
    # gzip: (50, 37) in (4, 5) chunks, [:33, :24] written, so rows 0-8 and columns 0-4 hold data;
    # shards of (16, 10) cover rows 0-11 of them, so rows 9-11 have a shard file but no chunk.
    rows = sorted(os.listdir(m.path / "gzip" / "c"), key=int)
    assert rows == [str(i) for i in range(9)]
    assert sorted(os.listdir(m.path / "gzip" / "c" / "0"), key=int) == [str(j) for j in range(5)]
    for absent in ("c/9", "c/0/5", "c/13", "c/0/0/0"):  # empty row, fill value, past the edge, too deep
        assert not (m.path / "gzip" / absent).exists(), absent
    v2 = sorted(os.listdir(m.path / "v2_keys"))
    assert v2 == sorted(["zarr.json", *(f"{i}.{j}" for i in range(3) for j in range(4))])  # [:12, :15] written
    walked = sum(len(files) for _, _, files in os.walk(m.path / "nested"))
    assert walked == 1 + 6 * 6  # zarr.json + the written (5, 5) chunks of [:26, :30]


def test_tensorstore_zarr3_sharded(tmp_path, mount) -> None:
    root = tmp_path / "ts.zarr"
    little = {"name": "bytes", "configuration": {"endian": "little"}}
    written = peers.create_tensorstore_zarr3(
        root, [70, 33, 9], "uint16", [32, 16, 9], [8, 8, 3],
        codecs=[little, {"name": "zstd"}], index_codecs=[little, {"name": "crc32c"}],
    )  # fmt: skip
    data = np.random.default_rng(1).integers(0, 60000, written.shape, dtype=np.uint16)
    written[...] = data
    m = mount(root)
    back = ts.open({"driver": "zarr3", "kvstore": f"file://{m.path}"}).result()
    assert back.chunk_layout.read_chunk.shape == (8, 8, 3)
    assert np.array_equal(back.read().result(), data)
    assert np.array_equal(zarr.open_array(m.path, mode="r")[...], data)


# ---------------------------------------------------------------------------------------------------------------------
# Bad input


def assert_healthy(mnt: Path, contents: dict, *skip: str) -> None:
    for name, expected in contents.items():
        if name not in skip:
            assert np.array_equal(zarr.open_array(mnt / name, mode="r")[...], expected), name


def test_truncated_shard(zarr_source, damaged, mount) -> None:
    shard = Path("gzip/c/0/0")
    m = mount(damaged(lambda r: (r / shard).write_bytes((r / shard).read_bytes()[:10])))
    assert_eio(m.path / "gzip/c/0/0")
    assert "gzip/c/0/0" in m.log_text()
    assert len((m.path / "gzip/c/4/0").read_bytes()) > 0  # another shard of the same array
    assert_healthy(m.path, zarr_source[1], "gzip")


def test_index_offset_past_end_of_file(zarr_source, damaged, mount) -> None:
    def edit(root: Path) -> None:
        rewrite_index(root / "raw/c/0/0", lambda t: t.__setitem__((0, 0), 1 << 40), cps=2 * 2)

    m = mount(damaged(edit))
    assert_eio(m.path / "raw/c/0/0")
    assert "raw/c/0/0" in m.log_text()
    assert len((m.path / "raw/c/0/1").read_bytes()) == 5 * 6  # same shard, intact entry
    assert_healthy(m.path, zarr_source[1], "raw")


def test_crc_mismatch(zarr_source, damaged, mount) -> None:
    def edit(root: Path) -> None:
        data = bytearray((root / "raw/c/1/0").read_bytes())
        data[-1] ^= 0xFF  # the crc32c after the index
        (root / "raw/c/1/0").write_bytes(bytes(data))

    m = mount(damaged(edit))
    for chunk in ("raw/c/2/0", "raw/c/3/1"):
        assert_eio(m.path / chunk)
    assert "checksum" in m.log_text() and "raw/c/1/0" in m.log_text()
    assert len((m.path / "raw/c/0/0").read_bytes()) == 5 * 6
    assert_healthy(m.path, zarr_source[1], "raw")


def test_malformed_zarr_json(zarr_source, damaged, mount, tmp_path) -> None:
    root = damaged(lambda r: (r / "zstd" / "zarr.json").write_text("{not json"))
    m = mount(root)
    assert (m.path / "zstd" / "zarr.json").read_text() == "{not json"  # served as it is stored
    assert_healthy(m.path, zarr_source[1], "zstd")
    assert "zstd/zarr.json: not valid JSON" in shardfs("info", root).stdout
    (root / "zarr.json").write_text('{"zarr_format": 3, "node_type": "grup"}')
    (tmp_path / "mnt").mkdir()
    refused = shardfs("mount", root, tmp_path / "mnt", check=False)
    assert refused.returncode == 2
    assert (
        refused.stderr.strip()
        == f"shardfs: {root / 'zarr.json'}: field 'node_type' must be 'group' or 'array', not 'grup'"
    )


@pytest.mark.parametrize("fill", [2**64, -(2**64), -1])
def test_a_fill_value_its_type_cannot_hold_keeps_the_array_from_the_views_only(
    zarr_source, damaged, mount, fill
) -> None:
    """An integer array whose fill value its type cannot hold (numpy raises OverflowError making one; hypothesis
    found the mount failing on it): natively every array is served, in a view that array is left out with its
    reason in `shardfs info`, and every other array is shown."""

    def edit(root: Path) -> None:
        meta = json.loads((root / "whole_shard_zstd" / "zarr.json").read_text())
        meta["data_type"], meta["fill_value"] = "uint16" if fill == -1 else "int32", fill
        (root / "whole_shard_zstd" / "zarr.json").write_text(json.dumps(meta))

    root = damaged(edit)
    assert_healthy(mount(root).path, zarr_source[1], "whole_shard_zstd")
    said = [line for line in shardfs("info", root).stdout.splitlines() if "whole_shard_zstd" in line]
    assert any(f"fill_value {fill} is out of range" in line for line in said), said
    shown = mount(root, "--view", "zarr2").path
    assert not (shown / "whole_shard_zstd" / ".zarray").exists()
    assert all((shown / name / ".zarray").exists() for name in zarr_source[1] if name != "whole_shard_zstd")


# ---------------------------------------------------------------------------------------------------------------------
# Cases a review found


def test_nested_shards_with_codecs_between_levels(tmp_path, mount) -> None:
    """Inner shards that are each zstd-compressed decode to blobs of equal length: they must not be taken
    for one another (the cache once keyed them by offsets inside the decoded bytes)."""
    serializer = ShardingCodec(chunk_shape=(4,), codecs=[ShardingCodec(chunk_shape=(2,)), ZstdCodec()])
    array = zarr.create_array(
        tmp_path / "a", shape=(8,), chunks=(8,), dtype="uint8", serializer=serializer, compressors=None,
        config={"write_empty_chunks": False}, fill_value=0,
    )  # fmt: skip
    array[0:2] = [1, 2]
    array[6:8] = [7, 8]
    m = mount(tmp_path / "a")
    assert sorted(os.listdir(m.path / "c")) == ["0", "3"]
    assert (m.path / "c" / "0").read_bytes() == b"\x01\x02" and (m.path / "c" / "3").read_bytes() == b"\x07\x08"
    assert not (m.path / "c" / "2").exists()
    assert zarr.open_array(m.path, mode="r")[...].tolist() == [1, 2, 0, 0, 0, 0, 7, 8]


def test_string_arrays_and_big_shards(tmp_path, mount) -> None:
    """Inner codecs pass through whatever they are (vlen-utf8 here); a whole-shard codec may decode to
    more than the cache budget, since its bound comes from the shard's geometry."""
    g = zarr.open_group(tmp_path / "g", mode="w")
    words = g.create_array("words", shape=(10,), chunks=(2,), shards=(4,), dtype=str)
    words[...] = np.array([f"w{i}" * (i + 1) for i in range(10)])
    big = g.create_array("big", shape=(128, 128, 16), dtype="uint8", serializer=ShardingCodec(chunk_shape=(32, 32, 16)))
    big[...] = np.random.default_rng(0).integers(0, 255, big.shape, dtype=np.uint8)  # a 256 KiB shard, zstd over it
    m = mount(tmp_path / "g", "--cache-size", "128K")
    back = zarr.open_group(m.path, mode="r")
    assert back["words"].shards is None and back["words"][...].tolist() == words[...].tolist()
    assert back["big"].shards is None and np.array_equal(back["big"][...], big[...])


def test_malformed_sub_arrays_and_stray_files_leave_the_rest_served(zarr_source, damaged, mount) -> None:
    def edit(root: Path) -> None:
        meta = json.loads((root / "zstd" / "zarr.json").read_text())
        meta["codecs"] = ["sharding_indexed"]  # not an object
        (root / "zstd" / "zarr.json").write_text(json.dumps(meta))
        meta = json.loads((root / "blosc" / "zarr.json").read_text())
        meta["chunk_grid"]["configuration"]["chunk_shape"] = [16, "x"]
        (root / "blosc" / "zarr.json").write_text(json.dumps(meta))
        shutil.rmtree(root / "raw" / "c" / "1")
        (root / "raw" / "c" / "1").write_bytes(b"stray")  # a file at a partial key of a 2-d array

    root = damaged(edit)
    m = mount(root)
    assert_healthy(m.path, zarr_source[1], "zstd", "blosc", "raw")  # those three are checked below
    info = shardfs("info", root).stdout
    assert "zstd/zarr.json" in info and "blosc/zarr.json" in info and info.count("refused") == 2
    rows = sorted(os.listdir(m.path / "raw" / "c"), key=int)
    assert "2" not in rows and "3" not in rows and "0" in rows  # rows of the replaced shard are gone
    for row in rows:
        assert os.listdir(m.path / "raw" / "c" / row)  # every listed directory holds chunks


# ---------------------------------------------------------------------------------------------------------------------
# Index encodings, codecs over the whole shard, chunk key encodings: each against zarr-python's own unsharded twin

INNER, SHARD = (4, 5), (8, 10)
ENCODED = {
    # name: create_array keyword arguments for the sharded array; its inner chunks are raw (no compressor)
    "index_big_endian_crc32c_at_start": {
        "serializer": ShardingCodec(
            chunk_shape=INNER, index_codecs=[BytesCodec(endian="big"), Crc32cCodec()], index_location="start"
        )
    },
    "index_big_endian_at_end": {
        "serializer": ShardingCodec(chunk_shape=INNER, index_codecs=[BytesCodec(endian="big")])
    },
    "index_without_crc32c_at_start": {
        "serializer": ShardingCodec(chunk_shape=INNER, index_codecs=[BytesCodec()], index_location="start")
    },
    "whole_shard_gzip": {"serializer": ShardingCodec(chunk_shape=INNER), "compressors": GzipCodec()},
    "whole_shard_blosc": {"serializer": ShardingCodec(chunk_shape=INNER), "compressors": BloscCodec()},
    "whole_shard_crc32c": {"serializer": ShardingCodec(chunk_shape=INNER), "compressors": Crc32cCodec()},
    "v2_keys_with_slash": {"shards": SHARD, "chunk_key_encoding": {"name": "v2", "separator": "/"}},
    "default_keys_with_dot": {"shards": SHARD, "chunk_key_encoding": {"name": "default", "separator": "."}},
}


def chunk_files(root: Path) -> dict[str, bytes]:
    """Every file below root but the metadata, by relative path."""
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file() and p.name != "zarr.json"}


@pytest.mark.parametrize("case", ENCODED)
def test_inner_chunks_are_the_unsharded_twins_files(tmp_path, mount, case) -> None:
    """zarr-python writes the sharded array, and, with the inner chunk shape and codecs and the same chunk key
    encoding, its unsharded twin: the mount holds the twin's files, byte for byte, and reads as the array."""
    kwargs = {"compressors": None, **ENCODED[case]}
    if "serializer" in kwargs:
        kwargs["chunks"] = SHARD
    else:
        kwargs["chunks"] = INNER
    shape, written = (19, 23), (slice(0, 13), slice(0, 15))  # the rest never written: empty entries
    data = np.random.default_rng(7).integers(1, 60000, shape, dtype=np.uint16)
    array = zarr.create_array(tmp_path / "a", shape=shape, dtype="uint16", fill_value=0, **kwargs)
    array[written] = data[written]
    keys = {"chunk_key_encoding": kwargs["chunk_key_encoding"]} if "chunk_key_encoding" in kwargs else {}
    twin = zarr.create_array(tmp_path / "twin", shape=shape, dtype="uint16", fill_value=0, chunks=INNER,
                             compressors=None, **keys)  # fmt: skip
    twin[written] = data[written]
    m = mount(tmp_path / "a")
    expected = chunk_files(tmp_path / "twin")
    assert len(expected) == 4 * 3
    assert chunk_files(m.path) == expected
    assert np.array_equal(zarr.open_array(m.path, mode="r")[...], array[...])


def test_an_array_to_array_codec_before_sharding_is_served_as_stored(tmp_path, mount) -> None:
    """`transpose` before sharding cannot be shown unsharded faithfully: every file is the source's, and
    zarr-python reads the mount as the array."""
    sharding, transpose = ShardingCodec(chunk_shape=(3, 3)), TransposeCodec(order=(1, 0))
    array = zarr.create_array(tmp_path / "a", shape=(12, 12), dtype="int32", chunks=(6, 6), compressors=None,
                              serializer=sharding, filters=[transpose])  # fmt: skip
    assert json.loads((tmp_path / "a" / "zarr.json").read_text())["codecs"][0]["name"] == "transpose"
    array[...] = np.arange(144, dtype="int32").reshape(12, 12)
    m = mount(tmp_path / "a")
    source = {str(p.relative_to(tmp_path / "a")): p.read_bytes() for p in (tmp_path / "a").rglob("*") if p.is_file()}
    assert {str(p.relative_to(m.path)): p.read_bytes() for p in m.path.rglob("*") if p.is_file()} == source
    assert np.array_equal(zarr.open_array(m.path, mode="r")[...], array[...])
    assert "transpose" in shardfs("info", tmp_path / "a").stdout


def test_inner_chunks_past_the_array_edge_are_absent(tmp_path, mount) -> None:
    """An edge shard whose index fills the entries past the array's edge (here with the bytes of a chunk
    inside it): those are neither listed nor found; the mount holds the unsharded twin's files."""
    data = np.arange(100, dtype="uint8").reshape(10, 10)
    array = zarr.create_array(tmp_path / "a", shape=(10, 10), dtype="uint8", chunks=(4, 4), shards=(8, 8),
                              compressors=None)  # fmt: skip
    array[...] = data
    twin = zarr.create_array(tmp_path / "twin", shape=(10, 10), dtype="uint8", chunks=(4, 4), compressors=None)
    twin[...] = data

    def fill_past_edge(table: np.ndarray) -> None:
        table[1:] = table[0]  # entries (2, 3), (3, 2), (3, 3): past the 3 x 3 grid of inner chunks

    rewrite_index(tmp_path / "a" / "c" / "1" / "1", fill_past_edge, cps=2 * 2)
    m = mount(tmp_path / "a")
    assert chunk_files(m.path) == chunk_files(tmp_path / "twin")
    assert sorted(os.listdir(m.path / "c")) == ["0", "1", "2"]
    assert not (m.path / "c" / "2" / "3").exists() and not (m.path / "c" / "3").exists()
    assert np.array_equal(zarr.open_array(m.path, mode="r")[...], data)


def test_consolidated_metadata_is_rewritten_too(tmp_path, mount) -> None:
    """A group's consolidated metadata carries its arrays' metadata: it must say unsharded as their own
    zarr.json does, or zarr-python, which prefers it, takes inner chunks for shards."""
    root = tmp_path / "c.zarr"
    group = zarr.open_group(root, mode="w")
    data = np.arange(20 * 20, dtype="uint16").reshape(20, 20)
    group.create_array("a", shape=(20, 20), dtype="uint16", chunks=(5, 5), shards=(10, 10))[...] = data
    group.create_group("g").create_array("b", shape=(6,), dtype="int8", chunks=(2,), shards=(4,))[...] = range(6)
    zarr.consolidate_metadata(root)
    m = mount(root)
    back = zarr.open_group(m.path, mode="r")  # uses the consolidated metadata
    assert back["a"].shards is None and np.array_equal(back["a"][...], data)
    assert back["g/b"].shards is None and back["g/b"][...].tolist() == list(range(6))
    entries = json.loads((m.path / "zarr.json").read_text())["consolidated_metadata"]["metadata"]
    assert entries["a"] == json.loads((m.path / "a" / "zarr.json").read_text())


def test_a_misspelt_codec_is_a_warning_naming_the_array_and_the_known_codecs(tmp_path) -> None:
    """`sharding_index` for `sharding_indexed` mounts (its files pass through as stored), but never in
    silence: `mount` (on stderr, the journal under systemd), `info` and `check` name the array, the field
    and the known names. Codecs zarr-python writes, numcodecs' included, raise no such word."""
    clean = zarr.create_array(tmp_path / "ok", shape=(8,), chunks=(4,), shards=(8,), dtype="u1",
                              compressors=[zarr.codecs.numcodecs.Zlib(level=1)])  # fmt: skip
    clean[...] = 1
    typo = zarr.create_array(tmp_path / "typo", shape=(8,), chunks=(4,), shards=(8,), dtype="u1")
    typo[...] = 2
    meta = json.loads((tmp_path / "typo" / "zarr.json").read_text())
    assert meta["codecs"][0]["name"] == "sharding_indexed"
    meta["codecs"][0]["name"] = "sharding_index"
    (tmp_path / "typo" / "zarr.json").write_text(json.dumps(meta))
    assert "WARNING" not in shardfs("ls", tmp_path / "ok", "--log-level", "debug").stderr
    (tmp_path / "m").mkdir()
    said = shardfs("mount", tmp_path / "typo", tmp_path / "m", "--log-file", tmp_path / "log").stderr
    try:
        assert said.startswith("WARNING: ") and "typo/zarr.json" in said and "'codecs'" in said
        assert "['sharding_index']" in said and "sharding_indexed" in said
        logged = (tmp_path / "log").read_text()  # planned before the daemon detached, and in its log too
        assert "level=warning event=unknown_codec" in logged and "['sharding_index']" in logged
        assert sorted(p.name for p in (tmp_path / "m" / "c").iterdir()) == ["0"]  # the shard, as stored
    finally:
        shardfs("unmount", tmp_path / "m")
    for command in ("info", "check"):
        out = shardfs(command, tmp_path / "typo").stdout
        assert "warning:" in out and "['sharding_index']" in out, out
