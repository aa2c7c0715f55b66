"""Sharded precomputed datasets written by tensorstore and cloud-volume, mounted, and read back through
the kernel by the same peers as *unsharded* datasets, by plain file tools, and compared with the
unsharded form tensorstore itself writes."""

from __future__ import annotations

import errno
import filecmp
import json
import os
import random
import shutil
import subprocess

import numpy as np
import pytest
from cloudvolume import CloudVolume
from cloudvolume.datasource.precomputed.annotation import PrecomputedAnnotationSource

from tests.support import peers
from tests.support.cli import SHARDFS, shardfs
from tests.support.reading import files_under, read_ts

pytestmark = [pytest.mark.kernel]


VOLUMES = [
    # (dtype, encoding, data_encoding, channels, sparse); cloud-volume cross-checks where it decodes correctly.
    ("uint8", "raw", "gzip", 1, False),
    ("uint16", "raw", "raw", 1, True),
    ("float32", "raw", "gzip", 2, False),
    ("uint32", "compressed_segmentation", "gzip", 1, False),
    ("uint64", "compressed_segmentation", "raw", 1, True),
    ("uint8", "jpeg", "raw", 1, False),
    ("uint8", "jpeg", "gzip", 3, False),
    ("uint8", "png", "gzip", 1, False),
    ("uint16", "png", "raw", 2, False),
]


@pytest.mark.parametrize(("dtype", "encoding", "data_encoding", "channels", "sparse"), VOLUMES)
def test_volume_reads_as_unsharded(tmp_path, mount, dtype, encoding, data_encoding, channels, sparse) -> None:
    source, twin = tmp_path / "src", tmp_path / "twin"
    expected = peers.write_tensorstore_volume(
        source,
        dtype=dtype,
        encoding=encoding,
        data_encoding=data_encoding,
        num_channels=channels,
        sparse=sparse,
        unsharded_twin=twin,
    )
    m = mount(source)

    # Byte for byte what tensorstore writes for the unsharded dataset: same names, same bytes.
    got, want = files_under(m.path / "4_4_40"), files_under(twin / "4_4_40")
    assert got.keys() == want.keys() and len(got) > 10
    assert got == want
    assert json.loads((m.path / "info").read_text()) == json.loads((twin / "info").read_text())
    assert files_under(m.path / "8_8_40") == files_under(source / "8_8_40")  # the unsharded scale passes through

    # Peers read the mount as an unsharded dataset and see the sharded source's data.
    assert np.array_equal(read_ts(m.path), expected)
    assert np.array_equal(read_ts(m.path, 1), read_ts(source, 1))
    if encoding in ("raw", "compressed_segmentation") or (encoding == "jpeg" and channels == 1):
        # (cloud-volume 12.15 mis-orders RGB jpeg channels and needs pyspng for png, on any source)
        cv = CloudVolume(f"file://{m.path}", mip=0, fill_missing=True, progress=False)
        assert cv.meta.info["scales"][0].get("sharding") is None
        assert np.array_equal(np.asarray(cv[cv.bounds]), expected)


def test_absent_and_misnamed_chunks_are_enoent(tmp_path, mount) -> None:
    peers.write_tensorstore_volume(tmp_path / "src", sparse=True)
    m = mount(tmp_path / "src")
    scale = m.path / "4_4_40"
    names = set(os.listdir(scale))
    assert "-5-11_3-19_7-15" in names and "59-65_3-19_7-15" not in names  # upper half of x never written
    for name in ["59-65_3-19_7-15", "-5-11_3-19_7-16", "-5-11_3-19_07-15", "-4-12_3-19_7-15", "0.shard", "junk"]:
        with pytest.raises(FileNotFoundError):
            (scale / name).read_bytes()
    for name in ["59-75_3-19_7-15", "75-91_3-19_7-15"]:  # past the upper bound, or unclipped at it
        assert not (scale / name).exists()


def test_read_only(tmp_path, mount) -> None:
    peers.write_tensorstore_volume(tmp_path / "src")
    m = mount(tmp_path / "src")
    chunk = next((m.path / "4_4_40").iterdir())
    for attempt in [
        lambda: (m.path / "new").write_bytes(b"x"),
        lambda: os.open(chunk, os.O_RDWR),
        lambda: chunk.unlink(),
        lambda: chunk.rename(m.path / "moved"),
        lambda: (m.path / "dir").mkdir(),
    ]:
        with pytest.raises(OSError) as e:
            attempt()
        assert e.value.errno == errno.EROFS


def test_plain_tools_copy_the_unsharded_tree(tmp_path, mount) -> None:
    source, twin = tmp_path / "src", tmp_path / "twin"
    peers.write_tensorstore_volume(source, unsharded_twin=twin)
    m = mount(source)
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-r", m.path, copy], check=True)
    compared = filecmp.dircmp(copy, twin, ignore=["info"])
    assert not compared.left_only and not compared.right_only and not compared.diff_files
    sub = filecmp.dircmp(copy / "4_4_40", twin / "4_4_40")
    assert not sub.left_only and not sub.right_only
    assert filecmp.cmpfiles(copy / "4_4_40", twin / "4_4_40", sub.common_files, shallow=False)[0] == sorted(
        sub.common_files
    )
    walked = {os.path.relpath(os.path.join(d, f), m.path) for d, _, fs in os.walk(m.path) for f in fs}
    assert walked == {str(p.relative_to(twin)) for p in twin.rglob("*") if p.is_file()}
    assert os.stat(next((m.path / "4_4_40").iterdir())).st_blksize == 1 << 20  # the README's 1 MiB


def test_bare_key_value_directory_streams_a_large_listing(tmp_path, mount) -> None:
    rng = random.Random(0)
    items = {0: b"zero", 1: b"", 2**64 - 1: b"max", 12345: os.urandom(3000)}
    items |= {rng.getrandbits(64): rng.randbytes(rng.randrange(1, 40)) for _ in range(20000)}
    peers.write_tensorstore_kv(tmp_path / "kv", items, sharding=peers.sharding_spec(minishard_bits=3, shard_bits=3))
    m = mount(tmp_path / "kv")
    listed = os.listdir(m.path)  # many readdir calls: the listing resumes where the kernel's buffer filled
    assert len(listed) == len(set(listed)) == len(items) + 1
    assert set(listed) == {str(k) for k in items} | {"info"}
    assert json.loads((m.path / "info").read_text()) == {}
    for key in [0, 1, 2**64 - 1, 12345, *rng.sample(sorted(items), 300)]:
        assert (m.path / str(key)).read_bytes() == items[key]
    assert not (m.path / "2").exists() or 2 in items


def test_annotations(tmp_path, mount) -> None:
    expected = peers.write_tensorstore_annotations(tmp_path / "ann")
    m = mount(tmp_path / "ann")
    info = json.loads((m.path / "info").read_text())
    assert "sharding" not in info["by_id"] and all("sharding" not in s for s in info["spatial"])
    assert all("sharding" not in r for r in info["relationships"])
    for directory in {p.split("/")[0] for p in expected}:
        assert sorted(os.listdir(m.path / directory)) == sorted(
            p.split("/")[1] for p in expected if p.startswith(directory)
        )
    assert files_under(m.path).keys() - {"info"} == expected.keys()
    for rel, blob in expected.items():
        assert (m.path / rel).read_bytes() == blob, rel
    # cloud-volume's annotation reader takes the unsharded path on the mount.
    src, mounted = (
        PrecomputedAnnotationSource(f"file://{tmp_path / 'ann'}"),
        PrecomputedAnnotationSource(f"file://{m.path}"),
    )
    ids = [int(p.split("/")[1]) for p in expected if p.startswith("by_id/")]
    assert np.array_equal(mounted.get_by_id(ids[3]).geometry, src.get_by_id(ids[3]).geometry)
    assert sorted(mounted.get_by_relationship("segment", 77).ids) == sorted(src.get_by_relationship("segment", 77).ids)


def test_skeletons(tmp_path, mount) -> None:
    expected = peers.write_cloudvolume_skeletons(tmp_path / "seg")
    m = mount(tmp_path / "seg")
    assert "sharding" not in json.loads((m.path / "skeletons" / "info").read_text())
    assert sorted(os.listdir(m.path / "skeletons")) == sorted([*map(str, expected), "info"])
    src, mounted = (
        CloudVolume(f"file://{tmp_path / 'seg'}", progress=False),
        CloudVolume(f"file://{m.path}", progress=False),
    )
    assert mounted.skeleton.meta.is_sharded() is False
    for segid, blob in expected.items():
        assert (m.path / "skeletons" / str(segid)).read_bytes() == blob
        a, b = mounted.skeleton.get(segid), src.skeleton.get(segid)
        assert np.array_equal(a.vertices, b.vertices) and np.array_equal(a.edges, b.edges)


@pytest.mark.parametrize("data_encoding", ["raw", "gzip"])
def test_multires_meshes(tmp_path, mount, data_encoding) -> None:
    expected = peers.write_cloudvolume_multires_meshes(tmp_path / "seg", data_encoding=data_encoding)
    m = mount(tmp_path / "seg")
    mesh = m.path / "mesh"
    assert "sharding" not in json.loads((mesh / "info").read_text())
    assert set(os.listdir(mesh)) == {*expected, "info"}
    for name, blob in expected.items():
        assert (mesh / name).read_bytes() == blob, name
    mounted = CloudVolume(f"file://{m.path}", progress=False)
    assert mounted.mesh.meta.is_sharded() is False
    for segid in peers.MESH_IDS:
        for lod in (0, 1):
            got = np.asarray(mounted.mesh.get(segid, lod=lod)[segid].vertices, np.float64)
            want = peers.mesh_expected_vertices(segid, lod)
            assert np.allclose(np.unique(got.round(3), axis=0), np.unique(want.round(3), axis=0), atol=1e-3)


def test_cli_reads_the_tree_without_mounting(tmp_path) -> None:
    source, twin = tmp_path / "src", tmp_path / "twin"
    peers.write_tensorstore_volume(source, unsharded_twin=twin)
    assert sorted(shardfs("ls", source).stdout.split()) == ["4_4_40/", "8_8_40/", "info"]
    assert sorted(shardfs("ls", source, "4_4_40").stdout.split()) == sorted(os.listdir(twin / "4_4_40"))
    name = sorted(os.listdir(twin / "4_4_40"))[7]
    cat = subprocess.run([*SHARDFS, "cat", source, f"4_4_40/{name}"], capture_output=True, check=True)
    assert cat.stdout == (twin / "4_4_40" / name).read_bytes()
    info = shardfs("info", source).stdout
    assert "4_4_40/: volume scale" in info and "shard files: 4 present of 4" in info
    missing = shardfs("cat", source, "4_4_40/0-1_0-1_0-1", check=False)
    assert missing.returncode == 1 and "4_4_40/0-1_0-1_0-1: not in the virtual tree" in missing.stderr
    shutil.rmtree(twin)


def test_a_shard_holding_another_shards_keys_lists_only_its_own(tmp_path, mount) -> None:
    """One shard file overwritten with another's bytes: where each chunk belongs comes from the spec's maths
    (peers.volume_chunk_shards), so the listing shows each chunk of the other shards once, and none of the
    overwritten shard's; every listed chunk reads as tensorstore's unsharded twin holds it."""
    source, twin = tmp_path / "src", tmp_path / "twin"
    peers.write_tensorstore_volume(source, unsharded_twin=twin, extra_unsharded_scale=False)
    where = peers.volume_chunk_shards(source, "4_4_40")
    kept, lost = sorted(set(where.values()))[:2]
    (source / "4_4_40" / lost).write_bytes((source / "4_4_40" / kept).read_bytes())
    m = mount(source)
    expected = sorted(name for name, shard in where.items() if shard != lost)
    assert sorted(os.listdir(m.path / "4_4_40")) == expected
    for name in expected:
        assert (m.path / "4_4_40" / name).read_bytes() == (twin / "4_4_40" / name).read_bytes(), name
    assert not any((m.path / "4_4_40" / name).exists() for name, shard in where.items() if shard == lost)


def test_a_misspelt_encoding_is_a_warning_naming_the_scale_and_the_known_encodings(tmp_path) -> None:
    """`compressed_segmentaton` mounts (its chunks are served as stored), but never in silence: the mount's
    stderr and log, `shardfs info` and `shardfs check` name the info, the field and the known encodings.
    The encodings tensorstore writes raise no such word."""
    root = tmp_path / "vol"
    peers.write_tensorstore_volume(
        root, dtype="uint32", encoding="compressed_segmentation", extra_unsharded_scale=False
    )
    assert "WARNING" not in shardfs("ls", root).stderr
    info = json.loads((root / "info").read_text())
    info["scales"][0]["encoding"] = "compressed_segmentaton"
    (root / "info").write_text(json.dumps(info))
    (tmp_path / "m").mkdir()
    said = shardfs("mount", root, tmp_path / "m", "--log-file", tmp_path / "log").stderr
    try:
        logged = (tmp_path / "log").read_text()
        for text in (said, logged):
            assert "'scales[0].encoding' is 'compressed_segmentaton'" in text and "compressed_segmentation" in text
        assert "level=warning event=unknown_encoding" in logged
        assert os.listdir(tmp_path / "m" / info["scales"][0]["key"])  # its chunks are still there, as stored
    finally:
        shardfs("unmount", tmp_path / "m")
    for command in ("info", "check"):
        assert "warning:" in shardfs(command, root, check=False).stdout
