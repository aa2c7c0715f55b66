"""The N5 and zarr v2 views block by block, through the kernel, on shapes where no dimension mirrors another
(37 x 19 x 11 in chunks of 8 x 5 x 3, every axis ending in a partial chunk): the N5 blocks read by two
independent readers, tensorstore's `n5` driver and zarr-python 2.18's N5Store (a header one reader tolerates,
the other may not), every block header naming its own clipped shape fastest dimension first, zero-copy
blocks byte for byte the stored chunk behind that header (one larger than the kernel's 128 KiB reads too),
and the grid ending where the array does."""

from __future__ import annotations

import errno
import os
import struct
from pathlib import Path

import numpy as np
import pytest
import tensorstore as ts
import zarr
from zarr.codecs import BytesCodec, GzipCodec, ZstdCodec

from tests.support import peers
from tests.support.reading import errno_of, precomputed, ts_read
from tests.support.zarr2 import run

pytestmark = [pytest.mark.kernel]


SHAPE, CHUNKS = (37, 19, 11), (8, 5, 3)
LARGE, LARGE_CHUNKS = (50, 130, 150), (40, 64, 64)  # an inside block of 160 KiB, read by the kernel in two
ZARR = {
    # name: (shape, chunks, dtype, fill value, create_array keywords): zero-copy inside and recompressed at
    # the edges, zero-copy inside and raw at the edges, transcoded everywhere, and filled where never written
    "be_gzip": (SHAPE, CHUNKS, ">u2", 0, {"serializer": BytesCodec(endian="big"), "compressors": GzipCodec()}),
    "u8_raw": (SHAPE, CHUNKS, "uint8", 0, {"shards": (16, 10, 6), "compressors": None}),
    "le_zstd": (SHAPE, CHUNKS, "<i4", 0, {"compressors": ZstdCodec()}),
    "filled": (SHAPE, CHUNKS, "<u2", 7, {}),
    "large": (LARGE, LARGE_CHUNKS, "uint8", 0, {"compressors": None}),
}


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, np.ndarray]]:
    """(zarr v3 hierarchy by zarr-python, raw uint8 precomputed volume by tensorstore, contents by name:
    the zarr arrays and the volume's "4_4_40" as (z, y, x), the order of the views' C-order arrays)."""
    where = tmp_path_factory.mktemp("blocks")
    g = zarr.open_group(where / "z.zarr", mode="w")
    rng = np.random.default_rng(11)
    contents = {}
    for name, (shape, chunks, dtype, fill, kwargs) in ZARR.items():
        array = g.create_array(name, shape=shape, chunks=chunks, dtype=dtype, fill_value=fill, **kwargs)
        written = tuple(slice(0, s // 2 if name == "filled" else s) for s in shape)
        array[written] = (rng.random(shape) * 250).astype(dtype)[written]
        contents[name] = array[...]
    peers.write_tensorstore_volume(where / "vol", size=SHAPE, chunk=CHUNKS, voxel_offset=(0, 0, 0),
                                   data_encoding="raw", extra_unsharded_scale=False)  # fmt: skip
    volume = ts.open({**precomputed(where / "vol"), "scale_index": 0}).result().read().result()
    contents["4_4_40"] = volume[..., 0].T
    return where / "z.zarr", where / "vol", contents


def n5_store_read(root: Path, names: list[str], out: Path) -> dict[str, np.ndarray]:
    """What zarr-python 2.18's N5Store reads of each dataset (in C order, as it shows them)."""
    run(
        """
        import sys, numpy as np, zarr
        store = zarr.N5Store(sys.argv[1])
        np.savez(sys.argv[2], **{n: zarr.open_array(store=store, path=n, mode="r")[...] for n in sys.argv[3:]})
        """,
        root,
        out,
        *map(Path, names),
    )
    with np.load(out) as saved:
        return {name: saved[name] for name in names}


def test_n5_blocks_read_by_tensorstore_and_zarr2_n5store(sources, mount, tmp_path) -> None:
    zarr_root, volume, contents = sources
    for source in (zarr_root, volume):
        n5 = mount(source, "--view", "n5").path
        names = [n for n in contents if (n5 / n).is_dir()]
        assert len(names) == (len(ZARR) if source == zarr_root else 1)
        by_zarr2 = n5_store_read(n5, names, tmp_path / f"{source.name}.npz")
        for name in names:
            expected = contents[name]
            np.testing.assert_array_equal(ts_read("n5", n5 / name), expected.T, err_msg=f"tensorstore {name}")
            assert by_zarr2[name].dtype == expected.dtype.newbyteorder("="), name
            np.testing.assert_array_equal(by_zarr2[name], expected, err_msg=f"zarr 2.18 N5Store {name}")


def test_zarr2_chunks_read_by_tensorstore(sources, mount) -> None:
    """zarr v2 pads edge chunks to the whole chunk: precomputed's clipped edges are padded, never served as
    stored."""
    zarr_root, volume, contents = sources
    for source in (zarr_root, volume):
        z2 = mount(source, "--view", "zarr2").path
        for name in (n for n in contents if (z2 / n).is_dir()):
            got = ts_read("zarr", z2 / name)
            np.testing.assert_array_equal(got[0] if got.ndim == 4 else got, contents[name], err_msg=name)


def blocks(shape: tuple[int, ...], chunks: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Every grid position, in C order."""
    grid = [-(-s // c) for s, c in zip(shape, chunks, strict=True)]
    return [tuple(int(i) for i in pos) for pos in np.ndindex(*grid)]


def test_n5_headers_name_each_blocks_clipped_shape_fastest_first(sources, mount) -> None:
    zarr_root, volume, _ = sources
    # (C-order shape and chunks): the volume's (x, y, z) is (z, y, x) in C order
    arrays = {**{name: case[:2] for name, case in ZARR.items()}, "4_4_40": (SHAPE[::-1], CHUNKS[::-1])}
    for source in (zarr_root, volume):
        n5 = mount(source, "--view", "n5").path
        for name in (n for n in arrays if (n5 / n).is_dir()):
            shape, chunks = arrays[name]
            for pos in blocks(shape, chunks):
                path = n5 / name / "/".join(map(str, pos[::-1]))
                if not path.exists():  # never written, and zero is the fill value
                    continue
                inside = [min(c, s - p * c) for p, c, s in zip(pos, chunks, shape, strict=True)]
                head = path.read_bytes()[: 4 + 4 * len(pos)]
                assert struct.unpack(">HH3I", head) == (0, 3, *inside[::-1]), (name, pos)


def test_zero_copy_n5_blocks_are_the_header_and_the_stored_chunk(sources, mount) -> None:
    """Inside the array, an N5 block of uint8 or big-endian values is the stored chunk behind its header,
    byte for byte; the 160 KiB one spans two of the kernel's reads, both cut at the right byte."""
    zarr_root, volume, _ = sources
    native, n5 = mount(zarr_root).path, mount(zarr_root, "--view", "n5").path
    cases = [("large", (0, 0, 0)), ("large", (0, 1, 1)), ("be_gzip", (1, 2, 1)), ("u8_raw", (3, 1, 2))]
    for name, pos in cases:
        chunks = LARGE_CHUNKS if name == "large" else CHUNKS
        stored = (native / name / "c" / "/".join(map(str, pos))).read_bytes()
        block = n5 / name / "/".join(map(str, pos[::-1]))
        assert block.read_bytes() == struct.pack(">HH3I", 0, 3, *chunks[::-1]) + stored, (name, pos)
    assert os.stat(n5 / "large" / "0" / "0" / "0").st_size > 128 << 10
    with open(n5 / "large" / "1" / "1" / "0", "rb") as f:  # reads that start inside the body, at odd places
        whole = (native / "large" / "c" / "0" / "1" / "1").read_bytes()
        for offset in (16, 17, 4095, 128 << 10, (128 << 10) + 3, len(whole) + 15):
            assert os.pread(f.fileno(), 1000, offset) == whole[offset - 16 : offset - 16 + 1000], offset
    vnative, vn5 = mount(volume).path, mount(volume, "--view", "n5").path
    edge = "32-37_15-19_9-11"  # the last cell along every axis, stored clipped: zero-copy too
    assert (vn5 / "4_4_40" / "4" / "3" / "3").read_bytes() == struct.pack(">HH3I", 0, 3, 5, 4, 2) + (
        vnative / "4_4_40" / edge
    ).read_bytes()


def test_the_grid_ends_where_the_array_does(sources, mount) -> None:
    """In both views the last block along each axis is there, and one past it is ENOENT: in N5, of an array
    whose fill value is not zero (so that blocks never written are shown too); in zarr v2, of one written
    whole (zarr v2 shows only chunks written)."""
    zarr_root, _, contents = sources
    n5, z2 = mount(zarr_root, "--view", "n5").path, mount(zarr_root, "--view", "zarr2").path
    grid = [-(-s // c) for s, c in zip(SHAPE, CHUNKS, strict=True)]
    for d in range(3):
        for last, present in ((grid[d] - 1, True), (grid[d], False)):
            pos = [0, 0, 0]
            pos[d] = last
            for path in (n5 / "filled" / "/".join(map(str, pos[::-1])), z2 / "le_zstd" / "/".join(map(str, pos))):
                assert errno_of(path) == (0 if present else errno.ENOENT), path
    assert ts_read("n5", n5 / "filled")[-1, -1, -1] == contents["filled"][-1, -1, -1] == 7
