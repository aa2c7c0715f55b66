"""Sources in a GCS bucket: the loopback server stands in for GCS's XML API (what obstore's GCSStore asks:
objects at /{bucket}/{key}, ListObjectsV2 listings), reached with --endpoint. Skeletons, multi-resolution
meshes and annotations, written by cloud-volume and tensorstore, read back through the kernel."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from cloudvolume import CloudVolume

from tests.support import peers
from tests.support.http_server import RangeServer

pytestmark = [pytest.mark.kernel, pytest.mark.loopback]


BUCKET = "bkt"


@pytest.fixture(scope="module")
def gcs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("gcs")
    bucket = root / BUCKET
    written = {
        "skeletons": peers.write_cloudvolume_skeletons(bucket / "seg"),
        "meshes": peers.write_cloudvolume_multires_meshes(bucket / "meshes", data_encoding="gzip"),
        "annotations": peers.write_tensorstore_annotations(bucket / "ann"),
    }
    return root, written


def test_skeletons_meshes_and_annotations_over_gcs(gcs, mount, monkeypatch) -> None:
    root, written = gcs
    for name in ("GOOGLE_SERVICE_ACCOUNT", "GOOGLE_SERVICE_ACCOUNT_PATH", "GOOGLE_APPLICATION_CREDENTIALS"):
        monkeypatch.delenv(name, raising=False)
    with RangeServer(root).running() as server:
        seg = mount(f"gs://{BUCKET}/seg", "--endpoint", server.url)
        assert sorted(os.listdir(seg.path / "skeletons")) == sorted([*map(str, written["skeletons"]), "info"])
        for segid, blob in written["skeletons"].items():
            assert (seg.path / "skeletons" / str(segid)).read_bytes() == blob
        mounted = CloudVolume(f"file://{seg.path}", progress=False)
        assert mounted.skeleton.meta.is_sharded() is False
        some = next(iter(written["skeletons"]))
        assert len(mounted.skeleton.get(some).vertices) > 0

        meshes = mount(f"precomputed://gs://{BUCKET}/meshes", "--endpoint", server.url)
        assert set(os.listdir(meshes.path / "mesh")) == {*written["meshes"], "info"}
        for name, blob in written["meshes"].items():
            assert (meshes.path / "mesh" / name).read_bytes() == blob, name
        assert "sharding" not in json.loads((meshes.path / "mesh" / "info").read_text())

        ann = mount(f"gs://{BUCKET}/ann", "--endpoint", server.url)
        for rel, blob in written["annotations"].items():
            assert (ann.path / rel).read_bytes() == blob, rel
        by_id = sorted(p.split("/")[1] for p in written["annotations"] if p.startswith("by_id/"))
        assert sorted(os.listdir(ann.path / "by_id")) == by_id
