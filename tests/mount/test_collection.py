"""One mount for a whole data directory (issue 43): a directory that is no dataset shows as stored, and every
dataset below it exactly as a mount of that dataset alone shows it, read by the peers that wrote it, through
the kernel. Written by tensorstore, cloud-volume, zarr-python and ome-zarr-py; read back by the same."""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3
import numpy as np
import pytest
import tensorstore as ts
import zarr
from cloudvolume import CloudVolume

from shardfs.fs.nodes import PACKED
from tests.mount.test_view_readers import assert_every_level, found_nodes, ome_zarr_read, write_ome_images
from tests.mount.test_zarr_draft import READ as READ_DRAFT
from tests.mount.test_zarr_draft import WRITE as WRITE_DRAFT
from tests.remote.test_remote_s3 import KEYS, credentials
from tests.support import peers
from tests.support.cli import shardfs
from tests.support.cloud import BUCKET, moto_server, upload
from tests.support.daemons import daemon_of, peak_and_now_kib, remote_requests
from tests.support.http_server import RangeServer
from tests.support.reading import files_under, read_ts
from tests.support.zarr2 import run

pytestmark = [pytest.mark.kernel, pytest.mark.loopback]

# Every dataset of the directory, by its path in it: a precomputed image (a sharded scale and an unsharded
# one), a segmentation with sharded meshes and skeletons, the unsharded copy of the image, a zarr-python
# hierarchy two directories down, another image, other voxels under the same names, two OME-Zarr 0.5 images
# (one with labels), and the 2022 sharding draft's hierarchy written by zarr-python 2.18.
DATASETS = (
    *("image", "seg", "unsharded", "labs/2026/brain.zarr", "labs/2025/image", "ome/zyx.zarr", "ome/czyx.zarr"),
    "draft",  # last: the views leave it out
)
OVERHEAD_MIB = 40  # the README's promise beyond --cache-size
WIDE = 12  # plain directories of the bucket's `wide/`
GRID = (64, 64, 32)  # 131,072 chunk files in one directory


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """(the data directory, what its writers wrote): the datasets of DATASETS, plain files, and `broken/`,
    whose `info` is no JSON."""
    top = tmp_path_factory.mktemp("lab")
    root = top / "data"
    written: dict = {"image": peers.write_tensorstore_volume(root / "image", unsharded_twin=top / "twin")}
    shutil.copytree(top / "twin", root / "unsharded")
    written["image 2025"] = peers.write_tensorstore_volume(root / "labs" / "2025" / "image", seed=1)
    written["mesh"] = peers.write_cloudvolume_multires_meshes(root / "seg")
    written["skeletons"] = peers.write_cloudvolume_skeletons(root / "seg")
    info = json.loads((root / "seg" / "info").read_text())
    (root / "seg" / "info").write_text(json.dumps({**info, "mesh": "mesh"}))  # both, as a real segmentation has
    written["zarr"] = peers.write_zarr_python(root / "labs" / "2026" / "brain.zarr")
    written["ome"] = write_ome_images(root / "ome")
    written["draft"] = top / "draft.npz"
    run(WRITE_DRAFT, root / "draft", written["draft"])
    (root / "README").write_text("what is where\n")
    (root / "notes").mkdir()
    (root / "notes" / "plan.txt").write_bytes(os.urandom(3000))
    (root / "broken" / "0").mkdir(parents=True)
    (root / "broken" / "info").write_text('{"@type": "neuroglancer_multiscale_volume", ')
    (root / "broken" / "0" / "0-64_0-64_0-64").write_bytes(b"\x01" * 100)
    return root, written


def listing(root: Path) -> list[str]:
    """`ls -R` of root: every directory and file below it, relative, a directory ending in '/'."""
    found = []
    for at, dirs, files in os.walk(root):
        rel = Path(at).relative_to(root)
        found += [f"{rel / name}/" for name in dirs] + [str(rel / name) for name in files]
    return sorted(found)


def test_a_data_directory_shows_every_dataset_as_its_own_mount_does(data, mount) -> None:
    """`ls -R` and every byte of each dataset equal a mount of that dataset alone (the image's also its
    unsharded copy); plain files and the broken dataset's pass through as stored, the broken one said once in
    the log; after all of it is read the daemon is within --cache-size + 40 MiB."""
    root, _ = data
    m = mount(root)
    assert listing(m.path / "image") == listing(root / "unsharded")
    expected = {p for p in listing(root) if not any(p.startswith(f"{d}/") and p != f"{d}/" for d in DATASETS)}
    for dataset in DATASETS:
        alone = mount(root / dataset).path
        assert files_under(m.path / dataset) == files_under(alone), dataset
        expected |= {f"{dataset}/{p}" for p in listing(alone)}
    assert listing(m.path) == sorted(expected)
    for plain in ("notes", "broken"):
        assert files_under(m.path / plain) == files_under(root / plain), plain
    assert (m.path / "README").read_bytes() == (root / "README").read_bytes()
    said = [line for line in m.log_text().splitlines() if "shown as plain files" in line]
    assert len(said) == 1 and "broken/info" in said[0], said
    peak_kib, _ = peak_and_now_kib(daemon_of(m.path).pid)
    assert peak_kib >> 10 <= 64 + OVERHEAD_MIB, f"peak {peak_kib >> 10} MiB"


def test_the_peers_read_every_dataset_of_the_directory(data, mount, tmp_path) -> None:
    """tensorstore and cloud-volume read the image and its unsharded copy, cloud-volume the meshes and
    skeletons, zarr-python every array of the hierarchy, the current ome-zarr-py both images and the labels:
    each equal to what its writer wrote."""
    root, written = data
    m = mount(root).path
    np.testing.assert_array_equal(read_ts(m / "image"), written["image"])
    np.testing.assert_array_equal(read_ts(m / "labs" / "2025" / "image"), written["image 2025"])
    np.testing.assert_array_equal(CloudVolume(f"file://{m / 'unsharded'}", progress=False)[:, :, :], written["image"])
    seg, source = CloudVolume(f"file://{m / 'seg'}", progress=False), CloudVolume(f"file://{root / 'seg'}")
    for segid in written["skeletons"]:
        got, want = seg.skeleton.get(segid), source.skeleton.get(segid)
        assert np.array_equal(got.vertices, want.vertices) and np.array_equal(got.edges, want.edges), segid
    for segid in peers.MESH_IDS:
        got = np.asarray(seg.mesh.get(segid, lod=0)[segid].vertices, np.float64)
        want = peers.mesh_expected_vertices(segid, 0)
        assert np.allclose(np.unique(got.round(3), axis=0), np.unique(want.round(3), axis=0), atol=1e-3), segid
    group = zarr.open_group(m / "labs" / "2026" / "brain.zarr", mode="r")
    for name, expected in written["zarr"].items():
        assert group[name].shards is None, name
        np.testing.assert_array_equal(group[name][...], expected, err_msg=name)
    mounted = {name: m / "ome" / name for name in ("zyx.zarr", "czyx.zarr")}
    kinds, read = ome_zarr_read("current", list(mounted.values()), tmp_path / "read.npz")
    assert kinds == found_nodes(mounted)
    assert_every_level(read, mounted, written["ome"])
    report = json.loads(run(READ_DRAFT, m / "draft", written["draft"]))
    assert report and all(array["equal"] and not array["transformers"] for array in report.values()), report


@pytest.fixture(scope="module")
def grid(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """A directory holding a volume `vol` whose scale `s0` has 131,072 one-voxel chunks (tensorstore), and
    their names."""
    root = tmp_path_factory.mktemp("grid") / "data"
    return root, peers.write_tensorstore_chunk_grid(root / "vol", GRID)


def test_chunks_below_a_directory_of_datasets_cost_the_daemon_nothing_a_file(grid, mount) -> None:
    """`ls -l` of 131,072 chunks of a dataset below a directory of datasets: the kernel keeps an entry of each,
    but a chunk's node id is its name (its directory's number, given as it was browsed, and its key), so the
    daemon keeps nothing per file, as a mount of the dataset alone does: it grows by less than the budget, the
    listing (56 bytes a name) and 20 MiB (a table of the paths the kernel holds grew it by 50 MiB here). Every
    chunk has its own inode number, a packed id, and its own voxel."""
    root, names = grid
    m = mount(root, "--cache-size", "1M")
    pid = daemon_of(m.path).pid
    _, idle = peak_and_now_kib(pid)
    inos = {entry.name: entry.stat().st_ino for entry in os.scandir(m.path / "vol" / "s0")}
    peak, _ = peak_and_now_kib(pid)
    grown = peak - idle
    assert grown < (1 + (56 * len(names) >> 20) + 20) << 10, f"grew by {grown >> 10} MiB from {idle >> 10} MiB"
    assert len(inos) == len(set(inos.values())) == len(names)
    assert all(ino & PACKED for ino in inos.values())
    for x, y, z in [(0, 0, 0), (5, 63, 17), (63, 63, 31)]:
        key = peers.compressed_morton_code((x, y, z), GRID)
        assert (m.path / "vol" / "s0" / f"{x}-{x + 1}_{y}-{y + 1}_{z}-{z + 1}").read_bytes() == bytes([key & 0xFF])


@pytest.fixture(scope="module")
def large(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory of 24 copies of a precomputed image of 40 sharded scales, each a grid of 2^14 x 2^14 x 2^10
    chunks (tensorstore writes the `info`; no chunk is written): an open one holds about 5 MiB, its scales'
    Morton tables."""
    root = tmp_path_factory.mktemp("large") / "data"
    spec = peers.sharding_spec(preshift_bits=9, minishard_bits=6, shard_bits=20, data_encoding="raw")
    for n in range(40):
        scale = {"key": f"s{n}", "size": [1 << 20, 1 << 20, 1 << 16], "chunk_size": [64, 64, 64],
                 "resolution": [n + 1] * 3, "sharding": spec, "encoding": "raw"}  # fmt: skip
        ts.open({
            "driver": "neuroglancer_precomputed", "kvstore": {"driver": "file", "path": str(root / "d00")},
            "multiscale_metadata": {"type": "image", "data_type": "uint8", "num_channels": 1},
            "scale_metadata": scale, "create": True,
        }).result()  # fmt: skip
    for n in range(1, 24):
        shutil.copytree(root / "d00", root / f"d{n:02}")
    return root


def test_the_datasets_kept_open_are_bounded_by_the_bytes_they_hold(large, mount) -> None:
    """Each of 24 datasets of 5 MiB browsed in turn (a scale of each looked up), twice: the daemon stays within
    --cache-size + 40 MiB (16 kept open, by their count alone, held 80 MiB), and datasets are let go by their
    bytes, not their count: 4 browsed in turn, fewer than 16, are opened again each time."""
    m = mount(large, "--log-level", "debug")
    for turn in range(2):
        for n in range(24):
            assert (m.path / f"d{n:02}" / f"s{turn}").is_dir()
    peak_kib, _ = peak_and_now_kib(daemon_of(m.path).pid)
    assert peak_kib >> 10 <= 64 + OVERHEAD_MIB, f"peak {peak_kib >> 10} MiB"
    for turn in range(2, 5):
        for n in range(4):
            assert (m.path / f"d{n:02}" / f"s{turn}").is_dir()
    opened = [line for line in m.log_text().splitlines() if "event=dataset_opened path=/d00 " in line]
    assert len(opened) == 5, opened  # each turn of d00, d01, d02 and d03 opened each anew


@pytest.mark.parametrize("view", ["zarr2", "n5"])
def test_a_view_applies_to_each_dataset(data, mount, view, tmp_path) -> None:
    """--view shows every dataset as a mount of it alone in that view does (ome-zarr-py 0.9 reads the zarr2
    view's images and labels, tensorstore the N5 view's arrays); what is no dataset, or none the view can
    show, is shown as stored."""
    root, written = data
    shown = mount(root, "--view", view)
    m = shown.path
    for dataset in DATASETS[:-1]:
        alone = mount(root / dataset, "--view", view).path
        assert listing(m / dataset) == listing(alone), dataset
        assert files_under(m / dataset) == files_under(alone), dataset
    for plain in ("broken", "draft"):  # the draft has no other view: a mount of it alone is refused, saying so
        assert files_under(m / plain) == files_under(root / plain), plain
    said = [line for line in shown.log_text().splitlines() if "shown as plain files" in line]
    assert len(said) == 2 and any(f"--view {view} shows zarr v3" in line for line in said), said
    assert (m / "README").read_bytes() == (root / "README").read_bytes()
    if view == "zarr2":
        mounted = {name: m / "ome" / name for name in ("zyx.zarr", "czyx.zarr")}
        kinds, read = ome_zarr_read("0.9", list(mounted.values()), tmp_path / "read.npz")
        assert kinds == found_nodes(mounted)
        assert_every_level(read, mounted, written["ome"])
    else:
        for name in ("raw", "gzip", "deep/sub/one_d"):
            got = ts.open({"driver": "n5", "kvstore": f"file://{m / 'labs' / '2026' / 'brain.zarr' / name}"})
            np.testing.assert_array_equal(got.result().read().result(), written["zarr"][name].T, err_msg=name)


# --- the same in an S3 bucket ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bucket(data: tuple[Path, dict]) -> Iterator[str]:
    """moto's S3 server on loopback, its endpoint: the data directory uploaded as it is to `lab/data/`,
    10,000 empty directories (the console's zero-byte `name/` objects) under `many/`, and under `wide/` WIDE
    directories of a file each and `prefixes/`, whose `zarr.json` and `info` are prefixes, not objects."""
    with moto_server() as endpoint:
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", **credentials())
        client.create_bucket(Bucket=BUCKET)
        upload(client, data[0], "lab/data")
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda n: client.put_object(Bucket=BUCKET, Key=f"many/d{n:05}/", Body=b""), range(10_000)))
        for key in (
            *(f"wide/d{n:02}/notes.txt" for n in range(WIDE)),
            "wide/prefixes/zarr.json/c",
            "wide/prefixes/info/c",
        ):
            client.put_object(Bucket=BUCKET, Key=key, Body=b"{}")
        yield endpoint


@pytest.fixture
def keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in KEYS.items():
        monkeypatch.setenv(k, v)


def test_a_bucket_prefix_shows_as_the_directory_does(data, bucket, keys, mount, tmp_path) -> None:
    """The uploaded directory, mounted from its prefix and (as `zarr://s3://…`, the form Neuroglancer users
    paste) from the bucket's root, lists and reads as the local directory's mount does; the peers read it."""
    root, written = data
    shown = mount(f"s3://{BUCKET}/lab/data", "--endpoint", bucket)
    m = shown.path
    local = mount(root).path
    assert listing(m) == listing(local)
    assert files_under(m) == files_under(local)
    np.testing.assert_array_equal(read_ts(m / "image"), written["image"])
    group = zarr.open_group(m / "labs" / "2026" / "brain.zarr", mode="r")
    for name, expected in written["zarr"].items():
        np.testing.assert_array_equal(group[name][...], expected, err_msg=name)
    mounted = {name: m / "ome" / name for name in ("zyx.zarr", "czyx.zarr")}
    kinds, read = ome_zarr_read("current", list(mounted.values()), tmp_path / "read.npz")
    assert kinds == found_nodes(mounted)
    assert_every_level(read, mounted, written["ome"])
    said = [line for line in shown.log_text().splitlines() if "shown as plain files" in line]
    assert len(said) == 1 and "broken/info: not valid JSON" in said[0], said
    whole = mount(f"zarr://s3://{BUCKET}", "--endpoint", bucket).path
    assert sorted(os.listdir(whole)) == ["lab", "many", "wide"]
    assert files_under(whole / "lab" / "data" / "seg") == files_under(local / "seg")


def test_a_prefix_of_10000_empty_directories_mounts_at_once(bucket, keys, mount) -> None:
    """Mounting sends the requests a dataset's would (its root's markers looked for) and one listing's page
    (something is there), not one a directory: nothing is crawled. A listing then shows every directory, in
    requests of a page of keys each."""
    m = mount(f"s3://{BUCKET}/many", "--endpoint", bucket).path
    mounting = remote_requests(m).total()
    assert remote_requests(m) == Counter(head=2, list=1), remote_requests(m)  # before: 2 HEADs and 3 LISTs
    assert sorted(os.listdir(m)) == [f"d{n:05}" for n in range(10_000)]
    assert 10 <= remote_requests(m).total() - mounting <= 11, remote_requests(m).total() - mounting


def test_a_bucket_directory_is_judged_by_one_head_a_metadata_name(bucket, keys, mount) -> None:
    """Whether a directory of a bucket is a dataset costs a HEAD of its `zarr.json` and one of its `info`, and no
    listing: an object of that name is metadata, a prefix of that name is not (`prefixes/` is a plain directory).
    Counted as the daemon sends them, for `ls` of each of WIDE+1 directories of a fresh mount: each one's lookup
    (a HEAD and a one-key LIST), judgement (two HEADs; before, a HEAD and a LIST for each name) and listing."""
    mounted = mount(f"s3://{BUCKET}/wide", "--endpoint", bucket)
    m = mounted.path
    names = os.listdir(m)
    before = remote_requests(m)
    shown = {name: sorted(os.listdir(m / name)) for name in names}
    spent = remote_requests(m) - before
    assert shown == {**{f"d{n:02}": ["notes.txt"] for n in range(WIDE)}, "prefixes": ["info", "zarr.json"]}
    assert "shown as plain files" not in mounted.log_text()  # no dataset there, not even a broken one
    assert spent == Counter(head=3 * (WIDE + 1), list=3 * (WIDE + 1)), spent  # before: 3 and 5 each


def test_a_deep_path_judges_each_directory_above_it_by_heads_alone(data, bucket, keys, mount) -> None:
    """A chunk four directories down, looked up in a fresh mount, costs for each directory above it its lookup
    (a HEAD, and a LIST where it is no object) and its judgement (two HEADs; before, a LIST too where a name was
    no object), then the dataset's info and the chunk (three GETs)."""
    root, _ = data
    scale = next(p for p in sorted((root / "unsharded").iterdir()) if p.is_dir())
    chunk = next(p for p in sorted(scale.iterdir()) if p.is_file())
    m = mount(f"s3://{BUCKET}/lab/data", "--endpoint", bucket).path
    before = remote_requests(m)
    assert (m / "labs" / "2025" / "image" / scale.name / chunk.name).stat().st_size > 0
    spent = remote_requests(m) - before
    assert spent == Counter(head=9, list=3, get=3), spent  # before: 9, 8 and 3


def test_the_metadata_names_of_a_directory_are_asked_for_at_once(tmp_path, mount) -> None:
    """The two HEADs that judge a directory are in flight together, at a server that takes 0.2 s an answer: a
    judgement waits one round trip, not two."""
    (tmp_path / BUCKET / "top" / "plain").mkdir(parents=True)
    (tmp_path / BUCKET / "top" / "plain" / "notes.txt").write_text("what is where\n")
    with RangeServer(tmp_path, latency=0.2).running() as server:
        m = mount(f"s3://{BUCKET}/top", "--endpoint", server.url, "--anonymous").path
        assert os.listdir(m / "plain") == ["notes.txt"]
        for name in ("zarr.json", "info"):
            assert server.requests[("HEAD", f"{BUCKET}/top/plain/{name}")] == 1, server.requests
        assert server.most_in_flight == 2


# What `shardfs info` says each dataset of the data directory is.
FORMATS = {
    "image": "precomputed image",
    "seg": "precomputed segmentation with mesh and skeletons",
    "unsharded": "precomputed image",
    "labs/2026/brain.zarr": "zarr v3 group",
    "labs/2025/image": "precomputed image",
    "ome/zyx.zarr": "OME-Zarr 0.5 image",
    "ome/czyx.zarr": "OME-Zarr 0.5 image",
    "draft": "zarr v3 draft hierarchy (2022 sharding storage transformer)",
}


def test_info_and_check_walk_the_datasets_a_directory_holds(data, mount, tmp_path) -> None:
    """`shardfs info` names each dataset with its format, and the broken one with why it is shown as plain files
    (its file and what is wrong), and counts them; `check` checks each dataset as a source of its own and fails
    if one has a corrupt shard; `shardfs list` shows the mount of the directory."""
    root, _ = data
    assert list(FORMATS) == list(DATASETS)
    done = shardfs("info", root)
    said = dict(line.split("/: ", 1) for line in done.stdout.splitlines() if "/: " in line)
    assert said.pop("broken").startswith(f"shown as plain files: {root}/broken/info: not valid JSON ("), done.stdout
    assert said == FORMATS, done.stdout
    assert f"{len(DATASETS)} datasets found and 1 that cannot be opened (shown as plain files)," in done.stdout
    more = tmp_path / "more"
    for part in ("mesh", "skeletons"):  # each a dataset of its own, out of the segmentation
        shutil.copytree(root / "seg" / part, more / part)
    peers.write_tensorstore_annotations(more / "points")
    peers.create_tensorstore_zarr3(more / "array.zarr", [8, 8], "uint8", [4, 4], [2, 2])
    said = dict(line.split("/: ", 1) for line in shardfs("info", more).stdout.splitlines() if "/: " in line)
    assert said == {
        "mesh": "precomputed multi-resolution meshes",
        "skeletons": "precomputed skeletons",
        "points": "precomputed annotations",
        "array.zarr": "zarr v3 array",
    }
    done = shardfs("check", root)
    walked = sorted(DATASETS, key=lambda d: (d.count("/"), d))  # breadth first, by name
    assert [line for line in done.stdout.splitlines() if line.endswith("/")] == [f"{d}/" for d in walked]
    assert done.stdout.endswith(f"OK: {len(DATASETS)} datasets checked\n"), done.stdout
    damaged = tmp_path / "damaged"
    shutil.copytree(root / "image", damaged / "image")
    (damaged / "notes").mkdir()
    shard = next((damaged / "image" / "4_4_40").glob("*.shard"))
    with shard.open("r+b") as f:
        f.write(struct.pack("<QQ", 0, 1 << 40) * 4)  # every minishard index said to end far past the file's end
    done = shardfs("check", damaged, check=False)
    assert done.returncode == 1 and "1 corrupt" in done.stdout and "CORRUPT: 1 dataset checked" in done.stdout
    m = mount(root).path
    assert any(line.split()[:2] == [str(m), str(root)] for line in shardfs("list").stdout.splitlines())
