"""Index maths against the published vectors and hand-derived cases, with no FUSE involved."""

import gzip
import struct
import zlib

import numpy as np
import pytest

from shardfs.cache import LARGE_VALUE
from shardfs.codecs import gunzip
from shardfs.errors import SourceError
from shardfs.formats.precomputed_dirs import fragment_bytes
from shardfs.formats.precomputed_names import GridCells, SegmentIds, VolumeChunks
from shardfs.shards.morton import MortonCode
from shardfs.shards.neuroglancer import MinishardIndex, ShardingSpec

SPEC = {"@type": "neuroglancer_uint64_sharded_v1", "preshift_bits": 0, "hash": "murmurhash3_x86_128"}


def spec(**kw) -> ShardingSpec:
    return ShardingSpec.from_json({**SPEC, "minishard_bits": 0, "shard_bits": 0, **kw}, "test")


@pytest.mark.parametrize(
    ("key", "hashed"), [(0, 0x4772B084E028AE41), (1, 0xE8BD67D616D4CE9A), (42, 0xC20B94F95119F47A)]
)
def test_murmurhash_vectors(key: int, hashed: int) -> None:
    assert spec().hashed(key) == hashed


def test_preshift_and_bit_fields() -> None:
    s = spec(preshift_bits=3, minishard_bits=4, shard_bits=5)
    h = 0xE8BD67D616D4CE9A  # murmurhash of 1, and 8..15 >> 3 == 1
    assert s.hashed(8) == s.hashed(15) == h
    assert s.shard_and_minishard(9) == ((h >> 4) & 31, h & 15)
    identity = spec(hash="identity", minishard_bits=2, shard_bits=3)
    assert identity.shard_and_minishard(0b10111_01) == (0b111, 0b01)


@pytest.mark.parametrize(
    ("bits", "shard", "name"),
    [
        (0, 0, "0.shard"),
        (3, 5, "5.shard"),
        (4, 15, "f.shard"),
        (5, 10, "0a.shard"),
        (9, 0x1FF, "1ff.shard"),
        (16, 0xBEEF, "beef.shard"),
    ],
)
def test_shard_file_names(bits: int, shard: int, name: str) -> None:
    s = spec(shard_bits=bits)
    assert s.shard_name(shard) == name
    assert s.shard_file(name) == (shard, "shard")
    stem = name.removesuffix(".shard")
    assert [s.shard_file(f"{stem}.{suffix}") for suffix in ("index", "data")] == [(shard, "index"), (shard, "data")]


def test_shard_file_rejects_other_files() -> None:
    s = spec(shard_bits=5)
    names = ("a.shard", "0A.shard", "40.shard", "0a.idx", "000a.shard", "a.index", "40.data", "0a.shard.data")
    assert [s.shard_file(n) for n in names] == [None] * len(names)


def test_spec_errors_name_the_field() -> None:
    with pytest.raises(SourceError, match=r"info: field 'x.sharding': 'minishard_bits' must be an integer"):
        ShardingSpec.from_json({**SPEC, "minishard_bits": "2", "shard_bits": 1}, "info: field 'x.sharding'")
    with pytest.raises(SourceError, match="'hash'"):
        ShardingSpec.from_json({**SPEC, "hash": "md5", "minishard_bits": 1, "shard_bits": 1}, "info")


def minishard_table(rows: list[list[int]]) -> bytes:
    return np.array(rows, dtype="<u8").tobytes()


def test_minishard_delta_decoding() -> None:
    # ids 3, 10, 12; sizes 5, 0, 7; offsets delta-encoded from the end of the previous chunk.
    raw = minishard_table([[3, 7, 2], [0, 4, 1], [5, 0, 7]])
    index = MinishardIndex.decode(raw, shard_index_size=32)
    assert index.find(3) == (32, 37)
    assert index.find(10) == (41, 41)
    assert index.find(12) == (42, 49)
    assert index.find(4) is None


def test_minishard_delta_decoding_wraps_around_uint64() -> None:
    # A delta of 2**64 - 1 is -1 modulo 2**64: ids 5 then 4; an offset delta may wrap the same way.
    top = 2**64 - 1
    raw = minishard_table([[5, top], [100, top - 9], [10, 3]])
    index = MinishardIndex.decode(raw, shard_index_size=16)
    assert index.find(5) == (116, 126)
    assert index.find(4) == (116, 119)  # 116 + 10 - 10 (wrapped)


def test_minishard_index_must_be_whole_rows() -> None:
    with pytest.raises(ValueError, match="multiple of 24"):
        MinishardIndex.decode(b"\0" * 25, 16)


def test_gzip_decode() -> None:
    assert gunzip(gzip.compress(b"hello"), 100) == b"hello"
    assert gunzip(gzip.compress(b"hello ") + gzip.compress(b"world"), 100) == b"hello world"  # two members
    pieces = gzip.compress(b"hello ") + gzip.compress(b"world")
    assert gunzip((pieces[i : i + 3] for i in range(0, len(pieces), 3)), 100) == b"hello world"  # fed in pieces
    assert gunzip(gzip.compress(b"hello"), 5) == b"hello"  # exactly at the limit
    with pytest.raises(ValueError, match="more than the 4-byte limit"):
        gunzip(gzip.compress(b"hello"), 4)
    large = bytes(range(256)) * (LARGE_VALUE // 128)  # past the one-call path: decoded in its turn, in pieces
    assert gunzip(gzip.compress(large), len(large)) == large


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (gzip.compress(bytes(8 << 20)), "more than the 65536-byte limit"),  # a bomb: 8 KiB that claims 8 MiB
        (gzip.compress(b"hello")[:-6], "ends before"),
        (gzip.compress(b"hello") + b"junk", "bad gzip"),
        (zlib.compress(b"hello"), "bad gzip"),  # zlib is not gzip
    ],
    ids=["bomb", "cut short", "junk after", "zlib"],  # gzip's header holds the time: the same ids in every worker
)
def test_gzip_decode_refuses(data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        gunzip(data, 1 << 16)


def reference_morton(pos: tuple[int, ...], grid: tuple[int, ...]) -> int:
    """The spec's definition, bit by bit."""
    bits = [max(g - 1, 0).bit_length() for g in grid]
    code, j = 0, 0
    for i in range(max(bits)):
        for d in range(len(grid)):
            if i < bits[d]:
                code |= ((pos[d] >> i) & 1) << j
                j += 1
    return code


@pytest.mark.parametrize(
    ("grid", "pos", "code"),
    [
        ((4, 4, 4), (1, 0, 0), 0b1),
        ((4, 4, 4), (0, 1, 0), 0b10),
        ((4, 4, 4), (0, 0, 1), 0b100),
        ((4, 4, 4), (2, 0, 0), 0b1000),
        ((4, 4, 4), (3, 3, 3), 0b111111),
        ((2, 4, 1), (1, 3, 0), 0b111),  # x has 1 bit, z none: bit 1 of y is packed right after
        ((2, 4, 1), (0, 2, 0), 0b100),
        ((8, 2, 2), (4, 1, 1), 0b10110),  # bits x0 y0 z0 x1 x2
        ((1, 1, 1), (0, 0, 0), 0),
    ],
)
def test_morton_hand_derived(grid, pos, code) -> None:
    m = MortonCode(grid)
    assert m.encode(pos) == code == reference_morton(pos, grid)
    assert m.decode(code) == pos


def test_morton_matches_reference_on_uneven_grids() -> None:
    rng = np.random.default_rng(1)
    for grid in [(1000, 3, 70000), (5, 4, 5), (1, 300, 2), (2**21, 2**20, 17)]:
        m = MortonCode(grid)
        for _ in range(300):
            pos = tuple(int(rng.integers(g)) for g in grid)
            assert m.encode(pos) == reference_morton(pos, grid)
            assert m.decode(m.encode(pos)) == pos


def test_morton_decode_outside_grid() -> None:
    m = MortonCode((5, 4, 5))
    assert m.decode(1 << m.key_bits) is None
    assert m.decode(MortonCode((8, 4, 8)).encode((6, 0, 0))) is None  # x = 6 is outside a grid of 5


@pytest.mark.parametrize("table_cells", [1 << 15, 0], ids=["by table", "parsed"])
def test_volume_chunk_names(table_cells: int) -> None:
    v = VolumeChunks(size=[70, 50, 33], chunk=[16, 16, 8], offset=[-5, 3, 7], table_cells=table_cells)
    assert v.name(0) == "-5-11_3-19_7-15"
    edge = v.morton.encode((4, 3, 4))
    assert v.name(edge) == "59-65_51-53_39-40"  # clipped at the upper bound
    assert v.key("59-65_51-53_39-40") == edge
    assert v.key("-5-11_3-19_7-15") == 0
    bad = ["59-75_51-53_39-40", "-4-12_3-19_7-15", "-5-11_3-19_7-015", "+5-11_3-19_7-15", "75-91_3-19_7-15", "x",
           "-5-11_3-19", "-5-11_3-19_7-15_7-15", "-5-11_3-19_7-15_", "-5-11__3-19_7-15", "-0-11_3-19_7-15"]  # fmt: skip
    for name in bad:
        assert v.key(name) is None, name
    for key in range(1 << v.morton.key_bits):
        assert v.name(key) is None or v.key(v.name(key)) == key
    assert v.voxels(0) == 16 * 16 * 8
    assert v.voxels(edge) == 6 * 2 * 1  # clipped


def test_segment_and_grid_names() -> None:
    ids = SegmentIds()
    assert ids.key("720575940621039145") == 720575940621039145
    assert [ids.key(n) for n in ("007", "-1", "1e3", str(2**64), "١٢")] == [None] * 5
    cells = GridCells([3, 2, 5])
    assert cells.key("2_1_4") == MortonCode([3, 2, 5]).encode((2, 1, 4))
    assert cells.name(cells.key("2_1_4")) == "2_1_4"
    assert cells.key("3_0_0") is None


def manifest(fragment_sizes: list[list[int]]) -> bytes:
    lods = len(fragment_sizes)
    head = struct.pack("<6fI", 1, 1, 1, 0, 0, 0, lods) + b"\0" * (16 * lods)
    head += struct.pack(f"<{lods}I", *map(len, fragment_sizes))
    for sizes in fragment_sizes:
        head += b"\0" * (12 * len(sizes)) + struct.pack(f"<{len(sizes)}I", *sizes)
    return head


def test_fragment_bytes_from_manifest() -> None:
    assert fragment_bytes(manifest([[10, 20], [5], []])) == 35
    assert fragment_bytes(manifest([])) == 0
    assert fragment_bytes(manifest([[1, 2]])[:-1]) is None  # truncated
    huge = bytearray(manifest([[1]]))
    huge[24:28] = struct.pack("<I", 2**32 - 1)  # a num_lods that would overrun
    assert fragment_bytes(bytes(huge)) is None


def test_where_a_minishards_bytes_begin() -> None:
    """The bytes before a minishard index run back to the end of the index that ends last before it (empty rows
    aside), or to the end of the shard index: in tensorstore's layout, exactly the minishard's chunks."""
    from shardfs.shards.neuroglancer import preceding_ends, span_start

    rows = np.array([[100, 130], [0, 0], [30, 60], [160, 200], [130, 130]], dtype="<u8")
    ends = preceding_ends(rows)
    assert ends.tolist() == [60, 130, 200]
    assert span_start(ends, 30) == 0  # the first: from the end of the shard index
    assert span_start(ends, 100) == 60
    assert span_start(ends, 160) == 130
    assert span_start(ends, 130) == 130  # nothing between: the caller reads the index alone
