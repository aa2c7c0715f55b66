"""`--view n5` and `--view zarr2`, through the kernel: sources written by zarr-python 3, tensorstore and
cloud-volume; the mount read by tensorstore's n5 and zarr drivers, zarr-python 3, zarr-python 2.18 (its
N5Store and its v2 arrays, in .venv-zarr2) and ome-zarr; every read compared with the source read directly.

Zero-copy (the stored bytes, behind N5's header): one-byte or big-endian values under raw, gzip, zstd or
blosc, away from a zarr array's edge; in zarr2, every zarr v3 chunk of `bytes` and at most one of those
compressors, and raw precomputed chunks away from the edge. The rest is transcoded; the tests say which.
"""

from __future__ import annotations

import gzip
import json
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tensorstore as ts
import zarr
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, GzipCodec, ZstdCodec

from tests.support import peers
from tests.support.cli import shardfs
from tests.support.peers import write_zarr_python
from tests.support.reading import assert_eio, precomputed, ts_read
from tests.support.zarr2 import run

pytestmark = [pytest.mark.kernel]


OME_05 = {
    "ome": {
        "version": "0.5",
        "multiscales": [
            {
                "axes": [{"name": "y", "type": "space"}, {"name": "x", "type": "space"}],
                "datasets": [{"path": "s0", "coordinateTransformations": [{"type": "scale", "scale": [1.0, 1.0]}]}],
            }
        ],
    }
}


def write_more(root: Path) -> dict[str, np.ndarray]:
    """What write_zarr_python lacks for the views: big-endian gzip with edges, a crc32c chain, one-byte
    and bool types, a non-zero fill value over never-written chunks, an OME-Zarr 0.5 image."""
    rng = np.random.default_rng(1)
    g = zarr.open_group(root, mode="a")
    be = {"serializer": BytesCodec(endian="big")}
    cases = {
        "be_gzip": ((23, 19), ">i4", 0, {"chunks": (5, 4), "shards": (10, 8), **be, "compressors": GzipCodec()}),
        "be_blosc": ((23, 19), ">f8", 0, {"chunks": (5, 4), "shards": (10, 8), **be, "compressors": BloscCodec()}),
        "be_zstd": ((12, 9, 7), ">u2", 0, {"chunks": (4, 3, 7), "shards": (8, 6, 7), **be, "compressors": ZstdCodec()}),
        "crc": ((20, 20), "int16", 0, {"chunks": (5, 5), "shards": (10, 10), "compressors": [Crc32cCodec()]}),
        "int8": ((9, 31), "int8", 0, {"chunks": (3, 8), "shards": (9, 16), "compressors": GzipCodec()}),
        "bools": ((10, 10), "bool", False, {"chunks": (5, 5), "shards": (10, 10)}),
        "half": ((10, 10), "float16", 0, {"chunks": (5, 5), "shards": (10, 10)}),
        "u64": ((10, 13), "uint64", 0, {"chunks": (5, 5), "shards": (10, 10), "compressors": GzipCodec()}),
        "u32_be": ((10, 13), ">u4", 0, {"chunks": (5, 5), "shards": (10, 10), **be, "compressors": None}),
        "filled": ((20, 18), "uint16", 7, {"chunks": (5, 6), "shards": (10, 6)}),
        "ome/s0": ((16, 16), "uint8", 0, {"chunks": (4, 4), "shards": (8, 8)}),
    }
    g.create_group("ome", attributes=OME_05)
    contents = {}
    for name, (shape, dtype, fill, kwargs) in cases.items():
        array = g.create_array(name, shape=shape, dtype=dtype, fill_value=fill, **kwargs)
        data = (rng.random(shape) * 100).astype(dtype)
        written = tuple(slice(0, s // 2 if name == "filled" else s) for s in shape)  # "filled": half never written
        array[written] = data[written]
        contents[name] = array[...]
    return contents


@pytest.fixture(scope="module")
def zarr_views(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    root = tmp_path_factory.mktemp("views") / "brain.zarr"
    contents = write_zarr_python(root)
    contents.update(write_more(root))
    return root, contents


# Not zstd ("be_zstd", and "ome/s0" and "plain_unsharded", under zarr-python 3's default zstd): Neuroglancer's
# n5 source reads raw, gzip and blosc only, and showed nothing of a zstd dataset, so zstd blocks are decoded.
N5_ZERO_COPY = {"raw", "big_endian", "be_gzip", "be_blosc", "int8", "u32_be"}
NEUROGLANCER_N5 = {"raw", "gzip", "blosc"}  # the compressions of its VolumeChunkEncoding
NOT_N5 = {"bools", "half"}  # N5 has no bool or float16: left out of the N5 view, and `shardfs info` says so


def test_n5_view_of_zarr_read_by_tensorstore(zarr_views, mount) -> None:
    source, contents = zarr_views
    info = shardfs("info", source, "--view", "n5").stdout.splitlines()
    assert {line.split(":")[0].strip() for line in info if line.endswith("N5 dataset, zero-copy")} == N5_ZERO_COPY
    mnt = mount(source, "--view", "n5").path
    assert json.loads((mnt / "attributes.json").read_text())["n5"] == "4.0.0"
    assert json.loads((mnt / "attributes.json").read_text())["note"] == "kept"  # group attributes carry over
    for name, expected in contents.items():
        if name in NOT_N5:
            assert not (mnt / name).exists()
            continue
        attrs = json.loads((mnt / name / "attributes.json").read_text())
        assert attrs["dimensions"] == list(expected.shape[::-1])
        assert attrs["compression"]["type"] in NEUROGLANCER_N5, name
        got = ts_read("n5", mnt / name)
        assert got.dtype == expected.dtype.newbyteorder("="), name
        np.testing.assert_array_equal(got, expected.T, err_msg=name)


def test_n5_view_read_by_zarr_python_2_n5store(zarr_views, mount) -> None:
    source, contents = zarr_views
    mnt = mount(source, "--view", "n5").path
    names = sorted(set(contents) - NOT_N5)
    out = run(
        """
        import json, sys, numpy as np, zarr
        store = zarr.N5Store(sys.argv[1])
        report = {}
        for name in sys.argv[2:]:
            a = zarr.open_array(store=store, path=name, mode="r")
            report[name] = {"shape": list(a.shape), "sum": float(a[...].astype("float64").sum()),
                            "corner": a[(0,) * a.ndim].item()}
        print(json.dumps(report))
        """,
        mnt,
        *names,
    )
    report = json.loads(out)
    for name in names:
        expected = contents[name]
        # zarr's N5Store reverses the N5 dimensions back: it shows the C-order shape.
        assert report[name]["shape"] == list(expected.shape), name
        assert report[name]["sum"] == pytest.approx(float(expected.astype("float64").sum())), name
        assert report[name]["corner"] == expected[(0,) * expected.ndim].item(), name


def test_n5_zero_copy_blocks_are_header_plus_stored_bytes(zarr_views, mount) -> None:
    source, _ = zarr_views
    native, n5 = mount(source).path, mount(source, "--view", "n5").path
    stored = (native / "be_gzip" / "c" / "1" / "2").read_bytes()  # inner chunk (1, 2): not at the edge
    assert (n5 / "be_gzip" / "2" / "1").read_bytes() == struct.pack(">HHII", 0, 2, 4, 5) + stored
    # At the edge the block is clipped, so decoded and compressed again: a real gzip block of 3 x 3.
    edge = (n5 / "be_gzip" / "4" / "4").read_bytes()
    assert edge[:12] == struct.pack(">HHII", 0, 2, 3, 3) and edge[12:14] == b"\x1f\x8b"
    # Little-endian data is transcoded raw: size from metadata alone.
    assert (n5 / "gzip" / "0" / "0").stat().st_size == 12 + 4 * 5 * 2


def test_n5_listing_and_fill_value(zarr_views, mount) -> None:
    source, contents = zarr_views
    mnt = mount(source, "--view", "n5").path
    # Only written blocks are listed ("raw" is 30 x 30 in 5 x 6 chunks, written over its first 20 x 20).
    assert sorted(int(d.name) for d in (mnt / "raw").iterdir() if d.is_dir()) == [0, 1, 2, 3]
    assert not (mnt / "raw" / "4" / "5").exists()
    # An unsharded array's blocks are its chunk files, fastest dimension first.
    keys = source / "plain_unsharded" / "c"
    expected = {"/".join(str(p.relative_to(keys)).split("/")[::-1]) for p in keys.rglob("*") if p.is_file()}
    blocks = mnt / "plain_unsharded"
    assert {str(p.relative_to(blocks)) for p in blocks.rglob("*") if p.is_file()} == {*expected, "attributes.json"}
    # N5 reads a missing block as 0; a fill value of 7 is served as blocks of 7, listed too.
    assert (mnt / "filled" / "2" / "3").exists() and zarr.open_array(source / "filled").nchunks_initialized < 12
    np.testing.assert_array_equal(ts_read("n5", mnt / "filled"), contents["filled"].T)


def test_zarr2_view_of_zarr_read_by_three_readers(zarr_views, mount) -> None:
    source, contents = zarr_views
    mnt = mount(source, "--view", "zarr2").path
    assert json.loads((mnt / ".zgroup").read_text()) == {"zarr_format": 2}
    assert json.loads((mnt / ".zattrs").read_text())["note"] == "kept"
    for name, expected in contents.items():
        np.testing.assert_array_equal(ts_read("zarr", mnt / name), expected, err_msg=f"tensorstore {name}")
        got = zarr.open_array(mnt / name, mode="r", zarr_format=2)
        np.testing.assert_array_equal(got[...], expected, err_msg=f"zarr-python 3 {name}")
    out = run(
        """
        import json, sys, zarr
        g = zarr.open_group(sys.argv[1], mode="r")
        print(json.dumps({name: g[name][...].tolist() for name in sys.argv[2:]}))
        """,
        mnt,
        *contents,
    )
    for name, values in json.loads(out).items():
        np.testing.assert_array_equal(np.asarray(values, contents[name].dtype), contents[name], err_msg=name)


def test_zarr2_zero_copy_and_transcoded_chunks(zarr_views, mount) -> None:
    source, _ = zarr_views
    native, z2 = mount(source).path, mount(source, "--view", "zarr2").path
    meta = json.loads((z2 / "gzip" / ".zarray").read_text())
    assert meta["compressor"]["id"] == "gzip" and meta["dtype"] == "<u2" and meta["dimension_separator"] == "/"
    assert (z2 / "gzip" / "3" / "1").read_bytes() == (native / "gzip" / "c" / "3" / "1").read_bytes()
    # A plain array keeps its source's separator: `v2` chunk keys `1.2` stay flat.
    assert json.loads((z2 / "v2_keys" / ".zarray").read_text())["dimension_separator"] == "."
    assert (z2 / "v2_keys" / "1.2").read_bytes() == (native / "v2_keys" / "1.2").read_bytes()
    info = shardfs("info", source, "--view", "zarr2").stdout
    assert "gzip: zarr v2 array, chunk files like 0/0, zero-copy" in info
    assert "v2_keys: zarr v2 array, chunk files like 0.0, zero-copy" in info
    assert json.loads((z2 / "big_endian" / ".zarray").read_text())["dtype"] == ">u2"
    # crc32c has no zarr v2 equivalent: compressor null, chunks decoded raw.
    crc = json.loads((z2 / "crc" / ".zarray").read_text())
    assert crc["compressor"] is None
    assert (z2 / "crc" / "0" / "0").stat().st_size == 5 * 5 * 2
    assert json.loads((z2 / "filled" / ".zarray").read_text())["fill_value"] == 7
    # "raw": 30 x 30 in 5 x 6, written up to 20 x 20: only directories and chunks that hold data are listed
    assert sorted(p.name for p in (z2 / "raw").iterdir()) == [".zarray", ".zattrs", "0", "1", "2", "3"]
    assert sorted(p.name for p in (z2 / "raw" / "2").iterdir()) == ["0", "1", "2", "3"]
    assert (z2 / "raw" / "5").is_dir() and not (z2 / "raw" / "6").exists() and not (z2 / "raw" / "5" / "5").exists()
    # Walked whole, each array's nested directories are exactly the chunk files stored, less `c/`: those of
    # the native view for sharded arrays (tested against tensorstore's unsharded twins), the source's else.
    for name, stored in (("raw", native), ("deep/sub/one_d", native), ("zstd", native), ("plain_unsharded", source)):
        keys = stored / name / "c"
        expected = {str(p.relative_to(keys)) for p in keys.rglob("*")} | {".zarray", ".zattrs"}
        assert {str(p.relative_to(z2 / name)) for p in (z2 / name).rglob("*")} == expected, name


def test_ome_zarr_05_is_read_as_04(zarr_views, mount) -> None:
    from ome_zarr.io import parse_url
    from ome_zarr.reader import Multiscales, Reader

    source, contents = zarr_views
    mnt = mount(source, "--view", "zarr2").path
    attrs = json.loads((mnt / "ome" / ".zattrs").read_text())
    assert "ome" not in attrs and attrs["multiscales"][0]["version"] == "0.4"
    nodes = list(Reader(parse_url(str(mnt / "ome")))())
    image = next(n for n in nodes if Multiscales.matches(n.zarr))
    assert [a["name"] for a in image.metadata["axes"]] == ["y", "x"]
    np.testing.assert_array_equal(np.asarray(image.data[0]), contents["ome/s0"])


def test_an_ome_zarr_image_at_the_root_of_the_mount_is_one(tmp_path, mount) -> None:
    """An OME-Zarr 0.5 image that is the dataset itself (its group the source's root), its array's chunk keys
    `.`-separated: the zarr2 view's array takes `/`, as OME-Zarr requires and its readers assume, so that
    ome-zarr-py reads its pixels from the mount's root as from a nested image."""
    from ome_zarr.io import parse_url
    from ome_zarr.reader import Multiscales, Reader

    source = tmp_path / "image.zarr"
    image = zarr.open_group(source, mode="w", attributes=OME_05)
    array = image.create_array("s0", shape=(16, 16), dtype="uint8", chunks=(4, 4), shards=(8, 8),
                               chunk_key_encoding={"name": "v2", "separator": "."})  # fmt: skip
    data = np.arange(256, dtype="uint8").reshape(16, 16)
    array[...] = data
    assert (source / "s0" / "1.1").is_file()  # the shards' keys, `.`-separated
    mnt = mount(source, "--view", "zarr2").path
    assert json.loads((mnt / "s0" / ".zarray").read_text())["dimension_separator"] == "/"
    assert (mnt / "s0" / "3" / "3").is_file() and not (mnt / "s0" / "3.3").exists()
    found = next(n for n in Reader(parse_url(str(mnt)))() if Multiscales.matches(n.zarr))
    np.testing.assert_array_equal(np.asarray(found.data[0]), data)


def test_tensorstore_zarr3_sharded_in_both_views(tmp_path, mount) -> None:
    source = tmp_path / "ts.zarr"
    array = peers.create_tensorstore_zarr3(source, [37, 29], "uint32", [16, 16], [4, 8])
    data = np.arange(37 * 29, dtype="uint32").reshape(37, 29)
    array[:30, :20].write(data[:30, :20]).result()
    expected = array.read().result()
    n5, z2 = mount(source, "--view", "n5").path, mount(source, "--view", "zarr2").path
    np.testing.assert_array_equal(ts_read("n5", n5), expected.T)
    np.testing.assert_array_equal(ts_read("zarr", z2), expected)
    # `cp -r` of a view is a plain N5 or zarr v2 dataset on disk.
    for view, driver, want in ((n5, "n5", expected.T), (z2, "zarr", expected)):
        copy = tmp_path / f"copy-{driver}"
        subprocess.run(["cp", "-r", str(view), str(copy)], check=True)
        np.testing.assert_array_equal(ts_read(driver, copy), want)


# ---------------------------------------------------------------------------------------------------------------------
# Precomputed volumes

PRECOMPUTED = [
    # (dtype, encoding, channels): every data type precomputed allows and every encoding tensorstore writes
    # (compresso: below); one-byte raw is N5 zero-copy, the rest transcode in N5.
    ("uint8", "raw", 1),
    ("uint16", "raw", 2),
    ("int32", "raw", 1),
    ("float32", "raw", 1),
    ("int8", "raw", 1),
    ("int16", "raw", 1),
    ("uint8", "jpeg", 1),
    ("uint8", "jpeg", 3),
    ("uint8", "png", 1),
    ("uint64", "compressed_segmentation", 1),
    ("uint32", "compressed_segmentation", 1),
]


@pytest.mark.parametrize(("dtype", "encoding", "channels"), PRECOMPUTED)
def test_precomputed_volume_in_both_views(tmp_path, mount, dtype, encoding, channels) -> None:
    source = tmp_path / "vol"
    peers.write_tensorstore_volume(source, dtype=dtype, encoding=encoding, num_channels=channels, sparse=True)
    n5, z2 = mount(source, "--view", "n5").path, mount(source, "--view", "zarr2").path
    for index, key in enumerate(["4_4_40", "8_8_40"]):  # the sharded scale and the unsharded one
        # tensorstore decodes jpeg too, so what it reads from the source is what the views must hold.
        expected = ts.open({**precomputed(source), "scale_index": index}).result().read().result()
        via_n5 = ts_read("n5", n5 / key)
        np.testing.assert_array_equal(via_n5, expected if channels > 1 else expected[..., 0], err_msg=key)
        via_zarr2 = ts_read("zarr", z2 / key)  # [c, z, y, x]
        np.testing.assert_array_equal(via_zarr2, expected.transpose(3, 2, 1, 0), err_msg=key)
    n5_attrs = json.loads((n5 / "8_8_40" / "attributes.json").read_text())
    channel = [1] * (channels > 1)  # every list one entry per dimension: Neuroglancer refuses other lengths
    assert n5_attrs["downsamplingFactors"] == [2, 2, 1, *channel]
    # pixelResolution is the first scale's: Neuroglancer and n5-viewer multiply it by downsamplingFactors.
    assert n5_attrs["pixelResolution"] == {"unit": "nm", "dimensions": [4, 4, 40, *channel]}
    assert n5_attrs["resolution"] == [8, 8, 40, *channel] and n5_attrs["units"] == ["nm"] * 3 + [""] * len(channel)
    assert n5_attrs["axes"] == ["x", "y", "z", *["c"] * len(channel)]
    root = json.loads((n5 / "attributes.json").read_text())
    assert root["scales"][0] == [1, 1, 1, *channel] and len(root["pixelResolution"]["dimensions"]) == 3 + len(channel)


def test_precomputed_zarr2_is_ome_zarr_04_with_padded_edges(tmp_path, mount) -> None:
    from ome_zarr.io import parse_url
    from ome_zarr.reader import Multiscales, Reader

    source = tmp_path / "vol"
    peers.write_tensorstore_volume(source, dtype="uint16", data_encoding="raw")  # size 70 x 50 x 33, chunk 16 x 16 x 8
    native, z2 = mount(source).path, mount(source, "--view", "zarr2").path
    expected = ts.open({**precomputed(source), "scale_index": 0}).result().read().result()
    nodes = list(Reader(parse_url(str(z2)))())
    image = next(n for n in nodes if Multiscales.matches(n.zarr))
    assert [a["name"] for a in image.metadata["axes"]] == ["c", "z", "y", "x"]
    transforms = image.metadata["coordinateTransformations"][0]
    assert transforms == [
        {"type": "scale", "scale": [1, 40, 4, 4]},
        {"type": "translation", "translation": [0, 300, 14, -18]},  # voxel_offset (-5, 3, 7) + 0.5, in nm
    ]
    np.testing.assert_array_equal(np.asarray(image.data[0]), expected.transpose(3, 2, 1, 0))
    # Inside chunks are the stored raw chunk, zero-copy; edge chunks are padded to the whole chunk.
    assert (z2 / "4_4_40" / "0/0/0/0").read_bytes() == (native / "4_4_40" / "-5-11_3-19_7-15").read_bytes()
    assert (z2 / "4_4_40" / "0/4/3/4").stat().st_size == 16 * 16 * 8 * 2


def test_precomputed_n5_raw_uint8_is_zero_copy(tmp_path, mount) -> None:
    source = tmp_path / "vol"
    peers.write_tensorstore_volume(source, dtype="uint8", data_encoding="raw")
    native, n5 = mount(source).path, mount(source, "--view", "n5").path
    edge = "59-65_51-53_39-40"  # x 4 (of 5), y 3, z 4 (of 5): clipped in every dimension, stored clipped
    assert (n5 / "4_4_40" / "4" / "3" / "4").read_bytes() == struct.pack(">HHIII", 0, 3, 6, 2, 1) + (
        native / "4_4_40" / edge
    ).read_bytes()


def test_compresso_scale_written_by_cloud_volume(tmp_path, mount) -> None:
    source = tmp_path / "vol"
    labels = peers.write_cloudvolume_compresso(source)  # (x, y, z) uint64, unsharded
    n5, z2 = mount(source, "--view", "n5").path, mount(source, "--view", "zarr2").path
    (key,) = (p.name for p in z2.iterdir() if p.is_dir())  # the scale's key; in N5 the level s0
    np.testing.assert_array_equal(ts_read("n5", n5 / "s0"), labels)
    np.testing.assert_array_equal(ts_read("zarr", z2 / key)[0], labels.T)
    # A damaged chunk (cloud-volume gzips compresso files: here the gzip is sound, the compresso inside is
    # not) is EIO for its block alone, logged with its file.
    stored = source / key / "0-16_16-30_8-16.gz"
    stored.write_bytes(gzip.compress(gzip.decompress(stored.read_bytes())[:40]))
    m = mount(source, "--view", "n5")
    assert_eio(m.path / "s0" / "0" / "1" / "1")
    assert "0-16_16-30_8-16" in m.log_text() and "compresso" in m.log_text()
    assert (m.path / "s0" / "1" / "1" / "1").read_bytes()[:2] == b"\0\0"


def test_views_refuse_what_they_cannot_show_and_eio_on_corrupt_chunks(tmp_path, mount) -> None:
    keys = tmp_path / "kv"  # a bare sharded key-value directory: no array in it
    peers.write_tensorstore_kv(keys, {1: b"one", 2: b"two"})
    refused = shardfs("mount", keys, tmp_path, "--view", "n5", check=False)
    assert (
        refused.returncode == 2 and "--view n5" in refused.stderr
    )  # a source it cannot show: exit 2 and len(refused.stderr.strip().splitlines()) == 1

    source = tmp_path / "z.zarr"
    g = zarr.open_group(source, mode="w")
    for name in ("good", "bad"):
        g.create_array(name, shape=(8, 8), chunks=(4, 4), shards=(8, 8), dtype="<u2", compressors=GzipCodec())[:] = 3
    shard = source / "bad" / "c" / "0" / "0"
    data = shard.read_bytes()
    shard.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # the index's crc32c no longer matches
    for view in ("n5", "zarr2"):
        m = mount(source, "--view", view)
        first = m.path / "bad" / "0/0"
        assert_eio(first)
        assert "bad/c/0/0" in m.log_text()
        assert ts_read(view if view == "n5" else "zarr", m.path / "good").sum() == 3 * 64


@pytest.mark.parametrize("view", ["zarr2", "n5"])
def test_a_walk_of_a_view_reads_a_precomputed_scale_once(tmp_path, view: str) -> None:
    """Precomputed has no prefix to narrow a listing by (Morton order, hashed shards), and N5's directories
    run against C order: the nested directories of both views filter one cached list of positions. Read
    whole for each directory, `find` over 16,384 chunks of the zarr2 view took 59 s through the kernel,
    against 1.6 s."""
    from shardfs.source import open_source

    source = tmp_path / "vol"
    peers.write_tensorstore_volume(source, dtype="uint8", data_encoding="raw", size=(64, 64, 32), chunk=(4, 4, 4),
                                   voxel_offset=(0, 0, 0), extra_unsharded_scale=False)  # fmt: skip
    tree = open_source(source, 64 << 20, view).tree
    scale = "s0" if view == "n5" else "4_4_40"  # N5 names a pyramid's levels s0, s1, ...
    array = tree.providers[scale].array
    reads, stored = [], array.stored
    array.stored = lambda prefix=(): reads.append(prefix) or stored(prefix)
    files, pending = [], [scale]
    while pending:
        directory = pending.pop()
        for name, is_dir in tree.listdir(directory):
            (pending if is_dir else files).append(f"{directory}/{name}")
    metadata = 2 if view == "zarr2" else 1  # .zarray and .zattrs, or attributes.json
    assert len(files) == 16 * 16 * 8 + metadata and reads == [()]  # every chunk, and one read
